// Entry point: VS Code calls activate() once the window has started (onStartupFinished); the server itself starts
// with the first document of a language in `kog.languages`.
import * as vscode from 'vscode';
import { ClientFactory, KogController } from './controller';

let controller: KogController | undefined;

export async function activate(context: vscode.ExtensionContext, factory?: ClientFactory): Promise<KogController> {
  // Loaded lazily so unit tests (which pass a fake factory) never load vscode-languageclient.
  const make: ClientFactory = factory ?? (require('./client') as typeof import('./client')).createLanguageClient;
  controller = new KogController(make);
  context.subscriptions.push(controller);
  await controller.startWhenNeeded();
  return controller;
}

export async function deactivate(): Promise<void> {
  const c = controller;
  controller = undefined;
  if (c) await c.dispose();
}
