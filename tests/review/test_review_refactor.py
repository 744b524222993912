import threading

import pytest
from lsprotocol import types

from kog_lsp import positions
from kog_lsp.refactor import (COMPLETE, REWRITE, RefactorCancelled, RefactorFailed, RefactorRequest,
                              block_indent_at, current_block, edit_for, list_actions, run_refactor, trim_at_suffix,
                              trim_to_block)

SRC = (
    "import os\n"
    "\n"
    "def f(a, b):\n"
    "    x = a + b\n"
    "    if x > 3:\n"
    "        x -= 1\n"
    "\n"
    "        x *= 2\n"
    "    return x\n"
    "\n"
    "print(f(1, 2))\n"
)


def _block(offset):
    r = current_block(SRC, offset)
    return None if r is None else SRC[r[0]:r[1]]


def test_current_block_body_and_header():
    assert _block(SRC.index("x -= 1")) == "        x -= 1\n\n        x *= 2\n"
    assert _block(SRC.index("if x")) == "        x -= 1\n\n        x *= 2\n"  # on a header: its body
    assert _block(SRC.index("x = a")) == ("    x = a + b\n    if x > 3:\n        x -= 1\n\n        x *= 2\n"
                                          "    return x\n")
    assert _block(SRC.index("print")) == "print(f(1, 2))\n"  # top level: the paragraph
    blank_in_block = SRC.index("\n\n        x *=") + 1
    assert _block(blank_in_block) == "        x -= 1\n\n        x *= 2\n"
    assert current_block("def g():\n", 3) is None  # header without body


def test_block_indent_at():
    assert block_indent_at(SRC, SRC.index("x -= 1")) == 8
    end_of_if = SRC.index("if x > 3:") + len("if x > 3:")
    assert block_indent_at(SRC, end_of_if) == 5  # deeper than the header
    assert block_indent_at("def g():\n", len("def g():\n")) == 1


def test_trims():
    assert trim_at_suffix("    y = 1\n    return x\n", "    return x\n") == "    y = 1\n"
    assert trim_at_suffix("    return x\n", "    return x\n") == "    return x\n"  # never to empty
    assert trim_to_block("a = 1\n        b = 2\n    c = 3\n", 8) == "a = 1\n        b = 2\n"
    assert trim_to_block("a = 1\n\n        b", 8) == "a = 1\n\n        b"


def test_list_actions_selection_block_and_only_filter():
    a, b = SRC.index("x = a"), SRC.index("    return")
    acts = list_actions("file:///t.py", 5, SRC, a, b)
    titles = [x.title for x in acts]
    assert titles == ["Kog: rewrite selection", "Kog: rewrite selection (alternative 2)",
                      "Kog: rewrite selection (alternative 3)", "Kog: complete this block"]
    assert all(x.edit is None for x in acts)  # listing never generates
    req = RefactorRequest.from_data(acts[1].data)
    assert req == RefactorRequest(REWRITE, "file:///t.py", 5, a, b, 1)
    cursor = SRC.index("x -= 1")
    acts = list_actions("file:///t.py", 5, SRC, cursor, cursor)
    assert acts[0].title == "Kog: rewrite this block"
    assert RefactorRequest.from_data(acts[-1].data).op == COMPLETE
    only = [types.CodeActionKind.QuickFix]
    assert list_actions("file:///t.py", 5, SRC, a, b, only) == []
    only = [types.CodeActionKind.Refactor]  # a parent kind admits refactor.rewrite
    assert len(list_actions("file:///t.py", 5, SRC, a, b, only)) == 4
    assert RefactorRequest.from_data({"tag": "other"}) is None


def test_edit_for_is_versioned_and_positions_in_encoding():
    text = "s = '😀'\nx = 1\n"
    a = text.index("x")
    req = RefactorRequest(REWRITE, "file:///t.py", 9, a, a + 5)
    we = edit_for(req, text, "x = 2", "utf-16")
    [tde] = we.document_changes
    assert tde.text_document.version == 9 and tde.text_document.uri == "file:///t.py"
    [e] = tde.edits
    assert (e.range.start.line, e.range.start.character, e.range.end.character) == (1, 0, 5)
    req = RefactorRequest(REWRITE, "file:///t.py", 9, 4, 7)  # the quoted emoji: 4 UTF-16 units
    [e] = edit_for(req, text, "'a'", "utf-16").document_changes[0].edits
    assert (e.range.start.character, e.range.end.character) == (4, 8)


def test_run_refactor_with_tiny_engine(tiny_engine):
    a, b = SRC.index("        x -= 1"), SRC.index("    return")
    for cand in (0, 1):
        req = RefactorRequest(REWRITE, "file:///t.py", 1, a, b, cand)
        try:
            out = run_refactor(tiny_engine, None, req, SRC, prefix_tokens=128, suffix_tokens=64)
        except RefactorFailed as exc:  # a random model may emit EOS at once: that is a message, not a crash
            assert "model" in str(exc)
            continue
        assert out.strip() and out.endswith("\n") and out != SRC[a:b]
    c = SRC.index("x -= 1") + len("x -= 1")
    req = RefactorRequest(COMPLETE, "file:///t.py", 1, c, c)
    try:
        out = run_refactor(tiny_engine, None, req, SRC, prefix_tokens=128, suffix_tokens=64)
        assert out == out.rstrip() and all(
            not ln.strip() or len(ln) - len(ln.lstrip()) >= 8 for ln in out.splitlines()[1:])
    except RefactorFailed:
        pass


def test_run_refactor_cancelled(tiny_engine):
    ev = threading.Event()
    ev.set()
    req = RefactorRequest(REWRITE, "file:///t.py", 1, 0, 9)
    with pytest.raises(RefactorCancelled):
        run_refactor(tiny_engine, ev, req, SRC, prefix_tokens=64, suffix_tokens=32)


def test_run_refactor_bad_region(tiny_engine):
    with pytest.raises(RefactorFailed):
        run_refactor(tiny_engine, None, RefactorRequest(REWRITE, "u", 1, 5, 10_000), SRC)


def test_apply_rewrite_edit_roundtrip():
    a, b = SRC.index("    x = a"), SRC.index("    if x")
    req = RefactorRequest(REWRITE, "file:///t.py", 2, a, b)
    [e] = edit_for(req, SRC, "    x = a * b\n", "utf-16").document_changes[0].edits
    out = positions.apply_change(SRC, (e.range.start.line, e.range.start.character),
                                 (e.range.end.line, e.range.end.character), e.new_text, "utf-16")
    assert out == SRC.replace("x = a + b", "x = a * b")
