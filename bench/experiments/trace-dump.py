"""Per-instruction trace records (Monokernel.trace_records) of three traced steps (60, 100, 140) of a 256-token launch
at ctx 512, with each model's instruction lists, as one JSON file: who is late in which stage, and what ran before it
on its SM (bench/NOTES.md, session 16). Same model, KV and backend as bench/decode.py.
usage: OUT=<dir> python3 bench/experiments/trace-dump.py qwen2.5-coder-0.5b[,qwen2.5-coder-1.5b,...]
       -> $OUT/trace_dump.json: {shape: {n_sm, cluster, n_splits, off, ins, ops, recs: {step: [record, ...]}}}"""
import json
import os
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch
from bench.decode import random_setup
from bench.mk_trace import trace_steps
from engine.backends.monokernel import MonokernelBackend
from kernels import isa

out = {}
for name in sys.argv[1].split(","):
    cfg, model, cache = random_setup(name, 512 + 256 + 64)
    be = MonokernelBackend(model, cache)
    mk = be.mk
    recs = trace_steps(mk, (60, 100, 140))
    off, ins = mk.sched.flat()
    out[name] = dict(n_sm=mk.n_sm, cluster=mk.attn_cluster, n_splits=mk.sched.n_splits, off=off.tolist(),
                     ins=ins.tolist(), ops=isa.OPS, recs=recs)
    print(name, mk.n_sm, "CTAs,", len(recs[100]), "instructions per step", flush=True)
    del be, mk, model, cache
    torch.cuda.empty_cache()
with open(os.path.join(os.environ.get("OUT", "/tmp"), "trace_dump.json"), "w") as f:
    json.dump(out, f)
