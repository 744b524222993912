"""What the ATTNQ q stage is made of (bench/NOTES.md, session 29), from the stamps of 100-mk-attnq-q-stamps.patch
(trace words 6: the part's matvec done, 7: every rank's rows in, 8: q and the row rotated; the patch keeps word 3 at
the end of the norm): ready -> norm -> matvec -> exchange -> rotate (+ the k / v wait of the split holding pos) ->
staging (attn_chunks' cp.async wait and barrier) -> loop -> merge, per ATTNQ record and for each part's slowest
split. Dumps of the session-29 patch (8 words) have no word 8: their "rotate" runs to q ready. Trace records of steps 60 and 100 of a 256-token launch at ctx 512 (the
engine's launch) go to $OUT/attnq_q_<shape>.json.
usage: cp -r . /tmp/p100 && cd /tmp/p100 && git apply bench/experiments/100-mk-attnq-q-stamps.patch &&
       OUT=<dir> python3 bench/experiments/attnq-q-stage.py <shape> [--no-early]
       python3 bench/experiments/attnq-q-stage.py --from <json>   (the analysis of a saved dump, any tree)
Then the ATTNQ and QKV matvecs binned by how long their early weight loads were in flight before them (leads).
--no-early: the same again with the weights loaded after the wait (Monokernel.early_loads = 0): the matvec with all of
its load latency inside, as the bound to read the early-load run's matvec against."""
import json
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

SEGMENTS = (("norm", "t_ready", "t_mv"), ("matvec", "t_mv", "t_x6"), ("exchange", "t_x6", "t_x7"),
            ("rotate (+ k / v wait)", "t_x7", "t_x8"), ("staging", "t_x8", "t_q"), ("loop", "t_q", "t_loop"),
            ("merge", "t_loop", "t_done"))


def report(recs_by_step: dict, attnq: int, cluster: int = 16) -> None:
    all_seg, slow_seg, skew = defaultdict(list), defaultdict(list), []
    for recs in recs_by_step.values():
        for r in recs:   # an 8-word dump: rotate runs to q ready, staging is 0
            r.setdefault("t_x8", r["t_q"])
        parts = defaultdict(list)
        for r in recs:
            if r["op"] == attnq and r.get("t_x7"):
                parts[(r["layer"], r["sm"] // cluster)].append(r)
        for rs in parts.values():
            busy = [r for r in rs if r["t_q"]]   # splits with positions
            for r in busy:
                for name, a, b in SEGMENTS:
                    all_seg[name].append(r[b] - r[a])
            last = max(busy, key=lambda r: r["t_q"])
            for name, a, b in SEGMENTS[:5]:
                slow_seg[name].append(last[b] - last[a])
            holds_pos = last["sm"] % cluster == max(r["sm"] % cluster for r in busy)   # split S_eff - 1
            slow_seg["is the split holding pos"].append(1e3 * holds_pos)
            skew.append(max(r["t_ready"] for r in rs) - min(r["t_ready"] for r in rs))
    med = lambda v: statistics.median(v) / 1e3   # noqa: E731
    print("segment, median over the busy splits (us), then the part's slowest split (latest q ready)")
    for name, _, _ in SEGMENTS:
        slow = med(slow_seg[name]) if name in slow_seg else float("nan")
        print(f"  {name:24s} {med(all_seg[name]):6.2f}   {slow:6.2f}")
    print(f"  slowest split holds pos in {100 * statistics.mean(slow_seg['is the split holding pos']) / 1e3:.0f} % of "
          f"parts; ready skew over a part's ranks {med(skew):.2f} us")


# How long an instruction's early weight loads were in flight before its matvec started (word 0, stamped once they
# are issued, to the matvec start), in these bins (us).
LEAD_BINS = (0.0, 1.0, 2.0, 3.0, 5.0, float("inf"))


def by_lead(recs_by_step: dict, op: int, end: str) -> None:
    """The matvec's time (t_mv -> `end`) of every `op` record, binned by its loads' lead (t_wait -> t_mv): if the
    matvec waits for its weights, it is longest where the lead is shortest."""
    bins = defaultdict(list)
    for recs in recs_by_step.values():
        for r in recs:
            if r["op"] != op or not r.get("t_mv") or not r.get(end):
                continue
            lead = (r["t_mv"] - r["t_wait"]) / 1e3
            k = next(i for i in range(len(LEAD_BINS) - 1) if lead < LEAD_BINS[i + 1])
            bins[k].append((r[end] - r["t_mv"]) / 1e3)
    for k in sorted(bins):
        v = bins[k]
        print(f"  lead {LEAD_BINS[k]:.0f}-{LEAD_BINS[k + 1]:.0f} us: {len(v):5d} records, matvec median "
              f"{statistics.median(v):5.2f}  p90 {sorted(v)[int(0.9 * (len(v) - 1))]:5.2f} us")


def leads(recs_by_step: dict, ops: dict) -> None:
    print("matvec time by how long its weight loads were in flight before it (word 0 -> matvec start)")
    print(" ATTNQ (matvec done: word 6)")
    by_lead(recs_by_step, ops["ATTNQ"], "t_x6")
    print(" QKV (to the rows signalled: matvec + epilogue)")
    by_lead(recs_by_step, ops["QKV"], "t_done")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from kernels import isa
    if sys.argv[1] == "--from":
        dump = json.load(open(sys.argv[2]))
        report(dump, isa.OPS["ATTNQ"])
        leads(dump, isa.OPS)
        sys.exit(0)
    if isa.TRACE_WORDS < 9:
        raise SystemExit("apply bench/experiments/100-mk-attnq-q-stamps.patch first (9 trace words)")
    from bench.decode import random_setup
    from bench.mk_trace import trace_steps
    from kernels.runtime import Monokernel
    from kernels.schedule import Dims, attn_cluster_model
    name = sys.argv[1]
    cfg, model, cache = random_setup(name, 512 + 256 + 64)
    mk = Monokernel(model, cache.k, cache.v, max_steps=320, attn_cluster=attn_cluster_model(Dims.of(cfg)))
    runs = [("", 1)] + [(".early_loads=0", 0)] * ("--no-early" in sys.argv[2:])
    for tag, early in runs:   # the same binary: early_loads is a run-time switch (weights loaded before the wait)
        mk.early_loads = early
        recs = trace_steps(mk, (60, 100))
        with open(os.path.join(os.environ.get("OUT", "/tmp"), f"attnq_q_{name}{tag}.json"), "w") as f:
            json.dump(recs, f)
        print(f"== {name} early_loads={early}")
        report(recs, isa.OPS["ATTNQ"])
        leads(recs, isa.OPS)
