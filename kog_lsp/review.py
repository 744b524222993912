"""Review: score a document with the model and flag tokens the model finds both very unlikely and where it is
confident in a different token; at most one finding per line. Plain logic, tested without a server.

Pipeline (runs on the engine worker thread, see `review_document`):
    text -> token ids -> engine.score in windows (WindowedScorer; unchanged windows come from a cache, the
    changed one hits the engine's prefix KV cache up to the first edited token) -> per-token surprisal
    -> Finding per line -> lsprotocol Diagnostics (+ quick fixes from their `data`).
"""

from __future__ import annotations

import logging
import math
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

from lsprotocol import types

from kog_lsp import positions
from kog_lsp.textmap import (SpanSet, declaration_spans, merge_spans, spans_match, strings_and_comments,
                             token_char_spans)

log = logging.getLogger(__name__)

SOURCE = "kog"
DATA_TAG = "kog.review"
LN2 = math.log(2.0)

SEVERITY = {
    "error": types.DiagnosticSeverity.Error,
    "warning": types.DiagnosticSeverity.Warning,
    "information": types.DiagnosticSeverity.Information,
    "hint": types.DiagnosticSeverity.Hint,
}


@dataclass(frozen=True)
class ReviewOptions:
    """Thresholds. The defaults are what bench/review.py chose for the shipped default model on held-out files
    with injected bugs (largest recall at >= 50% precision on the tuning half): 18 bits / 0.5 gave 48%
    precision, 14% recall, 2.4 false positives per 1,000 clean lines (bench/review_results.json)."""

    enable: bool = True
    severity: str = "information"
    min_surprisal_bits: float = 18.0  # -log2 p(actual token)
    min_top_prob: float = 0.5  # p(model's own top token)
    in_strings_and_comments: bool = False
    debounce_ms: int = 400

    @classmethod
    def from_settings(cls, settings) -> "ReviewOptions":
        """Read the review keys of kog_lsp.settings.Settings; keys it does not (yet) define keep our defaults."""
        d = cls()
        return cls(
            enable=bool(getattr(settings, "review_enable", d.enable)),
            severity=str(getattr(settings, "review_severity", d.severity)),
            min_surprisal_bits=float(getattr(settings, "review_min_surprisal", d.min_surprisal_bits)),
            min_top_prob=float(getattr(settings, "review_min_top_prob", d.min_top_prob)),
            in_strings_and_comments=bool(getattr(settings, "review_in_strings_and_comments",
                                                 d.in_strings_and_comments)),
            debounce_ms=int(getattr(settings, "review_debounce_ms", d.debounce_ms)),
        )


@dataclass
class TokenScores:
    """Per position i >= 1 of the scored ids: logprob of ids[i], the model's top id and its logprob."""

    logprobs: list[float]
    top_ids: list[int]
    top_logprobs: list[float]

    @classmethod
    def of(cls, result) -> "TokenScores":
        """Adapt engine.ScoreResult (lists or tensors) to plain lists."""
        def as_list(x):
            return x.tolist() if hasattr(x, "tolist") else list(x)

        return cls(as_list(result.token_logprobs), [int(i) for i in as_list(result.top_ids)],
                   as_list(result.top_logprobs))

    def __len__(self) -> int:
        return len(self.logprobs)


@dataclass(frozen=True)
class Finding:
    line: int
    start: int  # visible part of the token (whitespace stripped): the diagnostic range
    end: int
    token_start: int  # the whole token: the range the quick fix replaces
    token_end: int
    actual: str  # whole token texts
    expected: str
    prob: float  # p(actual)
    expected_prob: float  # p(expected)
    surprisal_bits: float

    @property
    def message(self) -> str:
        return (f"Unexpected `{self.actual.strip()}` (p={self.prob:.2g}): the model expects "
                f"`{self.expected.strip()}` ({self.expected_prob:.0%})")


class ReviewCancelled(Exception):
    """The review job's cancel event was set between windows (newer edit or a completion pre-empted it)."""


# ---------------------------------------------------------------- windows


class WindowedScorer:
    """Scores long token sequences in windows of at most `window` tokens.

    A document of at most `window` tokens is one window: the engine's prefix KV cache then rescores it from the
    first changed token. A longer one is cut at content-defined anchors (token indices where a top-level line
    starts whose text hashes to 0 mod ANCHOR_MOD, chosen by the caller from the text), never closer than a
    quarter window apart, and segments longer than the stride are split at fixed offsets from their start.
    Each window predicts its segment and sees `context` tokens before it. Results are cached by window
    content, so an edit costs the window(s) it touches: windows before it are unchanged, and because cuts
    follow content rather than token counts, windows after it keep their content (and their cache entries)
    even when the edit added or removed tokens.
    """

    def __init__(self, window: int = 2048, context: int = 256, cache_windows: int = 64, step: int | None = None):
        if context >= window:
            raise ValueError("context must be smaller than the window")
        self.window = window
        self.context = context
        # step: feed the engine growing prefixes of this many new tokens (each call reuses the prefix cache), so
        # a pre-empting completion waits for at most `step` tokens of prefill instead of the engine's whole
        # score chunk (256 tokens: ~150 ms with the default model on a CPU). None: one call per window (GPU).
        self.step = step
        self._cache: OrderedDict[tuple[int, ...], TokenScores] = OrderedDict()
        self._cache_windows = cache_windows
        self._lock = threading.Lock()
        self.windows_scored = 0
        self.windows_cached = 0

    def _engine_score(self, engine, ids: list[int], cancel: threading.Event | None):
        ends = range(self.step + 1, len(ids), self.step) if self.step else ()
        for end in [*ends, len(ids)]:
            res = engine.score(ids[:end], cancel=cancel)
            if getattr(res, "cancelled", False) or (cancel is not None and cancel.is_set()):
                raise ReviewCancelled()  # the engine returned early: never cache a partial result
        return res

    def plan(self, n: int, anchors: Sequence[int] = ()) -> list[tuple[int, int, int]]:
        """(context_start, target_start, end) per window; targets tile [1, n) (token 0 has no prediction)."""
        if n <= self.window:
            return [(0, 1, n)] if n > 1 else []
        stride = self.window - self.context
        min_gap = stride // 4
        cuts = [1]
        for a in sorted(anchors):
            if a - cuts[-1] >= min_gap and n - a >= 1:
                cuts.append(a)
        cuts.append(n)
        out = []
        for seg_start, seg_end in zip(cuts, cuts[1:]):
            t = seg_start
            while t < seg_end:
                end = min(seg_end, t + stride)
                out.append((max(0, t - self.context), t, end))
                t = end
        return out

    def score(self, engine, ids: Sequence[int], cancel: threading.Event | None = None,
              anchors: Sequence[int] = ()) -> TokenScores:
        merged = TokenScores([], [], [])
        for ctx, t, end in self.plan(len(ids), anchors):
            if cancel is not None and cancel.is_set():
                raise ReviewCancelled()
            key = tuple(ids[ctx:end])
            with self._lock:
                part = self._cache.get(key)
                if part is not None:
                    self._cache.move_to_end(key)
                    self.windows_cached += 1
            if part is None:
                res = self._engine_score(engine, list(key), cancel)
                part = TokenScores.of(res)
                if len(part) != len(key) - 1:
                    raise RuntimeError(f"engine.score returned {len(part)} positions for {len(key)} ids")
                with self._lock:
                    self._cache[key] = part
                    self.windows_scored += 1
                    while len(self._cache) > self._cache_windows:
                        self._cache.popitem(last=False)
            # part[j] predicts key[j + 1] = ids[ctx + j + 1]; keep the predictions of ids[t:end].
            lo, hi = t - ctx - 1, end - ctx - 1
            merged.logprobs += part.logprobs[lo:hi]
            merged.top_ids += part.top_ids[lo:hi]
            merged.top_logprobs += part.top_logprobs[lo:hi]
        return merged


# ---------------------------------------------------------------- findings


def _is_word_piece_mismatch(actual: str, expected: str) -> bool:
    """The model predicts a different tokenization of the same text (" foo" vs " foobar"), not another token."""
    a, e = actual, expected
    return bool(a) and bool(e) and (a.startswith(e) or e.startswith(a))


def token_candidates(text: str, ids: Sequence[int], spans: Sequence[tuple[int, int]], scores: TokenScores,
                     opts: ReviewOptions, decode_one: Callable[[int], str], language: str = "",
                     skip_ids: frozenset[int] = frozenset()) -> list[Finding]:
    """Every token of ids[1:] that passes the thresholds (several per line possible), in text order.

    `spans[i]` is the character span of ids[i] in `text`; `decode_one(id)` the text of one token.
    """
    if len(scores) != len(ids) - 1:
        raise ValueError(f"{len(scores)} scores for {len(ids)} ids")
    max_lp = -opts.min_surprisal_bits * LN2
    min_top_lp = math.log(opts.min_top_prob) if opts.min_top_prob > 0 else -math.inf
    skip = declaration_spans(text, language)
    if not opts.in_strings_and_comments:
        skip += strings_and_comments(text, language)
    excluded = SpanSet(merge_spans(skip))
    starts = positions.line_starts(text)
    out: list[Finding] = []
    for k in range(len(scores)):
        lp, top, top_lp = scores.logprobs[k], scores.top_ids[k], scores.top_logprobs[k]
        if lp > max_lp or top_lp < min_top_lp:
            continue
        i = k + 1
        if top == ids[i] or top in skip_ids or ids[i] in skip_ids:
            continue
        s, e = spans[i]
        actual = text[s:e]
        vis = actual.strip()
        if not vis:
            continue  # whitespace / layout: not what review is for
        expected = decode_one(top)
        if not expected.strip() or "\ufffd" in expected or _is_word_piece_mismatch(actual, expected):
            continue
        vs = s + (len(actual) - len(actual.lstrip()))
        if vs in excluded:
            continue
        line = positions.position_at(text, vs, "utf-32", starts)[0]
        out.append(Finding(line, vs, vs + len(vis), s, e, actual, expected, math.exp(lp), math.exp(top_lp), -lp / LN2))
    return out


def per_line(findings: Sequence[Finding]) -> list[Finding]:
    """At most one finding per line: the most surprising token."""
    best: dict[int, Finding] = {}
    for f in findings:
        if f.line not in best or f.surprisal_bits > best[f.line].surprisal_bits:
            best[f.line] = f
    return [best[line] for line in sorted(best)]


def find_unexpected(text: str, ids: Sequence[int], spans: Sequence[tuple[int, int]], scores: TokenScores,
                    opts: ReviewOptions, decode_one: Callable[[int], str], language: str = "",
                    skip_ids: frozenset[int] = frozenset()) -> list[Finding]:
    """Findings, at most one per line (the most surprising token), for tokens ids[1:] scored by `scores`."""
    return per_line(token_candidates(text, ids, spans, scores, opts, decode_one, language, skip_ids))


ANCHOR_MOD = 4  # about one top-level line in four may start a window (content-defined, see WindowedScorer)


def window_anchors(text: str, spans: Sequence[tuple[int, int]]) -> list[int]:
    """Token indices where a window may start: tokens that begin a non-indented line whose text hashes to 0 mod
    ANCHOR_MOD. Depends only on that line, so anchors move with their lines when text is inserted above."""
    out = []
    for i, (s, e) in enumerate(spans):
        if e > s and (s == 0 or text[s - 1] in "\r\n") and not text[s].isspace():
            nl = text.find("\n", s)
            line = text[s:nl if nl >= 0 else len(text)]
            if zlib.crc32(line.encode("utf-8", "surrogatepass")) % ANCHOR_MOD == 0:
                out.append(i)
    return out


def special_ids(tok) -> frozenset[int]:
    """Ids review never flags nor proposes: end-of-text and FIM markers."""
    skip = frozenset(getattr(tok, "eos_ids", ()) or ())
    fim = getattr(tok, "fim", None)
    if fim is not None and hasattr(fim, "marker_ids"):
        skip |= fim.marker_ids()
    return skip


def score_document(engine, text: str, scorer: WindowedScorer, cancel: threading.Event | None = None):
    """(ids, spans, scores) for `text`, or None when the tokenizer cannot map tokens back to the text."""
    tok = engine.tokenizer
    ids = tok.encode(text)
    if len(ids) < 2:
        return None
    spans = token_char_spans(tok, ids)
    if not spans_match(spans, text):
        # Only a tokenizer that normalizes text (not byte-level BPE) gets here; offsets would be wrong.
        log.warning("review skipped: decode(encode(text)) differs from the document (%d vs %d chars)",
                    spans[-1][1] if spans else 0, len(text))
        return None
    return ids, spans, scorer.score(engine, ids, cancel, window_anchors(text, spans))


def review_document(engine, text: str, language: str, opts: ReviewOptions, scorer: WindowedScorer,
                    cancel: threading.Event | None = None) -> list[Finding]:
    """The whole review of one document version; runs on the engine worker thread (calls engine.score)."""
    scored = score_document(engine, text, scorer, cancel)
    if scored is None:
        return []
    ids, spans, scores = scored
    tok = engine.tokenizer
    return find_unexpected(text, ids, spans, scores, opts, lambda i: tok.decode([i]), language, special_ids(tok))


# ---------------------------------------------------------------- LSP shapes


def lsp_range(text: str, a: int, b: int, encoding: str, starts: list[int] | None = None) -> types.Range:
    """LSP Range of the character offsets [a, b) of `text` (also used for refactor edits)."""
    starts = starts if starts is not None else positions.line_starts(text)
    sl, sc = positions.position_at(text, a, encoding, starts)
    el, ec = positions.position_at(text, b, encoding, starts)
    return types.Range(start=types.Position(line=sl, character=sc), end=types.Position(line=el, character=ec))


def to_diagnostics(text: str, findings: Sequence[Finding], encoding: str, version: int | None,
                   severity: str = "information") -> list[types.Diagnostic]:
    """Diagnostics whose `data` carries what the quick fix needs (version, token range, replacement)."""
    starts = positions.line_starts(text)
    sev = SEVERITY.get(severity, types.DiagnosticSeverity.Information)
    out = []
    for f in findings:
        fix = lsp_range(text, f.token_start, f.token_end, encoding, starts)
        out.append(types.Diagnostic(
            range=lsp_range(text, f.start, f.end, encoding, starts),
            message=f.message,
            severity=sev,
            source=SOURCE,
            code="unexpected-token",
            data={
                "tag": DATA_TAG, "version": version, "actual": f.actual, "expected": f.expected,
                "prob": f.prob, "expectedProb": f.expected_prob,
                "fixRange": {"start": {"line": fix.start.line, "character": fix.start.character},
                             "end": {"line": fix.end.line, "character": fix.end.character}},
            },
        ))
    return out


def _data_dict(data) -> dict | None:
    if isinstance(data, dict) and data.get("tag") == DATA_TAG:
        return data
    return None


def quick_fix(diagnostic: types.Diagnostic, uri: str, text: str, version: int | None,
              encoding: str, starts: list[int] | None = None) -> types.CodeAction | None:
    """'Replace the token with the expected one' for a review diagnostic, or None when it no longer applies
    (document changed since the diagnostic was computed, or the token is not there any more). `starts`: the
    line starts of `text` when the caller has them (the document's cached ones)."""
    if diagnostic.source != SOURCE:
        return None
    data = _data_dict(diagnostic.data)
    if data is None or data.get("version") != version:
        return None
    try:
        r = data["fixRange"]
        starts = starts if starts is not None else positions.line_starts(text)
        a = positions.offset_at(text, r["start"]["line"], r["start"]["character"], encoding, starts=starts)
        b = positions.offset_at(text, r["end"]["line"], r["end"]["character"], encoding, starts=starts)
        actual, expected = data["actual"], data["expected"]
    except (KeyError, TypeError, positions.PositionError):
        return None
    if text[a:b] != actual:
        return None
    edit = types.TextEdit(range=lsp_range(text, a, b, encoding, starts), new_text=expected)
    return types.CodeAction(
        title=f"Replace `{actual.strip()}` with `{expected.strip()}`",
        kind=types.CodeActionKind.QuickFix,
        diagnostics=[diagnostic],
        is_preferred=True,
        edit=versioned_edit(uri, version, [edit]),
    )


def versioned_edit(uri: str, version: int | None, edits: list[types.TextEdit]) -> types.WorkspaceEdit:
    """A WorkspaceEdit the client applies only to this document version (never to text that changed)."""
    return types.WorkspaceEdit(document_changes=[types.TextDocumentEdit(
        text_document=types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version),
        edits=edits,
    )])
