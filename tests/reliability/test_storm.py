"""Keystroke storm: 200 keystrokes at 50/s, each with an automatic inline request.

Every request is answered or cancelled, the newest one is answered within its budget, answers do not lag
further behind as the storm goes on (no queue growth), and the server counts its cancellations in kog/stats.
Two client styles: VS Code ($/cancelRequest for the request each keystroke makes stale) and Neovim 0.12 (never
cancels: the server itself must make the newest request per document win).
"""

from __future__ import annotations

import statistics
import time

import pytest

from .conftest import start_server

REQUEST_CANCELLED = -32800
KEYSTROKES = 200
INTERVAL_S = 0.02  # 50 keystrokes per second
NEWEST_BUDGET_S = 2.0  # tiny model on a shared 2-core CI runner: generous, still far below a queue backlog
MAX_LAG_S = 1.5  # a stale request must be answered promptly after the keystroke that made it stale

HEADER = "".join(f"def helper_{i}(value):\n    return value * {i} + len('é😀')\n\n" for i in range(40))
TYPED = ("class Inventory:\n    def __init__(self):\n        self.items = {}\n\n"
         "    def add(self, name, qty):\n        self.items[name] = self.items.get(name, 0) + qty\n\n"
         "    def total(self):\n        return sum(self.items.values())\n") * 2


def keystrokes(text: str, n: int) -> list[str]:
    """Split text into n keystrokes; a newline plus the next line's indentation is one (auto-indent)."""
    keys, i = [], 0
    while i < len(text) and len(keys) < n:
        j = i + 1
        if text[i] == "\n":
            while j < len(text) and text[j] == " ":
                j += 1
        keys.append(text[i:j])
        i = j
    assert len(keys) == n
    return keys


@pytest.fixture(scope="module")
def srv(tiny_model, tmp_path_factory):
    s = start_server(tiny_model, tmp_path_factory.mktemp("storm"), name="storm")
    yield s
    s.close()


def run_storm(s, uri: str, cancel_stale: bool):
    s.open(uri, HEADER)
    line = HEADER.count("\n")
    col = 0
    text = HEADER
    sent: list[tuple[object, float]] = []
    t_next = time.perf_counter()
    for k, key in enumerate(keystrokes(TYPED, KEYSTROKES)):
        t_next += INTERVAL_S
        s.change(uri, 2 + k, [{"range": {"start": {"line": line, "character": col},
                                         "end": {"line": line, "character": col}}, "text": key}])
        text += key
        if "\n" in key:
            line += 1
            col = len(key) - 1
        else:
            col += len(key)
        if cancel_stale and sent:
            s.notify("$/cancelRequest", {"id": sent[-1][0]})
        sent.append((s.inline(uri, line, col), time.perf_counter()))
        time.sleep(max(0.0, t_next - time.perf_counter()))
    for rid, _ in sent:
        s.wait_response(rid, timeout=15)
    assert s.document(uri)["text"] == text
    return sent


def check_storm(s, sent, cancel_stale: bool, n_messages_before: int):
    errors = [p for _, m in s.messages[n_messages_before:] if m.get("method") == "kog/status"
              for p in [m["params"]] if p.get("state") == "error"]
    assert not errors, f"the server went into error state during the storm: {errors}"
    codes = {}
    for rid, _ in sent:
        r = s.responses[rid]
        code = "ok" if "result" in r else r["error"]["code"]
        codes[code] = codes.get(code, 0) + 1
    assert set(codes) <= {"ok", REQUEST_CANCELLED}, f"unexpected answers: {codes}"
    if not cancel_stale:
        assert REQUEST_CANCELLED not in codes, codes

    newest, t_newest = sent[-1]
    resp = s.responses[newest]
    assert "result" in resp, f"the newest request was not answered: {resp}"
    took = s.response_times[newest] - t_newest
    assert took < NEWEST_BUDGET_S, f"newest request answered after {took:.2f} s"
    assert resp["result"]["items"], "the newest request (the one the editor shows) got no suggestion"

    # Queue growth shows as stale requests answered later and later after the keystroke that made them stale.
    lags = [s.response_times[rid] - sent[i + 1][1] for i, (rid, _) in enumerate(sent[:-1])]
    assert max(lags) < MAX_LAG_S, f"a stale request lagged {max(lags):.2f} s"
    head, tail = statistics.median(lags[:50]), statistics.median(lags[-50:])
    assert tail <= head + 0.25, f"answers fall behind: median lag {head:.3f} s -> {tail:.3f} s (a backlog)"

    stats = s.result("kog/stats", {})
    stale_unserved = sum(1 for rid, _ in sent[:-1]
                         if "error" in s.responses[rid] or not s.responses[rid]["result"]["items"])
    return codes, stats, lags, stale_unserved


def test_storm_neovim_never_cancels(srv):
    before = srv.result("kog/stats", {})
    n = len(srv.messages)
    sent = run_storm(srv, "file:///ws/storm_nvim.py", cancel_stale=False)
    codes, stats, lags, stale = check_storm(srv, sent, cancel_stale=False, n_messages_before=n)
    # Superseded requests answer empty at once and count as cancellations.
    new_cancel = stats["cancellations"] - before["cancellations"]
    new_empty = stats["emptyResults"] - before["emptyResults"]
    assert new_cancel >= stale - (new_empty - new_cancel), (new_cancel, new_empty, stale, codes)
    assert new_cancel >= KEYSTROKES // 2, f"only {new_cancel} of {KEYSTROKES} requests were superseded"


def test_storm_vscode_cancels_stale_requests(srv):
    # Review rescoring on every keystroke (reviewDebounceMs 0, a valid setting): each keystroke also replaces
    # a review job that is queued or running on the engine worker.
    srv.notify("workspace/didChangeConfiguration", {"settings": {"kog": {"reviewDebounceMs": 0}}})
    before = srv.result("kog/stats", {})
    n = len(srv.messages)
    try:
        sent = run_storm(srv, "file:///ws/storm_vscode.py", cancel_stale=True)
    finally:
        srv.notify("workspace/didChangeConfiguration", {"settings": {"kog": {"reviewDebounceMs": 400}}})
    codes, stats, lags, stale = check_storm(srv, sent, cancel_stale=True, n_messages_before=n)
    cancelled = codes.get(REQUEST_CANCELLED, 0)
    assert stats["cancellations"] - before["cancellations"] >= cancelled, (codes, stats)
    engine = stats["engine"]
    assert engine["generations"] - (before["engine"] or {}).get("generations", 0) <= KEYSTROKES
