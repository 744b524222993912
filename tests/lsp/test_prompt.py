from dataclasses import dataclass

from kog_lsp.context import ContextBuilder, display_path
from kog_lsp.fim import build_prompt, prefix_window, prompt_format, stop_ids_for, suffix_window

DOC = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(200))


def test_fim_prompt_layout(tiny_tokenizer):
    tok = tiny_tokenizer
    fim = tok.fim
    text = "import os\n\ndef main():\n    print(os.getcwd())\n"
    cur = text.index("print") + len("pri")
    p = build_prompt(tok, text, cur, prefix_tokens=512, suffix_tokens=64)
    assert p.fim and p.ids[0] == fim.prefix and p.ids[-1] == fim.middle
    i_suf = p.ids.index(fim.suffix)
    assert tok.decode(p.ids[1:i_suf]) == text[:cur]
    assert tok.decode(p.ids[i_suf + 1 : -1]) == text[cur:]
    assert p.window_start == 0 and p.prefix_tokens == i_suf - 1


def test_prefix_window_respects_budget_and_stays_put_while_typing(tiny_tokenizer):
    enc = tiny_tokenizer.encode
    cur = DOC.index("def f150")
    starts = set()
    for k in range(12):  # type 12 characters at the cursor
        before = DOC[:cur] + "abcdefghijkl"[:k]
        start, ids = prefix_window(enc, before, 300)
        assert len(ids) <= 300
        assert tiny_tokenizer.decode(ids) == before[start:]
        assert start == 0 or before[start - 1] == "\n"
        starts.add(start)
    assert len(starts) == 1  # the window start did not slide with each keystroke


def test_prefix_window_huge_line_keeps_last_tokens(tiny_tokenizer):
    before = "x = [" + "1, " * 3000
    start, ids = prefix_window(tiny_tokenizer.encode, before, 100)
    assert len(ids) == 100


def test_suffix_window(tiny_tokenizer):
    ids = suffix_window(tiny_tokenizer.encode, DOC, 50)
    assert 0 < len(ids) <= 50
    assert DOC.startswith(tiny_tokenizer.decode(ids))
    assert suffix_window(tiny_tokenizer.encode, DOC, 0) == []


@dataclass
class _NoFimTokenizer:
    """A tokenizer without FIM tokens (test double: characters as ids)."""

    fim = None
    bos_id = 7
    eos_ids = frozenset({0})

    def encode(self, text):
        return [ord(c) for c in text]


def test_prefix_only_prompt_without_fim():
    p = build_prompt(_NoFimTokenizer(), "abc\ndef", 5, prefix_tokens=100, suffix_tokens=100)
    assert not p.fim and p.ids == [7] + [ord(c) for c in "abc\nd"]
    assert stop_ids_for(_NoFimTokenizer()) == frozenset({0})
    assert prompt_format(_NoFimTokenizer()).startswith("prefix-only") and "no FIM tokens" in prompt_format(_NoFimTokenizer())


def test_prompt_format_names_the_fim_format(tiny_tokenizer):
    assert prompt_format(tiny_tokenizer) == "fim:qwen"


def test_spm_order_puts_the_prefix_last_and_keeps_the_suffix_cached(tiny_tokenizer):
    """fim_order "spm" (the shipped default model): <prefix><suffix> suffix <middle> prefix. Typing at the cursor
    only appends to the prompt, so the whole earlier prompt (suffix included) stays a cached prefix."""
    import dataclasses

    tok = tiny_tokenizer
    spm = dataclasses.replace(tok.fim, order="spm")
    orig = tok.fim
    tok.fim = spm
    try:
        text = "import os\n\ndef main():\n    print(os.getcwd())\n"
        cur = text.index("print") + len("pri")
        p = build_prompt(tok, text, cur, prefix_tokens=512, suffix_tokens=64)
        assert p.ids[:2] == [spm.prefix, spm.suffix]
        i_mid = p.ids.index(spm.middle)
        assert tok.decode(p.ids[2:i_mid]) == text[cur:]
        assert tok.decode(p.ids[i_mid + 1:]) == text[:cur]
        assert prompt_format(tok) == "fim:qwen:spm"
        typed = text[:cur] + "n" + text[cur:]
        q = build_prompt(tok, typed, cur + 1, prefix_tokens=512, suffix_tokens=64)
        same = next(i for i, (a, b) in enumerate(zip(p.ids + [None], q.ids)) if a != b)
        assert same >= i_mid + 1   # only the prefix's last token(s) change
    finally:
        tok.fim = orig


def test_shipped_default_model_asks_for_spm():
    from engine.engine import DEFAULT_MODEL_DIR
    from engine.tokenizer import Tokenizer

    assert Tokenizer.from_dir(DEFAULT_MODEL_DIR).fim.order == "spm"


def test_stop_ids_include_fim_markers(tiny_tokenizer):
    ids = stop_ids_for(tiny_tokenizer)
    fim = tiny_tokenizer.fim
    assert {fim.prefix, fim.suffix, fim.middle, fim.file_sep} <= ids and tiny_tokenizer.eos_ids <= ids


def test_context_chunks_sorted_deterministic_and_budgeted(tiny_tokenizer):
    tok, fim = tiny_tokenizer, tiny_tokenizer.fim
    docs = [("file:///w/b.py", 1, "B = 2\n" * 50), ("file:///w/a.py", 3, "A = 1\n"), ("file:///w/cur.py", 1, "x"),
            ("file:///w/empty.py", 1, "  \n")]
    cb = ContextBuilder()
    ids = cb.build(tok, docs, "file:///w/cur.py", 128, "file:///w")
    assert 0 < len(ids) <= 128
    assert ids.count(fim.file_sep) == 2
    text = tok.decode(ids)
    assert text.index("a.py") < text.index("b.py") and "cur.py" not in text and "empty.py" not in text
    assert cb.build(tok, list(reversed(docs)), "file:///w/cur.py", 128, "file:///w") == ids
    assert cb.build(tok, docs, "file:///w/cur.py", 0) == []
    p = build_prompt(tok, "x", 1, prefix_tokens=64, suffix_tokens=8, context_ids=ids, path="cur.py")
    assert p.ids[: len(ids)] == ids and p.ids[len(ids)] == fim.file_sep and p.context_tokens == len(ids)


def test_display_path():
    assert display_path("file:///w/src/a%20b.py", "file:///w") == "src/a b.py"
    assert display_path("file:///elsewhere/x.py", "file:///w") == "elsewhere/x.py"
    assert display_path("untitled:Untitled-1", None) == "untitled:Untitled-1"


def test_fit_budgets_scales_windows_to_the_engine():
    from kog_lsp.completer import fit_budgets

    assert fit_budgets(1024, 256, 512, 64, 4096) == (1024, 256, 512)
    pre, suf, ctx = fit_budgets(30000, 3000, 3000, 2048, 4096)
    assert pre + suf + ctx + 2048 <= 4096 and pre > suf and suf == ctx


def test_prompt_from_cached_line_starts_matches_full_scan(tiny_tokenizer):
    from kog_lsp.positions import line_starts

    text = DOC * 3
    starts = line_starts(text)
    for cur in (10, len(text) // 2, len(text) - 5, text.index("def f150") + 3):
        a = build_prompt(tiny_tokenizer, text, cur, prefix_tokens=200, suffix_tokens=40)
        b = build_prompt(tiny_tokenizer, text, cur, prefix_tokens=200, suffix_tokens=40, starts=starts)
        assert a.ids == b.ids and a.window_start == b.window_start
