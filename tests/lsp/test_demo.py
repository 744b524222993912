"""The demo (kog-lsp demo) and the latency bench replay against a tiny checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lsp_testutil import server_env

from kog_lsp.demo import DEMO_DATA, _keystrokes

ROOT = Path(__file__).resolve().parents[2]


def test_keystroke_split_auto_indent():
    assert _keystrokes("ab\n    c\n\nd") == ["a", "b", "\n    ", "c", "\n", "\n", "d"]


def test_demo_runs_against_tiny_checkpoint(tiny_model):
    proc = subprocess.run([sys.executable, "-m", "kog_lsp", "demo", "--model", tiny_model, "--device", "cpu",
                           "--speed", "4"], capture_output=True, text=True, timeout=120, env=server_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    session = json.loads((DEMO_DATA / "session.json").read_text())
    typed = sum(len(_keystrokes(s["type"])) for s in session["steps"] if "type" in s)
    assert last["kind"] == "kog-demo" and last["backend"] == "reference" and last["device"] == "cpu"
    assert last["keystrokes"] >= typed and last["requests"] >= last["keystrokes"]
    assert last["suggestions_shown"] > 0 and last["p50_ms"] > 0 and last["p95_ms"] >= last["p50_ms"]
    assert "keystroke -> suggestion latency: p50" in proc.stdout


def test_demo_reports_missing_model_clearly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kog_lsp", "demo", "--model", str(tmp_path / "nothing"),
                           "--device", "cpu"], capture_output=True, text=True, timeout=120, env=server_env(), cwd=ROOT)
    assert proc.returncode == 2
    assert "could not load the model" in proc.stderr
