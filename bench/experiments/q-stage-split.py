"""The attention's q stage split in three, from a trace dump of the diagnostic build of patch 84
(84-mk-q-stage-stamps.patch: ATTN's trace word 3 = the q stage starts, word 5 = thread 0's q loads are back; the
position loop and merge stamps are off in that build).
usage: (device, patched tree) OUT=<dir> python3 bench/experiments/trace-dump.py qwen2.5-coder-0.5b,qwen2.5-coder-1.5b
       (here) python3 bench/experiments/q-stage-split.py <dir>/trace_dump.json
Per shape, medians over the ATTN splits with positions of every traced step: ready -> start (the instruction's own
set-up after its wait), start -> loads back (thread 0's q / k reads of the floats QKV wrote), loads back -> q ready
(rotary factors, the stores, the staged K / V wait, the barrier). Prints a table, then a JSON line."""
import json
import statistics
import sys


def q_stage_parts(recs: list[dict], attn_op: int) -> dict[str, float]:
    """recs: Monokernel.trace_records() of the patched build -> median us of the three parts and their sum."""
    rows = [r for r in recs if r["op"] == attn_op and r["t_q"] is not None and r["t_mv"] is not None
            and r["t_loop"] is not None]
    if not rows:
        raise SystemExit("no ATTN split with positions has the patch's stamps (was the dump taken with 84 applied?)")
    part = {"setup": [r["t_mv"] - r["t_ready"] for r in rows], "loads": [r["t_loop"] - r["t_mv"] for r in rows],
            "rest": [r["t_q"] - r["t_loop"] for r in rows], "q": [r["t_q"] - r["t_ready"] for r in rows]}
    return {k: statistics.median(v) / 1e3 for k, v in part.items()} | {"splits": len(rows)}


def main(path: str) -> None:
    with open(path) as f:
        dump = json.load(f)
    out = {}
    print(f"{'shape':22s} {'splits':>6s} {'setup':>7s} {'loads':>7s} {'rest':>7s} {'q':>7s}  (us, medians)")
    for name, d in dump.items():
        recs = [r for step in d["recs"].values() for r in step]
        res = q_stage_parts(recs, d["ops"]["ATTN"])
        out[name] = res
        print(f"{name:22s} {res['splits']:6d} {res['setup']:7.2f} {res['loads']:7.2f} {res['rest']:7.2f} {res['q']:7.2f}")
    print(json.dumps({"bench": "q-stage-split", "rows": out}))


if __name__ == "__main__":
    main(sys.argv[1])
