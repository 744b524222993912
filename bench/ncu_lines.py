"""Where the monokernel's warps are, per CUDA source line, from Nsight Compute's warp-state sampling.

Input: the CSV that `ncu -i <report> --page source --csv --print-source cuda,sass` writes (bench/experiments/
ncu-source.sh makes it on the device): per source file a "File Path" row and a header row, then each CUDA line's row
(line number, source, its aggregated metrics) followed by its SASS rows (empty line number, address, instruction,
metrics). A sample is one warp's state at one moment, so a line's share of the samples is its share of warp time.
Reports: the lines with most samples and their main stall reasons, the same per source file, and the division sites
(an integer division by a run-time divisor starts with I2F...RP: ~20 dependent instructions), with the samples of
the instructions around each. Session 24 found ~0.45 us of each layer's attention in divisions this way.
usage: python3 bench/ncu_lines.py <ncu_shape.csv> [top N lines, default 40]; prints tables, then one JSON line.
       python3 bench/ncu_lines.py --compare <base.csv> <other.csv> [top N]: the lines whose samples or executed
       instructions differ most between two builds of the same launch (lines matched by file and source text, since
       a patch moves line numbers), then one JSON line.
"""
from __future__ import annotations

import csv
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field


@dataclass
class Line:
    file: str
    line: int
    source: str
    samples: int = 0
    stalls: Counter = field(default_factory=Counter)
    executed: int = 0


@dataclass
class Sass:
    address: int
    text: str
    where: str          # "file:line" of the CUDA line it belongs to
    samples: int
    executed: int


def _int(v: str) -> int:
    v = v.replace(",", "")
    return int(v) if v.isdigit() else 0


def parse(rows) -> tuple[dict[tuple[str, int], Line], list[Sass]]:
    """rows: the CSV's rows (lists of strings). -> ({(file, line): Line}, SASS instructions by address, each once)."""
    lines: dict[tuple[str, int], Line] = {}
    sass: dict[int, Sass] = {}
    cur_file, hdr, cur = "?", None, None
    for row in rows:
        if not row:
            continue
        if row[0] == "File Path":
            cur_file = row[1].rsplit("/", 1)[-1]
            continue
        if row[0] == "Line No":
            hdr = row
            continue
        if hdr is None or len(row) < len(hdr) or row[0] == "Function Name":
            continue
        m = dict(zip(hdr[4:], row[4:]))   # the metric columns follow Line No, Source, Address, Source
        if row[0] != "":
            ln = Line(cur_file, int(row[0]), row[1], _int(m.get("# Samples", "0")),
                      Counter({k[len("stall_"):]: _int(v) for k, v in m.items()
                               if k.startswith("stall_") and "Not Issued" not in k}),
                      _int(m.get("Instructions Executed", "0")))
            cur = lines.setdefault((cur_file, ln.line), ln)
            if cur is not ln:   # the same line listed again (another inlined copy): add it up
                cur.samples += ln.samples
                cur.stalls.update(ln.stalls)
                cur.executed = max(cur.executed, ln.executed)
        elif row[2].startswith("0x") and cur is not None:
            a = int(row[2], 16)
            if a not in sass:
                sass[a] = Sass(a, row[3].strip(), f"{cur.file}:{cur.line}", _int(m.get("# Samples", "0")),
                               _int(m.get("Instructions Executed", "0")))
    return lines, [sass[a] for a in sorted(sass)]


def division_sites(sass: list[Sass], before: int = 4, after: int = 22) -> list[dict]:
    """Each I2F...RP instruction (an integer division's reciprocal estimate) with the samples of the instructions
    from `before` ahead of it to `after` past it (the division's dependent chain), most samples first."""
    out = []
    for i, s in enumerate(sass):
        op = s.text.split()[0] if s.text else ""
        if op.startswith("@"):
            op = s.text.split()[1]
        if op.startswith("I2F") and ".RP" in op:
            w = sass[max(0, i - before): i + after]
            out.append(dict(where=s.where, executed=s.executed, samples=sum(x.samples for x in w)))
    return sorted(out, key=lambda d: -d["samples"])


def summary(lines: dict[tuple[str, int], Line], sass: list[Sass], top: int = 40) -> dict:
    total = sum(ln.samples for ln in lines.values()) or 1
    ranked = sorted(lines.values(), key=lambda ln: -ln.samples)[:top]
    by_file: Counter = Counter()
    for ln in lines.values():
        by_file[ln.file] += ln.samples
    return dict(
        total_samples=total,
        lines=[dict(where=f"{ln.file}:{ln.line}", pct=round(100 * ln.samples / total, 2), executed=ln.executed,
                    stalls={k: v for k, v in ln.stalls.most_common(3) if v}, source=ln.source.strip()[:80])
               for ln in ranked],
        files={f: round(100 * v / total, 2) for f, v in by_file.most_common() if v},
        divisions=[dict(d, pct=round(100 * d["samples"] / total, 2)) for d in division_sites(sass)[:top]
                   if d["samples"]])


def compare(a: dict[tuple[str, int], Line], b: dict[tuple[str, int], Line], top: int = 30) -> dict:
    """Per (file, source text) the samples and executed instructions of two profiles (a line inlined in several
    places, or one text on several lines, adds up), the `top` whose samples differ most, and the totals."""
    def by_text(lines):
        out: defaultdict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        for ln in lines.values():
            v = out[(ln.file, ln.source.strip())]
            v[0] += ln.samples
            v[1] += ln.executed
        return out
    ta, tb = by_text(a), by_text(b)
    keys = sorted(set(ta) | set(tb), key=lambda k: (-abs(tb[k][0] - ta[k][0]), k))   # ties in a fixed order
    rows = [dict(file=k[0], source=k[1][:80], samples=[ta[k][0], tb[k][0]], executed=[ta[k][1], tb[k][1]])
            for k in keys[:top]]
    tot = [sum(v[0] for v in t.values()) for t in (ta, tb)]
    ex = [sum(v[1] for v in t.values()) for t in (ta, tb)]
    return dict(total_samples=tot, total_executed=ex, lines=rows)


def main_compare(pa: str, pb: str, top: int) -> None:
    profiles = []
    for path in (pa, pb):
        with open(path, newline="") as f:
            profiles.append(parse(csv.reader(f))[0])
    c = compare(*profiles, top)
    print(f"samples {c['total_samples'][0]} -> {c['total_samples'][1]}, executed instructions "
          f"{c['total_executed'][0]} -> {c['total_executed'][1]}")
    print(f"{'d samples':>9s} {'base':>8s} {'other':>8s}  {'executed base':>14s} {'other':>14s}  file: source")
    for r in c["lines"]:
        (sa, sb), (ea, eb) = r["samples"], r["executed"]
        print(f"{sb - sa:+9d} {sa:8d} {sb:8d}  {ea:14d} {eb:14d}  {r['file']}: {r['source']}")
    print(json.dumps({"bench": "ncu-compare", **c}))


def main(path: str, top: int) -> None:
    with open(path, newline="") as f:
        lines, sass = parse(csv.reader(f))
    s = summary(lines, sass, top)
    print(f"{'% samples':>9s}  {'line':28s} {'executed':>10s}  top stalls / source")
    for d in s["lines"]:
        st = " ".join(f"{k}:{100 * v / max(1, sum(d['stalls'].values())):.0f}%" for k, v in d["stalls"].items())
        print(f"{d['pct']:9.2f}  {d['where']:28s} {d['executed']:10d}  {st:32s} {d['source']}")
    print("\nper file:", ", ".join(f"{f} {p} %" for f, p in s["files"].items()))
    print("\ninteger divisions (samples of each one's ~26 instructions):")
    for d in s["divisions"]:
        print(f"{d['pct']:9.2f}  {d['where']:28s} {d['executed']:10d}")
    print(json.dumps({"bench": "ncu-lines", **s}))


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        main_compare(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 30)
    else:
        main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40)
