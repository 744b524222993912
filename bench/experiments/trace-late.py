"""Who is late, and why, in the per-instruction traces of bench/experiments/trace-dump.py (bench/NOTES.md, session 16).
For each shape: per stage, how far each instruction finishes after the stage's median, grouped by what else its SM ran
in that layer; then the attention's slowest split per layer: how late it saw its inputs, its q / loop / partial times,
the op its SM ran before it and when that op signalled; then the gap between one instruction's signal and the next
one's wait on each SM, and who reaches a wait late (session 22). All medians over the traced layers of every traced
step.
usage: python3 bench/experiments/trace-late.py trace_dump.json"""
import collections
import json
import statistics as st
import sys


def us(ns):
    return ns / 1e3


def upper_median(xs):
    """The middle element (the upper one of an even count), as a value of xs: the reference point of a stage."""
    return sorted(xs)[len(xs) // 2]


def report(name: str, d: dict) -> None:
    ops = {v: k for k, v in d["ops"].items()}
    off, ins = d["off"], d["ins"]
    late = collections.defaultdict(list)            # (stage, what else the SM ran) -> lateness after the median
    slow = []                                         # the slowest attention split of each traced layer
    prev_ops = collections.Counter()
    for recs in d["recs"].values():
        per_sm = collections.defaultdict(dict)
        ran = collections.defaultdict(list)
        stages = collections.defaultdict(list)
        for r in recs:
            per_sm[r["sm"]][r["index"]] = r
            ran[r["sm"], r["layer"]].append(ops[r["op"]])
            stages[r["layer"], ops[r["op"]]].append(r)
        for (layer, op), rs in stages.items():
            if op in ("LMHEAD", "SAMPLE"):
                continue
            med = upper_median([r["t_done"] for r in rs])
            for r in rs:
                other = "+".join(o for o in ran[r["sm"], layer] if o != op and o not in ("LMHEAD", "SAMPLE")) or "-"
                late[op, other].append(us(r["t_done"] - med))
            split = [r for r in rs if op == "ATTN" and r["t_q"] is not None]
            if split:
                r0 = min(r["t_ready"] for r in split)
                s = max(split, key=lambda r: r["t_mv"])
                p = per_sm[s["sm"]].get(s["index"] - 1)
                if p is not None:
                    prev_ops[ops[ins[off[s["sm"]] + s["index"] - 1][0]]] += 1
                pubs = sorted(r["t_mv"] for r in split)
                slow.append(dict(spread=us(pubs[-1] - pubs[len(pubs) // 2]), start=us(s["t_ready"] - r0),
                                 q=us(s["t_q"] - s["t_ready"]), loop=us(s["t_loop"] - s["t_q"]),
                                 partial=us(s["t_mv"] - s["t_loop"]),
                                 prev_done=us(p["t_done"] - r0) if p else float("nan"),
                                 to_wait=us(s["t_wait"] - p["t_done"]) if p else float("nan")))
    print(f"== {name}: {d['n_sm']} CTAs, clusters {d['cluster']}, {d['n_splits']} splits per kv head")
    for (op, other), v in sorted(late.items()):
        v = sorted(v)
        print(f"  {op:6s} SMs that also ran {other:22s} n={len(v):5d}  after the median: med {st.median(v):+.2f} "
              f"p90 {v[int(0.9 * (len(v) - 1))]:+.2f} max {v[-1]:+.2f} us")
    if slow:
        m = {k: st.median(x[k] for x in slow) for k in slow[0]}
        print(f"  slowest attention split ({len(slow)} layers; previous op {dict(prev_ops)}): publishes "
              f"{m['spread']:.2f} us after the median split; sees its inputs {m['start']:.2f} after the first; q {m['q']:.2f}, loop "
              f"{m['loop']:.2f}, partial {m['partial']:.2f}; its SM's previous op signalled {m['prev_done']:+.2f} us "
              f"from the stage's first ready and reached this wait {m['to_wait']:.2f} us later")


def sm_offsets(name: str, d: dict, op: str) -> None:
    """Per CTA, its median duration (ready -> done) in stage `op` minus the stage's median, and how well one half of
    the samples predicts the other (split-half correlation): whether some CTAs stream systematically slower."""
    ops = {v: k for k, v in d["ops"].items()}
    per = collections.defaultdict(list)
    for recs in d["recs"].values():
        mine = [r for r in recs if ops[r["op"]] == op]
        stages = collections.defaultdict(list)
        for r in mine:
            stages[r["layer"]].append(r["t_done"] - r["t_ready"])
        med = {layer: upper_median(durs) for layer, durs in stages.items()}
        for r in mine:
            per[r["sm"]].append(us(r["t_done"] - r["t_ready"] - med[r["layer"]]))
    if len(per) < 3:
        return
    off = sorted((st.median(v), sm) for sm, v in per.items())
    a = [st.median(v[::2]) for _, v in sorted(per.items())]
    b = [st.median(v[1::2]) if len(v) > 1 else st.median(v) for _, v in sorted(per.items())]
    print(f"  {op} duration by CTA against the stage median: fastest "
          + ", ".join(f"{sm} {m:+.2f}" for m, sm in off[:4]) + "; slowest "
          + ", ".join(f"{sm} {m:+.2f}" for m, sm in off[-4:])
          + f" us; split-half correlation {st.correlation(a, b):.2f}")


def gaps_and_arrivals(name: str, d: dict) -> None:
    """(session 22) Per pair of consecutive ops on one SM, the time from the first one's signal to the second one's
    wait (what the SM does between two instructions); per stage, the share of instructions that reach their wait
    after the stage's first consumer saw its inputs, and how long those wait."""
    ops = {v: k for k, v in d["ops"].items()}
    gaps, late, n = collections.defaultdict(list), collections.defaultdict(list), collections.Counter()
    for recs in d["recs"].values():
        per_sm = collections.defaultdict(dict)
        stages = collections.defaultdict(list)
        for r in recs:
            per_sm[r["sm"]][r["index"]] = r
            stages[r["layer"], ops[r["op"]]].append(r)
        for m in per_sm.values():
            for i, r in m.items():
                if i - 1 in m:
                    gaps[ops[m[i - 1]["op"]], ops[r["op"]]].append(us(r["t_wait"] - m[i - 1]["t_done"]))
        for (_, op), rs in stages.items():
            first = min(r["t_ready"] for r in rs)
            n[op] += len(rs)
            late[op] += [us(r["t_ready"] - r["t_wait"]) for r in rs if r["t_wait"] > first]
    print("  signal -> next wait on the same SM: " + ", ".join(
        f"{a}->{b} {st.median(v):.2f}" for (a, b), v in sorted(gaps.items()) if len(v) >= 10) + " us (medians)")
    print("  reached the wait after the stage's inputs were ready: " + ", ".join(
        f"{op} {100 * len(late[op]) / n[op]:.1f} % (wait {st.median(late[op]) if late[op] else 0:.2f} us)"
        for op in n if op not in ("SAMPLE",)))


data = json.load(open(sys.argv[1]))
for name, d in data.items():
    report(name, d)
    gaps_and_arrivals(name, d)
    for op in ("MLP", "GATEUP", "DOWN", "LMHEAD"):
        sm_offsets(name, d, op)
