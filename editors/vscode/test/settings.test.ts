import { test } from 'node:test';
import * as assert from 'node:assert/strict';
import { ConfigReader, SERVER_DEFAULTS, launchConfig, needsRestart, serverSettings } from '../src/settings';

function reader(values: Record<string, unknown>): ConfigReader {
  return { get: <T>(k: string, d: T): T => (k in values ? (values[k] as T) : d) };
}

test('defaults mirror the server settings table', () => {
  assert.deepEqual(serverSettings(reader({})), SERVER_DEFAULTS);
  assert.deepEqual(SERVER_DEFAULTS, {
    enable: true, debounceMs: 50, maxTokens: 64, multiline: 'auto', prefixTokens: 1024,
    suffixTokens: 64, contextTokens: 512, temperature: 0, reviewEnable: true, reviewSeverity: 'information',
  });
});

test('user values pass through; invalid ones fall back to defaults', () => {
  const s = serverSettings(reader({
    enable: false, debounceMs: 120.4, maxTokens: 0, multiline: 'never', temperature: -1,
    reviewEnable: false, reviewSeverity: 'shout', prefixTokens: 'many', suffixTokens: 1e9,
  }));
  assert.equal(s.enable, false);
  assert.equal(s.debounceMs, 120);
  assert.equal(s.maxTokens, 1, 'maxTokens is clamped to at least 1');
  assert.equal(s.multiline, 'never');
  assert.equal(s.temperature, 0);
  assert.equal(s.reviewEnable, false);
  assert.equal(s.reviewSeverity, 'information');
  assert.equal(s.prefixTokens, 1024);
  assert.equal(s.suffixTokens, 32768, 'clamped to the server maximum');
});

test('launch uses python -m kog_lsp over stdio with model/device/backend', () => {
  const l = launchConfig(reader({ pythonPath: '/venv/bin/python', model: '/m', device: 'cpu', backend: 'graph' }));
  assert.equal(l.command, '/venv/bin/python');
  assert.deepEqual(l.args, ['-m', 'kog_lsp', '--stdio', '--model', '/m', '--device', 'cpu', '--backend', 'graph']);
});

test('serverPath replaces the interpreter; bad enums fall back; extra args are appended', () => {
  const l = launchConfig(reader({ serverPath: '/usr/bin/kog-lsp', device: 'tpu', extraArgs: ['--tp', '2', 7] }));
  assert.equal(l.command, '/usr/bin/kog-lsp');
  assert.deepEqual(l.args, ['--stdio', '--model', 'default', '--device', 'auto', '--backend', 'auto', '--tp', '2']);
  assert.equal(launchConfig(reader({ pythonPath: '  ' })).command, 'python3');
});

test('only launch settings need a restart', () => {
  assert.equal(needsRestart((s) => s === 'kog.model'), true);
  assert.equal(needsRestart((s) => s === 'kog.device'), true);
  assert.equal(needsRestart((s) => s === 'kog.maxTokens'), false);
});
