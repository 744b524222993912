"""us/token of the monokernel on n_sm SMs (what a cluster launch that leaves SMs idle would cost: bench/NOTES.md,
session 12); same model, KV and launch as bench/decode.py (context 512, 256 tokens).
usage: python3 bench/experiments/sm-count-time.py qwen2.5-coder-0.5b,llama-3.2-1b 132,128,120,112"""
import json
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch
from bench.decode import random_setup, timed
from kernels.runtime import Monokernel

ctx, N, reps = 512, 256, 3
res = {}
for name in sys.argv[1].split(","):
    _, model, cache = random_setup(name, ctx + N + 64)
    for n in [int(x) for x in sys.argv[2].split(",")]:
        mk = Monokernel(model, cache.k, cache.v, max_steps=N + 64, n_sm=n)
        mk.run(0, 1234, ctx, 32)
        us = timed(lambda: mk.run(0, 1234, ctx, N), reps) / N * 1e6
        res[f"{name}:{n}"] = us
        print(f"{name:22s} n_sm {n:4d} {us:8.1f} us/token", flush=True)
        del mk
        torch.cuda.synchronize()
print(json.dumps(res))
