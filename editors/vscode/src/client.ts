// Builds the real vscode-languageclient client: stdio transport, the documents of the
// `kog.languages` selector, native inline completion (languageclient >= 10), and a
// middleware that drops automatic requests while automatic suggestions are switched off.
import { LanguageClient, LanguageClientOptions, ServerOptions, TransportKind } from 'vscode-languageclient/node';
import type { ClientFactory, ClientLike } from './controller';
import { inlineCompletionGate } from './middleware';

export const createLanguageClient: ClientFactory = (launch, init, output, hooks, selector): ClientLike => {
  const exec = { command: launch.command, args: launch.args, transport: TransportKind.stdio };
  const serverOptions: ServerOptions = { run: exec, debug: exec };
  const clientOptions: LanguageClientOptions = {
    documentSelector: selector,
    initializationOptions: init,
    outputChannel: output,
    middleware: inlineCompletionGate(hooks),
  };
  return new LanguageClient('kog', 'kog-lsp', serverOptions, clientOptions);
};
