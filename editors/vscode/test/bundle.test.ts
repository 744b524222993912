// The esbuild bundle (what the .vsix ships) loads against the vscode API and activates;
// the inline-completion gate lets invoked requests through and drops automatic ones when off.
import { state, reset, hasDocument, InlineCompletionTriggerKind } from './vscode-mock';
import { test } from 'node:test';
import * as assert from 'node:assert/strict';
import * as path from 'node:path';
import { inlineCompletionGate } from '../src/middleware';

test('dist/extension.js exports activate/deactivate and activates with an injected client', async () => {
  reset();
  hasDocument('python');
  const bundle = require(path.join(__dirname, '..', '..', 'dist', 'extension.js'));
  assert.equal(typeof bundle.activate, 'function');
  assert.equal(typeof bundle.deactivate, 'function');
  let started = false;
  const fake = {
    start: async () => void (started = true), stop: async () => {},
    onNotification: () => ({ dispose() {} }), sendRequest: async () => ({}), sendNotification: async () => {},
  };
  await bundle.activate({ subscriptions: [] }, () => fake);
  assert.ok(started);
  assert.ok(state.commands.has('kog.showStats'));
  await bundle.deactivate();
});

test('automatic requests are skipped while disabled; invoked ones always reach the server', async () => {
  let allowed = true;
  const gate = inlineCompletionGate({ automaticAllowed: () => allowed });
  const calls: number[] = [];
  const next = ((_d: unknown, _p: unknown, ctx: { triggerKind: number }) => {
    calls.push(ctx.triggerKind);
    return [{ insertText: 'x' }];
  }) as any;
  const auto = { triggerKind: InlineCompletionTriggerKind.Automatic } as any;
  const invoke = { triggerKind: InlineCompletionTriggerKind.Invoke } as any;
  assert.deepEqual(gate.provideInlineCompletionItems({} as any, {} as any, auto, {} as any, next), [{ insertText: 'x' }]);
  allowed = false;
  assert.equal(gate.provideInlineCompletionItems({} as any, {} as any, auto, {} as any, next), null);
  assert.deepEqual(gate.provideInlineCompletionItems({} as any, {} as any, invoke, {} as any, next), [{ insertText: 'x' }]);
  assert.deepEqual(calls, [InlineCompletionTriggerKind.Automatic, InlineCompletionTriggerKind.Invoke]);
});
