"""The engine on the tensor-parallel monokernel (tp=KOG_TEST_TP, default 2, exact mode) against the single-GPU
monokernel engine, on a random-weight Qwen2.5-Coder-1.5B-shape model: the same greedy tokens for a prompt + 64
tokens, then for a request extending it (prefix-cache reuse after a TP decode: the decoded K/V were copied back from
the ranks), the engine's cache equal to every rank's cache bit for bit on the decoded positions (with 4 or 8 ranks
several ranks hold each KV head: all of them), a cancelled stream leaving a consistent slot, and stats showing the
tp size and an exchange wait. Skips without KOG_TEST_TP sm_90 GPUs.

Device run: NCCL_NVLS_ENABLE=0 python3 -m pytest -q -s tests/gpu/test_tp_engine_gpu.py
(4 ranks: KOG_TEST_TP=4 NCCL_NVLS_ENABLE=0 python3 -m pytest -q -s tests/gpu/test_tp_engine_gpu.py)
(not test_tp_engine.py: tests/tp/ has a module of that name, and pytest cannot collect both)"""
from __future__ import annotations

import threading

import torch
from tp_gpus import TP, needs_tp_gpus  # tests/gpu is on sys.path under pytest

pytestmark = needs_tp_gpus

SHAPE = "qwen2.5-coder-1.5b"
ML, PROMPT, NEW = 1024, 200, 64
NEAR_TIE = 2e-3     # logprob gap under which TP ranks and one GPU may pick different tokens (summation order)


class Pair:
    def __init__(self):
        from engine import Engine
        from engine.config import preset
        from kernels.testing import random_model
        self.cfg = cfg = preset(SHAPE)
        self.model = random_model(cfg, device="cuda:0", max_len=ML, seed=11)
        self.one = Engine(self.model, None, kv_slots=2, backend="monokernel")
        self.tp = Engine(self.model, None, kv_slots=2, backend="monokernel", tp=TP)
        g = torch.Generator().manual_seed(12)
        self.prompt = torch.randint(0, cfg.vocab_size, (PROMPT,), generator=g).tolist()
        self.extra = torch.randint(0, cfg.vocab_size, (37,), generator=g).tolist()


_pair: list[Pair] = []


def pair() -> Pair:
    if not _pair:
        _pair.append(Pair())
    return _pair[0]


def agree(p: Pair, prompt: list[int], a: list[int], b: list[int]) -> int:
    """Number of leading tokens equal in a (one GPU) and b (tp=TP). A difference is allowed only at a near-tie of
    the single-GPU model (scored on the reference path), and the comparison stops there."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            sc = p.one.score(prompt + a[:i] + [y])
            gap = sc.top_logprobs[-1] - sc.token_logprobs[-1]
            print(f"tokens differ at {i}: one GPU {x}, tp={TP} {y}, logprob gap {gap:.2e}")
            assert gap < NEAR_TIE, (i, x, y, gap)
            return i
    return len(a)


def test_engine_tp_selected_and_reports_tp():
    p = pair()
    s = p.tp.stats()
    print(f"\n{s['backend_detail']}\nreason: {s['backend_reason']}")
    assert s["backend"] == "monokernel" and s["tp"] == TP and s["tp_mode"] == "exact"
    bs = s["backend_stats"]
    assert bs["tp"] == TP and bs["tp_devices"] == [f"cuda:{i}" for i in range(TP)] and bs["vocab_parallel"]


def test_greedy_tokens_match_single_gpu_then_prefix_reuse_after_tp_decode():
    p = pair()
    none = frozenset()
    r1 = p.one.complete(p.prompt, max_new_tokens=NEW, stop_ids=none)
    t1 = p.tp.complete(p.prompt, max_new_tokens=NEW, stop_ids=none)
    print(f"\none GPU {r1.decode_tok_s:.0f} tok/s, tp={TP} {t1.decode_tok_s:.0f} tok/s; "
          f"tp backend stats {p.tp.stats()['backend_stats']}")
    assert len(r1.token_ids) == len(t1.token_ids) == NEW
    n = agree(p, p.prompt, r1.token_ids, t1.token_ids)
    print(f"first request: {n}/{NEW} tokens equal")

    # Decoded positions: the engine's cache holds the ranks' K/V bit for bit, and close to the one-GPU values
    # where both fed the same tokens.
    tp_b = p.tp.backend
    slot = next(i for i, s in enumerate(p.tp.cache.slots) if s.ids[:PROMPT] == p.prompt)
    lo, hi = PROMPT, PROMPT + NEW - 1
    for r, sh in enumerate(tp_b.mk.plan.ranks):
        k0, k1 = sh.kv_heads
        assert torch.equal(p.tp.cache.k[slot, :, k0:k1, lo:hi], tp_b.mk.k_caches[r][slot, :, :, lo:hi].to("cuda:0"))
        assert torch.equal(p.tp.cache.v[slot, :, k0:k1, lo:hi], tp_b.mk.v_caches[r][slot, :, :, lo:hi].to("cuda:0"))
    s1 = next(i for i, s in enumerate(p.one.cache.slots) if s.ids[:PROMPT] == p.prompt)
    same = min(n, NEW - 1)
    a, b = p.one.cache.k[s1, :, :, lo:lo + same].double(), p.tp.cache.k[slot, :, :, lo:lo + same].double()
    err = ((a - b).norm() / a.norm()).item()
    print(f"decoded K over {same} positions: tp={TP} vs one GPU rel L2 {err:.2e}")
    assert err < 1e-2

    # A second request extending the first (the TP engine's tokens) reuses the TP-decoded prefix.
    p2 = p.prompt + t1.token_ids + p.extra
    r2 = p.one.complete(p2, max_new_tokens=NEW, stop_ids=none)
    t2 = p.tp.complete(p2, max_new_tokens=NEW, stop_ids=none)
    assert t2.reused_tokens == PROMPT + NEW - 1, t2.reused_tokens
    m = agree(p, p2, r2.token_ids, t2.token_ids)
    print(f"extending request: tp={TP} reused {t2.reused_tokens} (one GPU {r2.reused_tokens}), {m}/{NEW} tokens equal")
    bs = p.tp.stats()["backend_stats"]
    print(f"exchange wait per token: last {bs['exchange_wait_us']} us (max over CTAs {bs['exchange_wait_max_us']}), "
          f"mean {bs['exchange_wait_mean_us']} us; K/V positions to ranks {bs['kv_to_ranks_positions']}, back "
          f"{bs['kv_from_ranks_positions']}, copies {bs['kv_copy_host_ms']:.2f} ms")
    assert isinstance(bs["exchange_wait_us"], float) and bs["exchange_wait_us"] >= 0.0
    assert bs["kv_from_ranks_positions"] >= NEW - 1


def test_cancelled_stream_then_extension_matches_single_gpu():
    p = pair()
    prompt = p.prompt[:120] + p.extra
    cancel = threading.Event()
    got = 0
    for ev in p.tp.generate(prompt, max_new_tokens=200, stop_ids=frozenset(), cancel=cancel):
        got += 1
        if got == 10:
            cancel.set()
    res = p.tp.last_result
    assert res.finish_reason == "cancelled" and 10 <= len(res.token_ids) < 200
    # the slot keeps what was fed; extending it must decode like one GPU from the same tokens
    p2 = prompt + res.token_ids + p.extra[:5]
    t = p.tp.complete(p2, max_new_tokens=32, stop_ids=frozenset())
    r = p.one.complete(p2, max_new_tokens=32, stop_ids=frozenset())
    assert t.reused_tokens >= len(prompt) + len(res.token_ids) - 1
    m = agree(p, p2, r.token_ids, t.token_ids)
    print(f"\nafter a cancel at {len(res.token_ids)} tokens: reused {t.reused_tokens}, {m}/32 tokens equal")
    assert len(t.token_ids) == 32
