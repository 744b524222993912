"""What a kv head's attention waits for, from a trace dump of main (bench/experiments/trace-dump.py; no patch).
ncu (bench/NOTES.md, session 24) put ~1.3 us of each ATTN instance of the 0.5B cluster launch at wait_pushes, the
wait for the cluster peers' partials. Per (step, layer, kv head), over the splits with positions (trace words: 1 =
inputs ready, 4 = q ready, 5 = every position done, 3 = the peers' pushes all in (cluster build) or the partial
published (plain launch), 2 = done):
  start skew   last - first split to see its inputs (the QKV -> ATTN handoff's spread)
  loop skew    last - first split to finish its positions
  lag          pushes in (word 3) - the head's last loop end: delivery after the slowest peer (cluster build)
  own wait     word 3 - the split's own loop end
  merge        done - word 3
and which split finishes its positions last (the one appending this step's K / V is split S_eff - 1).
usage: (device) OUT=<dir> python3 bench/experiments/trace-dump.py qwen2.5-coder-0.5b[,...]
       (here)   python3 bench/experiments/attn-wait-split.py <dir>/trace_dump.json
Prints a table (medians, us), then one JSON line."""
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernels import isa  # noqa: E402

F = {f: i for i, f in enumerate(isa.FIELDS)}


def head_groups(d: dict) -> list[list[dict]]:
    """One dump entry -> per (step, layer, head) the ATTN records of its splits with positions, each with 'split'."""
    attn, off, ins = d["ops"]["ATTN"], d["off"], d["ins"]
    groups = defaultdict(list)
    for step, recs in d["recs"].items():
        for r in recs:
            if r["op"] != attn or r["t_loop"] is None:
                continue
            w = ins[off[r["sm"]] + r["index"]]
            groups[(step, w[F["layer"]], w[F["a0"]])].append(dict(r, split=w[F["a1"]]))
    return [g for g in groups.values() if len(g) > 1]


def wait_parts(groups: list[list[dict]]) -> dict:
    med = lambda xs: statistics.median(xs) / 1e3 if xs else None  # noqa: E731
    start, loop, lag, own, merge, last_is_top = [], [], [], [], [], 0
    for g in groups:
        last_loop = max(r["t_loop"] for r in g)
        start.append(max(r["t_ready"] for r in g) - min(r["t_ready"] for r in g))
        loop.append(last_loop - min(r["t_loop"] for r in g))
        for r in g:
            if r["t_mv"] is not None:
                lag.append(r["t_mv"] - last_loop)
                own.append(r["t_mv"] - r["t_loop"])
                merge.append(r["t_done"] - r["t_mv"])
        top = max(r["split"] for r in g)
        last_is_top += max(g, key=lambda r: r["t_loop"])["split"] == top
    return dict(groups=len(groups), start_skew=med(start), loop_skew=med(loop), lag=med(lag), own_wait=med(own),
                merge=med(merge), last_is_appender=round(last_is_top / len(groups), 3) if groups else None)


def main(path: str) -> None:
    with open(path) as f:
        dump = json.load(f)
    out = {}
    print(f"{'shape':22s} {'heads':>6s} {'start':>6s} {'loop':>6s} {'lag':>6s} {'own':>6s} {'merge':>6s} "
          f"{'last=appender':>13s}  (us, medians; skews over a head's splits)")
    for name, d in dump.items():
        res = wait_parts(head_groups(d))
        out[name] = res
        cells = " ".join("     -" if res[k] is None else f"{res[k]:6.2f}"
                         for k in ("start_skew", "loop_skew", "lag", "own_wait", "merge"))
        print(f"{name:22s} {res['groups']:6d} {cells} {res['last_is_appender']:13}")
    print(json.dumps({"bench": "attn-wait-split", "rows": out}))


if __name__ == "__main__":
    main(sys.argv[1])
