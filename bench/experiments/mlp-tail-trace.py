"""Which CTAs end the fused MLP last (bench/NOTES.md, session 28: with 2 ATTNQ parts the 64 CTAs that ran the layer's
attention trailed into the MLP). Trace records of steps 60 and 100 of a 256-token launch at ctx 512, grouped per MLP
instruction by what its CTA did in the layer: ran the layer's attention (ATTN / ATTNQ), runs the next layer's, a side
CTA (past the main launch's n_main), or none; prints each group's mean lateness against the layer's median MLP end and
how often the group holds the last finisher. The records go to $OUT/mlp_tail_<shape>.json.
usage: OUT=<dir> python3 bench/experiments/mlp-tail-trace.py <shape> [name=value ...]   (Monokernel(...) arguments)
       python3 bench/experiments/mlp-tail-trace.py --from <json> [n_main]   (the analysis of a saved dump)"""
import ast
import json
import os
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

ATTN_OPS = {"ATTN", "ATTNQ"}


def mlp_tail(recs: list[dict], ops: dict[str, int], n_main: int) -> dict:
    """{group: (mean lateness us, records, layers where it holds the last MLP finisher)} over the records of one step."""
    attn_codes = {ops[o] for o in ATTN_OPS if o in ops}
    mlp, attn = defaultdict(list), defaultdict(set)
    for r in recs:
        if r["op"] == ops["MLP"]:
            mlp[r["layer"]].append(r)
        elif r["op"] in attn_codes:
            attn[r["layer"]].add(r["sm"])

    def group(sm, layer):
        if sm >= n_main:
            return "side"
        if sm in attn[layer]:
            return "attention this layer"
        return "attention next layer" if sm in attn.get(layer + 1, ()) else "other"

    late, last = defaultdict(list), Counter()
    for layer, rs in mlp.items():
        med = statistics.median(r["t_done"] for r in rs)
        for r in rs:
            late[group(r["sm"], layer)].append((r["t_done"] - med) / 1e3)
        last[group(max(rs, key=lambda r: r["t_done"])["sm"], layer)] += 1
    return {g: (statistics.mean(v), len(v), last[g]) for g, v in sorted(late.items())}


def report(dump: dict, ops: dict[str, int], n_main: int) -> None:
    for step, recs in dump["recs"].items():
        n_layers = len({r["layer"] for r in recs if r["op"] == ops["MLP"]})
        print(f"step {step}: group, mean MLP end - median (us), MLP records, layers where it ends last (of {n_layers})")
        for g, (m, n, k) in mlp_tail(recs, ops, n_main).items():
            print(f"  {g:22s} {m:+6.2f} {n:6d} {k:4d}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from kernels import isa
    if sys.argv[1] == "--from":
        d = json.load(open(sys.argv[2]))
        report(d, isa.OPS, int(sys.argv[3]) if len(sys.argv) > 3 else d["n_main"])
        sys.exit(0)
    from bench.decode import random_setup
    from bench.mk_trace import trace_steps
    from kernels.runtime import Monokernel
    from kernels.schedule import Dims, attn_cluster_model
    name = sys.argv[1]
    kw = {k: ast.literal_eval(v) for k, v in (a.split("=", 1) for a in sys.argv[2:])}
    cfg, model, cache = random_setup(name, 512 + 256 + 64)
    kw.setdefault("attn_cluster", attn_cluster_model(Dims.of(cfg)))
    mk = Monokernel(model, cache.k, cache.v, max_steps=320, **kw)
    recs = trace_steps(mk, (60, 100))
    dump = dict(shape=name, args=sys.argv[2:], n_main=mk.n_main, ran_alone=mk.ran_alone(), recs=recs)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), f"mlp_tail_{name}.json"), "w") as f:
        json.dump(dump, f)
    report(dump, isa.OPS, mk.n_main)
