"""Model faults: broken checkpoints, unsupported architectures and backend failures.

The server must start anyway, say clearly what is wrong (window/showMessage + kog/status "error"), keep tracking
documents exactly and answer requests (empty suggestions) instead of erroring or hanging. Backend faults are
injected by tests/reliability/fault_launcher.py (the product has no fault hooks).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from .conftest import start_server
from .wire import RawServer, kog_argv, server_env

LAUNCHER = str(Path(__file__).with_name("fault_launcher.py"))
DOC_URI = "file:///ws/faults.py"
DOC_TEXT = "def añadir(a, b):\n    return a + b  # 😀\n"


def _broken_models(tiny_model: str, root: Path) -> dict[str, tuple[str, tuple[str, ...]]]:
    """case -> (model dir, words the error message must contain one of)."""
    def copy(name):
        d = root / name
        shutil.copytree(tiny_model, d)
        return d

    out = {}
    d = copy("missing_weights")
    (d / "model.safetensors").unlink()
    out["missing_weights"] = (str(d), ("safetensors",))
    d = copy("truncated_weights")
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    out["truncated_weights"] = (str(d), ("truncated", "corrupt"))
    d = copy("unsupported_arch")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    cfg["model_type"] = "gpt2"
    (d / "config.json").write_text(json.dumps(cfg))
    out["unsupported_arch"] = (str(d), ("gpt2", "GPT2LMHeadModel", "architecture"))
    d = copy("no_tokenizer")
    (d / "tokenizer.json").unlink()
    out["no_tokenizer"] = (str(d), ("tokenizer",))
    out["no_such_dir"] = (str(root / "does-not-exist"), ("does not exist", "does-not-exist"))
    return out


@pytest.fixture(scope="module")
def broken_servers(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("broken-models")
    cases = _broken_models(tiny_model, root)
    # Spawn them all at once (start-up is mostly imports), then initialize each.
    servers = {name: RawServer(kog_argv(model), env=server_env(), stderr_path=root / f"{name}.log")
               for name, (model, _) in cases.items()}
    for s in servers.values():
        s.init_result = s.initialize()
    yield {name: (servers[name], cases[name][1]) for name in cases}
    for s in servers.values():
        s.close()


def check_serves_documents_without_model(s) -> None:
    s.open(DOC_URI, DOC_TEXT)
    s.change(DOC_URI, 2, [{"range": {"start": {"line": 1, "character": 4}, "end": {"line": 1, "character": 10}},
                           "text": "yield"}])
    assert s.document(DOC_URI)["text"] == DOC_TEXT.replace("return", "yield")
    resp = s.call("textDocument/inlineCompletion", {
        "textDocument": {"uri": DOC_URI}, "position": {"line": 1, "character": 9},
        "context": {"triggerKind": 2}}, timeout=20)
    assert "result" in resp, f"inline completion without a model must answer, not fail: {resp}"
    assert resp["result"]["items"] == []
    assert "result" in s.call("kog/stats", {}, timeout=10)
    assert s.alive()


@pytest.mark.parametrize("case", ["missing_weights", "truncated_weights", "unsupported_arch", "no_tokenizer",
                                  "no_such_dir"])
def test_broken_model_reports_and_keeps_serving(broken_servers, case):
    s, words = broken_servers[case]
    st = s.wait_status(("ready", "error"), timeout=120)
    assert st["state"] == "error", f"{case}: a broken model loaded?! {st}"
    text = f"{st.get('message')} {st.get('reason')}"
    assert any(w.lower() in text.lower() for w in words), f"{case}: unclear kog/status message: {text!r}"
    popup = s.wait_message(lambda m: m.get("method") == "window/showMessage"
                           and m["params"]["type"] == 1, timeout=10)["params"]["message"]
    assert any(w.lower() in popup.lower() for w in words), f"{case}: unclear showMessage: {popup!r}"
    check_serves_documents_without_model(s)


def _launch(fault: str, model: str, tmp_path: Path, name: str, env=None, **kw) -> RawServer:
    argv = [sys.executable, LAUNCHER, fault, "--", "--model", model, "--device", "cpu"]
    return start_server(model, tmp_path, name=name, argv=argv, env=env, **kw)


def test_backend_failing_at_build(tiny_model, tmp_path):
    s = _launch("build_fails", tiny_model, tmp_path, "build_fails", wait_ready=False)
    try:
        st = s.wait_status(("ready", "error"), timeout=120)
        assert st["state"] == "error", st
        assert "no kernel image" in f"{st.get('message')} {st.get('reason')}", st
        popup = s.wait_message(lambda m: m.get("method") == "window/showMessage" and m["params"]["type"] == 1,
                               timeout=10)["params"]["message"]
        assert "no kernel image" in popup
        check_serves_documents_without_model(s)
    finally:
        s.close()


def test_explicit_backend_that_cannot_run_falls_back_with_a_message(tiny_model, tmp_path):
    # graph needs CUDA: on this CPU machine the server falls back to reference and says so.
    s = start_server(tiny_model, tmp_path, argv=kog_argv(tiny_model, "--backend", "graph"))
    try:
        st = s.wait_status(("ready",), timeout=10)
        assert st["backend"] == "reference"
        assert "graph" in (st.get("reason") or ""), st
        popups = [p["message"] for p in s.notifications("window/showMessage") if p["type"] in (1, 2, 3)]
        assert any("graph" in p for p in popups), \
            f"the user asked for --backend graph and got reference: tell them (showMessage); got {popups}"
    finally:
        s.close()


def test_backend_failing_mid_generation(tiny_model, tmp_path):
    s = _launch("decode_fails_once", tiny_model, tmp_path, "decode_fails")
    try:
        s.open(DOC_URI, DOC_TEXT)
        params = {"textDocument": {"uri": DOC_URI}, "position": {"line": 1, "character": 10},
                  "context": {"triggerKind": 1}}
        first = s.call("textDocument/inlineCompletion", params, timeout=30)
        # The failed request is answered (an error or no items), never left hanging.
        assert "result" in first or "error" in first
        # The user is told (kog/status error or a showMessage naming the fault) ...
        told = [p for p in s.notifications("window/showMessage") if "illegal memory access" in p["message"]]
        told += [p for p in s.notifications("kog/status")
                 if "illegal memory access" in f"{p.get('message')} {p.get('reason')}"]
        assert told, f"a backend fault mid-generation must reach the user; first answer: {str(first)[:300]}"
        # ... and the server keeps serving: documents exact, the next generation works.
        s.change(DOC_URI, 2, [{"range": {"start": {"line": 2, "character": 0}, "end": {"line": 2, "character": 0}},
                               "text": "x"}])
        assert s.document(DOC_URI)["text"] == DOC_TEXT + "x"
        second = s.call("textDocument/inlineCompletion", dict(params, position={"line": 2, "character": 1}),
                        timeout=30)
        assert "result" in second, second
        stats = s.result("kog/stats", {})
        assert stats["engine"] is not None and stats["engine"]["generations"] >= 2, stats
        assert s.alive()
    finally:
        s.close()
