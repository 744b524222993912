import { test } from 'node:test';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import * as assert from 'node:assert/strict';
import {
  ConfigReader, DEFAULT_LANGUAGES, SERVER_DEFAULTS, documentSelector, languages, launchConfig, needsRestart, serverSettings,
} from '../src/settings';

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
  assert.equal(needsRestart((s) => s === 'kog.languages'), true);
  assert.equal(needsRestart((s) => s === 'kog.maxTokens'), false);
});

test('languages: trimmed, deduplicated, strings only; "*" wins; nothing valid means the default', () => {
  assert.deepEqual(languages(reader({})), DEFAULT_LANGUAGES);
  assert.deepEqual(languages(reader({ languages: [' rust ', 'go', 'rust', 3, ''] })), ['rust', 'go']);
  assert.deepEqual(languages(reader({ languages: ['go', '*'] })), ['*']);
  assert.deepEqual(languages(reader({ languages: [] })), DEFAULT_LANGUAGES);
  assert.deepEqual(languages(reader({ languages: 'python' })), DEFAULT_LANGUAGES);
  assert.deepEqual(documentSelector(['go']), [{ scheme: 'file', language: 'go' }, { scheme: 'untitled', language: 'go' }]);
  assert.deepEqual(documentSelector(['*']), [{ scheme: 'file' }, { scheme: 'untitled' }]);
});

test('package.json declares every setting with the defaults the code falls back to', () => {
  const pkg = JSON.parse(readFileSync(join(__dirname, '..', '..', 'package.json'), 'utf8'));
  const props = pkg.contributes.configuration.properties;
  for (const [k, v] of Object.entries(SERVER_DEFAULTS)) assert.deepEqual(props[`kog.${k}`].default, v, k);
  assert.deepEqual(props['kog.languages'].default, DEFAULT_LANGUAGES);
  // activation at startup: the server itself waits for a document of a served language (KogController.startWhenNeeded)
  assert.deepEqual(pkg.activationEvents, ['onStartupFinished']);
});
