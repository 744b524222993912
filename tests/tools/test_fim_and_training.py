"""FIM sample construction, tokenizer, tiny training and evaluation helpers of tools/ (CPU, seconds)."""
import random

import numpy as np
import pytest
import torch

from corpus import Document
from fim_data import FimIds, build_specs, choose_fim_span, make_sample, split_windows, tokenize_specs
from train_tokenizer import SPECIAL_TOKENS, save_tokenizer, train_tokenizer

SRC = '''import os


class Store:
    """A tiny key-value store."""

    def __init__(self, path):
        self.path = path
        self.data = {}

    def get(self, key, default=None):
        return self.data.get(key, default)

    def put(self, key, value):
        self.data[key] = value
        return value
'''


@pytest.fixture(scope="module")
def tok():
    texts = [SRC.replace("Store", f"Store{i}").replace("key", k) for i, k in enumerate(["key", "name", "k"] * 20)]
    return train_tokenizer(texts, vocab_size=400, min_frequency=1)


@pytest.fixture(scope="module")
def ids(tok):
    return FimIds.from_tokenizer(tok)


def test_special_tokens_follow_qwen_fim_convention(tok, ids):
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert (ids.prefix, ids.middle, ids.suffix, ids.eos) == (1, 2, 3, 0)
    enc = tok.encode("<|fim_prefix|>x = 1<|fim_suffix|>\n<|fim_middle|>", add_special_tokens=False).ids
    assert enc[0] == ids.prefix and ids.suffix in enc and enc[-1] == ids.middle
    text = "def f(é):\n\treturn '✓'  # ünïcode\n"
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text   # byte-level round trip


def test_saved_tokenizer_loads_in_hf_transformers(tok, tmp_path):
    transformers = pytest.importorskip("transformers")
    save_tokenizer(tok, tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert hf.eos_token == "<|endoftext|>" and hf.eos_token_id == 0
    assert hf.encode(SRC, add_special_tokens=False) == tok.encode(SRC, add_special_tokens=False).ids


def test_split_windows_keeps_the_text_and_cuts_at_line_ends():
    ws = split_windows(SRC, 80)
    assert "".join(ws) == SRC
    assert all(w.endswith("\n") for w in ws)
    assert all(len(w) <= 80 for w in ws)


def test_fim_spans_are_valid_and_mostly_line_shaped():
    rng = random.Random(0)
    line_ends = {i + 1 for i, c in enumerate(SRC) if c == "\n"}
    line_like = 0
    for _ in range(400):
        s, e = choose_fim_span(SRC, rng)
        assert 0 <= s <= e <= len(SRC)
        line_like += e in line_ends or (e + 1) in line_ends
    assert line_like > 400 * 0.6           # lines and blocks are 70% of spans; random ends rarely hit a line end


def test_make_sample_is_psm_and_reconstructs_the_text(ids):
    rng = random.Random(3)
    n_fim = 0
    for _ in range(50):
        spec = make_sample(SRC, "pkg/store.py", rng, ids, fim_rate=0.5)
        p = spec.parts
        if ids.middle in p:
            n_fim += 1
            assert [p[0], p[2], p[4], p[6]] == [ids.prefix, ids.suffix, ids.middle, ids.eos]
            assert p[1] + p[5] + p[3] == SRC               # prefix + middle + suffix is the window
        else:
            assert p == [SRC, ids.eos]
    assert 10 < n_fim < 40


def test_context_and_suffix_cut(ids):
    rng = random.Random(1)
    spec = make_sample(SRC, "pkg/store.py", rng, ids, fim_rate=1.0, context=[("pkg/other.py", "X = 1\n")],
                       max_suffix_chars=40)
    p = spec.parts
    assert p[:4] == [ids.file_sep, "pkg/other.py\nX = 1\n", ids.file_sep, "pkg/store.py\n"]
    suffix = p[p.index(ids.suffix) + 1]
    assert len(suffix) <= 40 and (suffix == "" or suffix.endswith("\n"))


def test_build_specs_and_tokenize_are_deterministic(tok, ids):
    docs = [Document("pkg", f"pkg/m{i}.py", SRC.replace("Store", f"S{i}")) for i in range(6)]
    a = tokenize_specs(build_specs(docs, ids, seed=5, window_chars=200), tok)
    b = tokenize_specs(build_specs(docs, ids, seed=5, window_chars=200), tok)
    c = tokenize_specs(build_specs(docs, ids, seed=6, window_chars=200), tok)
    assert a.dtype == np.int32 and np.array_equal(a, b) and not np.array_equal(a, c)
    assert (a == ids.eos).sum() >= 6                      # every sample ends with <|endoftext|>
    spec = build_specs(docs[:1], ids, seed=0, window_chars=10_000)[0]
    manual = []
    for part in spec.parts:
        manual += tok.encode(part, add_special_tokens=False).ids if isinstance(part, str) else [part]
    assert tokenize_specs([spec], tok).tolist() == manual


def test_tiny_training_and_eval_helpers(tok, ids):
    pytest.importorskip("transformers")
    from eval_model import greedy_batch, line_tasks, perplexity, pick_lines
    from train_model import build_model, lr_at, make_config, train

    assert lr_at(0, 100, 1.0, 10) == pytest.approx(0.1)
    assert lr_at(10, 100, 1.0, 10) == pytest.approx(1.0)
    assert lr_at(100, 100, 1.0, 10) == pytest.approx(0.1)
    docs = [Document("pkg", f"pkg/m{i}.py", SRC.replace("Store", f"S{i}")) for i in range(8)]
    stream = tokenize_specs(build_specs(docs, ids, seed=0, window_chars=300), tok)
    cfg = make_config("tiny", tok.get_vocab_size(), ids.eos)
    assert cfg.vocab_size % 64 == 0 and cfg.tie_word_embeddings
    torch.manual_seed(0)
    model = build_model(cfg, seed=0)
    stats = train(model, stream, seq_len=64, batch=4, device="cpu", seed=0, train_seconds=60, max_steps=12,
                  peak_lr=3e-3, warmup=2, calib_steps=8, log=lambda m: None)
    assert stats["steps"] == 12 and stats["tokens_trained"] == 12 * 4 * 64
    assert stats["loss_curve"][-1] < stats["loss_curve"][0]
    model.eval()
    ppl = perplexity(model, tok, docs, seq_len=64, max_tokens=512, device="cpu", eos_id=ids.eos)
    assert 1.0 < ppl["perplexity"] < cfg.vocab_size and ppl["bits_per_byte"] > 0
    assert pick_lines(docs, 5, seed=1) == pick_lines(docs, 5, seed=1)
    prompts = [stream[i:i + n].tolist() for i, n in ((0, 5), (40, 19), (100, 11))]
    batched = greedy_batch(model, prompts, max_new=6, eos_id=ids.eos, device="cpu", batch=3)
    single = [greedy_batch(model, [p], max_new=6, eos_id=ids.eos, device="cpu", batch=1)[0] for p in prompts]
    assert batched == single                               # left padding does not change greedy output
    res = line_tasks(model, tok, docs, n=6, seed=0, device="cpu", fim_ids=ids)
    assert res["samples"] == 6 and 0.0 <= res["fim_line_exact_match"] <= 1.0 and len(res["examples"]) == 6


def test_pack_aligned_keeps_every_fim_sample_inside_one_window(tok, ids):
    from fim_data import pack_aligned
    docs = [Document("pkg", f"pkg/m{i}.py", SRC.replace("Store", f"S{i}")) for i in range(12)]
    specs = build_specs(docs, ids, seed=2, window_chars=250, fim_rate=0.7, min_window_chars=60)
    seq = 96
    toks, mask, dropped = pack_aligned(specs, tok, seq, ids.middle, ids.eos)
    assert len(toks) == len(mask) and len(toks) % seq == 0
    n_fim_in = 0
    for w in range(len(toks) // seq):
        win = toks[w * seq:(w + 1) * seq].tolist()
        starts = [i for i, t in enumerate(win) if t == ids.prefix]
        for i in starts:                                    # prefix, suffix, middle and the closing eos follow
            rest = win[i:]
            assert ids.suffix in rest and ids.middle in rest
            assert ids.eos in rest[rest.index(ids.middle):]
        n_fim_in += len(starts)
        # no window starts inside a FIM sample: a middle never appears before its prefix
        if ids.middle in win:
            assert ids.prefix in win[: win.index(ids.middle)]
    n_fim = sum(1 for s in specs if ids.middle in s.parts)
    assert n_fim_in == n_fim - dropped and n_fim_in > 0
    assert not mask[toks != ids.eos].size or mask[toks != ids.eos].all()   # only padding is masked


def _tiny_run(tok, ids, **kw):
    from train_model import build_model, make_config, train

    docs = [Document("pkg", f"pkg/m{i}.py", SRC.replace("Store", f"S{i}")) for i in range(8)]
    stream = tokenize_specs(build_specs(docs, ids, seed=0, window_chars=300), tok)
    model = build_model(make_config("tiny", tok.get_vocab_size(), ids.eos), seed=0)
    stats = train(model, stream, seq_len=64, batch=4, device="cpu", seed=0, train_seconds=60, max_steps=3,
                  peak_lr=3e-3, warmup=2, calib_steps=8, log=lambda m: None, **kw)
    return model, stats


def test_compiled_training_step_matches_eager_and_falls_back(tok, ids, monkeypatch):
    """--compile trains the same weights through torch.compile (AOT autograd here, no C++ build on CI; inductor on
    the GPU); a backend that fails makes that step and the rest run eagerly, with the reason in the stats."""
    pytest.importorskip("transformers")
    eager, s0 = _tiny_run(tok, ids)
    assert s0["compile"] == {"backend": None, "used": False, "error": None}
    comp, s1 = _tiny_run(tok, ids, compile_backend="aot_eager")
    assert s1["compile"]["used"] and s1["compile"]["error"] is None and s1["steps"] == 3
    assert max((a - b).abs().max().item() for a, b in zip(eager.parameters(), comp.parameters())) < 1e-4

    def broken(model, backend=None):
        def fn(*a, **k):
            raise RuntimeError("no compiler here")
        return fn
    monkeypatch.setattr(torch, "compile", broken)
    fell, s2 = _tiny_run(tok, ids, compile_backend="inductor")
    assert not s2["compile"]["used"] and "no compiler here" in s2["compile"]["error"] and s2["steps"] == 3
    assert all(torch.equal(a, b) for a, b in zip(eager.parameters(), fell.parameters()))
