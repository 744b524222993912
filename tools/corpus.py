"""Build the training corpus for the default model from Python sources installed on this machine.

Sources: the interpreter's standard library (PSF licence) and every installed distribution whose
metadata declares a permissive licence (MIT, BSD, Apache, PSF, ISC, ...). Files are mapped to their
distribution through its RECORD, filtered (size, generated code, data-like files), deduplicated by
content hash, and split by *whole distributions* into train and held-out evaluation sets.

Run alone to print the manifest summary:  python tools/corpus.py --max-bytes 20000000
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import os
import re
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# SPDX ids (lower case) and words we accept as permissive.
PERMISSIVE_SPDX = {
    "mit", "mit-0", "mit-cmu", "x11", "bsd", "bsd-2-clause", "bsd-3-clause", "0bsd", "bsd-3-clause-clear",
    "apache-2.0", "apache", "apache 2.0", "apache license 2.0", "psf-2.0", "psf", "python-2.0", "cnri-python",
    "isc", "zlib", "unlicense", "cc0-1.0", "hpnd", "bsl-1.0", "public domain", "mit license", "bsd license",
}
# Phrases in a classifier or free-text licence field that mark a permissive licence.
PERMISSIVE_WORDS = (
    "mit", "bsd", "apache", "python software foundation", "psf", "isc", "zlib", "unlicense",
    "public domain", "hpnd", "historical permission", "boost software", "asl 2",
    "permission is hereby granted, free of charge",             # MIT text pasted into License:
    "redistribution and use in source and binary forms",        # BSD text
)
# Anything copyleft, proprietary or otherwise restricted: these reject a distribution.
RESTRICTED_RE = re.compile(
    r"\b(a?gpl|lgpl|gnu|general public|mpl|mozilla|proprietary|commercial|eupl|cddl|epl|"
    r"eclipse public|sspl|non-commercial|creative commons attribution-noncommercial)", re.I)

HOLDOUT_PREFERRED = ("click", "rich", "requests", "werkzeug", "jinja2", "pyparsing")


@dataclass
class Document:
    package: str          # distribution name, lower case ("stdlib" for the standard library)
    path: str             # path relative to the package root, used as a file header in training
    text: str


@dataclass
class PackageInfo:
    name: str
    version: str
    licence: str
    permissive: bool
    reason: str
    files: list = field(default_factory=list)   # (abs_path, rel_path, size)
    bytes_kept: int = 0
    files_kept: int = 0
    split: str = "train"


def _spdx_permissive(expr: str) -> bool:
    """True when a licence expression is satisfiable with permissive licences only.

    Approximation of SPDX semantics: parentheses dropped, `WITH exception` dropped, then an
    OR-alternative is acceptable when all of its AND-terms are permissive.
    """
    e = re.sub(r"\bWITH\s+[\w.\-]+", "", expr.replace("(", " ").replace(")", " "), flags=re.I)
    for alt in re.split(r"\s+OR\s+|/", e, flags=re.I):
        terms = [t.strip().lower() for t in re.split(r"\s+AND\s+", alt, flags=re.I) if t.strip()]
        if terms and all(t in PERMISSIVE_SPDX for t in terms):
            return True
    return False


def classify_licence(expression: str | None, licence_field: str | None,
                     classifiers: list[str]) -> tuple[str, bool, str]:
    """-> (label, permissive, reason). License-Expression is authoritative when present; otherwise
    the Trove classifiers and the License field are read together and any copyleft or proprietary
    mark rejects (conservative: docutils' "…, GPL" is rejected)."""
    if expression and expression.strip():
        ok = _spdx_permissive(expression)
        return expression.strip(), ok, "License-Expression" + ("" if ok else " not permissive")
    lic_cls = [c.split("::")[-1].strip() for c in classifiers if c.startswith("License ::")]
    field_text = (licence_field or "").strip()
    if field_text.upper() in ("UNKNOWN", "NONE", "DUAL LICENSE"):
        field_text = ""
    short_field = field_text if len(field_text) <= 200 else field_text[:400]
    sources = lic_cls + ([short_field] if short_field else [])
    if not sources:
        return "unknown", False, "no licence metadata"
    label = "; ".join(lic_cls) if lic_cls else short_field.splitlines()[0][:80]
    for s in sources:
        if RESTRICTED_RE.search(s):
            return label, False, f"restricted mark in {s[:60]!r}"
    for s in sources:
        low = s.lower()
        if _spdx_permissive(s) or any(w in low for w in PERMISSIVE_WORDS):
            return label, True, "classifier/License field"
    return label, False, "licence not recognised as permissive"


def _norm_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def discover_packages() -> list[PackageInfo]:
    """The stdlib plus every installed distribution (first of each name on sys.path), sorted."""
    pkgs: list[PackageInfo] = []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    std = PackageInfo("stdlib", sys.version.split()[0], "PSF-2.0", True, "Python standard library")
    skip_dirs = {"site-packages", "dist-packages", "__pycache__", "idle_test", "lib2to3", "tkinter", "turtledemo"}
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in skip_dirs and not d.startswith("."))
        for f in sorted(files):
            if f.endswith(".py"):
                p = Path(root) / f
                std.files.append((str(p), str(p.relative_to(stdlib)), 0))
    pkgs.append(std)
    seen = set()
    for dist in md.distributions():
        meta = dist.metadata
        name = meta.get("Name")
        if not name or _norm_name(name) in seen:
            continue
        seen.add(_norm_name(name))
        label, ok, reason = classify_licence(meta.get("License-Expression"), meta.get("License"),
                                             meta.get_all("Classifier") or [])
        info = PackageInfo(_norm_name(name), meta.get("Version") or "?", label, ok, reason)
        if ok:
            files = dist.files
            if files is None:
                info.permissive, info.reason = False, "no RECORD (cannot map files)"
            else:
                for rel in sorted(str(f) for f in files):
                    if rel.endswith(".py") and "/__pycache__/" not in rel and not rel.startswith(".."):
                        info.files.append((str(dist.locate_file(rel)), rel, 0))
        pkgs.append(info)
    pkgs.sort(key=lambda p: (p.name != "stdlib", p.name))
    return pkgs


def choose_holdout(pkgs: list[PackageInfo], preferred=HOLDOUT_PREFERRED, want: int = 4) -> list[str]:
    """Whole distributions held out for evaluation: the preferred names present (in order), topped up
    deterministically by name hash among permissive packages with some code."""
    usable = {p.name: p for p in pkgs if p.permissive and p.name != "stdlib" and len(p.files) >= 3}
    chosen = [n for n in preferred if n in usable][:want]
    if len(chosen) < min(2, want):
        rest = sorted((n for n in usable if n not in chosen), key=lambda n: hashlib.sha1(n.encode()).hexdigest())
        chosen += rest[: max(0, min(2, want) - len(chosen))]
    return chosen


# Literal special-token strings in a source file would be encoded as the special tokens themselves
# (an <|endoftext|> inside a document): such files (tokenizer code, mostly) are left out.
SPECIAL_MARKERS = ("<|endoftext|>", "<|fim_", "<|file_sep|>", "<|repo_name|>", "<|im_start|>", "<|im_end|>")
_GENERATED = re.compile(r"(auto-?generated|generated by|do not edit|@generated)", re.I)


def keep_text(text: str, name: str) -> str | None:
    """None when the file looks like data or generated code; else the reason-free text itself."""
    if name.endswith(("_pb2.py", "_pb2_grpc.py")):
        return None
    if len(text) < 200 or "\x00" in text:
        return None
    if "<|" in text and any(m in text for m in SPECIAL_MARKERS):
        return None
    if _GENERATED.search(text[:600]):
        return None
    lines = text.splitlines()
    if not lines or max(len(l) for l in lines) > 1000 or len(text) / len(lines) > 100:
        return None
    alnum = sum(c.isalnum() for c in text[:20000]) / min(len(text), 20000)
    if alnum < 0.25:
        return None
    return text


def content_key(text: str) -> str:
    """Dedupe key: trailing whitespace and blank-line differences do not make a new file."""
    norm = "\n".join(l.rstrip() for l in text.splitlines() if l.strip())
    return hashlib.sha1(norm.encode("utf-8", "surrogatepass")).hexdigest()


def _stable_order(items: list, salt: str) -> list:
    return sorted(items, key=lambda it: hashlib.sha1((salt + it[1]).encode()).hexdigest())


def build_corpus(max_bytes: int = 400_000_000, max_bytes_per_package: int = 30_000_000,
                 max_file_bytes: int = 300_000, time_budget_s: float = 90.0, holdout: list[str] | None = None,
                 n_holdout: int = 4, workers: int = 16, log=print):
    """-> (train_docs, eval_docs, manifest dict). Deterministic for a given machine and arguments."""
    t0 = time.time()
    pkgs = discover_packages()
    holdout = holdout if holdout is not None else choose_holdout(pkgs, want=n_holdout)
    for p in pkgs:
        if p.name in holdout:
            p.split = "eval"
    # Size pass (cheap stat) decides which files are read: per-package cap over a hash-shuffled order
    # so a capped package contributes a spread of its modules, not the alphabetically first ones.
    plan: list[tuple[PackageInfo, str, str]] = []
    total = 0
    ordered = [p for p in pkgs if p.split == "eval"] + [p for p in pkgs if p.split == "train"]
    for p in ordered:
        if not p.permissive:
            continue
        budget = max_bytes_per_package
        for ap, rel, _ in _stable_order(p.files, p.name):
            try:
                size = os.stat(ap).st_size
            except OSError:
                continue
            if size > max_file_bytes or size < 200 or size > budget:
                continue
            if p.split == "train" and total + size > max_bytes:
                continue
            budget -= size
            if p.split == "train":
                total += size
            plan.append((p, ap, rel))

    def read(item):
        p, ap, rel = item
        try:
            with open(ap, "rb") as f:
                raw = f.read()
            return item, raw.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            return item, None

    seen: dict[str, str] = {}
    train, evald = [], []
    dup = dropped = 0
    deadline = t0 + time_budget_s
    with ThreadPoolExecutor(workers) as ex:
        # map preserves order, so dedupe (first wins, held-out packages first) is deterministic.
        for (p, ap, rel), text in ex.map(read, plan, chunksize=64):
            if time.time() > deadline:
                log(f"corpus: time budget {time_budget_s}s reached; stopping the read early")
                ex.shutdown(wait=False, cancel_futures=True)
                break
            if text is None or keep_text(text, rel) is None:
                dropped += 1
                continue
            text = text.replace("\r\n", "\n")
            key = content_key(text)
            if key in seen:
                dup += 1
                continue
            seen[key] = p.name
            p.bytes_kept += len(text.encode("utf-8"))
            p.files_kept += 1
            (evald if p.split == "eval" else train).append(Document(p.name, rel, text))
    manifest = {
        "python": sys.version.split()[0],
        "stdlib_path": sysconfig.get_paths()["stdlib"],
        "holdout": holdout,
        "limits": {"max_bytes": max_bytes, "max_bytes_per_package": max_bytes_per_package,
                   "max_file_bytes": max_file_bytes, "time_budget_s": time_budget_s},
        "train_files": len(train), "train_bytes": sum(p.bytes_kept for p in pkgs if p.split == "train"),
        "eval_files": len(evald), "eval_bytes": sum(p.bytes_kept for p in pkgs if p.split == "eval"),
        "duplicates_dropped": dup, "filtered_out": dropped, "seconds": round(time.time() - t0, 1),
        "packages": [{"name": p.name, "version": p.version, "licence": p.licence, "used": p.permissive,
                      "reason": p.reason, "split": p.split, "files": p.files_kept, "bytes": p.bytes_kept}
                     for p in pkgs],
    }
    log(f"corpus: {len(train)} train files ({manifest['train_bytes']/1e6:.1f} MB), {len(evald)} eval files "
        f"({manifest['eval_bytes']/1e6:.1f} MB) from holdout {holdout}; {dup} duplicates, {dropped} filtered; "
        f"{sum(p.permissive for p in pkgs)}/{len(pkgs)} packages permissive; {manifest['seconds']}s")
    return train, evald, manifest


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-bytes", type=int, default=400_000_000)
    ap.add_argument("--manifest", type=Path)
    a = ap.parse_args()
    _, _, man = build_corpus(max_bytes=a.max_bytes)
    if a.manifest:
        a.manifest.write_text(json.dumps(man, indent=1))
    for p in man["packages"]:
        if not p["used"]:
            print(f"skipped {p['name']}: {p['licence']!r} ({p['reason']})")


if __name__ == "__main__":
    main()
