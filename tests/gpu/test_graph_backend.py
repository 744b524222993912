"""Graph backend (bf16, CUDA graphs) against the fp32 reference model on random Qwen- and Llama-shaped models.

Run on the GPU machine: python -m pytest tests/gpu/test_graph_backend.py -q
"""
import pytest
import torch

from engine.backends.graph import MIN_BUCKET, GraphBackend, bucket_for
from engine.sampling import SamplingParams
from shapes import SHAPES, paired_models, poisoned_cache, rel_l2  # noqa: E402  (tests/gpu on sys.path)

MAX_LEN = 512
PROMPT = MIN_BUCKET - 24   # the decode crosses a bucket boundary (a second graph per slot)
STEPS = 80


def _models(cfg, seed):
    return paired_models(cfg, seed, MAX_LEN, norm_jitter=True)


def _poisoned_cache(cfg, dtype):
    return poisoned_cache(cfg, dtype, MAX_LEN, slots=3)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_teacher_forced_logits_and_greedy(shape):
    cfg = SHAPES[shape]
    fast, ref = _models(cfg, seed=11)
    fc, rc = _poisoned_cache(cfg, torch.bfloat16), _poisoned_cache(cfg, torch.float32)
    backend = GraphBackend(fast, fc)
    backend.warmup()
    fc.k.fill_(float("nan"))   # warm-up wrote position 0 of every slot; poison again
    fc.v.fill_(float("nan"))
    slot = 2
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, cfg.vocab_size, (PROMPT,), generator=g).cuda()
    lf = backend.prefill(slot, prompt, 0)
    lr = ref.forward(rc.k, rc.v, slot, prompt, 0)
    assert rel_l2(lf, lr) <= 1e-2
    # Teacher-forced: both consume the reference's greedy tokens.
    tok = int(lr.argmax())
    errs = []
    for i in range(STEPS):
        pos = PROMPT + i
        a = backend.decode(slot, tok, pos).clone()
        b = ref.forward(rc.k, rc.v, slot, torch.tensor([tok], device="cuda"), pos)
        assert torch.isfinite(a).all(), f"non-finite logits at step {i}"
        errs.append(rel_l2(a, b))
        tok = int(b.argmax())
    assert max(errs) <= 1e-2, f"max rel L2 {max(errs):.3g} at step {errs.index(max(errs))}"
    assert {bucket_for(PROMPT + i, MAX_LEN) for i in range(STEPS)} == {MIN_BUCKET, 2 * MIN_BUCKET}
    st = backend.stats()
    assert st["replays"] == STEPS and st["eager_steps"] == 0 and st["capture_error"] is None
    assert st["graphs"] == 3 * 3   # warmup captured 3 slots x windows 128, 256, 512
    for other in (0, 1):
        assert torch.isnan(fc.k[other]).all()
    assert torch.isnan(fc.k[slot, :, :, PROMPT + STEPS:]).all()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_tokens_agree_with_reference(shape):
    cfg = SHAPES[shape]
    fast, ref = _models(cfg, seed=23)
    fc, rc = _poisoned_cache(cfg, torch.bfloat16), _poisoned_cache(cfg, torch.float32)
    backend = GraphBackend(fast, fc)
    prompt = torch.randint(0, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(9)).cuda()
    first = int(backend.prefill(0, prompt, 0).argmax())
    toks = [first] + list(backend.decode_loop(0, first, 40, 70, SamplingParams(), frozenset(), None))
    assert len(toks) == 71
    # Replay the backend's own tokens through the fp32 reference: each must be the reference's argmax, or
    # within a bf16-sized margin of it (random weights leave near-ties).
    lr = ref.forward(rc.k, rc.v, 0, prompt, 0)
    near_ties = 0
    for i, t in enumerate(toks):
        gap = (lr.max() - lr[t]).item()
        spread = lr.std().item()
        assert gap <= 0.05 * spread, f"step {i}: token {t} is {gap:.3g} below the reference max"
        near_ties += gap > 0
        lr = ref.forward(rc.k, rc.v, 0, torch.tensor([t], device="cuda"), 40 + i)
    assert near_ties <= len(toks) // 4


def test_engine_graph_backend_on_cuda(tmp_path):
    from engine import Engine
    from engine.testing import make_tiny_checkpoint
    d = make_tiny_checkpoint(tmp_path, arch="qwen2", hidden_size=128, n_heads=4, n_kv_heads=2, head_dim=32)
    e = Engine.load(str(d), device="cuda", backend="graph", max_seq_len=256)
    s = e.stats()
    assert s["backend"] == "graph" and s["dtype"] == "bfloat16" and "graph selected" in s["backend_reason"]
    ids = e.tokenizer.encode("def main():\n    return")
    r = e.complete(ids, max_new_tokens=20, stop_ids=())
    assert len(r.token_ids) == 20 and r.decode_tok_s > 0
    r2 = e.complete(ids + r.token_ids[:5], max_new_tokens=5, stop_ids=())
    assert r2.reused_tokens == len(ids) + 4
