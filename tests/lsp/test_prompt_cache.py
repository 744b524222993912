"""kog_lsp.token_cache: prompts built from cached line pieces are the exact ids of the uncached path."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kog_lsp.fim import build_prompt, safe_encode
from kog_lsp.positions import line_starts
from kog_lsp.token_cache import (MAX_TAIL_CHARS, MAX_TAILS, DocumentPieces, PromptTokenCache, _last_cut, cut_points,
                                 qualify, self_check)


@pytest.fixture(scope="module")
def default_tokenizer():
    from engine.engine import DEFAULT_MODEL_DIR
    from engine.tokenizer import Tokenizer

    return Tokenizer.from_dir(DEFAULT_MODEL_DIR)


# Fragments documents are made of: code, indentation, blank lines with spaces, CRLF and lone CR, tabs, form
# feeds, U+2028, NBSP, multi-byte and astral characters, a combining mark, special-token literals.
FRAGMENTS = ["def ", "f(x):", "return", " x", "1", "23", "'s", ":", ")", "    ", "  ", "\t", " ", "\n", "\n",
             "\n", "\r\n", "\r", "  \n", "\t\n", "\x0c", "\u2028", "\u00a0", "é", "中文", "😀", "\u0301",
             "<|fim_prefix|>", "<|file_sep|>", "<|endoftext|>", "#", "\"\"\"", "x = [1, 2]", "\x85", "\x0b",
             "\x1c", "\u3000", "\r\r\n", "\n\n\n", "\u1161", "1234567", "<|fim_", "|>", "\ud83d"]
texts = st.lists(st.sampled_from(FRAGMENTS), max_size=120).map("".join)
# Editing operations: type a fragment, delete characters, jump the cursor somewhere.
ops = st.lists(st.one_of(st.tuples(st.just("type"), st.sampled_from(FRAGMENTS)),
                         st.tuples(st.just("delete"), st.integers(1, 6)),
                         st.tuples(st.just("jump"), st.floats(0, 1))), min_size=1, max_size=12)


def _apply(text: str, cursor: int, op) -> tuple[str, int]:
    kind, arg = op
    if kind == "type":
        return text[:cursor] + arg + text[cursor:], cursor + len(arg)
    if kind == "delete":
        a = max(0, cursor - arg)
        return text[:a] + text[cursor:], a
    return text, int(arg * len(text))


def _check_session(tok, doc: str, cursor: float, steps, pre: int, suf: int, use_starts: bool,
                   cache: PromptTokenCache | None = None) -> PromptTokenCache:
    if cache is None:
        cache = PromptTokenCache(max_entries=64, max_chars=4000)  # small: eviction happens during the test too
    text, cur = doc, int(cursor * len(doc))
    for op in steps:
        text, cur = _apply(text, cur, op)
        starts = line_starts(text) if use_starts else None
        want = build_prompt(tok, text, cur, prefix_tokens=pre, suffix_tokens=suf, starts=starts)
        got = build_prompt(tok, text, cur, prefix_tokens=pre, suffix_tokens=suf, starts=starts,
                           token_cache=cache, doc="file:///a.py")
        assert got.ids == want.ids
        assert (got.window_start, got.prefix_tokens, got.suffix_tokens) == (
            want.window_start, want.prefix_tokens, want.suffix_tokens)
    return cache


@pytest.mark.parametrize("text", ["", "x", "a\nb", "a\n  \n", "a\nb" + "\n  " * 100, "a\nb\n" + "\n" * 200 + "  ",
                                  "\n" * 300, "a\n\r b\n c"], ids=lambda t: f"{len(t)}chars")
def test_last_cut_is_the_last_cut_point(text):
    cuts = cut_points(text)
    assert _last_cut(text) == (cuts[-1] if cuts else None)


def test_default_tokenizer_qualifies(default_tokenizer):
    assert qualify(default_tokenizer, safe_encode(default_tokenizer)) is None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts)
def test_line_pieces_concatenate_exactly(default_tokenizer, text):
    """The core property: cutting at any cut point (and at all of them) keeps the encoding."""
    enc = safe_encode(default_tokenizer)
    whole = enc(text)
    for c in cut_points(text):
        assert enc(text[:c]) + enc(text[c:]) == whole
    pieces = DocumentPieces(enc, PromptTokenCache().counters, max_entries=8, max_chars=10_000)
    assert pieces.encode(text) == whole
    assert pieces.encode(text) == whole  # second time from the cache


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=texts, cursor=st.floats(0, 1), steps=ops, pre=st.integers(4, 200), suf=st.integers(0, 40),
       use_starts=st.booleans())
def test_cached_prompts_equal_uncached_while_editing(default_tokenizer, doc, cursor, steps, pre, suf, use_starts):
    cache = _check_session(default_tokenizer, doc, cursor, steps, pre, suf, use_starts)
    assert cache.stats()["enabled"] and cache.stats()["fallbacks"] == 0


def test_cache_is_used_on_a_real_file(default_tokenizer):
    """Typing inside a long file: the cached path matches and most pieces come from the cache."""
    import textwrap

    doc = open(textwrap.__file__).read()
    cur = doc.index("def dedent")
    steps = [("type", c) for c in "    x = indent(text)\n"] + [("delete", 3), ("jump", 0.2), ("type", "y")]
    cache = _check_session(default_tokenizer, doc, cur / len(doc), steps, 1024, 64, True,
                           PromptTokenCache(max_entries=300, max_chars=20_000))
    s = cache.stats()
    assert s["reused_chars"] > 5 * s["encoded_chars"] and s["entries"] <= 300 + 8 + MAX_TAILS
    assert s["chars"] <= 2 * 20_000 + MAX_TAILS * MAX_TAIL_CHARS


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=texts, cursor=st.floats(0, 1), steps=ops, pre=st.integers(4, 200), suf=st.integers(0, 40))
def test_non_qualifying_tokenizer_falls_back(tiny_tokenizer, doc, cursor, steps, pre, suf):
    """The tiny test tokenizer uses GPT-2's regex (no proof for it): the cache stays off, ids unchanged."""
    cache = _check_session(tiny_tokenizer, doc, cursor, steps, pre, suf, True)
    s = cache.stats()
    assert not s["enabled"] and "regex" in s["reason"]
    assert s["fallbacks"] == len(steps) and s["entries"] == 0 and s["hits"] == 0


def test_gpt2_regex_really_breaks_line_cuts(tiny_tokenizer):
    """Why the GPT-2 regex is excluded: '  \\n' before a line is one pre-token alone, two after a cut."""
    pre = tiny_tokenizer.tok.pre_tokenizer
    whole = [p for p, _ in pre.pre_tokenize_str("x  \ny")]
    cut = [p for p, _ in pre.pre_tokenize_str("x  \n")] + [p for p, _ in pre.pre_tokenize_str("y")]
    assert whole != cut


def test_self_check_rejects_an_encoder_that_crosses_lines():
    # Pairs characters across everything, line breaks included: cutting after a "\n" changes the ids.
    def pairs(text):
        return [hash(text[i:i + 2]) for i in range(0, len(text), 2)]

    reason = self_check(pairs)
    assert reason is not None and "encode(a + b)" in reason
    assert self_check(lambda t: [ord(c) for c in t]) is None  # character ids concatenate trivially


class _CharTokenizer:
    """No tokenizers backend: the structural check cannot prove anything, so the cache stays off."""

    fim = None
    bos_id = None

    def encode(self, text):
        return [ord(c) for c in text]


def test_tokenizer_without_backend_falls_back():
    cache = PromptTokenCache()
    tok = _CharTokenizer()
    p = build_prompt(tok, "ab\ncd\n", 4, prefix_tokens=10, suffix_tokens=10, token_cache=cache, doc="u")
    assert p.ids == [ord(c) for c in "ab\nc"]
    s = cache.stats()
    assert not s["enabled"] and "tokenizers-backed" in s["reason"] and s["fallbacks"] == 1


def test_memory_is_bounded_per_document_and_documents_are_lru(default_tokenizer):
    tok = default_tokenizer
    cache = PromptTokenCache(max_docs=2, max_entries=10, max_chars=300)
    doc = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(100))
    for uri in ("a", "b", "a", "c"):
        build_prompt(tok, doc, len(doc) // 2, prefix_tokens=400, suffix_tokens=40, token_cache=cache, doc=uri)
    s = cache.stats()
    # per document: at most max_entries line pieces + 8 window heads (max_chars characters in each kind) + tails
    assert s["documents"] == 2 and 0 < s["entries"] <= 2 * (10 + 8 + MAX_TAILS)
    assert 0 < s["chars"] <= 2 * (2 * 300 + MAX_TAILS * MAX_TAIL_CHARS)
    assert set(cache._docs) == {"a", "c"}  # "b" was least recently used
    cache.forget("a")
    assert set(cache._docs) == {"c"}


def test_completer_drops_a_closed_document(default_tokenizer):
    from kog_lsp.completer import Completer
    from kog_lsp.settings import Settings
    from kog_lsp.stats import Stats

    c = Completer(runtime=None, settings=Settings(), stats=Stats())
    build_prompt(default_tokenizer, "x = 1\ny = 2\n", 8, prefix_tokens=64, suffix_tokens=8,
                 token_cache=c.prompt_tokens, doc="file:///a.py")
    assert c.prompt_tokens.stats()["documents"] == 1
    c.forget("file:///a.py")
    assert c.prompt_tokens.stats()["documents"] == 0


def test_a_new_tokenizer_resets_the_cache(default_tokenizer, tiny_tokenizer):
    cache = PromptTokenCache()
    build_prompt(default_tokenizer, "a\nb\nc", 5, prefix_tokens=64, suffix_tokens=8, token_cache=cache, doc="u")
    assert cache.stats()["enabled"] and cache.stats()["documents"] == 1
    want = build_prompt(tiny_tokenizer, "a\nb\nc", 5, prefix_tokens=64, suffix_tokens=8)
    got = build_prompt(tiny_tokenizer, "a\nb\nc", 5, prefix_tokens=64, suffix_tokens=8, token_cache=cache, doc="u")
    assert got.ids == want.ids and not cache.stats()["enabled"] and cache.stats()["documents"] == 0
