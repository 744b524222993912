"""Static SASS instructions per CUDA source line of a monokernel build, and how two builds differ, on any machine
(no GPU): nvdisasm's line info (the library is built with -lineinfo) maps each instruction to its file and line,
and lines are matched between builds by file and source text (a patch moves line numbers).

Why: a kernel change of a few us usually also costs several us in code it does not touch (bench/NOTES.md, sessions
16-20 and 27); Nsight Compute's executed-instruction counts (bench/ncu_lines.py --compare) locate that on the device,
and this shows the same growth statically before any device time is spent (session 27: the ATTNQ patches' cluster
builds have 74-80 more instructions on the matvec's weight-load line, whose executed count ncu put at +33 % for 94).

usage: python3 bench/sass_lines.py <lib.so> <source root> [<other lib.so> <other source root>] [--top N]
  one build: the lines with most instructions; two: the lines whose counts differ most, then one JSON line.
  The source roots are the trees the libraries were built from (the line info holds absolute paths: the part up to
  kernels/csrc is replaced by the root given). Tools: nvdisasm and cuobjdump from $KOG_CUDA_BIN or PATH (on a
  machine without the CUDA toolkit: `pip download --no-deps nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump` and unzip).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

_FILE = re.compile(r'\s*//## File "(.*)", line (\d+)')
_INSTR = re.compile(r"\s+/\*[0-9a-f]+\*/\s")


def tool(name: str) -> str:
    d = os.environ.get("KOG_CUDA_BIN")
    path = str(Path(d) / name) if d else shutil.which(name)
    if not path or not Path(path).exists():
        raise SystemExit(f"{name} not found: set KOG_CUDA_BIN to a directory holding it (see this file's usage)")
    return path


def count_lines(disasm: str) -> Counter:
    """nvdisasm -g output -> Counter {(absolute file, line): instructions}."""
    c: Counter = Counter()
    cur = None
    for ln in disasm.splitlines():
        m = _FILE.match(ln)
        if m:
            cur = (m.group(1), int(m.group(2)))
        elif cur is not None and _INSTR.match(ln):
            c[cur] += 1
    return c


def by_text(counts: Counter, root: str) -> Counter:
    """{(file name, source text): instructions}, reading each file under root (its path from kernels/csrc on, or
    its name); lines of files not found keep their number as text."""
    out: Counter = Counter()
    cache: dict[str, list[str]] = {}
    for (f, n), k in counts.items():
        if f not in cache:
            rel = f[f.index("kernels/csrc"):] if "kernels/csrc" in f else None
            p = Path(root) / rel if rel else None
            cache[f] = p.read_text().splitlines() if p is not None and p.exists() else []
        lines = cache[f]
        text = lines[n - 1].strip() if 0 < n <= len(lines) else f"line {n}"
        out[(f.rsplit("/", 1)[-1], text[:100])] += k
    return out


def disassemble(lib: str) -> str:
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([tool("cuobjdump"), "-xelf", "all", str(Path(lib).resolve())], cwd=d, check=True,
                       capture_output=True)
        cubins = sorted(Path(d).glob("*.cubin"))
        if not cubins:
            raise SystemExit(f"{lib}: no cubin inside")
        return "\n".join(subprocess.run([tool("nvdisasm"), "-g", "-c", str(c)], check=True, capture_output=True,
                                        text=True).stdout for c in cubins)


def compare(a: Counter, b: Counter, top: int) -> dict:
    keys = sorted(set(a) | set(b), key=lambda k: (-abs(b[k] - a[k]), k))
    return dict(total=[sum(a.values()), sum(b.values())],
                lines=[dict(file=k[0], source=k[1], instructions=[a[k], b[k]]) for k in keys[:top]])


def main(argv: list[str]) -> None:
    top = 40
    if "--top" in argv:
        i = argv.index("--top")
        top = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    builds = [by_text(count_lines(disassemble(argv[i])), argv[i + 1]) for i in range(0, len(argv), 2)]
    if len(builds) == 1:
        rows = builds[0].most_common(top)
        print(f"{sum(builds[0].values())} instructions")
        for (f, text), k in rows:
            print(f"{k:6d}  {f}: {text}")
        print(json.dumps({"bench": "sass-lines", "total": sum(builds[0].values()),
                          "lines": [dict(file=f, source=t, instructions=k) for (f, t), k in rows]}))
        return
    c = compare(builds[0], builds[1], top)
    print(f"instructions {c['total'][0]} -> {c['total'][1]}")
    for r in c["lines"]:
        x, y = r["instructions"]
        print(f"{y - x:+6d} {x:6d} {y:6d}  {r['file']}: {r['source']}")
    print(json.dumps({"bench": "sass-lines-compare", **c}))


if __name__ == "__main__":
    main(sys.argv[1:])
