// Drives the extension (activate -> commands -> settings -> status) against the mocked
// vscode module and a fake language client that records what it is sent.
import { state, reset, changeSettings, hasDocument, openDocument, InlineCompletionTriggerKind } from './vscode-mock';
import { test, beforeEach } from 'node:test';
import * as assert from 'node:assert/strict';
import { activate, deactivate } from '../src/extension';
import { COMMANDS, ClientFactory, ClientHooks } from '../src/controller';
import { DocumentFilter, LaunchConfig, ServerSettings } from '../src/settings';

class FakeClient {
  started = 0;
  stopped = 0;
  handlers = new Map<string, (p: any) => void>();
  requests: { method: string; param: unknown }[] = [];
  notifications: { method: string; params: unknown }[] = [];
  constructor(public launch: LaunchConfig, public init: ServerSettings, public hooks: ClientHooks,
    public selector: DocumentFilter[], public failStart = false) {}
  async start() {
    this.started++;
    if (this.failStart) throw new Error('spawn python3 ENOENT');
  }
  async stop() { this.stopped++; }
  onNotification(method: string, handler: (p: any) => void) {
    this.handlers.set(method, handler);
    return { dispose: () => this.handlers.delete(method) };
  }
  async sendRequest<R>(method: string, param?: unknown): Promise<R> {
    this.requests.push({ method, param });
    if (method === 'kog/stats') {
      return { latencyMs: { p50: 20, p95: 40, count: 5 }, tokPerS: 99, prefixCacheHitRate: 0.5, completions: 5,
        cancellations: 1, cacheHits: 2, engine: { backend: 'reference' } } as R;
    }
    throw new Error(`unexpected request ${method}`);
  }
  async sendNotification(method: string, params?: unknown) { this.notifications.push({ method, params }); }
}

let clients: FakeClient[] = [];
let failNext = false;
const factory: ClientFactory = (launch, init, _out, hooks, selector) => {
  const c = new FakeClient(launch, init, hooks, selector, failNext);
  failNext = false;
  clients.push(c);
  return c;
};
const context = () => ({ subscriptions: [] as { dispose(): unknown }[] }) as any;

beforeEach(async () => {
  await deactivate();
  reset({ 'kog.pythonPath': '/venv/bin/python', 'kog.device': 'cpu', 'kog.maxTokens': 32 });
  hasDocument('python');   // the window has a Python file open when the extension activates
  clients = [];
});

test('activate starts the server with launch args and initializationOptions', async () => {
  await activate(context(), factory);
  assert.equal(clients.length, 1);
  const c = clients[0];
  assert.equal(c.started, 1);
  assert.equal(c.launch.command, '/venv/bin/python');
  assert.deepEqual(c.launch.args.slice(0, 5), ['-m', 'kog_lsp', '--stdio', '--model', 'default']);
  assert.ok(c.launch.args.includes('cpu'));
  assert.equal(c.init.maxTokens, 32);
  for (const id of Object.values(COMMANDS)) assert.ok(state.commands.has(id), id);
  assert.equal(state.statusItems[0].text, '$(loading~spin) kog · loading');
  assert.equal(state.statusItems[0].command, COMMANDS.stats);
});

test('kog/status notifications drive the status bar', async () => {
  await activate(context(), factory);
  clients[0].handlers.get('kog/status')!({ state: 'ready', backend: 'graph', lastLatencyMs: 33, tokPerS: 120, model: 'm' });
  assert.equal(state.statusItems[0].text, '$(sparkle) kog · graph · 33 ms · 120 tok/s');
  clients[0].handlers.get('kog/status')!({ state: 'error', message: 'boom' });
  assert.equal(state.statusItems[0].backgroundColor.id, 'statusBarItem.errorBackground');
});

test('show stats requests kog/stats and opens a markdown document', async () => {
  await activate(context(), factory);
  await state.commands.get(COMMANDS.stats)!();
  assert.deepEqual(clients[0].requests.map((r) => r.method), ['kog/stats']);
  assert.equal(state.documents.length, 1);
  assert.equal(state.documents[0].language, 'markdown');
  assert.match(state.documents[0].content!, /\| latency p95 \| 40 ms \|/);
  assert.equal(state.shown.length, 1);
});

test('toggle flips kog.enable, tells the server, and gates automatic requests', async () => {
  await activate(context(), factory);
  const c = clients[0];
  c.handlers.get('kog/status')!({ state: 'ready', backend: 'reference' });
  assert.equal(c.hooks.automaticAllowed(), true);
  await state.commands.get(COMMANDS.toggle)!();
  assert.equal(state.settings['kog.enable'], false);
  assert.equal(c.hooks.automaticAllowed(), false);
  const last = c.notifications.at(-1)!;
  assert.equal(last.method, 'workspace/didChangeConfiguration');
  assert.equal((last.params as any).settings.kog.enable, false);
  assert.match(state.statusItems[0].text, /off/);
  assert.equal(InlineCompletionTriggerKind.Automatic, 1);
});

test('trigger runs the editor inline suggest command', async () => {
  await activate(context(), factory);
  await state.commands.get(COMMANDS.trigger)!();
  assert.ok(state.executed.some((e) => e.command === 'editor.action.inlineSuggest.trigger'));
});

test('non-launch settings are forwarded; launch settings restart the server', async () => {
  await activate(context(), factory);
  await changeSettings({ 'kog.multiline': 'never' });
  assert.equal(clients.length, 1);
  assert.equal((clients[0].notifications.at(-1)!.params as any).settings.kog.multiline, 'never');
  await changeSettings({ 'kog.model': '/models/qwen' });
  assert.equal(clients.length, 2);
  assert.equal(clients[0].stopped, 1);
  assert.ok(clients[1].launch.args.includes('/models/qwen'));
  // A status from the old client no longer changes the bar.
  clients[0].handlers.get('kog/status')?.({ state: 'ready', backend: 'stale' });
  assert.doesNotMatch(state.statusItems[0].text, /stale/);
});

test('restart command stops and starts a new client', async () => {
  await activate(context(), factory);
  await state.commands.get(COMMANDS.restart)!();
  assert.equal(clients.length, 2);
  assert.equal(clients[0].stopped, 1);
  assert.equal(clients[1].started, 1);
});

test('a server that does not start shows an error, not a silent failure', async () => {
  failNext = true;
  await activate(context(), factory);
  assert.equal(state.statusItems[0].backgroundColor.id, 'statusBarItem.errorBackground');
  assert.ok(state.messages.some((m) => m.level === 'error' && /ENOENT/.test(m.text)));
  await state.commands.get(COMMANDS.stats)!();
});

test('without a document of a served language the server waits for one', async () => {
  reset({ 'kog.pythonPath': '/venv/bin/python' });
  hasDocument('markdown');
  await activate(context(), factory);
  assert.equal(clients.length, 0);
  assert.equal(state.statusItems[0].text, '$(circle-outline) kog · idle');
  assert.match(state.statusItems[0].tooltip, /starts with the first python document/);
  await openDocument('typescript');
  assert.equal(clients.length, 0);
  await openDocument('python', 'untitled');
  assert.equal(clients.length, 1);
  assert.equal(clients[0].started, 1);
  assert.deepEqual(clients[0].selector, [{ scheme: 'file', language: 'python' }, { scheme: 'untitled', language: 'python' }]);
  await openDocument('python');
  assert.equal(clients.length, 1, 'one server per window');
});

test('kog.languages sets the documents served; "*" serves every language', async () => {
  reset({ 'kog.languages': [' typescript', 'rust', 7, '', 'rust'] });
  hasDocument('python');
  await activate(context(), factory);
  assert.equal(clients.length, 0, 'python is not in the list');
  await openDocument('rust');
  assert.equal(clients.length, 1);
  assert.deepEqual(clients[0].selector.map((f) => `${f.scheme}:${f.language}`),
    ['file:typescript', 'untitled:typescript', 'file:rust', 'untitled:rust']);
  await changeSettings({ 'kog.languages': ['go', '*'] });
  assert.equal(clients.length, 2, 'a new selector restarts the server');
  assert.equal(clients[0].stopped, 1);
  assert.deepEqual(clients[1].selector, [{ scheme: 'file' }, { scheme: 'untitled' }]);
});

test('a restart for a language list with no open document waits again', async () => {
  await activate(context(), factory);
  assert.equal(clients.length, 1);
  await changeSettings({ 'kog.languages': ['haskell'] });
  assert.equal(clients[0].stopped, 1);
  assert.equal(clients.length, 1);
  assert.match(state.statusItems[0].tooltip, /haskell/);
  await openDocument('haskell');
  assert.equal(clients.length, 2);
  assert.equal(clients[1].started, 1);
});
