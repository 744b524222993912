// Pure formatting of the kog/status notification and the kog/stats result
// (docs/interfaces.md, "Custom protocol") for the status bar and the stats view.

// idle: no document of a served language is open yet, so the server has not started (KogController.startWhenNeeded).
export type ServerState = 'loading' | 'ready' | 'busy' | 'error' | 'stopped' | 'starting' | 'idle';

export interface KogStatus {
  state: ServerState;
  backend?: string | null;
  reason?: string | null;
  model?: string | null;
  message?: string | null;
  lastLatencyMs?: number | null;
  tokPerS?: number | null;
}

export interface KogStats {
  latencyMs?: { p50?: number | null; p95?: number | null; count?: number | null } | null;
  tokPerS?: number | null;
  prefixCacheHitRate?: number | null;
  completions?: number | null;
  cancellations?: number | null;
  cacheHits?: number | null;
  engine?: Record<string, unknown> | null;
}

export interface StatusView {
  text: string;
  tooltip: string;
  /** True when the item should use the error background. */
  error: boolean;
}

const ICONS: Record<string, string> = {
  loading: '$(loading~spin)',
  starting: '$(loading~spin)',
  busy: '$(sync~spin)',
  ready: '$(sparkle)',
  error: '$(error)',
  stopped: '$(circle-slash)',
  idle: '$(circle-outline)',
};

function num(v: unknown): v is number {
  return typeof v === 'number' && Number.isFinite(v);
}

/** Status bar text: icon, state, backend, last latency, tok/s; "off" when automatic suggestions are disabled. */
export function formatStatus(s: KogStatus, autoEnabled: boolean): StatusView {
  const parts: string[] = [`${ICONS[s.state] ?? ''} kog`.trim()];
  if (s.state !== 'ready') parts.push(s.state);
  else if (!autoEnabled) parts.push('off');
  if (s.backend) parts.push(s.backend);
  if (num(s.lastLatencyMs)) parts.push(`${Math.round(s.lastLatencyMs)} ms`);
  if (num(s.tokPerS)) parts.push(`${s.tokPerS >= 100 ? Math.round(s.tokPerS) : s.tokPerS.toFixed(1)} tok/s`);
  const tip: string[] = [`kog-lsp: ${s.state}`];
  if (s.model) tip.push(`model: ${s.model}`);
  if (s.backend) tip.push(`backend: ${s.backend}${s.reason ? ` (${s.reason})` : ''}`);
  if (s.message) tip.push(s.message);
  tip.push(`automatic suggestions: ${autoEnabled ? 'on' : 'off'}`);
  tip.push('click for statistics');
  return { text: parts.join(' · '), tooltip: tip.join('\n'), error: s.state === 'error' };
}

function fmt(v: unknown, digits = 1, unit = ''): string {
  if (!num(v)) return '–';
  return `${Number.isInteger(v) ? v : v.toFixed(digits)}${unit}`;
}

/** Markdown report of a kog/stats result, shown by the "show stats" command. */
export function formatStats(st: KogStats): string {
  const lat = st.latencyMs ?? {};
  const rate = num(st.prefixCacheHitRate) ? `${(st.prefixCacheHitRate * 100).toFixed(1)} %` : '–';
  const lines = [
    '# kog-lsp statistics',
    '',
    '| metric | value |',
    '|---|---|',
    `| latency p50 | ${fmt(lat.p50, 1, ' ms')} |`,
    `| latency p95 | ${fmt(lat.p95, 1, ' ms')} |`,
    `| latency samples | ${fmt(lat.count, 0)} |`,
    `| decode speed | ${fmt(st.tokPerS, 1, ' tok/s')} |`,
    `| prefix cache hit rate | ${rate} |`,
    `| completions | ${fmt(st.completions, 0)} |`,
    `| cancellations | ${fmt(st.cancellations, 0)} |`,
    `| suggestion cache hits | ${fmt(st.cacheHits, 0)} |`,
  ];
  if (st.engine && typeof st.engine === 'object') {
    lines.push('', '## engine', '', '```json', JSON.stringify(st.engine, null, 2), '```');
  }
  return lines.join('\n') + '\n';
}
