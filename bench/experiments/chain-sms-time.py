"""What the attention chain (QKV, ATTN, OPROJ) costs when it runs on the first C SMs only, the MLP stages still on all
of them: the first risk of the chain-SMs design (bench/NOTES.md, session 19). A schedule change only, no kernel
change: the default schedule's instructions are placed again (each stage's in its global order, the chain stages
round-robin over SMs 0 .. C - 1, every other stage round-robin over all SMs, the sampler on SM 0), checked with
schedule.check, and timed as bench/experiments/one-launch-time.py times a launch (one process per run is not needed:
the binary is the same for every C).
usage: python3 bench/experiments/chain-sms-time.py [shape, default qwen2.5-coder-1.5b] [splits] [C ...]
splits: attention splits per kv head in the schedule (each ATTN instruction needs an SM of its own, so n_kv x splits
<= C; the default schedule has min(64, 132 / n_kv) of which the runtime uses at most 32). C = 0: every SM.
Plain launches only (the cluster launch places the attention by cluster)."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.decode import random_setup
from bench.mk_trace import time_and_trace
from kernels import isa
from kernels.runtime import Monokernel
from kernels.schedule import Schedule, check

N = 256
CHAIN = ("QKV", "ATTN", "OPROJ")


def placed(sched: Schedule, c: int) -> Schedule:
    """sched's instructions on new SMs: CHAIN stages round-robin over SMs [0, c), the others over all SMs."""
    names = {v: k for k, v in isa.OPS.items()}
    stages = ("QKV", "ATTN", "OPROJ", "MLP") if sched.fused_mlp else ("QKV", "ATTN", "OPROJ", "GATEUP", "DOWN")

    def rank(ins):
        name = names[ins[0]]
        if name in stages:
            return (ins[1], stages.index(name))
        return (sched.dims.n_layers, 0 if name == "LMHEAD" else 1)

    allins = sorted((ins for lst in sched.per_sm for ins in lst), key=rank)   # stable: emission order within a stage
    per_sm = [[] for _ in range(sched.n_sm)]
    cur = {"chain": 0, "all": 0}
    for ins in allins:
        name = names[ins[0]]
        if name == "SAMPLE":
            per_sm[0].append(ins)
        elif name in CHAIN:
            per_sm[cur["chain"] % c].append(ins)
            cur["chain"] += 1
        else:
            per_sm[cur["all"] % sched.n_sm].append(ins)
            cur["all"] += 1
    out = Schedule(dims=sched.dims, n_sm=sched.n_sm, n_splits=sched.n_splits, rows=dict(sched.rows),
                   counts=dict(sched.counts), per_sm=per_sm, n_counters=sched.n_counters, fused_mlp=sched.fused_mlp)
    check(out)
    return out


name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b"
splits = int(sys.argv[2]) if len(sys.argv) > 2 else 32
cs = [int(a) for a in sys.argv[3:]] or [0, 66]
cfg, model, cache = random_setup(name, 2048 + N + 64)
base = Monokernel(model, cache.k, cache.v, max_steps=N + 64, n_splits=splits)
for c in cs:
    if c and cfg.n_kv_heads * base.sched.n_splits > c:
        print(f"{name} chain on {c} SMs: skipped ({base.sched.n_splits} splits x {cfg.n_kv_heads} kv heads "
              f"need one SM each)")
        continue
    mk = base if c == 0 else Monokernel(model, cache.k, cache.v, max_steps=N + 64, sched=placed(base.sched, c))
    tag = f"{splits} splits, chain on {c or mk.n_sm} SMs"
    time_and_trace(mk, f"{name} {tag}", reps=1, n=N)
