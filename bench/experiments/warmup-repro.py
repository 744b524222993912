"""Hunt for session 15's unexplained crash (bench/NOTES.md): an illegal memory access in the one-GPU Backend
warm-up (`decode(0, 0, 0)`) of the dense-2b shape, seen once. Each trial builds a fresh random model (its own seed)
and a fresh KV cache of tp.py's size, the MonokernelBackend, its warm-up, one-step launches at positions 0-2 and
a 64-token decode loop from position 512; the first failure stops the script (the CUDA context is lost anyway).
usage: python3 bench/experiments/warmup-repro.py [shape, default dense-2b] [trials, default 8]
Under memcheck (the spin-waits slow down a lot there: NOWATCHDOG=1 stops the in-kernel watchdog from firing):
  NOWATCHDOG=1 compute-sanitizer --tool memcheck python3 bench/experiments/warmup-repro.py dense-2b 1"""
import os
import sys
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch
from bench.tp_peer import random_fill
from engine.backends.monokernel import MonokernelBackend
from engine.config import preset
from engine.kv_cache import KVCache
from engine.model import Model
from engine.sampling import SamplingParams

name = sys.argv[1] if len(sys.argv) > 1 else "dense-2b"
trials = int(sys.argv[2]) if len(sys.argv) > 2 else 8
cfg = preset(name)
max_len = 512 + 256 + 64            # bench/tp.py's _time_backend
t0 = time.time()
for trial in range(trials):
    model = random_fill(Model(cfg, device="cuda", dtype=torch.bfloat16, max_len=max_len), seed=trial)
    cache = KVCache(1, cfg.n_layers, cfg.n_kv_heads, max_len, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    cache.k.normal_()
    cache.v.normal_()
    be = MonokernelBackend(model, cache)
    if os.environ.get("NOWATCHDOG"):
        be.mk.watchdog_cycles = 1 << 62
    stage = "warm-up"
    try:
        be.warmup()
        for pos in (0, 1, 2):
            stage = f"one step at position {pos}"
            be.decode(0, (trial * 7 + pos) % cfg.vocab_size, pos)
        stage = "64 tokens from position 512"
        toks = list(be.decode_loop(0, 1234 % cfg.vocab_size, 512, 64, SamplingParams(), frozenset(), None))
        torch.cuda.synchronize()
    except Exception as e:   # noqa: BLE001 - report which trial and stage failed, then stop
        print(f"trial {trial} ({be.describe()}): FAILED in {stage}: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
    print(f"trial {trial}: ok ({len(toks)} tokens; {time.time() - t0:.0f} s)", flush=True)
    del be, model, cache
    torch.cuda.empty_cache()
print(f"{trials} trials of {name}: no failure")
