"""Monokernel on a Hopper GPU: teacher-forced logits vs the fp32 reference for real model shapes (random
weights), KV writes, poisoned unused KV, reproducibility, cancellation, sampling, and the engine end to end.
Skips cleanly without CUDA / sm_90."""
from __future__ import annotations

import time

import pytest
import torch

cuda_ok = torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0)
pytestmark = pytest.mark.skipif(not cuda_ok, reason="needs an sm_90 (Hopper) CUDA GPU")

SHAPES = ["qwen2.5-coder-0.5b", "llama-3.2-1b", "qwen2.5-coder-1.5b"]
PROMPT, STEPS = 64, 256


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def fp32_reference(m16, max_len: int):
    """The fp32 reference of a bf16 model: its upcast copy and a zeroed one-slot fp32 K / V cache of max_len
    positions. -> (m32, k32, v32)"""
    from kernels.testing import upcast
    m32 = upcast(m16)
    cfg = m32.cfg
    shape = (1, cfg.n_layers, cfg.n_kv_heads, max_len, cfg.head_dim)
    return m32, torch.zeros(shape, device=m16.device), torch.zeros(shape, device=m16.device)


class Setup:
    def __init__(self, name, max_len=1024, seed=0):
        """name: an engine.config preset or a ModelConfig."""
        from engine.config import preset
        from kernels.runtime import Monokernel
        from kernels.testing import random_model
        self.cfg = cfg = preset(name) if isinstance(name, str) else name
        self.m16 = random_model(cfg, max_len=max_len, seed=seed)
        self.m32, self.k32, self.v32 = fp32_reference(self.m16, max_len)
        shape = self.k32.shape
        self.k16 = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
        self.v16 = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
        g = torch.Generator(device="cpu").manual_seed(seed + 1)
        self.ids = torch.randint(0, cfg.vocab_size, (PROMPT + STEPS,), generator=g)
        self.m32.forward(self.k32, self.v32, 0, self.ids[:PROMPT].cuda(), 0)
        self.k16[:, :, :, :PROMPT] = self.k32[:, :, :, :PROMPT].bfloat16()
        self.v16[:, :, :, :PROMPT] = self.v32[:, :, :, :PROMPT].bfloat16()
        self.k16_0, self.v16_0 = self.k16.clone(), self.v16.clone()
        self.mk = Monokernel(self.m16, self.k16, self.v16, max_steps=4096)

    def restore(self):
        self.k16.copy_(self.k16_0)
        self.v16.copy_(self.v16_0)


_cache: dict[str, Setup] = {}


HD96 = "llama-small-hd96"   # tests/gpu/shapes.py's small Llama with head_dim 96 (setup_for builds it)


def setup_for(name) -> Setup:
    if name not in _cache:
        _cache.clear()
        torch.cuda.empty_cache()
        if name == HD96:
            from shapes import SHAPES as SMALL   # tests/gpu is on sys.path under pytest
            _cache[name] = Setup(SMALL["llama"].replace(head_dim=96, hidden_size=768, name=HD96))
        else:
            _cache[name] = Setup(name)
    return _cache[name]


def bf16_eager_errors(s: Setup, forced_ids: torch.Tensor, ref: torch.Tensor) -> list[float]:
    """The same teacher-forced steps on the bf16 eager model (engine.model, bf16 weights, activations and KV
    cache), rel L2 per step against the fp32 reference: what bf16 arithmetic alone costs at this shape."""
    k, v = torch.nan_to_num(s.k16_0, nan=0.0), torch.nan_to_num(s.v16_0, nan=0.0)
    return [rel(s.m16.forward(k, v, 0, forced_ids[j:j + 1].cuda(), PROMPT + j).float(), ref[j])
            for j in range(len(ref))]


def check_teacher_forced(s: Setup, name: str, steps: int = STEPS) -> None:
    """Teacher-forced logits vs the fp32 reference at every step: rel L2 <= 1e-2 (shared/GPU.md), or, where bf16
    eager arithmetic itself misses that at this shape, at most 1.25x the bf16 eager error; greedy picks a maximal
    logit; KV written at the decoded positions only; a rerun bit-identical."""
    cfg = s.cfg
    forced = s.ids[PROMPT:PROMPT + steps].tolist()
    ref = torch.stack([s.m32.forward(s.k32, s.v32, 0, s.ids[PROMPT + j:PROMPT + j + 1].cuda(), PROMPT + j)
                       for j in range(steps)])
    s.restore()
    out = torch.full((steps, cfg.vocab_size), float("nan"), device="cuda")
    t0 = time.perf_counter()
    toks, reason = s.mk.run(0, forced[0], PROMPT, steps, forced=forced, logits_out=out)
    dt = time.perf_counter() - t0
    assert reason == "length" and len(toks) == steps
    errs = [rel(out[j], ref[j]) for j in range(steps)]
    tol = 1e-2
    line = (f"\n{name}: teacher-forced rel L2 max {max(errs):.2e} mean {sum(errs) / len(errs):.2e} "
            f"({steps} steps, {dt * 1e3:.1f} ms incl. launch)")
    if max(errs) > tol:
        eager = bf16_eager_errors(s, s.ids[PROMPT:PROMPT + steps], ref)
        tol = max(tol, 1.25 * max(eager))
        line += f"; bf16 eager: max {max(eager):.2e} mean {sum(eager) / len(eager):.2e}"
    print(line)
    assert not torch.isnan(out).any()
    assert max(errs) <= tol, [(j, e) for j, e in enumerate(errs) if e > tol][:5]
    # the greedy sampler picked a maximal logit every step
    picked = out.gather(1, torch.tensor(toks, device="cuda")[:, None])[:, 0]
    assert torch.equal(picked, out.max(dim=1).values)
    # KV written at the decoded positions (bf16 vs fp32 reference), untouched beyond
    end = PROMPT + steps
    assert rel(s.k16[:, :, :, PROMPT:end].float(), s.k32[:, :, :, PROMPT:end]) < 1e-2
    assert rel(s.v16[:, :, :, PROMPT:end].float(), s.v32[:, :, :, PROMPT:end]) < 1e-2
    assert torch.isnan(s.k16[:, :, :, end:].float()).all() and torch.isnan(s.v16[:, :, :, end:].float()).all()
    # two runs are bit-identical (a moving result would be a race)
    s.restore()
    out2 = torch.full_like(out, float("nan"))
    toks2, _ = s.mk.run(0, forced[0], PROMPT, steps, forced=forced, logits_out=out2)
    assert torch.equal(out, out2) and toks == toks2


@pytest.mark.parametrize("name", SHAPES + ["dense-2b"])   # dense-2b: head_dim 96
def test_teacher_forced_logits_match_fp32_reference(name):
    check_teacher_forced(setup_for(name), name)


def test_head_dim_96_small_shape_matches_fp32_reference():
    """head_dim 96 (12 16-byte chunks per V row: lanes 24-31 idle in the value sums) on a small Llama shape, where
    bf16 rounding is far below the tolerance, so a wrong lane map cannot hide in it."""
    check_teacher_forced(setup_for(HD96), HD96, steps=64)


@pytest.mark.parametrize("name,launch", [("qwen2.5-coder-0.5b", "plain"), ("qwen2.5-coder-0.5b", "engine"),
                                         ("qwen2.5-coder-1.5b", "engine")])
def test_long_context_8k(name, launch):
    """Positions 8,190-8,197 of a random model against the fp32 reference: the plain launch, and the launch the engine
    picks (schedule.attn_cluster_model: clusters of 16 with the side launch, ATTNQ parts and k / v apart for both
    shapes), whose 16 splits per kv head then hold ~512 positions each: several staged chunks, so it runs the
    long-context library (Monokernel long_lib), which gives the default library's bits."""
    from engine.config import preset
    from kernels.runtime import Monokernel
    from kernels.schedule import Dims, attn_cluster_model
    from kernels.testing import random_model
    _cache.clear()
    torch.cuda.empty_cache()
    cfg = preset(name)
    P, N, ML = 8190, 8, 8256
    m16 = random_model(cfg, max_len=ML, seed=3)
    m32, k32, v32 = fp32_reference(m16, ML)
    shape = k32.shape
    ids = torch.randint(0, cfg.vocab_size, (P + N,), generator=torch.Generator().manual_seed(4)).cuda()
    m32.forward(k32, v32, 0, ids[:P], 0)
    k16 = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    v16 = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    k16[:, :, :, :P], v16[:, :, :, :P] = k32[:, :, :, :P].bfloat16(), v32[:, :, :, :P].bfloat16()
    ref = torch.stack([m32.forward(k32, v32, 0, ids[P + j:P + j + 1], P + j) for j in range(N)])
    cluster = attn_cluster_model(Dims.of(cfg)) if launch == "engine" else 0
    mk = Monokernel(m16, k16, v16, max_steps=64, attn_cluster=cluster)
    if launch == "engine":
        assert cluster and mk.sched.kv_apart
    out = torch.empty(N, cfg.vocab_size, device="cuda")
    mk.run(0, int(ids[P]), P, N, forced=ids[P:].tolist(), logits_out=out)
    assert not mk.ran_alone()
    errs = [rel(out[j], ref[j]) for j in range(N)]
    print(f"\n{name} {launch} launch, long context pos {P}..{P + N - 1}: rel L2 max {max(errs):.2e}")
    assert max(errs) <= 1e-2
    if launch == "engine":
        assert mk.lib_long is not None and mk.long_launches == 1, mk.long_lib_off
        assert mk.lib_for(0, 64) is mk.lib and mk.lib_for(P, N) is mk.lib_long
        lib_long, mk.lib_long = mk.lib_long, None   # the same launch on the default library (its rows rewritten)
        out2 = torch.empty_like(out)
        mk.run(0, int(ids[P]), P, N, forced=ids[P:].tolist(), logits_out=out2)
        mk.lib_long = lib_long
        print(f"{name}: the long-context library against the default one: max |diff| "
              f"{(out - out2).abs().max().item():.2e}")
        assert torch.equal(out, out2) and mk.long_launches == 1


def test_cancel_mid_run_and_sampling():
    s = setup_for(SHAPES[0])
    mk = s.mk
    s.restore()
    mk.launch(0, int(s.ids[PROMPT]), PROMPT, 900)
    t0 = time.monotonic()
    while mk.count() < 20:
        assert time.monotonic() - t0 < 10, "no tokens streamed"
        time.sleep(1e-4)
    mk.cancel()
    mk.wait(timeout_s=10)
    n = mk.count()
    print(f"\ncancel: stopped after {n} of 900 tokens, reason {mk.reason()}")
    assert mk.reason() == "cancelled" and 20 <= n < 900
    # temperature sampling: reproducible per seed, different across seeds
    runs = []
    for seed in (5, 5, 6):
        s.restore()
        runs.append(mk.run(0, int(s.ids[PROMPT]), PROMPT, 32, temperature=0.8, seed=seed)[0])
    assert runs[0] == runs[1] and runs[0] != runs[2]
    # top-p: every token inside the nucleus of the logits the kernel saw at that step
    s.restore()
    out = torch.empty(32, s.cfg.vocab_size, device="cuda")
    toks, _ = mk.run(0, int(s.ids[PROMPT]), PROMPT, 32, temperature=0.7, top_p=0.9, seed=1, logits_out=out)
    for j, t in enumerate(toks):
        p = torch.softmax(out[j].double() / 0.7, -1)
        sp, si = torch.sort(p, descending=True)
        n_keep = int(((torch.cumsum(sp, 0) - sp) < 0.9).sum())
        assert t in set(si[:n_keep + 8].tolist())   # + the candidate-set approximation's slack
    # stop ids: stop on the 5th greedy token
    s.restore()
    free, _ = mk.run(0, int(s.ids[PROMPT]), PROMPT, 16)
    s.restore()
    stopped, reason = mk.run(0, int(s.ids[PROMPT]), PROMPT, 16, stop_ids=[free[4]])
    assert reason == "stop" and stopped == free[:free.index(free[4]) + 1]


@pytest.mark.parametrize("name", [SHAPES[0], SHAPES[2]])
def test_screened_lm_head_picks_the_exact_heads_tokens(name):
    """The screened LM head (kernels/lm_screen.py: int8 screen, exact bf16 logits of the candidates) against the exact
    head of the same kernel at 256 teacher-forced steps: greedy tokens are the argmax of the exact logits, Gumbel-max
    samples (two temperatures) the exact head's with the same seed; flat logits (final norm zeroed: every row ties)
    overflow the candidate list, and that block runs exactly (lowest index wins, as in the exact head)."""
    s = setup_for(name)
    mk, V = s.mk, s.cfg.vocab_size
    assert mk.lm_screen_off is None, mk.lm_screen_off
    forced = s.ids[PROMPT:PROMPT + STEPS].tolist()
    s.restore()
    out = torch.empty(STEPS, V, device="cuda")
    exact, _ = mk.run(0, forced[0], PROMPT, STEPS, forced=forced, logits_out=out)
    assert mk.lm_mode == "exact (logits output)"
    s.restore()
    screened, _ = mk.run(0, forced[0], PROMPT, STEPS, forced=forced)
    assert mk.lm_mode == "screened"
    assert screened == exact == out.argmax(dim=1).tolist()
    over0 = mk.lm_over
    for T in (0.8, 1.5):
        got = {}
        for off in (None, "test: exact head"):
            mk.lm_screen_off = off
            s.restore()
            got[off] = mk.run(0, forced[0], PROMPT, STEPS, forced=forced, temperature=T, seed=11)[0]
        mk.lm_screen_off = None
        assert got[None] == got["test: exact head"], T
    assert mk.lm_over == over0   # random weights: every block's candidates fit
    norm = mk.final_norm.clone()
    try:
        mk.final_norm.zero_()
        s.restore()
        flat, _ = mk.run(0, forced[0], PROMPT, 4, forced=forced)
        assert mk.lm_mode == "screened" and mk.lm_over == over0 + 1 and flat == [0] * 4
    finally:
        mk.final_norm.copy_(norm)
    print(f"\n{name}: screened = exact head: {STEPS} greedy + 2 x {STEPS} sampled steps")


def test_engine_end_to_end(tmp_path):
    from engine import Engine
    from engine.testing import make_tiny_checkpoint
    from kernels.schedule import MLP_WEIGHTS
    _cache.clear()
    d = make_tiny_checkpoint(tmp_path / "m", arch="qwen2", hidden_size=256, n_heads=4, n_kv_heads=2, head_dim=64,
                             intermediate_size=512, n_layers=2, init_std=0.2)
    eng = Engine.load(d, device="cuda", backend="monokernel", max_seq_len=512, kv_slots=2)
    assert eng.stats()["backend"] == "monokernel", eng.stats()
    # small layers: the engine launches the attention in clusters of 16 (schedule.attn_cluster_model) and says so
    assert eng.stats()["backend_stats"]["attn_cluster"] == 16, eng.stats()
    assert "attention in clusters of 16" in eng.stats()["backend_detail"]
    # and QKV inside them (schedule.qkv_parts_default): 2 q heads per kv head in 2 parts, 2 x 2 of the 7 clusters
    assert eng.stats()["backend_stats"]["qkv_parts"] == 2, eng.stats()
    assert "QKV inside them in 2 parts per kv head" in eng.stats()["backend_detail"]
    # and the MLP's adds by cluster-rank pairs (schedule.mlp_pairs_default)
    assert eng.stats()["backend_stats"]["mlp_pairs"] is True, eng.stats()
    assert "MLP adds by cluster-rank pairs" in eng.stats()["backend_detail"]
    # and the MLP rows weighted by CTA class (schedule.mlp_weights_default: k / v rows apart)
    free, side = MLP_WEIGHTS
    assert eng.stats()["backend_stats"]["mlp_weights"] == [free, side], eng.stats()
    assert f"MLP rows {free:g} / {side:g} on the free / side CTAs" in eng.stats()["backend_detail"]
    # a 512-position cache: no launch restages, so neither the plain launch nor the long-context library is made
    assert eng.stats()["backend_stats"]["long_lib"] == "off (no launch restages within the cache)", eng.stats()
    assert eng.backend.mk_long is None and eng.backend.mk.lib_long is None
    prompt = list(range(10, 40))
    res = eng.complete(prompt, max_new_tokens=40, stop_ids=frozenset())
    assert len(res.token_ids) == 40
    sc = eng.score(prompt + res.token_ids)
    # each generated token is the reference's argmax (up to bf16 near-ties)
    for i, tok in enumerate(res.token_ids):
        j = len(prompt) - 1 + i
        assert sc.token_logprobs[j] >= sc.top_logprobs[j] - 0.05, (i, tok, sc.top_ids[j])


def test_engine_long_context_runs_the_plain_launch(tmp_path):
    """The engine's cluster launch runs the plain one for launches where its splits would restage K / V
    (MonokernelBackend._pick): from a prompt past that point the plain launch generates; one step from the prompt on
    both launches against the fp32 reference of the same prompt, where the plain launch must be as close as the
    clusters; a short launch afterwards runs the clusters again. (This random model's bf16 prefill alone moves its
    logprobs by ~0.3 at these positions, so the generated tokens are not compared with a bf16 score.)"""
    from engine import Engine
    from engine.testing import make_tiny_checkpoint
    _cache.clear()
    ML = 16384
    d = make_tiny_checkpoint(tmp_path / "m", arch="qwen2", hidden_size=256, n_heads=4, n_kv_heads=2, head_dim=64,
                             intermediate_size=512, n_layers=2, init_std=0.2)
    eng = Engine.load(d, device="cuda", backend="monokernel", max_seq_len=ML, kv_slots=1)
    be = eng.backend
    assert be.mk.attn_cluster == 16 and be.mk_long is not None and be.mk_long.attn_cluster == 0, eng.stats()
    assert eng.stats()["backend_stats"]["long_launch"] == "plain where the clusters restage"
    # the cluster launch's long-context library is neither built nor loaded: the plain launch takes its launches
    assert eng.stats()["backend_stats"]["long_lib"].startswith("off (the plain launch") and be.mk.lib_long is None
    first = next(p for p in range(256, ML, 256) if be.mk.restages(p, 1))
    print(f"\nthe tiny model's clusters restage from ~{first} positions ({be.mk.kv_stage_pos} staged per chunk)")
    assert first + 64 < ML - 32
    prompt = [10 + i % 150 for i in range(first + 64)]
    res = eng.complete(prompt, max_new_tokens=16, stop_ids=frozenset())
    assert len(res.token_ids) == 16 and eng.stats()["backend_stats"]["plain_long_launches"] >= 1, eng.stats()
    pos, tok = len(prompt), res.token_ids[0]
    n_long = eng.stats()["backend_stats"]["plain_long_launches"]
    plain = be.decode(0, tok, pos)
    assert eng.stats()["backend_stats"]["plain_long_launches"] == n_long + 1
    be.mk.launch(0, tok, pos, 1, logits_out=be._logits)
    be.mk.wait()
    clusters = be._logits[0].clone()
    m32, k32, v32 = fp32_reference(be.model, ML)
    m32.forward(k32, v32, 0, torch.tensor(prompt, device="cuda"), 0)
    ref = m32.forward(k32, v32, 0, torch.tensor([tok], device="cuda"), pos)
    e_plain, e_cl = rel(plain, ref), rel(clusters, ref)
    print(f"one step at {pos}: rel L2 to fp32, plain {e_plain:.2e}, clusters {e_cl:.2e}; "
          f"plain to clusters {rel(plain, clusters):.2e}")
    assert e_plain <= 1.5 * e_cl + 2e-3 and e_plain < 0.1
    n_long = eng.stats()["backend_stats"]["plain_long_launches"]
    res = eng.complete(list(range(10, 40)), max_new_tokens=8, stop_ids=frozenset())
    assert len(res.token_ids) == 8 and eng.stats()["backend_stats"]["plain_long_launches"] == n_long


@pytest.mark.parametrize("name", [SHAPES[0], SHAPES[2]])
def test_load_timing_variants_are_bit_identical(name):
    """Early weight loads, the L2 prefetch and the warp that releases each stage's counter (signal_warp) only move
    work in time: not a single bit may change."""
    s = setup_for(name)
    forced = s.ids[PROMPT:PROMPT + 32].tolist()
    outs = []
    assert s.mk.signal_warp == 15
    for early, pf, sw in ((1, 0, 15), (0, 0, 15), (1, 32768, 15), (1, 0, 0), (0, 0, 7)):
        s.restore()
        s.mk.early_loads, s.mk.prefetch_bytes, s.mk.signal_warp = early, pf, sw
        out = torch.empty(32, s.cfg.vocab_size, device="cuda")
        s.mk.run(0, forced[0], PROMPT, 32, forced=forced, logits_out=out)
        outs.append(out)
    s.mk.early_loads, s.mk.prefetch_bytes, s.mk.signal_warp = 1, 0, 15
    for i, o in enumerate(outs[1:], 1):
        assert torch.equal(outs[0], o), f"variant {i} changed bits"


@pytest.mark.parametrize("name", [SHAPES[0], SHAPES[1]])
def test_attention_split_length_only_changes_rounding(name):
    """attn_min_pos and attn_min_splits pick how many position splits carry the attention (every split at min_pos 1
    without the min_splits bound, 8 at min_splits 8 from position 64 on, one at min_pos 4096), and kv_stage_pos
    how many positions a split stages per chunk (1 and 16: many chunks, each merged into the running softmax; with
    min_splits 8, 16 positions per chunk also means ceil(n / 16) splits): the logits agree to rounding, and each
    setting is reproducible to the bit."""
    s = setup_for(name)
    forced = s.ids[PROMPT:PROMPT + 16].tolist()
    outs = {}
    cap = s.mk.kv_stage_pos
    default = (64, 8, cap)
    for key in ((1, 0, cap), default, (4096, 0, cap), default, (64, 8, 16), (4096, 0, 1), (1, 8, cap)):
        s.restore()
        s.mk.attn_min_pos, s.mk.attn_min_splits, s.mk.kv_stage_pos = key
        out = torch.empty(16, s.cfg.vocab_size, device="cuda")
        s.mk.run(0, forced[0], PROMPT, 16, forced=forced, logits_out=out)
        if key in outs:
            assert torch.equal(outs[key], out), "same split length, different bits"
        outs[key] = out
    s.mk.attn_min_pos, s.mk.attn_min_splits, s.mk.kv_stage_pos = default
    for key in ((1, 0, cap), (4096, 0, cap), (64, 8, 16), (4096, 0, 1), (1, 8, cap)):
        err = max(rel(outs[key][i], outs[default][i]) for i in range(16))
        print(f"{name}: attn_min_pos {key[0]}, attn_min_splits {key[1]}, kv_stage_pos {key[2]} vs {default}: "
              f"rel L2 max {err:.2e}")
        assert err < 2e-3, (key, err)


@pytest.mark.parametrize("cs", [8, 16])
@pytest.mark.parametrize("name", SHAPES + [HD96])
def test_attention_clusters_match_the_default_launch(name, cs):
    """Monokernel(attn_cluster=cs): clusters of cs CTAs (16: the non-portable size), each kv head's cs attention
    splits on one cluster, combined over distributed shared memory. With splits of 128 / cs positions (from half
    of the splits to all of them in use at positions 64..127) the teacher-forced logits match the fp32 reference,
    agree with the default launch to rounding, and repeat to the bit."""
    from kernels.runtime import Monokernel
    s = setup_for(name)
    steps = 64
    mk = Monokernel(s.m16, s.k16, s.v16, max_steps=steps + 8, attn_cluster=cs, side=False)
    assert mk.n_sm % cs == 0 and mk.n_side == 0 and mk.sched.n_splits == cs
    forced = s.ids[PROMPT:PROMPT + steps].tolist()
    ref = torch.stack([s.m32.forward(s.k32, s.v32, 0, s.ids[PROMPT + j:PROMPT + j + 1].cuda(), PROMPT + j)
                       for j in range(steps)])
    outs = []
    mk.attn_min_pos = 128 // cs
    s.mk.attn_min_pos = 16
    for kernel in (mk, mk, s.mk):
        s.restore()
        out = torch.full((steps, s.cfg.vocab_size), float("nan"), device="cuda")
        kernel.run(0, forced[0], PROMPT, steps, forced=forced, logits_out=out)
        outs.append(out)
    s.mk.attn_min_pos = 64
    err = max(rel(outs[0][j], ref[j]) for j in range(steps))
    between = max(rel(outs[0][j], outs[2][j]) for j in range(steps))
    print(f"\n{name}: attention in clusters of {cs} on {mk.n_sm} CTAs: teacher-forced rel L2 max {err:.2e}, "
          f"vs the default launch {between:.2e}")
    assert err <= 1e-2 and between <= 2e-3
    assert torch.equal(outs[0], outs[1])


def forced_twice(mk, s, forced: list[int]) -> list[torch.Tensor]:
    """The logits of two teacher-forced launches of `forced` from PROMPT on mk, the shape's cache restored before
    each (rows the launch did not write stay NaN)."""
    runs = []
    for _ in range(2):
        s.restore()
        out = torch.full((len(forced), s.cfg.vocab_size), float("nan"), device="cuda")
        mk.run(0, forced[0], PROMPT, len(forced), forced=forced, logits_out=out)
        runs.append(out)
    return runs


@pytest.mark.parametrize("name", [SHAPES[0], SHAPES[2]])
def test_paired_mlp_matches_reference_and_the_unpaired_launch(name):
    """Monokernel(mlp_pairs=True), the engine's default: its cluster launch with paired MLP instructions (cluster
    ranks 2k and 2k + 1 exchange their h rows over distributed shared memory and each adds half of the outputs).
    Teacher-forced logits match the fp32 reference and the unpaired launch to rounding, and each repeats to the bit,
    also run alone (without the side launch, on the main launch's own pairs), and with the MLP rows weighted by CTA
    class as the engine launches them (mlp_weights=None: schedule.mlp_weights_default, fewer rows on the CTAs without
    a part and on the side launch's), and the other way round (more on the free cluster's)."""
    from kernels import isa
    from kernels.runtime import Monokernel
    from kernels.schedule import MLP_WEIGHTS, mlp_partner
    s = setup_for(name)
    steps = 48
    forced = s.ids[PROMPT:PROMPT + steps].tolist()
    ref = torch.stack([s.m32.forward(s.k32, s.v32, 0, s.ids[PROMPT + j:PROMPT + j + 1].cuda(), PROMPT + j)
                       for j in range(steps)])
    outs = {}
    even = (1.0, 1.0)
    for pairs, alone, w in ((False, False, even), (True, False, even), (True, True, even), (True, False, None),
                            (True, False, (1.15, 0.85))):
        mk = Monokernel(s.m16, s.k16, s.v16, max_steps=steps + 8, attn_cluster=16, side=True, mlp_pairs=pairs,
                        mlp_weights=w)
        if w != even:
            assert mk.sched.mlp_weights == (w or MLP_WEIGHTS) and mk.sched.counts["MLP"] == mk.n_sm
        n_paired = sum(1 for lst in mk.sched.per_sm for ins in lst if ins[0] == isa.OPS["MLP"] and mlp_partner(ins[7]))
        assert (n_paired > 0) == pairs
        if alone:
            mk.side_wait_ns = 0
        runs = forced_twice(mk, s, forced)
        assert mk.ran_alone() == alone
        assert torch.equal(runs[0], runs[1]), f"pairs {pairs} alone {alone} weights {w}: a rerun changed a bit"
        outs[(pairs, alone, w)] = runs[0]
        del mk
    base = outs[(False, False, even)]
    for key, out in outs.items():
        err = max(rel(out[j], ref[j]) for j in range(steps))
        between = max(rel(out[j], base[j]) for j in range(steps))
        print(f"\n{name}: mlp_pairs {key[0]}{' alone' if key[1] else ''} weights {key[2] or 'default'}: "
              f"teacher-forced rel L2 max {err:.2e}, vs unpaired {between:.2e}")
        assert err <= 1e-2 and between <= 2e-3


@pytest.mark.parametrize("name", [SHAPES[0], SHAPES[2]])
def test_qkv_inside_the_clusters_matches_qkv_and_attn(name):
    """Monokernel(attn_cluster=16, qkv_parts=P): no QKV stage, each part of a kv head's q heads computes its q / k / v
    rows on its own cluster and shares them over distributed shared memory (schedule.build(qkv_parts=...)); with
    kv_apart the parts compute q rows only and the CTAs without a part the k / v rows. With the engine's default
    parts, with 3 parts, with 3 parts and kv_apart (also run alone, without the side launch: the free cluster takes
    the k / v rows; and with 2 positions staged per chunk, so the step's own K / V row lands in a later chunk, which
    each part stages from the cache row its own split wrote) and with the QKV stage (0): teacher-forced logits match
    the fp32 reference, the layouts agree to rounding, each repeats to the bit, and the KV cache holds the same rows."""
    from kernels.runtime import Monokernel
    from kernels.schedule import qkv_parts_default
    s = setup_for(name)
    steps = 48
    forced = s.ids[PROMPT:PROMPT + steps].tolist()
    ref = torch.stack([s.m32.forward(s.k32, s.v32, 0, s.ids[PROMPT + j:PROMPT + j + 1].cuda(), PROMPT + j)
                       for j in range(steps)])
    outs, kvs = {}, {}
    for parts, kv_apart, alone, stage in ((0, False, False, 0), (None, False, False, 0), (3, False, False, 0),
                                          (3, True, False, 0), (3, True, True, 0), (3, True, False, 2)):
        mk = Monokernel(s.m16, s.k16, s.v16, max_steps=steps + 8, attn_cluster=16, side=True, qkv_parts=parts,
                        kv_apart=kv_apart)
        if stage:
            mk.kv_stage_pos = stage
        want = qkv_parts_default(mk.dims, 16, mk.n_main // 16) if parts is None else parts
        assert mk.sched.qkv_parts == want and mk.sched.kv_apart == kv_apart
        if alone:
            mk.side_wait_ns = 0
        runs = forced_twice(mk, s, forced)
        assert mk.ran_alone() == alone
        key = (f"qkv_parts {want}{' kv_apart' if kv_apart else ''}{' alone' if alone else ''}"
               f"{f' {stage} positions per chunk' if stage else ''}")
        assert torch.equal(runs[0], runs[1]), f"{key}: a rerun changed a bit"
        outs[key], kvs[key] = runs[0], s.k16[:, :, :, PROMPT:PROMPT + steps].float().clone()
        del mk
    base, kv0 = outs["qkv_parts 0"], kvs["qkv_parts 0"]
    for key, out in outs.items():
        err = max(rel(out[j], ref[j]) for j in range(steps))
        between = max(rel(out[j], base[j]) for j in range(steps))
        kv = rel(kvs[key].flatten(), kv0.flatten())
        print(f"\n{name}: {key}: teacher-forced rel L2 max {err:.2e}, vs QKV + ATTN {between:.2e}, K cache {kv:.2e}")
        assert err <= 1e-2 and between <= 2e-3 and kv <= 1e-2


@pytest.mark.parametrize("name", SHAPES)
def test_side_launch_matches_reference_and_runs_alone_when_late(name):
    """Monokernel(attn_cluster=16, side=True): a plain launch on the SMs the clusters leave idle runs at the same time
    on the same counters. Teacher-forced logits match the fp32 reference and the launch without it, repeat to the bit,
    every side CTA is traced; with side_wait_ns = 0 the main launch decides before the side's CTAs arrive, runs
    alone on its own schedule (the same bits as a cluster launch without a side) and says so."""
    from kernels.runtime import Monokernel
    s = setup_for(name)
    steps = 48
    mk = Monokernel(s.m16, s.k16, s.v16, max_steps=steps + 8, attn_cluster=16, side=True)
    plain = Monokernel(s.m16, s.k16, s.v16, max_steps=steps + 8, attn_cluster=16, side=False)
    assert mk.n_side == torch.cuda.get_device_properties(0).multi_processor_count - mk.n_main > 0
    assert mk.n_main == plain.n_sm and mk.n_sm == mk.n_main + mk.n_side
    forced = s.ids[PROMPT:PROMPT + steps].tolist()
    ref = torch.stack([s.m32.forward(s.k32, s.v32, 0, s.ids[PROMPT + j:PROMPT + j + 1].cuda(), PROMPT + j)
                       for j in range(steps)])

    def run(kernel, trace=None):
        s.restore()
        kernel.enable_trace(trace)
        out = torch.full((steps, s.cfg.vocab_size), float("nan"), device="cuda")
        kernel.run(0, forced[0], PROMPT, steps, forced=forced, logits_out=out)
        return out

    both = [run(mk), run(mk, trace=5)]
    assert not mk.ran_alone() and mk.side_alone == 0
    recs = mk.trace_records()
    side_sms = {r["sm"] for r in recs if r["sm"] >= mk.n_main}
    assert side_sms == set(range(mk.n_main, mk.n_sm)), "a side CTA ran no instruction of the traced step"
    assert all(r["t_wait"] <= r["t_ready"] <= r["t_done"] for r in recs)
    mk.side_wait_ns = 0
    alone = run(mk)
    assert mk.ran_alone() and mk.side_alone == 1
    base = run(plain)
    err = max(rel(both[0][j], ref[j]) for j in range(steps))
    err_alone = max(rel(alone[j], ref[j]) for j in range(steps))
    between = max(rel(both[0][j], base[j]) for j in range(steps))
    print(f"\n{name}: side launch of {mk.n_side} CTAs next to {mk.n_main}: teacher-forced rel L2 max {err:.2e}, vs "
          f"the cluster launch alone {between:.2e}; run alone {err_alone:.2e}")
    assert err <= 1e-2 and err_alone <= 1e-2 and between <= 2e-3
    assert torch.equal(both[0], both[1]), "tracing or a rerun changed a bit"
    assert torch.equal(alone, base), "the main launch alone must run the plain cluster schedule"


@pytest.mark.parametrize("name", [SHAPES[0], SHAPES[2]])
def test_tracing_changes_timing_not_results(name):
    """The trace stores only shift instructions in time: not a single bit may change, and every instruction
    of the traced step leaves ordered stamps (wait <= ready <= done)."""
    s = setup_for(name)
    forced = s.ids[PROMPT:PROMPT + 32].tolist()
    outs = []
    for trace in (None, 5):
        s.restore()
        s.mk.enable_trace(trace)
        out = torch.empty(32, s.cfg.vocab_size, device="cuda")
        s.mk.run(0, forced[0], PROMPT, 32, forced=forced, logits_out=out)
        outs.append(out)
    recs = s.mk.trace_records()
    s.mk.enable_trace(None)
    assert torch.equal(outs[0], outs[1])
    off, ins = s.mk.sched.flat()
    assert len(recs) == len(ins)
    assert all(r["t_wait"] <= r["t_ready"] <= r["t_done"] for r in recs)


@pytest.mark.parametrize("name", SHAPES)
def test_fused_mlp_matches_reference_and_the_gateup_down_schedule(name):
    """The one-GPU build runs the fused MLP schedule by default (schedule.build(fused_mlp=True)); it and GATEUP + DOWN
    must both match the fp32 reference teacher-forced, be close to each
    other (the fixed-point adds and the DOWN partials' order differ), and the fused one must be bit-reproducible
    (its integer adds do not depend on the order the SMs add in)."""
    from kernels.runtime import Monokernel
    s = setup_for(name)
    assert s.mk.fused_mlp
    steps = 64
    fused = s.mk
    split = Monokernel(s.m16, s.k16, s.v16, max_steps=steps + 8, fused_mlp=False)
    assert fused.fused_mlp and not split.fused_mlp
    forced = s.ids[PROMPT:PROMPT + steps].tolist()
    ref = torch.stack([s.m32.forward(s.k32, s.v32, 0, s.ids[PROMPT + j:PROMPT + j + 1].cuda(), PROMPT + j)
                       for j in range(steps)])
    outs = []
    for kernel in (fused, fused, split):
        s.restore()
        out = torch.full((steps, s.cfg.vocab_size), float("nan"), device="cuda")
        kernel.run(0, forced[0], PROMPT, steps, forced=forced, logits_out=out)
        outs.append(out)
    err_f = max(rel(outs[0][j], ref[j]) for j in range(steps))
    err_s = max(rel(outs[2][j], ref[j]) for j in range(steps))
    between = max(rel(outs[2][j], outs[0][j]) for j in range(steps))
    print(f"\n{name}: teacher-forced rel L2 max: fused MLP {err_f:.2e}, GATEUP + DOWN {err_s:.2e}; "
          f"between them {between:.2e}")
    assert err_f <= 1e-2 and err_s <= 1e-2
    assert 0 < between <= 1e-3
    assert torch.equal(outs[0], outs[1])


def test_no_finite_logit_stops_the_launch_and_the_next_one_runs():
    """Every logit NaN (the final norm's gains poisoned): the sampler has no candidate, so the launch stops at that
    step with reason no_token and a RuntimeError saying so, instead of reading the embedding row of a token that
    does not exist (an illegal address would take the whole CUDA context down). The next launch runs normally."""
    from shapes import SHAPES as SMALL   # tests/gpu is on sys.path under pytest
    _cache.clear()
    torch.cuda.empty_cache()
    s = Setup(SMALL["qwen"])
    gains = s.mk.final_norm.clone()
    s.mk.final_norm.fill_(float("nan"))
    tok = int(s.ids[PROMPT])
    with pytest.raises(RuntimeError, match="no finite logit at step 0"):
        s.mk.run(0, tok, PROMPT, 8)
    assert s.mk.reason() == "no_token" and s.mk.count() == 0
    s.mk.final_norm.copy_(gains)
    s.restore()
    toks, reason = s.mk.run(0, tok, PROMPT, 8)
    torch.cuda.synchronize()
    assert reason == "length" and len(toks) == 8 and all(0 <= t < s.cfg.vocab_size for t in toks)


def test_engine_short_chunks_prefill_as_kernel_steps(tmp_path):
    """Short prefill chunks as teacher-forced kernel steps (MonokernelBackend.prefill; its limit comes from the
    warm-up timing, printed here and tested on the CPU, and is set to 2 for this test): a two-token chunk's last
    logits against the fp32 reference of the same tokens, where the kernel must be as close as the graph prefill
    of the same chunk; then a keystroke-like request (the cached prompt plus one token) prefills through the kernel
    and generates."""
    from engine import Engine
    from engine.testing import make_tiny_checkpoint
    _cache.clear()
    ML = 1024
    d = make_tiny_checkpoint(tmp_path / "m", arch="qwen2", hidden_size=256, n_heads=4, n_kv_heads=2, head_dim=64,
                             intermediate_size=512, n_layers=2)
    eng = Engine.load(d, device="cuda", backend="monokernel", max_seq_len=ML, kv_slots=1)
    be = eng.backend
    st = eng.stats()["backend_stats"]
    print(f"\nwarm-up timing: kernel prefill up to {st['kernel_prefill_max']} tokens ({st['kernel_prefill_ms']})")
    be.kernel_prefill_max = 2
    prompt = [10 + (7 * i) % 150 for i in range(100)]
    eng.complete(prompt, max_new_tokens=1, stop_ids=frozenset())   # the prompt's K / V in slot 0, no decode launch
    chunk = torch.tensor([33, 44], device="cuda")
    n0 = be.stats["kernel_prefills"]
    kern = be.prefill(0, chunk, 100)
    assert be.stats["kernel_prefills"] == n0 + 1
    graph = be.prefill_graphs.prefill(0, chunk, 100)
    m32, k32, v32 = fp32_reference(be.model, ML)
    ref = m32.forward(k32, v32, 0, torch.tensor(prompt + chunk.tolist(), device="cuda"), 0)
    e_k, e_g = rel(kern, ref), rel(graph, ref)
    print(f"two-token chunk at 100: rel L2 to fp32, kernel {e_k:.2e}, graph {e_g:.2e}")
    assert e_k <= 1.5 * e_g + 2e-3 and e_k < 0.05
    n0 = be.stats["kernel_prefills"]
    res = eng.complete(prompt + [55], max_new_tokens=4, stop_ids=frozenset())
    assert len(res.token_ids) == 4 and res.reused_tokens == 100, res
    assert be.stats["kernel_prefills"] == n0 + 1, eng.stats()
