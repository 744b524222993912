"""Tensor-parallel decode benchmark (issue #6): the same model on 1 and N GPUs.

Rows per model shape (random bf16 weights, context 512, 256 tokens timed after warm-up, median of repeats):
- peer, 1 GPU and N GPUs (bench/tp_peer.py): the model sharded with engine/tp/shard.py (exact mode), one process per GPU
  (torch.multiprocessing), torch.distributed + NCCL, each rank's whole decode step (all layers, vocab-parallel LM
  head, greedy (max, index) exchange, token fed back on the GPU) captured in one CUDA graph, gpt-fast style: one
  all-reduce after the O-projection and one after the down-projection of every layer. Also timed: the same graph
  with the collectives left out (compute only; its difference to the full step is what communication costs) and
  a graph of the collectives alone. The 1-GPU peer is the same step code unsharded (rank 0 alone); the sharded
  logits are checked against it (relative L2, printed). Default ops are plain torch ops (~25 kernels per layer);
  --compile hands the three blocks between exchanges to torch.compile (fused elementwise ops, as gpt-fast does),
  falling back to plain ops on every rank, with the reason printed, if compilation fails anywhere.
- monokernel 1 GPU / N GPUs exact / N GPUs delayed: HOOKS (backend_row below) for the lead's persistent kernel.
  A backend that does not exist or cannot run prints "not run: <reason>"; no number is ever made up.
  "monokernel-exact" is kernels/tp_runtime.py's TPMonokernel (in-kernel peer exchange), timed with launches of
  --tokens steps next to a single-GPU Monokernel on the same weights timed the same way in the same run (its
  speedup is against that); it also reports the exchange wait (per CTA and token, kernel-measured) and checks
  that both ranks' logits are bit-identical and close to the single GPU's.

    NCCL_NVLS_ENABLE=0 python3 bench/tp.py --gpus 2 [--shape qwen-1.5b,llama-1b|all] [--ctx 512] [--tokens 256]
                                           [--compile] [--eager] [--no-monokernel]
    python3 bench/tp.py --plan-only --gpus 2     # the shard plans and byte counts, no GPU needed

Runs with engine/ + torch (+ kernels/ for the monokernel rows); no server packages. Prints a table, then one
JSON line last. Exit status 2 when CUDA or enough GPUs are missing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.tp_peer import SHAPES, log, random_fill, run_peer  # noqa: E402
from engine.config import ModelConfig  # noqa: E402
from engine.model import Model  # noqa: E402
from engine.tp.shard import make_plan  # noqa: E402

HBM_BYTES_PER_S = 4.29e12     # read-only bandwidth measured on the H200 (shared/GPU.md), for --plan-only

MONOKERNEL_ROWS = ("monokernel-1gpu", "monokernel-exact", "monokernel-delayed")


def random_kv(shape, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A random bf16 K and V cache of `shape` on cuda:0, drawn from g in that order."""
    k = torch.randn(shape, generator=g, device="cuda:0").bfloat16()
    return k, torch.randn(shape, generator=g, device="cuda:0").bfloat16()


def random_dense(cfg: ModelConfig, max_len: int, g: torch.Generator) -> tuple[Model, torch.Tensor, torch.Tensor]:
    """The benches' dense model on cuda:0 (random_fill, seed 0) and its random KV cache of one slot (from g)."""
    model = random_fill(Model(cfg, device="cuda:0", dtype=torch.bfloat16, max_len=max_len), seed=0)
    return (model, *random_kv((1, cfg.n_layers, cfg.n_kv_heads, max_len, cfg.head_dim), g))


def random_lanes(lcfg, max_len: int, g: torch.Generator):
    """-> (LaneModel of LaneConfig lcfg with random weights (seed 0) on cuda:0, its random lane-major K, V)."""
    from engine.lanes import LaneModel
    from kernels.testing import random_lane_weights_on
    lanes = LaneModel(lcfg, random_lane_weights_on(lcfg, device="cuda:0", seed=0))
    return (lanes, *random_kv((1, lcfg.num_layers, lcfg.num_kv_heads, max_len, lcfg.head_dim), g))


def backend_row(backend: str, cfg: ModelConfig, args) -> dict:
    """One benchmark row for `backend` in MONOKERNEL_ROWS:
      "monokernel-1gpu"    the single-GPU persistent kernel, through the Backend contract;
      "monokernel-exact"   args.gpus GPUs, TPMonokernel exact mode, next to a 1-GPU Monokernel timed the same way;
      "monokernel-delayed" args.gpus GPUs, TPMonokernel(mode='delayed') on random lane weights of the same size
                           (args.gpus lanes, broadcast delay --lane-delay), timed like monokernel-exact.
    Returns {"backend", "gpus", "us", ...} or {"backend", "gpus", "not_run": reason}. Never invents a number."""
    gpus = 1 if backend == "monokernel-1gpu" else args.gpus
    row = {"backend": backend, "gpus": gpus}
    try:
        from engine.backends.monokernel import MonokernelBackend
    except Exception as e:                    # noqa: BLE001
        return {**row, "not_run": f"engine.backends.monokernel does not import: {type(e).__name__}: {e}"}
    ok, why = MonokernelBackend.supported(cfg, "cuda")
    if not ok:
        return {**row, "not_run": f"monokernel does not support {cfg.name}: {why}"}
    if backend == "monokernel-1gpu":
        return {**row, **_time_backend(MonokernelBackend, cfg, args, tp=1, tp_mode="exact")}
    if backend == "monokernel-exact":
        if args.gpus < 2:
            return {**row, "not_run": "--gpus 1: no exchange to time"}
        return {**row, **_time_tp_monokernel(cfg, args)}
    if backend == "monokernel-delayed":
        if args.gpus < 2:
            return {**row, "not_run": "--gpus 1: delayed mode runs one lane per GPU"}
        return {**row, **_time_tp_delayed(cfg, args)}
    raise ValueError(f"unknown backend row {backend!r} (known: {', '.join(MONOKERNEL_ROWS)})")


def _time_backend(cls, cfg: ModelConfig, args, tp: int, tp_mode: str) -> dict:
    """us/token of backend `cls` through the Backend contract: decode_loop from position ctx (random KV context),
    greedy, no stop ids; median of args.reps runs of args.tokens tokens after a warm-up run."""
    from engine.kv_cache import KVCache
    from engine.sampling import SamplingParams
    max_len = args.ctx + max(args.tokens, args.warmup) + 64
    try:
        model = random_fill(Model(cfg, device="cuda", dtype=torch.bfloat16, max_len=max_len), seed=0)
        cache = KVCache(1, cfg.n_layers, cfg.n_kv_heads, max_len, cfg.head_dim, dtype=torch.bfloat16,
                        device="cuda")
        cache.k.normal_()
        cache.v.normal_()
        be = cls(model, cache, tp=tp, tp_mode=tp_mode)
        if hasattr(be, "warmup"):
            be.warmup()
        greedy, tok0 = SamplingParams(), 1234 % cfg.vocab_size

        def run(n):
            list(be.decode_loop(0, tok0, args.ctx, n, greedy, frozenset(), None))
        run(args.warmup)
        ts = []
        for _ in range(args.reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run(args.tokens)
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) / args.tokens)
        out = {"us": statistics.median(ts) * 1e6, "how": "Backend.decode_loop (tokens streamed to the host)"}
        st = be.stats() if callable(getattr(be, "stats", None)) else getattr(be, "stats", {})
        if isinstance(st, dict) and "wait_us" in st:
            out["wait_us"] = st["wait_us"]
        del be, model, cache
        torch.cuda.empty_cache()
        return out
    except Exception as e:                    # noqa: BLE001
        traceback.print_exc()
        return {"not_run": f"failed: {type(e).__name__}: {e}"}


def time_kernel_run(eng, restore, args, tok0: int) -> float:
    """Median us/token of eng.run (Monokernel or TPMonokernel) over args.reps runs of args.tokens from position
    args.ctx, each after restore() (the KV cache as before the run) and one untimed warm-up run."""
    restore()
    if args.warmup:
        eng.run(0, tok0, args.ctx, args.warmup)
    ts = []
    for _ in range(args.reps):
        restore()
        t0 = time.perf_counter()
        toks, _ = eng.run(0, tok0, args.ctx, args.tokens)
        ts.append((time.perf_counter() - t0) / len(toks))
    return statistics.median(ts) * 1e6


def _time_tp_monokernel(cfg: ModelConfig, args) -> dict:
    """us/token of TPMonokernel on args.gpus GPUs and of Monokernel on GPU 0 (same weights, same random KV
    context, same timing: one launch of args.tokens greedy steps from position ctx, median of args.reps, after a
    warm-up launch), the exchange wait, and a 16-step teacher-forced check (ranks bit-identical, rel L2 to 1 GPU)."""
    from kernels.runtime import Monokernel
    from kernels.tp_runtime import TPMonokernel
    max_len = args.ctx + max(args.tokens, args.warmup, 16) + 64
    n = args.gpus
    try:
        model, k, v = random_dense(cfg, max_len, torch.Generator(device="cuda:0").manual_seed(1))
        tok0 = 1234 % cfg.vocab_size

        def timed(eng, restore) -> float:
            return time_kernel_run(eng, restore, args, tok0)

        k1, v1 = k.clone(), v.clone()
        mk = Monokernel(model, k1, v1, max_steps=max(args.tokens, args.warmup, 16) + 1)
        us1 = timed(mk, lambda: (k1.copy_(k), v1.copy_(v)))
        forced = torch.randint(0, cfg.vocab_size, (16,), generator=torch.Generator().manual_seed(2)).tolist()
        k1.copy_(k), v1.copy_(v)
        ref = torch.empty(16, cfg.vocab_size, device="cuda:0")
        mk.run(0, forced[0], args.ctx, 16, forced=forced, logits_out=ref)
        del mk, k1, v1
        torch.cuda.empty_cache()
        devs = [f"cuda:{i}" for i in range(n)]
        steps = max(args.tokens, args.warmup, 16) + 1
        # replicated LM head first: its per-rank logits show the residual streams are bit-identical
        tp = TPMonokernel(model, devs, max_len=max_len, slots=1, max_steps=steps, vocab_parallel=False)
        us_rep = timed(tp, lambda: tp.load_cache(k, v))
        tp.load_cache(k, v)
        outs = [torch.empty(16, cfg.vocab_size, device=d) for d in devs]
        tp.run(0, forced[0], args.ctx, 16, forced=forced, rank_logits=outs)
        same = all(torch.equal(outs[0], o.to("cuda:0")) for o in outs[1:])
        del tp
        torch.cuda.empty_cache()
        tp = TPMonokernel(model, devs, max_len=max_len, slots=1, max_steps=steps)
        us = timed(tp, lambda: tp.load_cache(k, v))
        wait = tp.exchange_wait_us()      # of the last timed launch
        tp.load_cache(k, v)
        vp = torch.empty(16, cfg.vocab_size, device="cuda:0")
        tp.run(0, forced[0], args.ctx, 16, forced=forced, logits_out=vp)
        err = max(((vp[j].double() - ref[j].double()).norm() / ref[j].double().norm()).item() for j in range(16))
        head = "vocabulary-parallel" if tp.vocab_parallel else "replicated (candidates do not fit)"
        del tp, model
        torch.cuda.empty_cache()
        return {"us": us, "us_1gpu_same_run": us1, "speedup_vs_1gpu": us1 / us, "wait_us": wait["mean_us"],
                "wait_max_us": wait["max_us"], "check_rel_l2_vs_1gpu": err, "ranks_bit_identical": same,
                "vp_equals_replicated": bool(torch.equal(vp, outs[0])), "us_replicated_head": us_rep,
                "lm_head": head,
                "how": "one launch of --tokens greedy steps (tokens streamed to the host); 1-GPU Monokernel "
                       "timed the same way in this run"}
    except Exception as e:                    # noqa: BLE001
        traceback.print_exc()
        return {"not_run": f"failed: {type(e).__name__}: {e}"}


def _time_tp_delayed(cfg: ModelConfig, args) -> dict:
    """us/token of TPMonokernel(mode='delayed') on args.gpus GPUs running a random Laneformer lane model with cfg's
    sizes (args.gpus lanes, replicate LM head, broadcast delay args.lane_delay, early layers PRESENT), next to the
    single-GPU Monokernel on a dense model of cfg timed the same way in this run (one launch of args.tokens greedy
    steps from position ctx over a random KV context, median of args.reps after a warm-up launch); the exchange
    wait is the kernel-measured time CTAs spent waiting for peers' partials (per token)."""
    from kernels.runtime import Monokernel
    from kernels.testing import lane_config_like
    from kernels.tp_runtime import TPMonokernel
    n = args.gpus
    steps = max(args.tokens, args.warmup, 16) + 1
    max_len = args.ctx + steps + 64
    tok0 = 1234 % cfg.vocab_size

    def timed(eng, restore) -> float:
        return time_kernel_run(eng, restore, args, tok0)

    try:
        lcfg = lane_config_like(cfg, n, broadcast_delay=args.lane_delay)
        g = torch.Generator(device="cuda:0").manual_seed(1)
        model, k, v = random_dense(cfg, max_len, g)
        k1, v1 = k.clone(), v.clone()
        mk = Monokernel(model, k1, v1, max_steps=steps)
        us1 = timed(mk, lambda: (k1.copy_(k), v1.copy_(v)))
        del mk, k1, v1, model, k, v
        torch.cuda.empty_cache()
        lanes, k, v = random_lanes(lcfg, max_len, g)
        tp = TPMonokernel(lanes, [f"cuda:{i}" for i in range(n)], max_len=max_len, slots=1, max_steps=steps,
                          mode="delayed")
        us = timed(tp, lambda: tp.load_cache(k, v))
        wait = tp.exchange_wait_us()      # of the last timed launch
        tp.load_cache(k, v)
        a = tp.run(0, tok0, args.ctx, 16)[0]
        tp.load_cache(k, v)
        rerun_same = tp.run(0, tok0, args.ctx, 16)[0] == a
        desc = tp.lanes.describe()
        del tp, lanes
        torch.cuda.empty_cache()
        return {"us": us, "us_1gpu_same_run": us1, "speedup_vs_1gpu": us1 / us, "wait_us": wait["mean_us"],
                "wait_max_us": wait["max_us"], "rerun_tokens_identical": rerun_same, "lanes": desc,
                "how": "one launch of --tokens greedy steps (tokens streamed to the host); random lane weights of "
                       "the dense shape's size; 1-GPU Monokernel on the dense shape timed the same way in this run"}
    except Exception as e:                    # noqa: BLE001
        traceback.print_exc()
        return {"not_run": f"failed: {type(e).__name__}: {e}"}


# ---- output ------------------------------------------------------------------------------------------------
def kv_bytes_per_token(cfg: ModelConfig, plan, rank: int, ctx: int, tokens: int) -> float:
    """K+V bytes (bf16) rank `rank` reads per token, averaged over the timed positions ctx..ctx+tokens-1."""
    live = ctx + (tokens + 1) / 2
    return 2 * 2 * cfg.n_layers * plan.ranks[rank].n_kv * cfg.head_dim * live


def table_rows(name: str, cfg: ModelConfig, peer: dict, mk: list[dict], gpus: int, bw: float, args) -> list[dict]:
    """Flat rows for one shape: backend, gpus, us/token, tok/s, speedup vs the same backend on 1 GPU, % of the
    per-GPU weight+KV streaming roofline, communication cost. bw: the measured copy rate (read + write), which on
    the H200 equals the read-only rate (shared/GPU.md: 4.25 vs 4.29 TB/s), so it is the streaming rate here."""
    out = []
    plans = {n: make_plan(cfg, n) for n in {1, gpus}}

    def roof(n):
        p = plans[n]
        return max(p.rank_weight_bytes(r) + kv_bytes_per_token(cfg, p, r, args.ctx, args.tokens)
                   for r in range(n)) / bw * 1e6

    base_peer = peer.get("peer_1gpu_us")
    for n in sorted({1, gpus}):
        r = {"shape": name, "backend": "peer (NCCL + CUDA graph)", "gpus": n, "roofline_us": roof(n),
             "ops": peer.get("ops_1gpu" if n == 1 else "ops"), "timing": peer.get("timing")}
        us = peer.get(f"peer_{n}gpu_us")
        if us is None:
            r["not_run"] = peer.get("error", "no timing (see log)")
        else:
            r["us"] = us
            if n > 1:
                r["speedup_vs_1gpu"] = base_peer / us if base_peer else None
                r["comm_cost_us"] = peer.get(f"peer_{n}gpu_comm_cost_us")
                r["compute_only_us"] = peer.get(f"peer_{n}gpu_compute_only_us")
                r["collectives_only_us"] = peer.get(f"peer_{n}gpu_collectives_only_us")
                r["check_rel_l2_vs_1gpu"] = peer.get("check_rel_l2_vs_1gpu")
        out.append(r)
    mk1 = next((m.get("us") for m in mk if m["backend"] == "monokernel-1gpu"), None)
    for m in mk:
        r = {"shape": name, **m, "roofline_us": roof(m["gpus"]) if m["gpus"] in plans else None}
        if "us" in r and m["gpus"] > 1 and mk1:   # a row timed against its own 1-GPU run keeps that ratio
            r.setdefault("speedup_vs_1gpu", mk1 / r["us"])
        out.append(r)
    for r in out:
        if "us" in r:
            r["tok_s"] = 1e6 / r["us"]
            if r.get("roofline_us"):
                r["pct_roofline"] = 100 * r["roofline_us"] / r["us"]
    return out


def print_table(rows: list[dict]) -> None:
    log("")
    log(f"{'shape':<10} {'backend':<26} {'gpus':>4} {'us/token':>9} {'tok/s':>7} {'x 1gpu':>7} {'%roof':>6} "
        f"{'comm us':>8} {'coll us':>8}  note")
    for r in rows:
        def f(k, fmt, width):
            return (fmt.format(r[k]) if r.get(k) is not None else "-").rjust(width)
        notes = [f"not run: {r['not_run']}"] if "not_run" in r else []
        if r.get("ops"):
            notes.append(r["ops"])
        if r.get("check_rel_l2_vs_1gpu") is not None:
            notes.append(f"logits rel L2 vs 1 GPU {r['check_rel_l2_vs_1gpu']:.1e}")
        if r.get("us_1gpu_same_run") is not None:
            notes.append(f"1-GPU monokernel same run {r['us_1gpu_same_run']:.1f} us")
        if r.get("wait_us") is not None:
            notes.append(f"exchange wait {r['wait_us']:.1f} us/token per CTA (max {r.get('wait_max_us', 0):.1f})")
        if r.get("rerun_tokens_identical") is not None:
            notes.append("reruns identical" if r["rerun_tokens_identical"] else "RERUNS DIFFER")
        if r.get("ranks_bit_identical") is not None:
            notes.append("ranks bit-identical" if r["ranks_bit_identical"] else "RANKS DIFFER")
        if r.get("lm_head"):
            notes.append(f"LM head {r['lm_head']}")
        if r.get("us_replicated_head") is not None:
            notes.append(f"replicated head {r['us_replicated_head']:.1f} us")
        if r.get("vp_equals_replicated") is not None:
            notes.append("vocab-parallel logits = replicated" if r["vp_equals_replicated"]
                         else "VOCAB-PARALLEL LOGITS DIFFER")
        log(f"{r['shape']:<10} {r['backend']:<26} {r['gpus']:>4} {f('us', '{:.1f}', 9)} {f('tok_s', '{:.0f}', 7)} "
            f"{f('speedup_vs_1gpu', '{:.2f}x', 7)} {f('pct_roofline', '{:.0f}%', 6)} {f('comm_cost_us', '{:.1f}', 8)} "
            f"{f('collectives_only_us', '{:.1f}', 8)}  {'; '.join(notes)}")


def plan_only(args, shapes: list[str]) -> int:
    """Shard plans, bytes per GPU and the streaming roofline at HBM_BYTES_PER_S; no GPU needed."""
    rows = []
    log(f"{'shape':<10} {'gpus':>4} {'split':<9} {'GB/GPU':>7} {'KV MB/tok':>9} {'roof us':>8}  plan")
    for name in shapes:
        cfg = SHAPES[name]()
        for n in sorted({1, args.gpus}):
            p = make_plan(cfg, n)
            wb = max(p.rank_weight_bytes(r) for r in range(n))
            kvb = max(kv_bytes_per_token(cfg, p, r, args.ctx, args.tokens) for r in range(n))
            row = {"shape": name, "gpus": n, "head_split": p.head_split, "weights_GB_per_gpu": wb / 1e9,
                   "kv_MB_per_token": kvb / 1e6, "roofline_us": (wb + kvb) / HBM_BYTES_PER_S * 1e6,
                   "plan": p.describe()}
            rows.append(row)
            log(f"{name:<10} {n:>4} {p.head_split:<9} {wb / 1e9:7.3f} {kvb / 1e6:9.2f} {row['roofline_us']:8.1f}  "
                f"{p.describe()}")
    log(json.dumps({"bench": "tp", "mode": "plan-only", "gpus": args.gpus, "ctx": args.ctx, "tokens": args.tokens,
                    "hbm_TBps_assumed": HBM_BYTES_PER_S / 1e12, "rows": rows}))
    return 0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="Tensor-parallel decode benchmark: 1 GPU vs N GPUs (issue #6).")
    ap.add_argument("--gpus", type=int, default=2, help="GPUs for the tensor-parallel rows (default 2)")
    ap.add_argument("--shape", default="qwen-1.5b",
                    help=f"comma list of model shapes, or 'all' (known: {', '.join(SHAPES)})")
    ap.add_argument("--ctx", type=int, default=512, help="context length before the timed tokens")
    ap.add_argument("--tokens", type=int, default=256, help="timed tokens per repeat")
    ap.add_argument("--warmup", type=int, default=32, help="untimed tokens before timing")
    ap.add_argument("--reps", type=int, default=5, help="repeats (the median is reported)")
    ap.add_argument("--no-monokernel", action="store_true", help="skip the monokernel hook rows")
    ap.add_argument("--lane-delay", type=int, default=2,
                    help="monokernel-delayed: broadcast delay in layers of the random lane model (default 2, as "
                         "reported for laneformer-2b)")
    ap.add_argument("--eager", action="store_true", help="time the peer without CUDA graphs (if capture fails)")
    ap.add_argument("--compile", action="store_true",
                    help="peer: torch.compile the blocks between exchanges (fused elementwise ops, gpt-fast style)")
    ap.add_argument("--plan-only", action="store_true", help="print shard plans and byte counts; no GPU needed")
    args = ap.parse_args(argv)
    shapes = list(SHAPES) if args.shape == "all" else [s for s in args.shape.split(",") if s]
    bad = [s for s in shapes if s not in SHAPES]
    if bad or not shapes:
        ap.error(f"unknown shape(s) {bad or args.shape!r}; known: {', '.join(SHAPES)}, all")
    if args.gpus < 1:
        ap.error("--gpus must be >= 1")
    if args.lane_delay < 1:
        ap.error("--lane-delay must be >= 1")
    if min(args.ctx, args.tokens, args.reps) < 1 or args.warmup < 0:
        ap.error("--ctx, --tokens and --reps must be >= 1, --warmup >= 0")
    return args, shapes


def main(argv=None) -> int:
    args, shapes = parse_args(argv)
    if args.plan_only:
        return plan_only(args, shapes)
    if not torch.cuda.is_available():
        print("bench/tp.py needs CUDA GPUs: torch.cuda.is_available() is False here "
              "(use --plan-only to print the shard plans without a GPU)", file=sys.stderr)
        return 2
    have = torch.cuda.device_count()
    if have < args.gpus:
        print(f"bench/tp.py --gpus {args.gpus} needs {args.gpus} GPUs; this machine has {have}", file=sys.stderr)
        return 2
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    dev = torch.cuda.get_device_name(0)
    from bench.decode import copy_bandwidth   # the same probe as the single-GPU bench
    bw = copy_bandwidth()
    log(f"device {dev} x{have}; copy bandwidth {bw / 1e12:.2f} TB/s (read + write); NCCL_NVLS_ENABLE=0; "
        f"shapes {','.join(shapes)}; ctx {args.ctx}, {args.tokens} tokens x {args.reps} repeats")
    torch.cuda.empty_cache()
    spec = {"device": "cuda", "dtype": "bf16", "ctx": args.ctx, "tokens": args.tokens, "warmup": args.warmup,
            "reps": args.reps, "graphs": not args.eager, "compile": args.compile}
    t0 = time.monotonic()
    peer_rows = {r["shape"]: r for r in run_peer(shapes, args.gpus, spec)}
    log(f"peer done in {time.monotonic() - t0:.0f} s")
    for r in peer_rows.values():
        log(json.dumps({k: v for k, v in r.items() if k not in ("logits", "ref_logits")}))
    rows = []
    for name in shapes:
        cfg = SHAPES[name]()
        mk = [] if args.no_monokernel else [backend_row(b, cfg, args) for b in MONOKERNEL_ROWS]
        rows += table_rows(name, cfg, peer_rows.get(name, {"error": "no result"}), mk, args.gpus, bw, args)
    print_table(rows)
    log(json.dumps({"bench": "tp", "device": dev, "gpus": args.gpus, "copy_bw_TBps": bw / 1e12, "ctx": args.ctx,
                    "tokens": args.tokens, "reps": args.reps, "rows": rows,
                    "peer": [{k: v for k, v in r.items() if k not in ("logits", "ref_logits")}
                             for r in peer_rows.values()]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
