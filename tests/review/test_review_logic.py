import math
import threading

import pytest
from lsprotocol import types

from kog_lsp import positions
from kog_lsp.review import (Finding, ReviewCancelled, ReviewOptions, TokenScores, WindowedScorer, find_unexpected,
                            quick_fix, review_document, to_diagnostics)

LN2 = math.log(2)


def _toks(pieces):
    """A hand-made tokenization: ids = positions in `pieces`, spans from concatenation."""
    spans, pos = [], 0
    for p in pieces:
        spans.append((pos, pos + len(p)))
        pos += len(p)
    return "".join(pieces), list(range(len(pieces))), spans


def _scores(n, overrides):
    """Confident, correct predictions everywhere (top == actual) except `overrides` {i: (p_actual, top_piece_id, p_top)}."""
    lp, top, tlp = [], [], []
    for i in range(1, n):
        if i in overrides:
            pa, t, pt = overrides[i]
            lp.append(math.log(pa)), top.append(t), tlp.append(math.log(pt))
        else:
            lp.append(math.log(0.9)), top.append(i), tlp.append(math.log(0.9))
    return TokenScores(lp, top, tlp)


# The document's tokens (ids 0..11) and two alternatives the fake model may prefer.
DOC = ["def", " f", "(", "n", "):", "\n   ", " return", " n", " -", " 1", "  # note", "\n"]
ALT_PLUS, ALT_M = 100, 101
TABLE = {**dict(enumerate(DOC)), ALT_PLUS: " +", ALT_M: " m"}


def _run(overrides, language="python", **opt):
    text, ids, spans = _toks(DOC)
    opts = ReviewOptions(**{"min_surprisal_bits": 6.0, "min_top_prob": 0.5, **opt})
    return text, find_unexpected(text, ids, spans, _scores(len(ids), overrides), opts, TABLE.__getitem__, language)


def test_flags_unlikely_token_with_confident_alternative():
    text, found = _run({8: (0.001, ALT_PLUS, 0.95)})
    assert len(found) == 1
    f = found[0]
    assert text[f.start:f.end] == "-" and text[f.token_start:f.token_end] == " -"
    assert f.line == 1 and f.actual == " -" and f.expected == " +"
    assert f.surprisal_bits == pytest.approx(-math.log2(0.001))
    assert "`-`" in f.message and "`+`" in f.message and "95%" in f.message


@pytest.mark.parametrize("override, opt", [
    ({8: (0.05, ALT_PLUS, 0.95)}, {}),  # not surprising enough (4.3 bits < 6)
    ({8: (0.001, ALT_PLUS, 0.3)}, {}),  # model not confident in its alternative
    ({8: (0.001, 8, 0.95)}, {}),  # the top token is the actual one
    ({5: (0.001, ALT_PLUS, 0.95)}, {}),  # whitespace token
    ({7: (0.001, ALT_M, 0.95)}, {"min_top_prob": 0.99}),  # threshold from options
])
def test_not_flagged(override, opt):
    assert _run(override, **opt)[1] == []


def test_word_piece_mismatch_is_not_a_finding():
    # actual " n" vs expected " n" + more (a different tokenization of the same word): skip.
    text, ids, spans = _toks(["x", " n", "\n"])
    table = {0: "x", 1: " n", 2: "\n", 3: " nn"}
    sc = TokenScores([math.log(1e-4), math.log(0.9)], [3, 2], [math.log(0.9), math.log(0.9)])
    assert find_unexpected(text, ids, spans, sc, ReviewOptions(), table.__getitem__) == []


def test_comment_tokens_skipped_unless_enabled():
    over = {10: (0.001, ALT_M, 0.95)}  # the "  # note" token
    assert _run(over)[1] == []
    found = _run(over, in_strings_and_comments=True)[1]
    assert len(found) == 1 and found[0].actual == "  # note"


def test_one_finding_per_line_keeps_most_surprising():
    over = {7: (0.002, ALT_M, 0.9), 8: (0.0001, ALT_PLUS, 0.9), 3: (0.001, ALT_M, 0.9)}
    text, found = _run(over, language="text")
    assert [(f.line, f.actual) for f in found] == [(0, "n"), (1, " -")]


def test_python_bound_names_are_not_findings():
    # `n` in `def f(n):` is a parameter being named (a free choice), its use in `return n` is checked.
    over = {3: (0.001, ALT_M, 0.9), 7: (0.001, ALT_M, 0.9)}
    text, found = _run(over)
    assert [(f.line, f.actual) for f in found] == [(1, " n")]


def test_diagnostics_ranges_in_utf16_and_quick_fix_applies():
    text = 'x = "😀"; y = a - b\n'
    a = text.index(" -")
    f = Finding(0, a + 1, a + 2, a, a + 2, " -", " +", 0.001, 0.9, 9.97)
    for enc, col in (("utf-16", a + 2), ("utf-32", a + 1), ("utf-8", a + 4)):
        [d] = to_diagnostics(text, [f], enc, version=7, severity="warning")
        assert d.range.start == types.Position(line=0, character=col)
        assert d.severity == types.DiagnosticSeverity.Warning and d.source == "kog"
        action = quick_fix(d, "file:///t.py", text, 7, enc)
        assert action is not None and action.kind == types.CodeActionKind.QuickFix
        [tde] = action.edit.document_changes
        assert tde.text_document.version == 7
        [edit] = tde.edits
        r = edit.range
        fixed = positions.apply_change(text, (r.start.line, r.start.character), (r.end.line, r.end.character),
                                       edit.new_text, enc)
        assert fixed == 'x = "😀"; y = a + b\n'


def test_quick_fix_refuses_stale_or_changed_text():
    text = "y = a - b\n"
    f = Finding(0, 6, 7, 5, 7, " -", " +", 0.001, 0.9, 9.97)
    [d] = to_diagnostics(text, [f], "utf-16", version=3)
    assert quick_fix(d, "file:///t.py", text, 4, "utf-16") is None  # document version moved on
    assert quick_fix(d, "file:///t.py", "y = a * b\n", 3, "utf-16") is None  # token no longer there
    foreign = types.Diagnostic(range=d.range, message="x", source="other", data=d.data)
    assert quick_fix(foreign, "file:///t.py", text, 3, "utf-16") is None


def test_severity_default_information():
    f = Finding(0, 0, 1, 0, 1, "x", "y", 0.001, 0.9, 9.97)
    [d] = to_diagnostics("x\n", [f], "utf-16", version=1)
    assert d.severity == types.DiagnosticSeverity.Information


class FakeEngine:
    """score() depends only on (previous id, id), so windows give the same numbers as one long pass."""

    def __init__(self):
        self.calls = []

    def score(self, ids, cancel=None):
        self.calls.append(list(ids))

        class R:
            token_logprobs = [-((a * 7 + b) % 13) / 3.0 for a, b in zip(ids, ids[1:])]
            top_ids = [(a + 1) % 50 for a in ids[:-1]]
            top_logprobs = [-0.1] * (len(ids) - 1)
            cancelled = False
        return R()


def test_windowed_scorer_tiles_and_matches_single_pass():
    ids = [(k * 31) % 50 for k in range(103)]
    full = FakeEngine().score(ids)
    eng = FakeEngine()
    sc = WindowedScorer(window=32, context=8)
    plan = sc.plan(len(ids))
    assert plan[0] == (0, 1, 25) and all(e - c <= 32 for c, t, e in plan)
    assert [t for _, t, _ in plan[1:]] == [e for _, _, e in plan[:-1]] and plan[-1][2] == len(ids)
    got = sc.score(eng, ids)
    assert got.logprobs == full.token_logprobs and got.top_ids == full.top_ids
    assert len(eng.calls) == len(plan)
    # Same ids again: every window from the cache.
    eng.calls.clear()
    sc.score(eng, ids)
    assert eng.calls == []
    # Edit inside the last window only: only that window is rescored.
    ids2 = ids[:-3] + [1, 2, 3]
    sc.score(eng, ids2)
    assert len(eng.calls) == 1 and eng.calls[0][-3:] == [1, 2, 3]


def test_windowed_scorer_cancel():
    ev = threading.Event()
    ev.set()
    with pytest.raises(ReviewCancelled):
        WindowedScorer(window=32, context=8).score(FakeEngine(), list(range(40)), ev)


def test_review_document_with_tiny_engine(tiny_engine):
    text = 'def add(a, b):\n    s = "text 😀"  # comment\n    return a + b\n\nprint(add(1, 2))\n'
    scorer = WindowedScorer(window=64, context=16)
    # Zero thresholds: every token where the model prefers another one is a candidate; one per line at most.
    opts = ReviewOptions(min_surprisal_bits=0.0, min_top_prob=0.0)
    found = review_document(tiny_engine, text, "python", opts, scorer)
    lines = [f.line for f in found]
    assert lines == sorted(set(lines)) and found
    excluded = [text.index('"text'), text.index("# comment")]
    for f in found:
        assert text[f.start:f.end] == f.actual.strip() and f.actual == text[f.token_start:f.token_end]
        assert not (excluded[0] <= f.start < excluded[0] + 11)
        assert not (excluded[1] <= f.start < excluded[1] + 9)
    # The windowed result equals the engine's single-pass scores where the window saw the whole prefix.
    ids = tiny_engine.tokenizer.encode(text)
    direct = tiny_engine.score(ids)
    first = WindowedScorer(window=len(ids) + 1, context=8).score(tiny_engine, ids)
    assert first.top_ids == list(direct.top_ids)
    assert first.logprobs == pytest.approx(list(direct.token_logprobs), abs=1e-4)


def test_content_defined_windows_survive_an_insertion():
    import random

    rng = random.Random(5)
    ids = [rng.randrange(50) for _ in range(300)]
    anchors = list(range(20, 300, 20))
    eng = FakeEngine()
    sc = WindowedScorer(window=64, context=8)
    sc.score(eng, ids, anchors=anchors)
    first = len(eng.calls)
    assert first == len(sc.plan(len(ids), anchors)) > 5
    # Insert 3 tokens early: the anchors move with the content after the insertion.
    ids2 = ids[:10] + [7, 8, 9] + ids[10:]
    anchors2 = [a + 3 for a in anchors]
    eng.calls.clear()
    got = sc.score(eng, ids2, anchors=anchors2)
    assert len(eng.calls) == 1  # only the window holding the insertion was scored again
    assert len(got.logprobs) == len(ids2) - 1
    assert got.logprobs == FakeEngine().score(ids2).token_logprobs  # context-free fake: same as one pass


def test_window_anchors_are_top_level_lines(tiny_engine):
    from kog_lsp.review import ANCHOR_MOD, window_anchors
    from kog_lsp.textmap import token_char_spans

    text = "".join(f"def f{k}(x):\n    return x + {k}\n\n" for k in range(40))
    tok = tiny_engine.tokenizer
    ids = tok.encode(text)
    spans = token_char_spans(tok, ids)
    anchors = window_anchors(text, spans)
    assert anchors and len(anchors) < 40
    for i in anchors:
        s = spans[i][0]
        assert text[s - 1] == "\n" and text[s:s + 3] == "def"
    # Prepending a line moves every anchor by the same number of tokens (they follow content, not indices).
    pre = "import os\n"
    ids2 = tok.encode(pre + text)
    shift = len(ids2) - len(ids)
    assert window_anchors(pre + text, token_char_spans(tok, ids2)) == [a + shift for a in anchors]
    assert ANCHOR_MOD >= 2


def test_stepped_scoring_matches_one_call_and_stops_between_steps(tiny_engine):
    text = "".join(f"def f{k}(x):\n    return x * {k}\n\n" for k in range(30))
    ids = tiny_engine.tokenizer.encode(text)[:200]
    one = WindowedScorer(window=256, context=32).score(tiny_engine, ids)
    calls = []

    class Spy:
        def score(self, ids, cancel=None):
            calls.append(len(ids))
            return tiny_engine.score(ids, cancel=cancel)

    stepped = WindowedScorer(window=256, context=32, step=64).score(Spy(), ids)
    assert calls == [65, 129, 193, 200]
    assert stepped.top_ids == one.top_ids
    assert stepped.logprobs == pytest.approx(one.logprobs, abs=1e-4)

    ev = threading.Event()

    class CancelAfterFirst:
        def score(self, ids, cancel=None):
            ev.set()  # a completion arrived while this step ran
            return tiny_engine.score(ids, cancel=None)

    with pytest.raises(ReviewCancelled):
        WindowedScorer(window=256, context=32, step=64).score(CancelAfterFirst(), ids, ev)
