// Client-side gate for inline completion requests: while automatic suggestions are off,
// automatic requests are answered locally with nothing (no round trip to the server);
// explicitly invoked ones (the trigger command) always go through.
import * as vscode from 'vscode';
import type { Middleware } from 'vscode-languageclient';
import type { ClientHooks } from './controller';

type InlineGate = Pick<Required<Middleware>, 'provideInlineCompletionItems'>;

export function inlineCompletionGate(hooks: ClientHooks): InlineGate {
  return {
    provideInlineCompletionItems: (document, position, context, token, next) => {
      if (context.triggerKind === vscode.InlineCompletionTriggerKind.Automatic && !hooks.automaticAllowed()) {
        return null;
      }
      return next(document, position, context, token);
    },
  };
}
