"""The cost half of "the chain inside the attention clusters" (bench/NOTES.md, session 21, next item 1), measured
with a schedule change only: each layer's QKV rows go to the CTAs that run that layer's attention splits (one QKV
instruction each, placed right before its ATTN), instead of round-robin over every CTA. No kernel change (same
binary as the default launch). What it shows: how long QKV takes on 32 CTAs with ~36 rows each (weights preloaded
only once their previous instruction ends), and what the attention and OPROJ do when their SMs' neighbours change.
What it cannot show: the gain the real design is for (q over DSMEM instead of the QKV -> ATTN handoff and the q
stage's L2 reads).
usage: python3 bench/experiments/qkv-on-attn-sms-time.py [shape, default qwen2.5-coder-0.5b] [default|placed]
One configuration per process (as one-launch-time.py); the cluster launch of the engine (schedule.attn_cluster_model).
`python3 bench/experiments/qkv-on-attn-sms-time.py --twin` checks the placement on the CPU twin (tiny cluster shapes,
plain and fused MLP, two SM orders): logits equal to the reference model's."""
import math
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernels import isa
from kernels.schedule import Schedule, check

N = 256


def qkv_on_attention_sms(sched: Schedule) -> Schedule:
    """sched with every layer's QKV rows re-cut into one instruction per SM that runs an ATTN of that layer, placed
    just before that ATTN; the ATTN waits count the new number of QKV producers."""
    QKV, ATTN = isa.OPS["QKV"], isa.OPS["ATTN"]
    dm = sched.dims
    m = dm.q_dim + 2 * dm.kv_dim
    per_sm = [[ins for ins in lst if ins[0] != QKV] for lst in sched.per_sm]
    first_qkv = {}   # layer -> (wait_ctr, wait_n, sig_ctr) of its QKV instructions
    for lst in sched.per_sm:
        for ins in lst:
            if ins[0] == QKV:
                first_qkv.setdefault(ins[1], (ins[4], ins[5], ins[6]))
    counts = dict(sched.counts)
    rows = dict(sched.rows)
    for layer in range(dm.n_layers):
        sms = sorted(sm for sm, lst in enumerate(per_sm) for ins in lst if ins[0] == ATTN and ins[1] == layer)
        r = math.ceil(m / len(sms))
        n_qkv = math.ceil(m / r)
        wc, wn, sc = first_qkv[layer]
        for i, sm in enumerate(sms[:n_qkv]):
            lst = per_sm[sm]
            at = next(j for j, ins in enumerate(lst) if ins[0] == ATTN and ins[1] == layer)
            lst.insert(at, (QKV, layer, i * r, min(r, m - i * r), wc, wn, sc, 0))
        for lst in per_sm:
            for j, ins in enumerate(lst):
                if ins[0] == ATTN and ins[1] == layer:
                    lst[j] = ins[:5] + (n_qkv,) + ins[6:]
        counts["QKV"], rows["QKV"] = n_qkv, r   # the same for every layer (same SM count per layer)
    out = Schedule(dims=dm, n_sm=sched.n_sm, n_splits=sched.n_splits, rows=rows, counts=counts, per_sm=per_sm,
                   n_counters=sched.n_counters, fused_mlp=sched.fused_mlp, cluster=sched.cluster)
    check(out)
    return out


def twin_check() -> None:
    from kernels import schedule
    from kernels.testing import tiny_cfg, tiny_model, twin_schedule_error
    for kw in (dict(arch="qwen2"), dict(arch="qwen2", n_heads=6, n_kv_heads=2, head_dim=32, hidden_size=96)):
        for n_sm, cs in ((16, 8), (32, 16)):
            for fused in (False, True):
                cfg = tiny_cfg(**kw)
                sched = qkv_on_attention_sms(schedule.build(schedule.Dims.of(cfg), n_sm=n_sm, fused_mlp=fused,
                                                            cluster=cs))
                for seed in (1, 2):
                    err = twin_schedule_error(tiny_model(cfg, seed=n_sm), sched, n_sm, seed)
                    print(f"twin {kw} n_sm {n_sm} cluster {cs} fused {fused} order {seed}: QKV "
                          f"{sched.counts['QKV']} x {sched.rows['QKV']} rows, max rel err {err:.1e}")
                    assert err < 1e-4


if __name__ == "__main__" and sys.argv[1:] == ["--twin"]:
    twin_check()
elif __name__ == "__main__":
    from bench.mk_trace import time_replaced_schedule
    name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-0.5b"
    mode = sys.argv[2] if len(sys.argv) > 2 else "placed"
    if mode not in ("default", "placed"):
        raise SystemExit("mode: default or placed")
    time_replaced_schedule(name, (lambda s, _: qkv_on_attention_sms(s)) if mode == "placed" else None, f"QKV {mode}",
                           n=N)
