"""Pre-token-boundary FIM splits, SPM samples, and the eval's cursor variants / healing / SPM prompts (CPU)."""
import random

import pytest
import torch

from corpus import Document
from fim_data import FimIds, build_specs, choose_fim_span, make_sample, pretoken_snapper
from train_tokenizer import train_tokenizer

SRC = '''import os.path


def load(items, key=None):
    s = sorted(items, key=key)
    for name in s:
        print(os.path.join("x", name))
    return {k: v for k, v in s}
'''


@pytest.fixture(scope="module")
def tok():
    texts = [SRC.replace("load", f"load{i}").replace("name", n) for i, n in enumerate(["name", "item", "n"] * 20)]
    return train_tokenizer(texts, vocab_size=400, min_frequency=1)


@pytest.fixture(scope="module")
def ids(tok):
    return FimIds.from_tokenizer(tok)


def _enc(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


def test_snapped_split_tokenizes_like_the_whole_text(tok):
    snap = pretoken_snapper(tok)
    whole = _enc(tok, SRC)
    starts = {a for _, (a, _) in tok.pre_tokenizer.pre_tokenize_str(SRC)}
    moved = 0
    for k in range(len(SRC) + 1):
        s = snap(SRC, k)
        assert s <= k and (s in starts or s in (0, len(SRC)))
        assert _enc(tok, SRC[:s]) + _enc(tok, SRC[s:]) == whole, (k, s)
        moved += s != k
    assert moved > len(SRC) // 3          # most character positions are inside a pre-token
    tricky = "x = f(a)\n\n   \n\tif y:  \n        pass\n\n\n"   # blank lines, trailing spaces, tabs
    for k in range(len(tricky) + 1):
        s = snap(tricky, k)
        assert s <= k and _enc(tok, tricky[:s]) + _enc(tok, tricky[s:]) == _enc(tok, tricky), (k, s)


def test_snapped_spans_and_spm_samples(tok, ids):
    snap = pretoken_snapper(tok)
    rng = random.Random(0)
    for _ in range(200):
        s, e = choose_fim_span(SRC, rng, snap=snap)
        assert 0 <= s <= e <= len(SRC) and snap(SRC, s) == s
    n_spm = n_psm = 0
    for _ in range(60):
        p = make_sample(SRC, "pkg/a.py", rng, ids, fim_rate=1.0, snap=snap, spm_rate=0.5).parts
        if p[1] == ids.suffix:             # SPM: <pre><suf>S<mid>P M<eos>
            n_spm += 1
            assert [p[0], p[1], p[3], p[6]] == [ids.prefix, ids.suffix, ids.middle, ids.eos]
            assert p[4] + p[5] + p[2] == SRC
        else:
            n_psm += 1
            assert p[4] == ids.middle and p[1] + p[5] + p[3] == SRC
    assert n_spm > 10 and n_psm > 10


def test_spm_rate_zero_keeps_the_old_data(ids):
    docs = [Document("pkg", f"pkg/m{i}.py", SRC.replace("load", f"f{i}")) for i in range(5)]
    a = build_specs(docs, ids, seed=3, window_chars=120, fim_rate=0.9)
    b = build_specs(docs, ids, seed=3, window_chars=120, fim_rate=0.9, spm_rate=0.0, snap=None)
    assert [x.parts for x in a] == [x.parts for x in b]


def test_cursor_variants_rebuild_the_text():
    from eval_model import VARIANTS, cursor_split
    before, line, after = "def f():\n", "    return os.path.join(a)\n", "x = 1\n"
    rng = random.Random(0)
    for v in VARIANTS:
        pre, head, post = cursor_split(before, line, after, v, rng)
        assert pre.startswith(before) and pre[len(before):] == head and line.startswith(head)
        middle = line if v == "line" else line[len(head):].rstrip("\n")    # what the model must write
        assert pre + middle + post == before + line + after
        assert v == "line" or post.startswith("\n")                        # the line's end stays after the cursor
    assert cursor_split(before, line, after, "indent", rng)[1] == "    "


def test_eval_heals_and_builds_spm_prompts(tok, ids):
    pytest.importorskip("transformers")
    from eval_model import greedy_batch, line_tasks
    from train_model import build_model, make_config

    from engine import healing
    from engine.tokenizer import Tokenizer as EngineTokenizer
    model = build_model(make_config("tiny", tok.get_vocab_size(), ids.eos), seed=0).eval()
    vocab = healing.heal_vocab(EngineTokenizer(tok))
    prompt = _enc(tok, "    s = sorted(")
    hp = healing.plan(vocab, prompt, len(prompt))
    assert hp is not None and hp.text.endswith("(")
    out = greedy_batch(model, [hp.ids], max_new=5, eos_id=ids.eos, device="cpu", batch=1, heal_vocab=vocab,
                       removed=[hp.removed])[0]
    spelled = b"".join(vocab.spelling.get(t, b"") for t in out)
    assert spelled.startswith(hp.removed) or hp.removed.startswith(spelled)
    docs = [Document("pkg", f"pkg/m{i}.py", SRC.replace("load", f"f{i}")) for i in range(4)]
    torch.manual_seed(0)
    for order in ("psm", "spm"):
        for variant in ("indent", "mid"):
            r = line_tasks(model, tok, docs, n=5, seed=0, device="cpu", fim_ids=ids, variant=variant, heal=True,
                           order=order)
            assert r["samples"] == 5 and r["order"] == order and r["variant"] == variant
            assert r["healed_next_line_prompts"] > 0
    with pytest.raises(ValueError):
        line_tasks(model, tok, docs, n=1, seed=0, device="cpu", fim_ids=ids, order="pms")
