"""us/token of one Monokernel configuration in a process of its own, so that every configuration runs with the same
memory and process state (several Monokernels in one process each hold their own transposed Wd copy); compare
configurations one process each, alternating with main's tree in the same device call (bench/experiments/ab.sh).
Same model, KV and launch as bench/decode.py (the engine's launch: clusters where schedule.attn_cluster_model picks
them); 256 tokens at ctx 512 and 2048, twice each, then the per-stage table of one traced step at 512.
usage: python3 bench/experiments/one-launch-time.py [shape, default qwen2.5-coder-0.5b] [name=value ...]
       every name=value goes to Monokernel(...) (values: ints, True / False / None), e.g. n_splits=16; .name=value
       sets that attribute after construction (a run-time switch of the same binary), e.g. .signal_warp=0.
       KOG_CTXS=512,1024,4096 times those contexts instead of 512 and 2048; KOG_TRACE_CTXS=512,8000 traces a step
       at each of those contexts instead of 512 only (session 32's long-context curve:
       KOG_CTXS=512,2048,4096,8000 KOG_TRACE_CTXS=512,2048,4096,8000)."""
import ast
import os
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.decode import random_setup
from bench.mk_trace import time_and_trace
from kernels.runtime import Monokernel
from kernels.schedule import Dims, attn_cluster_model

N = 256
name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-0.5b"
kw = {k: ast.literal_eval(v) for k, v in (a.split("=", 1) for a in sys.argv[2:]) if not k.startswith(".")}
attrs = {k[1:]: ast.literal_eval(v) for k, v in (a.split("=", 1) for a in sys.argv[2:]) if k.startswith(".")}
CTXS = [int(c) for c in os.environ.get("KOG_CTXS", "512,2048").split(",")]
TRACE_CTXS = [int(c) for c in os.environ.get("KOG_TRACE_CTXS", "512").split(",")]
cfg, model, cache = random_setup(name, max(CTXS) + N + 64)
kw.setdefault("attn_cluster", attn_cluster_model(Dims.of(cfg)))
mk = Monokernel(model, cache.k, cache.v, max_steps=N + 64, **kw)
for k, v in attrs.items():
    if not hasattr(mk, k):
        raise SystemExit(f"Monokernel has no attribute {k!r}")
    setattr(mk, k, v)
tag = " ".join([f"{k}={v}" for k, v in kw.items()] + [f".{k}={v}" for k, v in attrs.items()])
time_and_trace(mk, f"{name} {tag}", CTXS, n=N, trace_ctxs=TRACE_CTXS)
