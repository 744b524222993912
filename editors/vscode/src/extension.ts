// Entry point: VS Code calls activate() on the first Python document.
import * as vscode from 'vscode';
import { ClientFactory, KogController } from './controller';

let controller: KogController | undefined;

export async function activate(context: vscode.ExtensionContext, factory?: ClientFactory): Promise<KogController> {
  // Loaded lazily so unit tests (which pass a fake factory) never load vscode-languageclient.
  const make: ClientFactory = factory ?? (require('./client') as typeof import('./client')).createLanguageClient;
  controller = new KogController(make);
  context.subscriptions.push(controller);
  await controller.start();
  return controller;
}

export async function deactivate(): Promise<void> {
  const c = controller;
  controller = undefined;
  if (c) await c.dispose();
}
