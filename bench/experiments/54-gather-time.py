"""us/token with OPROJ's gather of the attention partials on (attn_cc = cc_splits) and off (0), needs
54-mk-oproj-gather.patch applied; same model, KV and launch as bench/decode.py (256 tokens from context 128 and 512),
alternating on / off twice (bench/NOTES.md, session 12).
usage: python3 bench/experiments/54-gather-time.py qwen2.5-coder-0.5b,llama-3.2-1b,qwen2.5-coder-1.5b"""
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
    mk = Monokernel(model, cache.k, cache.v, max_steps=N + 64)
    for ctxv in (128, 512):
        for cc in (mk.cc_splits, 0, mk.cc_splits, 0):
            mk.attn_cc = cc
            mk.run(0, 1234, ctxv, 32)
            us = timed(lambda: mk.run(0, 1234, ctxv, N), reps) / N * 1e6
            res.setdefault(f"{name}:ctx{ctxv}:cc{cc}", []).append(us)
            print(f"{name:22s} ctx {ctxv:4d} attn_cc {cc:3d} {us:8.1f} us/token", flush=True)
    del mk
    torch.cuda.synchronize()
print(json.dumps(res))
