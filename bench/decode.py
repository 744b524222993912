"""Decode benchmark on one GPU: measured copy bandwidth, the monokernel, the graph backend and the HF
transformers peer (StaticCache + torch.compile) for real model shapes with random bf16 weights.

Protocol (shared/GPU.md): context 512, 256 generated tokens after warm-up, median of repeats, same run and GPU
for everything. Prints a table, then one JSON line last.

    python bench/decode.py [--shapes a,b] [--ctx 512] [--tokens 256] [--peer all|none|SHAPE,...] [--budget-s 400]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.mk_trace import format_table, stage_table  # noqa: E402

SHAPES = ["qwen2.5-coder-0.5b", "llama-3.2-1b", "qwen2.5-coder-1.5b"]


def log(*a):
    print(*a, flush=True)


def copy_bandwidth(gib: float = 2.0, reps: int = 10) -> float:
    """Device-to-device copy, bytes read + written per second (median)."""
    n = int(gib * (1 << 30)) // 4
    a = torch.randn(n, device="cuda")
    b = torch.empty_like(a)
    ts = []
    for _ in range(reps + 2):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n * 4 / statistics.median(ts[2:])


def timed(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def weight_bytes(model) -> int:
    seen, total = set(), 0
    for t in model.params.values():
        key = (t.untyped_storage().data_ptr(), t.data_ptr(), t.numel())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def random_setup(name: str, max_len: int):
    """The bench's model of a preset shape: random bf16 weights (seed 0) and a one-slot bf16 KV cache of max_len
    positions filled with random values, on the GPU. -> (cfg, model, cache)"""
    from engine.config import preset
    from engine.kv_cache import KVCache
    from kernels.testing import random_model

    cfg = preset(name)
    model = random_model(cfg, max_len=max_len, seed=0)
    cache = KVCache(1, cfg.n_layers, cfg.n_kv_heads, max_len, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    cache.k.normal_()
    cache.v.normal_()
    return cfg, model, cache


def bench_shape(name: str, args, bw: float, peer: bool, deadline: float) -> dict:
    from engine.backends.monokernel import MonokernelBackend
    from engine.sampling import SamplingParams
    from kernels import isa
    from kernels.runtime import Monokernel
    from kernels.schedule import CLUSTER_SIZE

    ctx, N = args.ctx, args.tokens
    max_len = ctx + N + 64
    cfg, model, cache = random_setup(name, max_len)
    wb = weight_bytes(model)
    per_pos = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 2
    kvb = per_pos * sum(ctx + i + 1 for i in range(N)) / N
    roof = (wb + kvb) / bw
    row = {"shape": name, "weights_GB": wb / 1e9, "kv_MB_per_token": kvb / 1e6, "roofline_us": roof * 1e6}
    tok0 = 1234
    greedy = SamplingParams()

    # monokernel: kernel-level loop, and through the backend (host streaming + Python generator)
    mkb = MonokernelBackend(model, cache)
    mk = mkb.mk
    mk.run(0, tok0, ctx, 32)
    t = timed(lambda: mk.run(0, tok0, ctx, N), args.reps)
    row["monokernel_us"] = t / N * 1e6
    row["lm_head"] = mk.lm_mode   # screened (kernels/lm_screen.py) unless it cannot run here
    if mk.lm_screen_off is None:   # the exact LM head, same launch otherwise
        mk.lm_screen_off = "bench: exact head"
        mk.run(0, tok0, ctx, 32)
        row["mk_exact_lm_us"] = timed(lambda: mk.run(0, tok0, ctx, N), args.reps) / N * 1e6
        mk.lm_screen_off = None
    # variants, same launch otherwise: v0 = weight loads only after the wait; pf = + L2 prefetch before the wait
    variants = {"mk_v0_us": dict(early_loads=0, prefetch_bytes=0)}
    for pf in args.prefetch:
        variants[f"mk_pf{pf // 1024}k_us"] = dict(early_loads=1, prefetch_bytes=pf)
    default = dict(early_loads=mk.early_loads, prefetch_bytes=mk.prefetch_bytes)
    for key, kw in variants.items():
        for k, v in kw.items():
            setattr(mk, k, v)
        mk.run(0, tok0, ctx, 32)
        row[key] = timed(lambda: mk.run(0, tok0, ctx, N), args.reps) / N * 1e6
    for k, v in default.items():
        setattr(mk, k, v)
    # attention split length (attn_min_pos): the default and alternatives, same launch otherwise
    default_mp = mk.attn_min_pos
    for mp in args.min_pos:
        mk.attn_min_pos = mp
        mk.run(0, tok0, ctx, 32)
        row[f"mk_minpos{mp}_us"] = timed(lambda: mk.run(0, tok0, ctx, N), args.reps) / N * 1e6
    mk.attn_min_pos = default_mp
    # one traced launch (thread 0 stamps every instruction of one step): where the step's time goes
    mk.enable_trace(min(100, N - 1))
    mk.run(0, tok0, ctx, N)
    row["trace"] = stage_table(mk.trace_records(), {v: k for k, v in isa.OPS.items()})
    mk.enable_trace(None)
    log(format_table(name, row["trace"]))
    t = timed(lambda: list(mkb.decode_loop(0, tok0, ctx, N, greedy, frozenset(), None)), args.reps)
    row["monokernel_stream_us"] = t / N * 1e6
    row["fused_mlp"] = mk.fused_mlp
    row["attn_cluster"] = mk.attn_cluster
    row["mk_ctas"] = mk.n_sm
    row["attn_split_rule"] = [mk.attn_min_pos, mk.attn_min_splits]   # schedule.attn_split_defaults
    if "attn_cluster_fallback" in mkb.stats:
        row["attn_cluster_fallback"] = mkb.stats["attn_cluster_fallback"]
    del mkb, mk
    torch.cuda.empty_cache()

    def other_kernel_us(key: str, **kw) -> None:
        """row[key]: us/token of another Monokernel configuration of this model, same launch otherwise (the
        engine's attention launch unless kw names one); row[key without _us + _ctas]: its CTA count. A screen, not
        a verdict: it runs in this process after the default one (session 21: dense-2b GATEUP + DOWN 1,328 against
        1,342 fused here, 1,345-1,348 against 1,343-1,347 one process each); decide with
        bench/experiments/one-launch-time.py."""
        kw.setdefault("attn_cluster", row["attn_cluster"])
        mk2 = Monokernel(model, cache.k, cache.v, max_steps=N + 64, **kw)
        row[key.replace("_us", "_ctas")] = mk2.n_sm
        mk2.run(0, tok0, ctx, 32)
        row[key] = timed(lambda: mk2.run(0, tok0, ctx, N), args.reps) / N * 1e6
        del mk2
        torch.cuda.empty_cache()

    # the MLP schedule the engine does not run (GATEUP + DOWN)
    other_kernel_us("mk_other_mlp_us", fused_mlp=False)
    # the other attention launch: clusters of 16 CTAs (kernels/build.py cluster=True; 112 CTAs on an H200) where the
    # engine runs without them, and the reverse (schedule.attn_cluster_model): checks the per-model pick
    try:
        other_kernel_us("mk_other_attn_us", attn_cluster=0 if row["attn_cluster"] else CLUSTER_SIZE)
    except Exception as e:
        row["other_attn_skip"] = f"{type(e).__name__}: {e}"
        log(f"[{name}] the other attention launch skipped: {row['other_attn_skip']}")

    # graph backend (engine/backends/graph.py), if present
    try:
        from engine.backends.graph import GraphBackend
        gb = GraphBackend(model, cache)
        if hasattr(gb, "warmup"):
            gb.warmup()
        list(gb.decode_loop(0, tok0, ctx, 32, greedy, frozenset(), None))
        t = timed(lambda: list(gb.decode_loop(0, tok0, ctx, N, greedy, frozenset(), None)), args.reps)
        row["graph_us"] = t / N * 1e6
        del gb
    except Exception as e:
        row["graph_skip"] = f"{type(e).__name__}: {e}"
        log(f"[{name}] graph backend skipped: {row['graph_skip']}")
    del model, cache
    torch.cuda.empty_cache()

    if peer and time.monotonic() < deadline:
        try:
            row["peer_us"] = hf_peer(cfg, ctx, N, args.reps)
        except Exception as e:
            row["peer_skip"] = f"{type(e).__name__}: {e}"
            log(f"[{name}] HF peer skipped: {row['peer_skip']}")
            traceback.print_exc()
    elif peer:
        row["peer_skip"] = "bench time budget spent"
        log(f"[{name}] HF peer skipped: time budget spent")
    else:
        row["peer_skip"] = "not requested"
    for k in ("monokernel_us", "graph_us", "peer_us"):
        if k in row:
            row[k.replace("_us", "_tok_s")] = 1e6 / row[k]
            row[k.replace("_us", "_pct_roof")] = 100 * row["roofline_us"] / row[k]
    if "monokernel_us" in row:
        row["monokernel_GBps"] = (wb + kvb) / (row["monokernel_us"] * 1e-6) / 1e9
    if "peer_us" in row:
        row["mk_speedup_vs_peer"] = row["peer_us"] / row["monokernel_us"]
    if "graph_us" in row:
        row["mk_speedup_vs_graph"] = row["graph_us"] / row["monokernel_us"]
    return row


def hf_peer(cfg, ctx: int, N: int, reps: int) -> float:
    """HF transformers with a static cache and a compiled forward: per-token decode time in us
    (generate(N) minus generate(1), so the 512-token prefill is excluded)."""
    import transformers
    hf_cfg = getattr(transformers, "Qwen2Config" if cfg.arch == "qwen2" else "LlamaConfig")(**{
        k: v for k, v in cfg.to_hf_dict().items() if k not in ("architectures", "model_type", "torch_dtype")})
    cls = getattr(transformers, "Qwen2ForCausalLM" if cfg.arch == "qwen2" else "LlamaForCausalLM")
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = cls(hf_cfg).to(torch.bfloat16).eval()
    m.generation_config.eos_token_id = None
    m.generation_config.pad_token_id = 0
    # generate() compiles the decode forward itself when the cache is static (auto-compile on CUDA);
    # a second, manual torch.compile of forward on top of it would only add compile time.
    m.generation_config.compile_config = transformers.CompileConfig(fullgraph=True, mode="reduce-overhead")
    ids = torch.randint(0, cfg.vocab_size, (1, ctx), device="cuda")

    try:   # one cache of a fixed size for every call: the compiled graph is reused by generate(1) and (N)
        cache = transformers.StaticCache(config=m.config, max_cache_len=ctx + N + 8)
    except Exception as e:
        log(f"[peer] StaticCache(config, max_cache_len) failed ({e}); using cache_implementation='static'")
        cache = None

    def gen(n):
        kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False)
        with torch.inference_mode():
            if cache is not None:
                cache.reset()
                kw["past_key_values"] = cache
            else:
                kw["cache_implementation"] = "static"
            m.generate(ids, **kw)

    t0 = time.perf_counter()
    gen(N)
    gen(1)
    gen(N)
    log(f"[peer {cfg.name}] compiled + warm in {time.perf_counter() - t0:.1f} s")
    t_n = timed(lambda: gen(N), reps)
    t_1 = timed(lambda: gen(1), reps)
    del m
    torch.cuda.empty_cache()
    return (t_n - t_1) / (N - 1) * 1e6


def best(r: dict, prefix: str) -> str:
    """The fastest of the timed variants named <prefix><value>_us, as 'value:us'."""
    vals = {k[len(prefix):-3]: v for k, v in r.items() if k.startswith(prefix)}
    if not vals:
        return "-"
    k = min(vals, key=vals.get)
    return f"{k}:{vals[k]:.0f}"


def pf_best(r: dict) -> str:
    vals = [v for k, v in r.items() if k.startswith("mk_pf")]
    return f"{min(vals):9.0f}" if vals else f"{'-':>9}"


def attn_columns(r: dict) -> str:
    """The table's attention-launch columns: the engine's launch and its CTA count (plain:132, cl16:112), then the
    other launch's us/token and CTA count."""
    mine = f"{'cl' + str(r['attn_cluster']) if r.get('attn_cluster') else 'plain'}:{r.get('mk_ctas', '-')}"
    other = f"{r['mk_other_attn_us']:.0f}:{r['mk_other_attn_ctas']}" if "mk_other_attn_us" in r else "-"
    return f"{mine:>10} {other:>10}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--peer", default="all", help="all | none | comma list of shapes")
    ap.add_argument("--prefetch", default="32768", help="comma list of prefetch byte budgets to also time")
    ap.add_argument("--min-pos", default="1,32",
                    help="attention split lengths (attn_min_pos) to time besides the default; 1 = every split")
    ap.add_argument("--budget-s", type=float, default=1e9, help="skip peers once this much time has passed")
    args = ap.parse_args()
    args.prefetch = [int(x) for x in args.prefetch.split(",") if x.strip() and int(x) > 0]
    args.min_pos = [int(x) for x in args.min_pos.split(",") if x.strip()]
    t_start = time.monotonic()
    deadline = t_start + args.budget_s
    dev = torch.cuda.get_device_name(0)
    bw = copy_bandwidth()
    log(f"device {dev}; measured copy bandwidth {bw / 1e12:.2f} TB/s (read + write)")
    shapes = [s for s in args.shapes.split(",") if s]
    peers = set(shapes) if args.peer == "all" else set() if args.peer == "none" else set(args.peer.split(","))
    rows = []
    for name in shapes:
        try:
            row = bench_shape(name, args, bw, name in peers, deadline)
        except Exception as e:
            traceback.print_exc()
            row = {"shape": name, "error": f"{type(e).__name__}: {e}"}
        rows.append(row)
        log(json.dumps(row))
    hdr = (f"{'shape':<20} {'roof us':>8} {'mk us':>8} {'mk tok/s':>9} {'%roof':>6} {'exactLM':>7} {'v0 us':>7} {'mk+pf us':>9} "
           f"{'minpos':>10} {'mlp':>6} {'other':>6} {'attn:CTAs':>10} {'other:CTAs':>10} "
           f"{'layer us':>8} "
           f"{'stream us':>9} "
           f"{'graph us':>9} {'peer us':>8} {'mk/peer':>8} {'mk/graph':>8}")
    log("")
    log(hdr)
    f = lambda r, k, fmt: (fmt.format(r[k]) if k in r else "-")  # noqa: E731
    for r in rows:
        if "error" in r:
            log(f"{r['shape']:<20} ERROR {r['error']}")
            continue
        log(f"{r['shape']:<20} {f(r, 'roofline_us', '{:8.0f}')} {f(r, 'monokernel_us', '{:8.0f}')} "
            f"{f(r, 'monokernel_tok_s', '{:9.0f}')} {f(r, 'monokernel_pct_roof', '{:5.0f}%')} "
            f"{f(r, 'mk_exact_lm_us', '{:7.0f}')} {f(r, 'mk_v0_us', '{:7.0f}')} {pf_best(r)} {best(r, 'mk_minpos'):>10} "
            f"{'fused' if r.get('fused_mlp') else 'split':>6} {f(r, 'mk_other_mlp_us', '{:6.0f}')} "
            f"{attn_columns(r)} "
            f"{r['trace']['layer_us'] if 'trace' in r else float('nan'):8.1f} "
            f"{f(r, 'monokernel_stream_us', '{:9.0f}')} {f(r, 'graph_us', '{:9.0f}')} {f(r, 'peer_us', '{:8.0f}')} "
            f"{f(r, 'mk_speedup_vs_peer', '{:7.2f}x')} {f(r, 'mk_speedup_vs_graph', '{:7.2f}x')}")
    log(json.dumps({"bench": "decode", "device": dev, "copy_bw_TBps": bw / 1e12, "ctx": args.ctx,
                    "tokens": args.tokens, "rows": rows}))


if __name__ == "__main__":
    main()
