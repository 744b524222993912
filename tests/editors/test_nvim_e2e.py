"""End to end: Debian's Neovim (0.7.2 here; any >= 0.7) + the kog plugin + the real kog-lsp server.

Loads the plugin, opens a Python file, types, waits for the ghost-text extmark, accepts it with <Tab> and checks
that the buffer now holds exactly what the ghost text showed; then waits for a review diagnostic and applies a
code action through the built-in client (vim.lsp.buf.code_action). Model: engine/models/default when it is
there, else a tiny random checkpoint (junk suggestions, but real ones from the real engine).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys

import pytest

from .nvim_driver import ROOT, Nvim, nvim_version

NVIM = nvim_version()
pytestmark = [
    pytest.mark.skipif(shutil.which("nvim") is None, reason="nvim is not installed (apt-get install -y neovim)"),
    pytest.mark.skipif(NVIM is not None and NVIM < (0, 7, 0), reason=f"the plugin needs Neovim >= 0.7, found {NVIM}"),
    pytest.mark.skipif(importlib.util.find_spec("kog_lsp") is None or importlib.util.find_spec("engine") is None,
                       reason="the server packages (kog_lsp, engine) cannot be imported"),
]

SOURCE = 'def add(a, b):\n    return a + b\n\n\ndef main():\n    total = add(1, 2)\n'
HAS_REVIEW = importlib.util.find_spec("kog_lsp") is not None and \
    importlib.util.find_spec("kog_lsp.features.review") is not None


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    default = ROOT / "engine" / "models" / "default"
    if (default / "config.json").exists():
        return default
    from engine.testing import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def nvim(model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("nvim-e2e")
    src = work / "demo.py"
    src.write_text(SOURCE)
    cmd = [sys.executable, "-m", "kog_lsp", "--stdio", "--model", str(model_dir), "--device", "cpu",
           "--log-file", str(work / "server.log")]
    settings = {"debounceMs": 0, "maxTokens": 16}
    if HAS_REVIEW:
        # Flag every token the model finds at all surprising, so a tiny random model also yields findings:
        # this tests the editor path, not review quality.
        settings.update({"reviewMinTopProb": 0.0, "reviewMinSurprisal": 0.0, "reviewDebounceMs": 0})
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    n = Nvim(src, cmd, settings, env)
    n.server_log = work / "server.log"

    def server_error():
        st = n.probe("status()")
        if st["state"] == "error":
            return f"kog/status error: {st.get('message')!r}; server log tail:\n{_server_log(n)}"
        return None
    try:
        n.wait_for(lambda: n.probe("status()")["state"] == "ready", 240, "kog/status ready", interval=0.25)
        n.abort = server_error  # from here on a server error fails the test at once
        yield n
    finally:
        n.close()
        keep = os.environ.get("KOG_E2E_ARTIFACTS")  # a folder to keep the server log in (debugging)
        if keep and (work / "server.log").exists():
            os.makedirs(keep, exist_ok=True)
            shutil.copy(work / "server.log", os.path.join(keep, "server.log"))


def _server_log(nvim) -> str:
    log = nvim.server_log
    return log.read_text(errors="replace")[-3000:] if log.exists() else "(no server log)"


def _shown(g):
    """The ghost text as drawn: the overlay line (padding removed) followed by the virtual lines."""
    assert len(g["extmarks"]) == 1, g
    m = g["extmarks"][0]
    return m, [m["overlay"].rstrip(" ")] + m["virt_lines"]


def _wait_ghost(nvim, chunks):
    """Type chunks one by one until a ghost-text extmark is drawn; returns the probe or None."""
    for chunk in chunks:
        nvim.send(chunk)
        try:
            return nvim.wait_for(lambda: (lambda s: s if s["extmarks"] and s["current"] else None)(nvim.probe("ghost()")),
                                 30, "a ghost-text extmark", interval=0.1)
        except TimeoutError:  # (a server error raises RuntimeError and ends the test)
            continue
    return None


def test_ghost_text_is_shown_and_tab_accepts_exactly_it(nvim):
    st = nvim.probe("status()")
    assert st["attached"] and st["caps"]["inlineCompletion"], st
    # Open a new line at the end and type; the model may answer a position with an empty suggestion (the
    # server drops what does not fit), so keep typing a little until one is drawn.
    g = _wait_ghost(nvim, ["<C-\\><C-n>Go", "result = ", "add(", "total"])
    assert g is not None, f"no ghost text appeared for any prefix; server log tail:\n{_server_log(nvim)}"
    assert nvim.probe("status()")["mode"].startswith("i")
    cur = g["current"]
    row, col = cur["row"], cur["col"]
    mark, shown = _shown(g)
    assert (mark["row"], mark["col"]) == (row, col)
    before = g["lines"]
    line_b = before[row].encode()
    # What accepting must produce: the text up to the cursor, the suggestion, then what survives the range.
    expected_tail = (line_b[:col] + cur["text"].encode() + line_b[cur["replace_end"]:]).decode()
    expected = before[:row] + expected_tail.split("\n") + before[row + 1:]

    nvim.send("<Tab>")
    after = nvim.wait_for(lambda: (lambda s: s if s["tick"] != g["tick"] else None)(nvim.probe("ghost()")),
                          15, "the buffer to change after <Tab>")
    assert after["lines"] == expected
    assert after["extmarks"] == [] and after["current"] is None
    # The accepted text is what the user saw: the drawn lines now are the buffer lines (tabs drawn as spaces).
    n = len(shown)
    drawn_after = [line_b[:col].decode() + shown[0]] + shown[1:]
    ts = 8
    assert [s.expandtabs(ts).rstrip(" ") for s in after["lines"][row:row + n]] == \
        [s.expandtabs(ts).rstrip(" ") for s in drawn_after]
    # The cursor ends right after the inserted text.
    last = expected_tail.split("\n")
    end_row = row + len(last) - 1
    tail_len = len(line_b[cur["replace_end"]:])
    assert after["cursor"] == [end_row + 1, len(last[-1].encode()) - tail_len]


def test_tab_is_not_stolen_from_an_open_completion_menu(nvim):
    # New line, type until a suggestion is drawn, then open the keyword completion menu over it.
    g = _wait_ghost(nvim, ["<C-\\><C-n>Go", "x = to", "t"])
    assert g is not None, f"no ghost text appeared; server log tail:\n{_server_log(nvim)}"
    row = g["current"]["row"]
    before = g["lines"][row]
    nvim.send("<C-n>")
    nvim.wait_for(lambda: nvim.probe("status()")["pum"], 15, "the completion menu")
    assert nvim.probe("ghost()")["current"] is not None, "the suggestion is still shown under the menu"
    nvim.send("<Tab>")
    after = nvim.wait_for(lambda: (lambda s: s if s["lines"][row] != before else None)(nvim.probe("ghost()")),
                          15, "<Tab> to act")
    line = after["lines"][row]
    # <Tab> did what it does with the menu open (here: insert indentation), not accept the suggestion.
    assert line.startswith(before) and line[len(before):].strip() == "", (before, line, g["current"])
    assert len(after["lines"]) == len(g["lines"])


def test_review_diagnostic_appears(nvim):
    if not HAS_REVIEW:
        pytest.skip("the server has no review feature (kog_lsp.features.review) yet")
    diags = nvim.wait_for(lambda: [d for d in nvim.probe("diagnostics()") if d["source"] == "kog"], 90,
                          "a kog review diagnostic (vim.diagnostic)", interval=0.25)
    assert diags[0]["message"]
    assert 0 <= diags[0]["lnum"] < len(nvim.probe("ghost()")["lines"])


def test_code_action_applies_through_builtin_client(nvim):
    st = nvim.probe("status()")
    if not st["caps"].get("codeAction"):
        pytest.skip("the server does not advertise codeActionProvider")
    g0 = nvim.probe("ghost()")
    nvim.send("<Esc>")
    diags = [d for d in nvim.probe("diagnostics()") if d["source"] == "kog"]
    line = diags[0]["lnum"] if diags else 1
    nvim.probe(f"code_action({line})")
    titles = nvim.wait_for(lambda: nvim.probe("picked_titles()"), 30, "the code action list (vim.ui.select)")
    assert titles and all(isinstance(t, str) and t for t in titles)
    after = nvim.wait_for(lambda: (lambda s: s if s["lines"] != g0["lines"] else None)(nvim.probe("ghost()")),
                          120, f"the buffer to change after applying {titles[0]!r}", interval=0.25)
    assert after["lines"] != g0["lines"]


def test_restart_brings_up_a_new_server(nvim):
    old = nvim.probe("status()")
    nvim.send("<C-\\><C-n>:KogRestart<CR>")
    st = nvim.wait_for(lambda: (lambda s: s if s["client_id"] not in (None, old["client_id"]) and s["attached"]
                                and s["state"] == "ready" else None)(nvim.probe("status()")),
                       240, "a new, attached, ready kog client after :KogRestart", interval=0.25)
    assert st["statusline"].startswith("kog ready")
