"""us/token of the monokernel on n_sm SMs (what a cluster launch that leaves SMs idle would cost: bench/NOTES.md,
session 12); same model, KV and launch as bench/decode.py (context 512, 256 tokens).
usage: python3 bench/experiments/sm-count-time.py qwen2.5-coder-0.5b,llama-3.2-1b 132,128,120,112"""
import json
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch
from bench.decode import timed
from engine.config import preset
from engine.kv_cache import KVCache
from kernels.runtime import Monokernel
from kernels.testing import random_model

ctx, N, reps = 512, 256, 3
res = {}
for name in sys.argv[1].split(","):
    cfg = preset(name)
    model = random_model(cfg, max_len=ctx + N + 64, seed=0)
    cache = KVCache(1, cfg.n_layers, cfg.n_kv_heads, ctx + N + 64, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    cache.k.normal_()
    cache.v.normal_()
    for n in [int(x) for x in sys.argv[2].split(",")]:
        mk = Monokernel(model, cache.k, cache.v, max_steps=N + 64, n_sm=n)
        mk.run(0, 1234, ctx, 32)
        us = timed(lambda: mk.run(0, 1234, ctx, N), reps) / N * 1e6
        res[f"{name}:{n}"] = us
        print(f"{name:22s} n_sm {n:4d} {us:8.1f} us/token", flush=True)
        del mk
        torch.cuda.synchronize()
print(json.dumps(res))
