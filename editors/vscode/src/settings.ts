// Pure mapping between the VS Code `kog.*` settings and what the server takes:
// launch arguments (model, device, backend need a restart) and the `kog` settings
// object sent as initializationOptions and in workspace/didChangeConfiguration
// (keys as in docs/interfaces.md). No `vscode` import so it is unit-testable as is.

/** Reads one setting; mirrors vscode.WorkspaceConfiguration.get. */
export interface ConfigReader {
  get<T>(key: string, defaultValue: T): T;
}

export interface LaunchConfig {
  command: string;
  args: string[];
}

/** The server's settings table (docs/interfaces.md, "Server settings"). */
export interface ServerSettings {
  enable: boolean;
  debounceMs: number;
  maxTokens: number;
  multiline: 'auto' | 'always' | 'never';
  prefixTokens: number;
  suffixTokens: number;
  contextTokens: number;
  temperature: number;
  reviewEnable: boolean;
  reviewSeverity: 'error' | 'warning' | 'information' | 'hint';
}

export const SERVER_DEFAULTS: ServerSettings = {
  enable: true,
  debounceMs: 50,
  maxTokens: 64,
  multiline: 'auto',
  prefixTokens: 1024,
  suffixTokens: 64,
  contextTokens: 512,
  temperature: 0.0,
  reviewEnable: true,
  reviewSeverity: 'information',
};

/** Settings that change how the process is started or which documents it serves: a change restarts the server. */
export const RESTART_KEYS = ['pythonPath', 'serverPath', 'model', 'device', 'backend', 'extraArgs', 'languages'];

/** The languages served when `kog.languages` gives none: the shipped default model is a Python model. */
export const DEFAULT_LANGUAGES = ['python'];

/** A document filter as vscode-languageclient's documentSelector takes it. */
export interface DocumentFilter {
  scheme: string;
  language?: string;
}

const MULTILINE = ['auto', 'always', 'never'];
const SEVERITY = ['error', 'warning', 'information', 'hint'];

// Ranges as the server validates them (kog_lsp/settings.py); out-of-range values are clamped
// here so one bad setting never makes the server reject it and keep a stale value.
function intIn(v: unknown, min: number, max: number, fallback: number): number {
  return typeof v === 'number' && Number.isFinite(v) ? Math.min(max, Math.max(min, Math.round(v))) : fallback;
}

function oneOf<T extends string>(v: unknown, allowed: string[], fallback: T): T {
  return typeof v === 'string' && allowed.includes(v) ? (v as T) : fallback;
}

/** The `kog` section for the server; invalid values fall back to the server's defaults. */
export function serverSettings(cfg: ConfigReader): ServerSettings {
  const d = SERVER_DEFAULTS;
  const temperature = cfg.get<number>('temperature', d.temperature);
  return {
    enable: cfg.get<boolean>('enable', d.enable) !== false,
    debounceMs: intIn(cfg.get<number>('debounceMs', d.debounceMs), 0, 10_000, d.debounceMs),
    maxTokens: intIn(cfg.get<number>('maxTokens', d.maxTokens), 1, 2048, d.maxTokens),
    multiline: oneOf(cfg.get<string>('multiline', d.multiline), MULTILINE, d.multiline),
    prefixTokens: intIn(cfg.get<number>('prefixTokens', d.prefixTokens), 1, 32_768, d.prefixTokens),
    suffixTokens: intIn(cfg.get<number>('suffixTokens', d.suffixTokens), 0, 32_768, d.suffixTokens),
    contextTokens: intIn(cfg.get<number>('contextTokens', d.contextTokens), 0, 32_768, d.contextTokens),
    temperature:
      typeof temperature === 'number' && Number.isFinite(temperature) && temperature >= 0 && temperature <= 5
        ? temperature
        : d.temperature,
    reviewEnable: cfg.get<boolean>('reviewEnable', d.reviewEnable) !== false,
    reviewSeverity: oneOf(cfg.get<string>('reviewSeverity', d.reviewSeverity), SEVERITY, d.reviewSeverity),
  };
}

/**
 * How to start the server over stdio. `serverPath` (a `kog-lsp` executable) wins over
 * `pythonPath -m kog_lsp`, so both a venv's python and an installed console script work.
 */
export function launchConfig(cfg: ConfigReader): LaunchConfig {
  const args: string[] = [];
  const serverPath = cfg.get<string>('serverPath', '').trim();
  const python = cfg.get<string>('pythonPath', '').trim() || 'python3';
  const command = serverPath || python;
  if (!serverPath) args.push('-m', 'kog_lsp');
  args.push('--stdio');
  const model = cfg.get<string>('model', 'default').trim() || 'default';
  args.push('--model', model);
  const device = oneOf(cfg.get<string>('device', 'auto'), ['auto', 'cpu', 'cuda'], 'auto');
  args.push('--device', device);
  const backend = oneOf(
    cfg.get<string>('backend', 'auto'),
    ['auto', 'reference', 'graph', 'monokernel'],
    'auto',
  );
  args.push('--backend', backend);
  const extra = cfg.get<string[]>('extraArgs', []);
  if (Array.isArray(extra)) args.push(...extra.filter((a) => typeof a === 'string'));
  return { command, args };
}

/**
 * The VS Code language ids the client serves (`kog.languages`): trimmed, without duplicates or non-strings; `*`
 * anywhere in the list means every language; an empty or invalid value means DEFAULT_LANGUAGES.
 */
export function languages(cfg: ConfigReader): string[] {
  const v = cfg.get<unknown>('languages', DEFAULT_LANGUAGES);
  const ids = Array.isArray(v) ? v.filter((x): x is string => typeof x === 'string').map((x) => x.trim()) : [];
  const unique = [...new Set(ids.filter((x) => x.length > 0))];
  if (unique.includes('*')) return ['*'];
  return unique.length > 0 ? unique : [...DEFAULT_LANGUAGES];
}

/** Saved files and untitled buffers of those languages (every language for `*`). */
export function documentSelector(langs: string[]): DocumentFilter[] {
  const schemes = ['file', 'untitled'];
  if (langs.includes('*')) return schemes.map((scheme) => ({ scheme }));
  return langs.flatMap((language) => schemes.map((scheme) => ({ scheme, language })));
}

/** Whether a configuration change under `kog.` needs a server restart. */
export function needsRestart(affects: (section: string) => boolean): boolean {
  return RESTART_KEYS.some((k) => affects(`kog.${k}`));
}
