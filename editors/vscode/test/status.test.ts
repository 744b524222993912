import { test } from 'node:test';
import * as assert from 'node:assert/strict';
import { formatStats, formatStatus } from '../src/status';

test('ready status shows backend, latency and tok/s', () => {
  const v = formatStatus(
    { state: 'ready', backend: 'graph', reason: 'cuda, no sm_90a', model: 'default', lastLatencyMs: 41.6, tokPerS: 182.3 },
    true,
  );
  assert.equal(v.text, '$(sparkle) kog · graph · 42 ms · 182 tok/s');
  assert.match(v.tooltip, /backend: graph \(cuda, no sm_90a\)/);
  assert.match(v.tooltip, /model: default/);
  assert.match(v.tooltip, /automatic suggestions: on/);
  assert.equal(v.error, false);
});

test('loading, off and error states are visible; null fields are left out', () => {
  assert.equal(formatStatus({ state: 'loading', backend: null, lastLatencyMs: null }, true).text, '$(loading~spin) kog · loading');
  assert.equal(formatStatus({ state: 'ready', backend: 'reference', tokPerS: 9.25 }, false).text, '$(sparkle) kog · off · reference · 9.3 tok/s');
  const e = formatStatus({ state: 'error', message: 'CUDA out of memory' }, true);
  assert.equal(e.error, true);
  assert.match(e.tooltip, /CUDA out of memory/);
});

test('stats render as a markdown table with the engine block', () => {
  const md = formatStats({
    latencyMs: { p50: 38.25, p95: 90, count: 12 }, tokPerS: 150.5, prefixCacheHitRate: 0.875,
    completions: 12, cancellations: 3, cacheHits: 4, engine: { backend: 'graph', kv_slots: 4 },
  });
  assert.match(md, /\| latency p50 \| 38\.3 ms \|/);
  assert.match(md, /\| latency p95 \| 90 ms \|/);
  assert.match(md, /\| prefix cache hit rate \| 87\.5 % \|/);
  assert.match(md, /\| cancellations \| 3 \|/);
  assert.match(md, /"kv_slots": 4/);
  assert.match(formatStats({}), /\| latency p50 \| – \|/);
});
