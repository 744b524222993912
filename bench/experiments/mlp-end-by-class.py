"""When each class of CTA finishes its fused MLP instruction, from a trace dump (bench/experiments/trace-dump.py):
the CTAs of a layer's ATTNQ parts, the cluster CTAs without a part ("free") and the side launch's ("side"). Per
shape and class: the MLP's ready -> done time and its done stamp against the layer's median MLP done stamp (us,
means over layers and traced steps), and how often the layer's last MLP to finish is of that class. It says whether
schedule.build's mlp_weights (free, side) should move rows between classes (bench/NOTES.md, session 33).
usage: python3 bench/experiments/mlp-end-by-class.py trace_dump.json"""
import json
import statistics
import sys


def classes(d: dict) -> dict[tuple[int, int], str]:
    """(sm, layer) -> class, from the dump's flat instruction lists (off, ins) and the clustered launch's size."""
    op = d["ops"]
    out = {}
    for sm in range(d["n_sm"]):
        for ins in d["ins"][d["off"][sm]:d["off"][sm + 1]]:
            if ins[0] == op["ATTNQ"]:
                out[(sm, ins[1])] = "part"
    return out


def table(name: str, d: dict) -> list[str]:
    parts, mlp_op, n_main = classes(d), d["ops"]["MLP"], d.get("n_main", d["n_sm"])
    dur, late, last = {}, {}, {}
    for recs in d["recs"].values():
        by_layer: dict[int, list[dict]] = {}
        for r in recs:
            if r["op"] == mlp_op:
                by_layer.setdefault(r["layer"], []).append(r)
        for layer, rs in by_layer.items():
            med = statistics.median(r["t_done"] for r in rs)
            for r in rs:
                c = "side" if r["sm"] >= n_main else parts.get((r["sm"], layer), "free")
                dur.setdefault(c, []).append((r["t_done"] - r["t_ready"]) / 1000)
                late.setdefault(c, []).append((r["t_done"] - med) / 1000)
            c = max(rs, key=lambda r: r["t_done"])
            c = "side" if c["sm"] >= n_main else parts.get((c["sm"], layer), "free")
            last[c] = last.get(c, 0) + 1
    n_last = sum(last.values())
    return [f"{name:20s} {c:5s} {len(dur[c]):6d} {statistics.mean(dur[c]):8.2f} {statistics.mean(late[c]):+8.2f} "
            f"{max(late[c]):+8.2f} {100 * last.get(c, 0) / n_last:7.0f} %" for c in ("part", "free", "side") if c in dur]


if __name__ == "__main__":
    dump = json.load(open(sys.argv[1]))
    print(f"{'shape':20s} class   MLPs  mv+adds  vs median  worst   last")
    for name, d in dump.items():
        print("\n".join(table(name, d)))
