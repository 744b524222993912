"""Bad input over the wire: every malformed frame, bad request or odd document gets a proper LSP error or is
ignored with a log line; the server stays up and every other document's text stays exact.

One server serves the whole module; "witness" documents with multi-byte and astral text are checked (through
the server's kog/document request) after every bad input.
"""

from __future__ import annotations

import json
import time

import pytest

from .conftest import start_server
from .wire import frame

INVALID_PARAMS, METHOD_NOT_FOUND, INVALID_REQUEST, PARSE_ERROR = -32602, -32601, -32600, -32700
MSG_ERROR = 1

WITNESS = {
    "file:///ws/witness_a.py": "def café(x):\n    return x + '😀'  # ünïcödé\r\n\tpass\n",
    "file:///ws/witness_b.py": "class 𝒞:\n    \"\"\"日本語 テキスト\"\"\"\n\n    value = 1\n",
}


@pytest.fixture(scope="module")
def srv(tiny_model, tmp_path_factory):
    s = start_server(tiny_model, tmp_path_factory.mktemp("bad-input"))
    for uri, text in WITNESS.items():
        s.open(uri, text)
    yield s
    s.close()


def _new_messages(s, n_before: int) -> list[dict]:
    return [m for _, m in s.messages[n_before:]]


def _error_popups(msgs) -> list[str]:
    return [m["params"]["message"] for m in msgs
            if m.get("method") == "window/showMessage" and (m.get("params") or {}).get("type") == MSG_ERROR]


def check_still_serving(s) -> None:
    """The server is up, answers a request, and every witness document is exactly what the client sent."""
    assert s.alive(), f"server died\n{s.stderr_text()[-3000:]}"
    for uri, text in WITNESS.items():
        doc = s.document(uri, timeout=20)
        assert doc["text"] == text, f"{uri} changed: {doc['text']!r}"


def _inline_params(uri, line, ch):
    return {"textDocument": {"uri": uri}, "position": {"line": line, "character": ch}, "context": {"triggerKind": 2}}


# ---------------------------------------------------------------- framing and JSON


MALFORMED = {
    "non_numeric_content_length": b"Content-Length: abc\r\n\r\n{}\r\n",
    "zero_content_length": b"Content-Length: 0\r\n\r\n",
    "invalid_json": frame(b"{not json"),
    "json_array": frame(b"[1, 2]"),
    "json_string": frame(b'"hello"'),
    "json_number": frame(b"42"),
    "json_null": frame(b"null"),
    "invalid_utf8": frame(b'{"jsonrpc": "2.0", "method": "x/y", "params": "\xff\xfe"}'),
    # Content-Length shorter than the body: the cut body is invalid JSON; the rest (ending in a line break)
    # is read as junk header lines until the next real header.
    "short_content_length": frame(b'{"jsonrpc": "2.0", "id": 9, "method": "kog/stats"}', length=12) + b"\r\n",
    "unknown_headers": b"X-Whatever: 1\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8\r\n"
                       + frame({"jsonrpc": "2.0", "method": "$/unknownNotification", "params": {}}),
    "notification_without_jsonrpc": frame({"method": "textDocument/didChange", "params": {}}),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_frame_is_ignored_with_a_log_line(srv, name):
    n = len(srv.messages)
    srv.send_raw(MALFORMED[name])
    check_still_serving(srv)
    msgs = _new_messages(srv, n)
    # A parse error may be answered (-32700 / -32600 with id null); it must not pop an error at the user.
    assert _error_popups(msgs) == [], f"{name}: error popup for protocol garbage: {_error_popups(msgs)}"
    for m in msgs:
        if "id" in m and "method" not in m and m["id"] is None:
            assert m["error"]["code"] in (PARSE_ERROR, INVALID_REQUEST)


def test_request_without_jsonrpc_version_is_answered(srv):
    # A request that carries an id must always get an answer, or the client waits forever.
    srv.send({"id": "no-version-1", "method": "kog/stats"})
    resp = srv.wait_response("no-version-1", timeout=5)
    assert "error" in resp and resp["error"]["code"] == INVALID_REQUEST
    check_still_serving(srv)


# ---------------------------------------------------------------- methods and params


def test_unknown_methods(srv):
    n = len(srv.messages)
    resp = srv.call("kog/noSuchRequest", {"x": 1}, timeout=10)
    assert resp["error"]["code"] == METHOD_NOT_FOUND
    srv.notify("kog/noSuchNotification", {"x": 1})
    srv.notify("$/noSuchThing", {})
    check_still_serving(srv)
    assert _error_popups(_new_messages(srv, n)) == []


@pytest.mark.parametrize("params", [
    None,
    [1, 2],
    {"textDocument": {"uri": "file:///ws/witness_a.py"}, "position": {"line": "zero", "character": 0},
     "context": {"triggerKind": 2}},
    {"textDocument": {"uri": 5}, "position": {"line": 0, "character": 0}, "context": {"triggerKind": 2}},
    {"textDocument": {"uri": "file:///ws/witness_a.py"}, "position": {"line": 0}, "context": {"triggerKind": 2}},
], ids=["no_params", "array_params", "string_line", "int_uri", "missing_character"])
def test_request_with_wrong_param_types_gets_invalid_params(srv, params):
    resp = srv.call("textDocument/inlineCompletion", params, timeout=10)
    assert resp.get("error", {}).get("code") == INVALID_PARAMS, resp
    check_still_serving(srv)


def test_notification_with_wrong_param_types_is_ignored(srv):
    n = len(srv.messages)
    uri = "file:///ws/witness_a.py"
    srv.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": "seven"}, "contentChanges": 5})
    srv.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 99},
                                          "contentChanges": [{"range": {"start": {"line": "a"}}, "text": "x"}]})
    srv.notify("textDocument/didOpen", {"textDocument": {"uri": 12}})
    srv.notify("workspace/didChangeConfiguration", {"settings": {"kog": {"maxTokens": "many"}}})
    check_still_serving(srv)
    assert _error_popups(_new_messages(srv, n)) == [], _error_popups(_new_messages(srv, n))


# ---------------------------------------------------------------- documents never opened


def test_requests_for_documents_never_opened(srv):
    n = len(srv.messages)
    ghost = "file:///ws/never_opened.py"
    pos = {"line": 0, "character": 0}
    calls = {
        "textDocument/inlineCompletion": _inline_params(ghost, 0, 0),
        "textDocument/completion": {"textDocument": {"uri": ghost}, "position": pos},
        "textDocument/codeAction": {"textDocument": {"uri": ghost}, "range": {"start": pos, "end": pos},
                                    "context": {"diagnostics": []}},
        "textDocument/diagnostic": {"textDocument": {"uri": ghost}},
        "kog/document": {"uri": ghost},
    }
    for method, params in calls.items():
        resp = srv.call(method, params, timeout=10)
        if "error" in resp:
            assert resp["error"]["code"] == INVALID_PARAMS, (method, resp)
        else:
            res = resp["result"]
            items = res.get("items", []) if isinstance(res, dict) else (res or [])
            assert items == [], (method, resp)
    srv.change(ghost, 2, [{"text": "x = 1\n"}])
    srv.notify("textDocument/didClose", {"textDocument": {"uri": ghost}})
    check_still_serving(srv)
    assert srv.call("kog/document", {"uri": ghost})["error"]["code"] == INVALID_PARAMS  # not created by didChange
    assert _error_popups(_new_messages(srv, n)) == []


# ---------------------------------------------------------------- positions and ranges


@pytest.mark.parametrize("line,ch", [(-1, 0), (0, -3), (10**6, 0), (2**31, 2**31)],
                         ids=["negative_line", "negative_character", "line_past_end", "huge"])
def test_position_out_of_range_gets_invalid_params(srv, line, ch):
    resp = srv.call("textDocument/inlineCompletion", _inline_params("file:///ws/witness_a.py", line, ch), timeout=10)
    assert resp.get("error", {}).get("code") == INVALID_PARAMS, resp
    check_still_serving(srv)


def test_character_past_line_end_is_clamped(srv):
    # LSP: a character past the end of its line means the line end.
    resp = srv.call("textDocument/inlineCompletion", _inline_params("file:///ws/witness_a.py", 0, 10**6), timeout=20)
    assert "result" in resp, resp
    for item in resp["result"]["items"]:
        assert item["range"]["start"] == {"line": 0, "character": len("def café(x):")}
    check_still_serving(srv)


def test_selected_completion_range_out_of_range(srv):
    params = _inline_params("file:///ws/witness_a.py", 0, 3)
    params["context"]["selectedCompletionInfo"] = {
        "range": {"start": {"line": 40, "character": 0}, "end": {"line": 41, "character": 2}}, "text": "abc"}
    resp = srv.call("textDocument/inlineCompletion", params, timeout=10)
    assert resp.get("error", {}).get("code") == INVALID_PARAMS, resp
    check_still_serving(srv)


def test_invalid_incremental_changes(srv):
    uri = "file:///ws/edits.py"
    srv.open(uri, "abc\ndef\n")
    n = len(srv.messages)
    steps = [
        # (range, text, expected document afterwards)
        ({"start": {"line": 99, "character": 0}, "end": {"line": 99, "character": 5}}, "X", "abc\ndef\nX"),
        ({"start": {"line": 0, "character": 3}, "end": {"line": 0, "character": 1}}, "Y", "aY\ndef\nX"),
        ({"start": {"line": 0, "character": 50}, "end": {"line": 1, "character": 70}}, "W", "aYW\nX"),
        ({"start": {"line": -1, "character": 0}, "end": {"line": 0, "character": 1}}, "Z", "aYW\nX"),  # ignored
        ({"start": {"line": 0, "character": 0}}, "Q", "aYW\nX"),  # no end: ignored
    ]
    for k, (rng, text, expected) in enumerate(steps):
        srv.change(uri, 2 + k, [{"range": rng, "text": text}])
        assert srv.document(uri)["text"] == expected, (k, rng)
    srv.change(uri, 20, [{"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}}}])
    srv.change(uri, 21, [])
    assert srv.document(uri)["text"] == "aYW\nX"
    check_still_serving(srv)
    srv.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert _error_popups(_new_messages(srv, n)) == [], _error_popups(_new_messages(srv, n))


# ---------------------------------------------------------------- odd documents


def test_empty_document(srv):
    uri = "file:///ws/empty.py"
    srv.open(uri, "")
    try:
        resp = srv.call("textDocument/inlineCompletion", _inline_params(uri, 0, 0), timeout=20)
        assert "result" in resp, resp
        diag = srv.call("textDocument/diagnostic", {"textDocument": {"uri": uri}}, timeout=20)
        assert diag.get("result", {}).get("items") == [], diag
        srv.change(uri, 2, [{"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}},
                             "text": "x = 1\n"}])
        assert srv.document(uri)["text"] == "x = 1\n"
        srv.change(uri, 3, [{"range": {"start": {"line": 0, "character": 0}, "end": {"line": 1, "character": 0}},
                             "text": ""}])
        assert srv.document(uri)["text"] == ""
        resp = srv.call("textDocument/inlineCompletion", _inline_params(uri, 0, 0), timeout=20)
        assert "result" in resp, resp
    finally:
        srv.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    check_still_serving(srv)


# NUL, lone surrogates (JSON escapes a JavaScript client can produce), a lone CR and U+2028 (not a line break).
ODD_TEXT_JSON = r'"a\u0000b = \"\ud800\" + \"\udfff\"\n\u2028x\ry = 1\n"'
ODD_TEXT = json.loads(ODD_TEXT_JSON)


def _open_odd(srv, uri):
    body = ('{"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": "%s", '
            '"languageId": "python", "version": 1, "text": %s}}}' % (uri, ODD_TEXT_JSON))
    srv.send_raw(frame(body.encode("ascii")))


def test_nul_and_lone_surrogates_text_stays_exact(srv):
    uri = "file:///ws/odd_exact.py"
    _open_odd(srv, uri)
    try:
        assert srv.document(uri)["text"] == ODD_TEXT
        srv.change(uri, 2, [{"range": {"start": {"line": 0, "character": 1}, "end": {"line": 0, "character": 2}},
                             "text": "\x00\x00"}])
        assert srv.document(uri)["text"] == ODD_TEXT[:1] + "\x00\x00" + ODD_TEXT[2:]
    finally:
        srv.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    check_still_serving(srv)


def test_completion_in_document_with_lone_surrogates(srv):
    uri = "file:///ws/odd_complete.py"
    _open_odd(srv, uri)
    try:
        for line, ch in [(0, 0), (0, 6), (1, 0), (3, 5)]:
            resp = srv.call("textDocument/inlineCompletion", _inline_params(uri, line, ch), timeout=20)
            assert "result" in resp, f"({line}, {ch}): {str(resp)[:300]}"
    finally:
        srv.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    check_still_serving(srv)


def test_lone_surrogates_in_one_document_do_not_break_others(srv):
    uri = "file:///ws/odd_neighbour.py"
    _open_odd(srv, uri)
    try:
        # The odd document is open, so it is a context chunk of every other document's prompt.
        resp = srv.call("textDocument/inlineCompletion", _inline_params("file:///ws/witness_b.py", 3, 4), timeout=20)
        assert "result" in resp, str(resp)[:300]
    finally:
        srv.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    check_still_serving(srv)


def test_review_of_document_with_lone_surrogates_answers(srv):
    uri = "file:///ws/odd_review.py"
    _open_odd(srv, uri)
    try:
        resp = srv.call("textDocument/diagnostic", {"textDocument": {"uri": uri}}, timeout=10)
        assert "result" in resp, str(resp)[:300]
    finally:
        srv.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    check_still_serving(srv)


def _big_text(mb: int = 10) -> str:
    line = "value_%07d = compute('é', [1, 2, 3])  # 😀\n"
    n = mb * 1024 * 1024 // len((line % 0).encode("utf-8"))
    return "".join(line % i for i in range(n))


@pytest.fixture(scope="module")
def big_text():
    text = _big_text(10)
    assert len(text.encode("utf-8")) >= 10 * 1024 * 1024 - 100
    return text


def test_ten_megabyte_document_edits_stay_exact_and_fast(srv, big_text):
    """Document sync alone (review off): keystrokes in a 10 MB file must not cost a fraction of a second each."""
    uri = "file:///ws/big_sync.py"
    srv.notify("workspace/didChangeConfiguration", {"settings": {"kog": {"reviewEnable": False}}})
    srv.open(uri, big_text)
    try:
        assert srv.document(uri, timeout=60)["text"] == big_text
        mid = big_text.count("\n") // 2
        t0 = time.perf_counter()
        for k in range(10):  # a short burst of keystrokes in the middle of the file
            srv.change(uri, 2 + k, [{"range": {"start": {"line": mid, "character": k},
                                               "end": {"line": mid, "character": k}}, "text": "é"}])
        srv.result("kog/stats", {}, timeout=60)  # answered after the 10 changes were applied
        burst_s = time.perf_counter() - t0
        a = 0
        for _ in range(mid):
            a = big_text.index("\n", a) + 1
        expected = big_text[:a] + "é" * 10 + big_text[a:]
        assert srv.document(uri, timeout=60)["text"] == expected
        assert burst_s < 2.0, f"10 didChange on a 10 MB document took {burst_s:.1f} s"
        resp = srv.call("textDocument/inlineCompletion", _inline_params(uri, mid, 15), timeout=30)
        assert "result" in resp, str(resp)[:300]
    finally:
        srv.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        srv.notify("workspace/didChangeConfiguration", {"settings": {"kog": {"reviewEnable": True}}})
    check_still_serving(srv)


def test_ten_megabyte_document_does_not_freeze_the_server(srv, big_text):
    """With review on (the default), an idle 10 MB document must not stall everything else."""
    uri = "file:///ws/big_review.py"
    srv.open(uri, big_text)
    try:
        time.sleep(1.0)  # past reviewDebounceMs (400): the big document's review is due now
        t0 = time.perf_counter()
        resp = srv.call("textDocument/inlineCompletion", _inline_params("file:///ws/witness_a.py", 1, 4), timeout=30)
        took = time.perf_counter() - t0
        assert "result" in resp, str(resp)[:300]
        assert took < 3.0, f"a completion in another document took {took:.1f} s while the 10 MB one was open"
        t0 = time.perf_counter()
        srv.change(uri, 2, [{"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}},
                             "text": "#"}])
        srv.result("kog/stats", {}, timeout=30)
        took = time.perf_counter() - t0
        assert took < 3.0, f"one keystroke in the 10 MB document took {took:.1f} s to be processed"
    finally:
        srv.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    check_still_serving(srv)
