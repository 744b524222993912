"""Times chain-SM schedules with / without the MLP stash against the every-SM fused schedule (needs
50-mk-chain-sms-mlp-stash.patch applied; bench/NOTES.md, session 11).
usage: python3 bench/experiments/50-chain-time.py SHAPE CONFIGS TAG
  CONFIGS: every,c36:0,c36:1,c0:1,c0:1:17920,... (c<chain_sms>:<stash 0|1>[:<stash bytes>]; c0:1 = the stash on
  the every-SM schedule; a byte count smaller than the region stashes only an instruction's last rows);
  prints us/token and the stage table per config, dumps each traced step to $OUT/trace_TAG_CONFIG.json."""
import json
import os
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch
from bench.decode import timed
from bench.mk_trace import format_table, stage_table
from engine.config import preset
from engine.kv_cache import KVCache
from kernels import isa
from kernels.runtime import Monokernel
from kernels.testing import random_model

name, configs, tag = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
out = Path(os.environ.get("OUT", "/tmp"))
ctx, N, reps = 512, 256, 3
cfg = preset(name)
model = random_model(cfg, max_len=ctx + N + 64, seed=0)
cache = KVCache(1, cfg.n_layers, cfg.n_kv_heads, ctx + N + 64, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
cache.k.normal_()
cache.v.normal_()
row = {}
for c in configs:
    if c == "every":
        mk = Monokernel(model, cache.k, cache.v, max_steps=N + 64)
    else:
        ch, st, *size = c[1:].split(":")
        mk = Monokernel(model, cache.k, cache.v, max_steps=N + 64, chain_sms=int(ch),
                        stash=st == "1")
        if size:
            mk.stash_bytes = min(int(size[0]), mk.stash_bytes)
    mk.run(0, 1234, ctx, 32)
    row[c] = timed(lambda: mk.run(0, 1234, ctx, N), reps) / N * 1e6
    mk.enable_trace(100)
    mk.run(0, 1234, ctx, N)
    recs = mk.trace_records()
    (out / f"trace_{tag}_{c.replace(':', '_')}.json").write_text(json.dumps(recs))
    print(format_table(f"{tag} {name} {c}: {row[c]:.1f} us (smem {mk.smem}, stash {mk.stash_bytes})",
                       stage_table(recs, {v: k for k, v in isa.OPS.items()})), flush=True)
    del mk
    torch.cuda.empty_cache()
print(tag, " ".join(f"{k}={v:.1f}" for k, v in row.items()))
print(json.dumps({tag: row}))
