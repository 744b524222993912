"""Where a tensor-parallel monokernel token step spends its time: per-stage trace of every rank (bench/mk_trace.py's
table) for exact and / or delayed mode on N GPUs, next to the one-GPU Monokernel of the same shape, all from one
random-weight model and one random KV context of ctx positions (the tp.py setup). With tensor parallelism a
stage's hop includes its exchange wait (the wait for the peers' partials), so hop + span per layer against the
one-GPU trace shows what the exchange and the per-rank latency cost; the kernel-measured exchange wait (per CTA,
summed over the step) is printed too.

    NCCL_NVLS_ENABLE=0 python3 bench/tp_trace.py --gpus 4 [--shape dense-2b] [--mode exact,delayed] [--ctx 512]

Prints one table per (mode, rank), a summary table, then one JSON line last. Exit status 2 without enough GPUs.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.mk_trace import format_table, stage_table  # noqa: E402
from bench.tp import random_dense, random_lanes  # noqa: E402
from bench.tp_peer import SHAPES, log  # noqa: E402

STEPS = 24      # steps per launch; the traced one is in the middle (caches warm, no start-up effects)


def traced(eng, restore, tok0: int, ctx: int, step: int, ranks) -> list[dict]:
    """One untimed launch, then one with step `step` traced on `ranks` (Monokernels); -> their stage tables."""
    from kernels import isa
    op_names = {v: k for k, v in isa.OPS.items()}
    restore()
    eng.run(0, tok0, ctx, STEPS)
    for mk in ranks:
        mk.enable_trace(step)
    restore()
    eng.run(0, tok0, ctx, STEPS)
    tabs = [stage_table(mk.trace_records(), op_names) for mk in ranks]
    for mk in ranks:
        mk.enable_trace(None)
    return tabs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--shape", default="dense-2b", help=f"one of {', '.join(SHAPES)}")
    ap.add_argument("--mode", default="exact,delayed", help="comma list of exact, delayed")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--lane-delay", type=int, default=2)
    args = ap.parse_args(argv)
    modes = [m for m in args.mode.split(",") if m]
    if args.shape not in SHAPES or not modes or any(m not in ("exact", "delayed") for m in modes):
        ap.error(f"--shape one of {', '.join(SHAPES)}; --mode a comma list of exact, delayed")
    if not torch.cuda.is_available() or torch.cuda.device_count() < args.gpus or args.gpus < 2:
        print(f"bench/tp_trace.py --gpus {args.gpus} needs that many (>= 2) CUDA GPUs", file=sys.stderr)
        return 2
    from kernels.runtime import Monokernel
    from kernels.testing import lane_config_like
    from kernels.tp_runtime import TPMonokernel
    cfg = SHAPES[args.shape]()
    n, step = args.gpus, STEPS // 2
    max_len = args.ctx + STEPS + 64
    tok0 = 1234 % cfg.vocab_size
    devs = [f"cuda:{i}" for i in range(n)]
    g = torch.Generator(device="cuda:0").manual_seed(1)
    model, k, v = random_dense(cfg, max_len, g)
    out = {"bench": "tp_trace", "shape": args.shape, "gpus": n, "ctx": args.ctx, "traced_step": step, "runs": []}

    def report(what: str, tabs: list[dict], wait: dict | None) -> None:
        for r, tab in enumerate(tabs):
            log(format_table(f"{args.shape} {what} rank {r}", tab))
        row = {"what": what, "layer_us": [t["layer_us"] for t in tabs], "step_us": [t["step_us"] for t in tabs],
               "stages_rank0": {op: t for op, t in tabs[0].items() if isinstance(t, dict)}}
        if wait:
            row["exchange_wait_us"] = wait
        out["runs"].append(row)

    k1, v1 = k.clone(), v.clone()
    mk = Monokernel(model, k1, v1, max_steps=STEPS + 1, fused_mlp=False)   # the TP build's stages
    report("1 GPU (GATEUP + DOWN)", traced(mk, lambda: (k1.copy_(k), v1.copy_(v)), tok0, args.ctx, step,
                                                   [mk]), None)
    del mk, k1, v1
    torch.cuda.empty_cache()
    for mode in modes:
        if mode == "exact":
            tp = TPMonokernel(model, devs, max_len=max_len, slots=1, max_steps=STEPS + 1)
            kk, vv = k, v
        else:
            try:
                lcfg = lane_config_like(cfg, n, broadcast_delay=args.lane_delay)
            except ValueError as e:   # the lanes must divide the heads, FFN width and vocabulary
                log(f"delayed x{n}: not run: {e}")
                out["runs"].append({"what": f"delayed x{n}", "not_run": str(e)})
                continue
            lanes, kk, vv = random_lanes(lcfg, max_len, g)
            tp = TPMonokernel(lanes, devs, max_len=max_len, slots=1, max_steps=STEPS + 1, mode="delayed")
        tabs = traced(tp, lambda: tp.load_cache(kk, vv), tok0, args.ctx, step, tp.ranks)
        report(f"{mode} x{n} ({tp.describe()})", tabs, tp.exchange_wait_us())
        del tp
        torch.cuda.empty_cache()
    log("")
    log(f"{'run':<60} {'layer us (rank 0 / max)':>24} {'step us':>9}  stage hop+span, rank 0")
    for row in out["runs"]:
        if "not_run" in row:
            log(f"{row['what']:<60} not run: {row['not_run']}")
            continue
        st = row["stages_rank0"]
        parts = " ".join(f"{op} {t['hop_us'] + t['span_us']:.1f}" for op, t in st.items())
        log(f"{row['what'][:60]:<60} {row['layer_us'][0]:>11.1f} / {max(row['layer_us']):>10.1f} "
            f"{row['step_us'][0]:>9.1f}  {parts}")
    log(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
