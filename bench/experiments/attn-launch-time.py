"""us/token of attention launch configurations, same model, KV and launch as bench/decode.py: the plain launch and
thread-block clusters of 8 or 16 (Monokernel(attn_cluster=...)), each at several attention split lengths
(attn_min_pos), 256 tokens from each context, alternating twice; then the per-stage table of one traced step of each
configuration at the first context (bench/NOTES.md, session 13).
usage: python3 bench/experiments/attn-launch-time.py qwen2.5-coder-0.5b[,llama-3.2-1b,...] [ctx,ctx,...]
       [config,config,...]    config: c<cluster size>m<min pos>[s<splits per kv head>][n<min splits>], e.g. c0m64
       (plain, the default), c16m32, c0m64s16 (a schedule of 16 splits per kv head), c0m64n0 (attn_min_splits 0: no
       bound by the staged chunk; without n the runtime's default). MAXLEN=<positions> sets the KV cache length (default
       the longest context + 320), which sets the staging capacity."""
import json
import os
import re
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch
from bench.decode import random_setup, timed
from bench.mk_trace import format_table, stage_table
from kernels import isa
from kernels.runtime import Monokernel

N, reps = 256, 3
names = sys.argv[1].split(",")
ctxs = [int(c) for c in (sys.argv[2] if len(sys.argv) > 2 else "512,2048").split(",")]
configs = [(int(a), int(b), int(c) if c else 0, int(q) if q else None) for a, b, c, q in
           (re.fullmatch(r"c(\d+)m(\d+)(?:s(\d+))?(?:n(\d+))?", c).groups()
            for c in (sys.argv[3] if len(sys.argv) > 3 else "c0m64,c8m64,c8m32,c16m32").split(","))]
res = {}
for name in names:
    _, model, cache = random_setup(name, int(os.environ.get("MAXLEN", max(ctxs) + N + 64)))
    kernels = {}
    default_q = None
    for cs, sp in sorted({(cs, sp) for cs, _, sp, _ in configs}):
        try:
            kernels[cs, sp] = Monokernel(model, cache.k, cache.v, max_steps=N + 64, attn_cluster=cs,
                                         n_splits=sp or None)
        except Exception as e:
            print(f"{name}: clusters of {cs}, {sp} splits skipped: {type(e).__name__}: {e}", flush=True)
            continue
        default_q = kernels[cs, sp].attn_min_splits
    for ctx in ctxs:
        for rep in range(2):
            for cs, mp, sp, q in configs:
                if (cs, sp) not in kernels:
                    continue
                mk = kernels[cs, sp]
                mk.attn_min_pos = mp
                mk.attn_min_splits = default_q if q is None else q
                mk.run(0, 1234, ctx, 32)
                us = timed(lambda: mk.run(0, 1234, ctx, N), reps) / N * 1e6
                key = f"c{cs}m{mp}s{mk.sched.n_splits}n{mk.attn_min_splits}k{mk.kv_stage_pos}"
                res.setdefault(f"{name}:ctx{ctx}:{key}", []).append(round(us, 1))
                print(f"{name:22s} ctx {ctx:5d} {key:14s} ({mk.n_sm} CTAs) {us:8.1f} us/token", flush=True)
    for cs, mp, sp, q in configs:
        if (cs, sp) in kernels:
            mk = kernels[cs, sp]
            mk.attn_min_pos = mp
            mk.attn_min_splits = default_q if q is None else q
            mk.enable_trace(100)
            mk.run(0, 1234, ctxs[0], N)
            tag = f"c{cs}m{mp}s{mk.sched.n_splits}n{mk.attn_min_splits}k{mk.kv_stage_pos}"
            table = stage_table(mk.trace_records(), {v: k for k, v in isa.OPS.items()})
            print(format_table(f"{name} {tag} ctx {ctxs[0]}", table), flush=True)
            mk.enable_trace(None)
    del kernels
    torch.cuda.empty_cache()
print(json.dumps(res))
