"""Property test: random incremental edits with multi-byte and astral characters, in every position encoding;
the server's text (kog/document) always equals the client's.

The client side here converts offsets to LSP positions with its own code (not kog_lsp.positions), following
the spec: lines end at "\\r\\n", "\\r" or "\\n" only; `character` counts UTF-8 bytes, UTF-16 units or code
points depending on the negotiated encoding.
"""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .wire import RawServer, kog_argv

ENCODINGS = ("utf-8", "utf-16", "utf-32")
# ASCII, 2-byte, 3-byte, astral (4 UTF-8 bytes, 2 UTF-16 units), all three line terminators, tab, a BOM-like
# char, U+2028 (not an LSP line break) and a combining mark.
ALPHABET = ["a", "b", " ", "\t", "é", "€", "日", "😀", "𝄞", "\n", "\r\n", "\r", "\u2028", "\ufeff", "e\u0301"]
_BREAK = re.compile(r"\r\n|\r|\n")


def units(s: str, enc: str) -> int:
    if enc == "utf-8":
        return len(s.encode("utf-8"))
    if enc == "utf-16":
        return len(s.encode("utf-16-le")) // 2
    return len(s)


def to_position(text: str, offset: int, enc: str) -> dict:
    line, start = 0, 0
    for m in _BREAK.finditer(text, 0, offset):
        if m.end() > offset:
            break
        line, start = line + 1, m.end()
    return {"line": line, "character": units(text[start:offset], enc)}


def snap(text: str, offset: int) -> int:
    """No LSP position lies between the \\r and \\n of a CRLF: move such an offset before the \\r."""
    if 0 < offset < len(text) and text[offset - 1] == "\r" and text[offset] == "\n":
        return offset - 1
    return offset


pieces = st.lists(st.sampled_from(ALPHABET), max_size=12).map("".join)
edit = st.tuples(st.floats(0, 1), st.floats(0, 1), pieces, st.integers(0, 9))
notification = st.lists(edit, min_size=1, max_size=3)  # several contentChanges in one didChange


@pytest.fixture(scope="module")
def servers(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sync")
    # Spawn the three servers at once (start-up is mostly imports), then initialize each.
    out = {enc: RawServer(kog_argv(tiny_model), stderr_path=tmp / f"sync-{enc}.log") for enc in ENCODINGS}
    try:
        for enc, s in out.items():
            # Completions and review off: this is about document synchronisation only.
            res = s.initialize(encodings=(enc,), init_options={"enable": False, "reviewEnable": False})
            assert res["capabilities"].get("positionEncoding", "utf-16") == enc
        yield out
    finally:
        for s in out.values():
            s.close()


_uris = itertools.count()


@pytest.mark.parametrize("enc", ENCODINGS)
def test_incremental_edits_keep_text_exact(servers, enc):
    s = servers[enc]

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow],
              database=None)
    @given(initial=pieces, batches=st.lists(notification, min_size=1, max_size=6))
    def run(initial, batches):
        uri = f"file:///ws/prop_{enc}_{next(_uris)}.py"
        text = initial
        s.open(uri, text)
        version = 1
        try:
            for batch in batches:
                changes = []
                for fa, fb, new, kind in batch:
                    if kind == 0:  # whole-document replacement
                        changes.append({"text": new})
                        text = new
                        continue
                    a = snap(text, round(fa * len(text)))
                    b = snap(text, round(fb * len(text)))
                    a, b = min(a, b), max(a, b)
                    changes.append({"range": {"start": to_position(text, a, enc), "end": to_position(text, b, enc)},
                                    "text": new})
                    text = text[:a] + new + text[b:]
                version += 1
                s.change(uri, version, changes)
            doc = s.document(uri)
            assert doc["text"] == text
            assert doc["version"] == version
        finally:
            s.notify("textDocument/didClose", {"textDocument": {"uri": uri}})

    run()
