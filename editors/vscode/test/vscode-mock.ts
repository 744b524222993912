// A small in-memory stand-in for the `vscode` module (VS Code itself cannot be
// downloaded here). Importing this file first makes `require('vscode')` resolve to it.
import Module = require('module');

type Listener<T> = (e: T) => unknown;

export class EventEmitter<T> {
  private listeners: Listener<T>[] = [];
  event = (l: Listener<T>) => {
    this.listeners.push(l);
    return { dispose: () => (this.listeners = this.listeners.filter((x) => x !== l)) };
  };
  async fire(e: T): Promise<void> {
    for (const l of [...this.listeners]) await l(e);
  }
}

export class ThemeColor {
  constructor(public readonly id: string) {}
}

export const StatusBarAlignment = { Left: 1, Right: 2 };
export const ConfigurationTarget = { Global: 1, Workspace: 2, WorkspaceFolder: 3 };
export const InlineCompletionTriggerKind = { Invoke: 0, Automatic: 1 };

/** Everything the tests look at after driving the extension. */
export const state = {
  settings: {} as Record<string, unknown>,
  commands: new Map<string, (...a: unknown[]) => unknown>(),
  executed: [] as { command: string; args: unknown[] }[],
  messages: [] as { level: string; text: string }[],
  documents: [] as { language?: string; content?: string }[],
  shown: [] as unknown[],
  statusItems: [] as Record<string, any>[],
  outputLines: [] as string[],
  configEvents: new EventEmitter<{ affectsConfiguration(s: string): boolean }>(),
  /** workspace.textDocuments; openDocument() adds one and fires onDidOpenTextDocument. */
  textDocuments: [] as MockDocument[],
  openEvents: new EventEmitter<MockDocument>(),
};

export interface MockDocument {
  uri: { scheme: string; toString(): string };
  languageId: string;
}

function mockDocument(languageId: string, scheme: string): MockDocument {
  const n = state.textDocuments.length;
  return { uri: { scheme, toString: () => `${scheme}:/doc${n}` }, languageId };
}

/** A document VS Code already had open when the extension activated. */
export function hasDocument(languageId: string, scheme = 'file'): void {
  state.textDocuments.push(mockDocument(languageId, scheme));
}

/** Opens a document the way the editor does: listed, then onDidOpenTextDocument. */
export async function openDocument(languageId: string, scheme = 'file'): Promise<void> {
  const d = mockDocument(languageId, scheme);
  state.textDocuments.push(d);
  await state.openEvents.fire(d);
}

/** vscode.languages.match for filters {scheme, language?}: 10 for a match, else 0 (a score, as VS Code's). */
function match(selector: { scheme?: string; language?: string }[], d: MockDocument): number {
  const hit = selector.some((f) => (f.scheme === undefined || f.scheme === d.uri.scheme) &&
    (f.language === undefined || f.language === d.languageId));
  return hit ? 10 : 0;
}

export function reset(settings: Record<string, unknown> = {}): void {
  state.settings = { ...settings };
  state.commands.clear();
  state.executed.length = 0;
  state.messages.length = 0;
  state.documents.length = 0;
  state.shown.length = 0;
  state.statusItems.length = 0;
  state.outputLines.length = 0;
  state.configEvents = new EventEmitter();
  state.textDocuments = [];
  state.openEvents = new EventEmitter();
}

/** Changes settings the way the Settings UI would: store, then fire the change event. */
export async function changeSettings(changes: Record<string, unknown>): Promise<void> {
  Object.assign(state.settings, changes);
  const keys = Object.keys(changes);
  await state.configEvents.fire({
    affectsConfiguration: (s: string) => keys.some((k) => k === s || k.startsWith(s + '.')),
  });
}

function configuration(section: string) {
  return {
    get<T>(key: string, dflt: T): T {
      const full = `${section}.${key}`;
      return full in state.settings ? (state.settings[full] as T) : dflt;
    },
    async update(key: string, value: unknown): Promise<void> {
      await changeSettings({ [`${section}.${key}`]: value });
    },
  };
}

const disposable = () => ({ dispose() {} });

export const vscodeMock = {
  EventEmitter,
  ThemeColor,
  StatusBarAlignment,
  ConfigurationTarget,
  InlineCompletionTriggerKind,
  workspace: {
    getConfiguration: configuration,
    onDidChangeConfiguration: (l: Listener<any>) => state.configEvents.event(l),
    get textDocuments() {
      return state.textDocuments;
    },
    onDidOpenTextDocument: (l: Listener<MockDocument>) => state.openEvents.event(l),
    openTextDocument: async (opts: { language?: string; content?: string }) => {
      state.documents.push(opts);
      return { uri: `untitled:${state.documents.length}`, ...opts };
    },
  },
  window: {
    createStatusBarItem: (alignment: number, priority: number) => {
      const item: Record<string, any> = { alignment, priority, visible: false };
      item.show = () => (item.visible = true);
      item.hide = () => (item.visible = false);
      item.dispose = () => (item.disposed = true);
      state.statusItems.push(item);
      return item;
    },
    createOutputChannel: (_name: string) => ({
      appendLine: (l: string) => state.outputLines.push(l),
      info: (l: string) => state.outputLines.push(l),
      dispose() {},
    }),
    showErrorMessage: async (text: string) => void state.messages.push({ level: 'error', text }),
    showWarningMessage: async (text: string) => void state.messages.push({ level: 'warning', text }),
    showInformationMessage: async (text: string) => void state.messages.push({ level: 'info', text }),
    showTextDocument: async (doc: unknown) => void state.shown.push(doc),
  },
  commands: {
    registerCommand: (id: string, fn: (...a: unknown[]) => unknown) => {
      if (state.commands.has(id)) throw new Error(`command '${id}' already exists`);
      state.commands.set(id, fn);
      return { dispose: () => state.commands.delete(id) };
    },
    executeCommand: async (command: string, ...args: unknown[]) => {
      state.executed.push({ command, args });
      const fn = state.commands.get(command);
      return fn ? fn(...args) : undefined;
    },
  },
  languages: { match },
  Disposable: { from: disposable },
};

// Route require('vscode') to the mock for every module loaded after this one.
const M = Module as unknown as { _resolveFilename: (req: string, ...rest: unknown[]) => string };
const original = M._resolveFilename;
M._resolveFilename = function (request: string, ...rest: unknown[]) {
  if (request === 'vscode') return __filename;
  return original.call(this, request, ...rest);
};
// `require('vscode')` resolved to this file returns its exports: expose the mock's API there.
Object.assign(module.exports, vscodeMock);
