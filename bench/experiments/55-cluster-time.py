"""us/token of the default launch against Monokernel(attn_cluster=8) (needs 55-mk-attention-clusters.patch): each
kv head's attention splits on one cluster of 8 CTAs, combined over distributed shared memory. Same model, KV and
launch as bench/decode.py, 256 tokens from context 512 and 2048, alternating twice; then the per-stage table of one
traced step of each at context 512 (bench/NOTES.md, session 12).
usage: python3 bench/experiments/55-cluster-time.py qwen2.5-coder-0.5b,llama-3.2-1b,qwen2.5-coder-1.5b"""
import json
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch
from bench.decode import random_setup, timed
from bench.mk_trace import format_table, stage_table
from kernels import isa
from kernels.runtime import Monokernel

N, reps = 256, 3
res = {}
for name in sys.argv[1].split(","):
    _, model, cache = random_setup(name, 2048 + N + 64)
    kernels = {"default": Monokernel(model, cache.k, cache.v, max_steps=N + 64),
               "cluster8": Monokernel(model, cache.k, cache.v, max_steps=N + 64, attn_cluster=8)}
    for ctx in (512, 2048):
        for rep in range(2):
            for tag, mk in kernels.items():
                mk.run(0, 1234, ctx, 32)
                us = timed(lambda: mk.run(0, 1234, ctx, N), reps) / N * 1e6
                res.setdefault(f"{name}:ctx{ctx}:{tag}", []).append(round(us, 1))
                print(f"{name:22s} ctx {ctx:5d} {tag:9s} ({mk.n_sm} CTAs) {us:8.1f} us/token", flush=True)
    for tag, mk in kernels.items():
        mk.enable_trace(100)
        mk.run(0, 1234, 512, N)
        print(format_table(f"{name} {tag} ctx 512", stage_table(mk.trace_records(),
                                                                 {v: k for k, v in isa.OPS.items()})), flush=True)
    del kernels
    torch.cuda.empty_cache()
print(json.dumps(res))
