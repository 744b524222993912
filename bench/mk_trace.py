"""Where a monokernel token step spends its time, from the kernel's per-instruction timestamps.

`Monokernel.enable_trace(step)` makes thread 0 of every CTA stamp each instruction of one token step with
%globaltimer (ns): when it starts waiting for its inputs, when they are ready, when its outputs are signalled.
For each stage (layer, op) this derives:
  hop    = first consumer sees its inputs - last producer of the previous stage signalled (signal latency)
  span   = last instruction of the stage signalled - first one saw its inputs (work + stragglers)
  spread = last - median signal time of the stage (how much the slowest CTA holds everyone up; for ATTN, as its
           prep and mv below, over the splits with positions only: idle splits signal at once, and with them in the
           median a plain launch's attention showed a ~2.9 us "spread" that was no straggler, NOTES session 22)
and, per matvec instruction (medians over the stage's instructions): prep = inputs ready -> matvec start
(norm / vector loads), mv = matvec start -> signalled (weights + epilogue; mv_max the slowest). For ATTN the
"matvec start" stamp is the split's partial published: prep = the partial, mv = the wait for the head's other
partials plus the split's slice of the merge (mv_max the slowest); the slowest split's partial is
also cut into q (+ rope, K/V append), the position loop, and the merge of the warps' results up to the ticket.
Per op these are averaged over layers; hop + span summed over a layer's stages is the layer's critical path.
"""
from __future__ import annotations

import statistics

STAGE_ORDER = ("QKV", "ATTN", "ATTNQ", "OPROJ", "GATEUP", "DOWN", "MLP")   # MLP: the fused schedule's last stage


def stage_table(records: list[dict], op_names: dict[int, str]) -> dict:
    """records: Monokernel.trace_records(); op_names: opcode -> name. -> {op: {hop_us, span_us, spread_us}},
    plus 'layer_us' (mean critical path per layer) and 'step_us' (first stamp to last)."""
    stages: dict[tuple[int, str], list[dict]] = {}
    for r in records:
        name = op_names[r["op"]]
        key = ((r["layer"], STAGE_ORDER.index(name)) if name in STAGE_ORDER
               else (10**6, len(STAGE_ORDER) + (name == "SAMPLE")))
        stages.setdefault(key, []).append(r)
    order = sorted(stages)
    per_op: dict[str, dict[str, list[float]]] = {}
    prev_done = None
    for key in order:
        rs = stages[key]
        ready = min(r["t_ready"] for r in rs)
        done = max(r["t_done"] for r in rs)
        busy = [r for r in rs if r.get("t_q") is not None] if op_names[rs[0]["op"]] in ("ATTN", "ATTNQ") else rs
        dones = sorted(r["t_done"] for r in (busy or rs))
        d = per_op.setdefault(op_names[rs[0]["op"]], {"hop_us": [], "span_us": [], "spread_us": [], "prep_us": [],
                                                       "prep_max_us": [], "mv_us": [], "mv_max_us": []})
        att = [r for r in rs if r.get("t_q") is not None and r.get("t_loop") is not None]
        if att and op_names[rs[0]["op"]] == "MLP":   # medians: GATEUP rows, the DOWN share, its adds + signal
            for k, a, b in (("gu_us", "t_mv", "t_q"), ("down_us", "t_q", "t_loop"), ("red_us", "t_loop", "t_done")):
                d.setdefault(k, []).append(statistics.median(r[b] - r[a] for r in att) / 1e3)
        elif att:   # ATTN splits with positions: q + rope, the position loop, the in-CTA merge up to the ticket
            for k, a, b in (("q_us", "t_ready", "t_q"), ("loop_us", "t_q", "t_loop"), ("merge_us", "t_loop", "t_mv")):
                d.setdefault(k, []).append(max(r[b] - r[a] for r in att if r[b] is not None) / 1e3)
        mv = [r for r in (busy or rs) if r.get("t_mv") is not None]
        if mv:
            d["prep_us"].append(statistics.median(r["t_mv"] - r["t_ready"] for r in mv) / 1e3)
            d["prep_max_us"].append(max(r["t_mv"] - r["t_ready"] for r in mv) / 1e3)
            d["mv_us"].append(statistics.median(r["t_done"] - r["t_mv"] for r in mv) / 1e3)
            d["mv_max_us"].append(max(r["t_done"] - r["t_mv"] for r in mv) / 1e3)
        if prev_done is not None:
            d["hop_us"].append((ready - prev_done) / 1e3)
        d["span_us"].append((done - ready) / 1e3)
        d["spread_us"].append((done - statistics.median(dones)) / 1e3)
        prev_done = done
    out = {op: {k: (sum(v) / len(v) if v else 0.0) for k, v in d.items()} for op, d in per_op.items()}
    layer = sum(out[op]["hop_us"] + out[op]["span_us"] for op in STAGE_ORDER if op in out)
    t_all = [r[k] for r in records for k in ("t_wait", "t_ready", "t_done")]
    out["layer_us"] = layer
    out["step_us"] = (max(t_all) - min(t_all)) / 1e3 if t_all else 0.0
    return out


def format_table(name: str, tab: dict) -> str:
    lines = [f"[{name}] per-stage means over layers (us): hop = signal -> first consumer ready, "
             f"span = first ready -> last signal, spread = last - median signal"]
    for op in STAGE_ORDER + ("LMHEAD", "SAMPLE"):
        if op in tab:
            t = tab[op]
            lines.append(f"  {op:<7} hop {t['hop_us']:6.2f}  span {t['span_us']:6.2f}  spread {t['spread_us']:6.2f}"
                         f"  | prep {t['prep_us']:5.2f} (max {t['prep_max_us']:5.2f})"
                         f"  mv {t['mv_us']:6.2f} (max {t['mv_max_us']:6.2f})"
                         + (f"  | slowest split: q {t['q_us']:.2f} loop {t['loop_us']:.2f} merge {t['merge_us']:.2f}"
                            if "loop_us" in t else "")
                         + (f"  | gateup {t['gu_us']:.2f} down {t['down_us']:.2f} adds {t['red_us']:.2f}"
                            if "gu_us" in t else ""))
    lines.append(f"  layer critical path {tab['layer_us']:.2f} us; traced step {tab['step_us']:.1f} us")
    return "\n".join(lines)


def time_and_trace(mk, label: str, ctxs=(512, 2048), reps: int = 2, n: int = 256, trace_ctxs=(512,)) -> None:
    """The experiments' common measurement (bench/experiments/*-time.py): us/token of Monokernel mk at each context
    (reps timings of n tokens after a 32-token warm-up, each the median of 3 launches), then the per-stage table of
    one traced step at each of trace_ctxs."""
    from bench.decode import timed
    from kernels import isa
    for ctx in ctxs:
        for _ in range(reps):
            mk.run(0, 1234, ctx, 32)
            us = timed(lambda: mk.run(0, 1234, ctx, n), 3) / n * 1e6
            print(f"{label}: ctx {ctx:5d} {us:8.1f} us/token ({mk.n_sm} CTAs, {mk.smem} B shared memory)", flush=True)
    for ctx in trace_ctxs:
        mk.enable_trace(100)
        mk.run(0, 1234, ctx, n)
        tag = label if tuple(trace_ctxs) == (512,) else f"{label} ctx {ctx}"
        print(format_table(tag, stage_table(mk.trace_records(), {v: k for k, v in isa.OPS.items()})), flush=True)
    mk.enable_trace(None)


def trace_steps(mk, steps, ctx: int = 512, n: int = 256) -> dict[int, list[dict]]:
    """Monokernel mk's trace records (Monokernel.trace_records) of each of `steps` of an n-token launch at context
    ctx, after a 32-token warm-up, one launch per step; tracing is off again after."""
    mk.run(0, 1234, ctx, 32)
    recs = {}
    for step in steps:
        mk.enable_trace(step)
        mk.run(0, 1234, ctx, n)
        recs[step] = mk.trace_records()
    mk.enable_trace(None)
    return recs


def time_replaced_schedule(name: str, transform, label: str, n: int = 256) -> None:
    """time_and_trace of the engine's launch for preset `name` (bench/decode.py's random model and KV) with every
    schedule the runtime builds passed through transform(schedule, dims) first (None: as built): the runner of the
    schedule re-placement experiments (bench/experiments/qkv-*-time.py). One configuration per process."""
    from bench.decode import random_setup
    import kernels.runtime as rt
    from kernels.schedule import Dims, attn_cluster_model
    cfg, model, cache = random_setup(name, 2048 + n + 64)
    dims = Dims.of(cfg)
    if transform is not None:
        built = rt.build_schedule
        rt.build_schedule = lambda *a, **kw: transform(built(*a, **kw), dims)
    mk = rt.Monokernel(model, cache.k, cache.v, max_steps=n + 64, attn_cluster=attn_cluster_model(dims))
    time_and_trace(mk, f"{name} {label} ({mk.sched.counts['QKV']} QKV instructions, at most {mk.sched.rows['QKV']} "
                   f"rows)", n=n)
