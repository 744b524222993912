"""The 1.5B / Llama attention straggler (bench/NOTES.md, session 21, next item 2), measured with a schedule change
only: each layer's QKV rows are cut unevenly, `light` rows on every SM that runs an ATTN split with positions
(attn_split_defaults) of that layer (so its QKV ends early and its ATTN is already polling when the stage's last QKV
lands) and the rest spread over the other SMs, one QKV instruction per SM. No kernel change (same binary as the
default launch). Session 16's traces put the slowest split on an SM whose own QKV was among the last to finish and
which then took ~0.8 us to reach its ATTN wait; the price here is more rows on the SMs without an ATTN.
Session 22: the ATTN spread barely moves (1.5B 2.86 -> 2.55 us), 1.5B is slower, Llama ~0.5 % faster (NOTES).
usage: python3 bench/experiments/qkv-light-on-attn-time.py [shape, default qwen2.5-coder-1.5b] [light rows, 0: default]
One configuration per process (as one-launch-time.py); the engine's launch for the shape.
`python3 bench/experiments/qkv-light-on-attn-time.py --twin` checks the re-cut schedule on the CPU twin (tiny shapes,
plain and fused MLP, two SM orders): logits equal to the reference model's."""
import math
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernels import isa
from kernels.schedule import Schedule, _red_fits, check

N = 256


def qkv_light_on_attention_sms(sched: Schedule, light: int, busy: int) -> Schedule:
    """sched with every layer's QKV rows re-cut: `light` rows for each SM that runs an ATTN split < busy (the splits
    holding positions at the bench's contexts: attn_split_defaults) of that layer, the rest
    evenly over the other SMs (at most one QKV instruction per SM), each placed where the SM's layer begins; the
    ATTN waits count the new number of QKV producers."""
    QKV, ATTN = isa.OPS["QKV"], isa.OPS["ATTN"]
    dm = sched.dims
    m = dm.q_dim + 2 * dm.kv_dim
    stage = {isa.OPS[k]: i for i, k in enumerate(("QKV", "ATTN", "OPROJ", "GATEUP", "DOWN", "MLP"))}
    per_sm = [[ins for ins in lst if ins[0] != QKV] for lst in sched.per_sm]
    proto = {}   # layer -> (wait_ctr, wait_n, sig_ctr) of its QKV instructions
    for lst in sched.per_sm:
        for ins in lst:
            if ins[0] == QKV:
                proto.setdefault(ins[1], (ins[4], ins[5], ins[6]))
    counts, rows = dict(sched.counts), dict(sched.rows)
    n_qkv = None
    for layer in range(dm.n_layers):
        attn = sorted({sm for sm, lst in enumerate(per_sm) for ins in lst
                       if ins[0] == ATTN and ins[1] == layer and ins[3] < busy})
        other = [sm for sm in range(sched.n_sm) if sm not in set(attn)]
        rest = m - light * len(attn)
        heavy = math.ceil(rest / len(other))
        if rest <= 0 or not _red_fits(heavy, dm.d, 1):
            raise ValueError(f"light={light}: {heavy} rows per QKV instruction on the other SMs do not fit")
        cuts, r0 = [], 0
        for sm in attn + other:
            r = min(light if sm in attn else heavy, m - r0)
            if r > 0:
                cuts.append((sm, r0, r))
                r0 += r
        assert r0 == m
        wc, wn, sc = proto[layer]
        for sm, a0, r in cuts:
            lst = per_sm[sm]
            # first instruction of this layer at or after ATTN, or of a later layer / the LM head: QKV goes before it
            at = next((j for j, ins in enumerate(lst)
                       if ins[0] in stage and (ins[1], stage[ins[0]]) >= (layer, stage[ATTN])
                       or ins[0] not in stage), len(lst))
            lst.insert(at, (QKV, layer, a0, r, wc, wn, sc, 0))
        for lst in per_sm:
            for j, ins in enumerate(lst):
                if ins[0] == ATTN and ins[1] == layer:
                    lst[j] = ins[:5] + (len(cuts),) + ins[6:]
        if n_qkv not in (None, len(cuts)):
            raise ValueError("QKV instruction count differs between layers")
        n_qkv = len(cuts)
        rows["QKV"] = max(light, heavy)
    counts["QKV"] = n_qkv
    # the next layer's QKV waits did not change (they wait on the MLP / DOWN counter)
    out = Schedule(dims=dm, n_sm=sched.n_sm, n_splits=sched.n_splits, rows=rows, counts=counts, per_sm=per_sm,
                   n_counters=sched.n_counters, fused_mlp=sched.fused_mlp, cluster=sched.cluster)
    check(out)
    return out


def twin_check() -> None:
    from kernels import schedule
    from kernels.testing import tiny_cfg, tiny_model, twin_schedule_error
    for kw in (dict(arch="qwen2"), dict(arch="llama", n_heads=8, n_kv_heads=4, head_dim=16, hidden_size=96)):
        for n_sm, light in ((16, 2), (32, 1)):
            for fused in (False, True):
                cfg = tiny_cfg(**kw)
                dm = schedule.Dims.of(cfg)
                ns = max(1, n_sm // (2 * dm.n_kv))
                sched = qkv_light_on_attention_sms(schedule.build(dm, n_sm=n_sm, n_splits=ns, fused_mlp=fused),
                                                   light, ns // 2)
                for seed in (1, 2):
                    err = twin_schedule_error(tiny_model(cfg, seed=n_sm), sched, n_sm, seed)
                    print(f"twin {kw} n_sm {n_sm} light {light} fused {fused} order {seed}: QKV "
                          f"{sched.counts['QKV']} instructions (max {sched.rows['QKV']} rows), max rel err {err:.1e}")
                    assert err < 1e-4


if __name__ == "__main__" and sys.argv[1:] == ["--twin"]:
    twin_check()
elif __name__ == "__main__":
    from bench.mk_trace import time_replaced_schedule
    from kernels.schedule import attn_split_defaults
    name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b"
    light = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    time_replaced_schedule(
        name, (lambda s, dims: qkv_light_on_attention_sms(s, light, attn_split_defaults(dims)[1])) if light else None,
        f"QKV light={light}", n=N)
