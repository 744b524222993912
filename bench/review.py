"""Review quality on injected bugs: precision / recall of flagged lines and false positives per 1,000 clean lines.

Held-out Python files (the packages engine/models/default/corpus_manifest.json lists under "holdout", minus any
package that pip/setuptools vendor, since a vendored copy could sit in the training corpus) get realistic
single-token bugs: a swapped identifier (another name used nearby), a wrong operator (+/-, </<=, ==/!=, and/or,
...), an off-by-one integer constant, a wrong attribute name (another attribute used in the file). Every mutated
file still parses. Each file is scored once clean and in `--copies` mutated versions through the same code path
as the server (kog_lsp.review: WindowedScorer + token_candidates), then thresholds are swept:

- bugs go to uses of names, never to bindings (see candidate_sites);
- a line is flagged when one of its tokens has surprisal >= S bits and the model's top token has p >= P
  (plus the server's filters: not whitespace, not inside strings/comments, not a re-tokenization);
- precision / recall over lines of the mutated files (a flagged line is right iff it holds an injected bug);
- false positives per 1,000 non-blank lines of the clean files.

Files are split in two halves by a hash of their path: thresholds are chosen on the "tune" half (largest recall
with precision >= --target-precision) and reported on the "test" half.

    python bench/review.py                      # shipped default model, CPU
    python bench/review.py --model DIR --files 40 --json-out /tmp/review.json
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.metadata as md
import io
import json
import keyword
import pickle
import random
import sys
import sysconfig
import time
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kog_lsp.review import ReviewOptions, WindowedScorer, score_document, special_ids, token_candidates  # noqa: E402
from kog_lsp.textmap import SpanSet, python_binding_spans, token_char_spans, tokenize_line_starts  # noqa: E402

S_GRID = [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16, 18, 20, 22, 24]
P_GRID = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
LOOSE = ReviewOptions(min_surprisal_bits=min(S_GRID), min_top_prob=min(P_GRID))
OPS = {"+": "-", "-": "+", "*": "/", "/": "*", "<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=",
       "!=": "==", "+=": "-=", "-=": "+=", "and": "or", "or": "and", "is": "is not", "in": "not in"}
KINDS = ("identifier", "operator", "constant", "attribute")


# ---------------------------------------------------------------- held-out files


def _vendored_names() -> set[str]:
    """Top-level package names that appear under some site-packages */_vendor/ directory."""
    names = set()
    for sp in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for v in Path(sp).glob("*/_vendor/*"):
            names.add(v.name.split(".")[0].lower())
        for v in Path(sp).glob("*/*/_vendor/*"):
            names.add(v.name.split(".")[0].lower())
    return names


def _usable(text: str) -> bool:
    if not 400 <= len(text) <= 200_000 or "<|" in text:
        return False
    lines = text.splitlines()
    return bool(lines) and max(len(ln) for ln in lines) <= 400


def held_out_files(model_dir: Path, keep_vendored: bool) -> tuple[list[tuple[str, str]], str]:
    """[(label, text)] and a sentence saying where they come from."""
    man = model_dir / "corpus_manifest.json"
    out = []
    if man.exists():
        holdout = json.loads(man.read_text()).get("holdout", [])
        vendored = _vendored_names()
        used, skipped = [], []
        for name in holdout:
            if not keep_vendored and name.lower() in vendored:
                skipped.append(name)
                continue
            try:
                dist = md.distribution(name)
            except md.PackageNotFoundError:
                skipped.append(f"{name} (not installed here)")
                continue
            used.append(f"{name} {dist.version}")
            for f in dist.files or []:
                if str(f).endswith(".py"):
                    try:
                        text = Path(dist.locate_file(f)).read_text(encoding="utf-8")
                    except (OSError, UnicodeDecodeError):
                        continue
                    if _usable(text):
                        out.append((f"{name}/{f}", text.replace("\r\n", "\n")))
        where = f"held-out packages {used}" + (f"; skipped {skipped} (vendored copies may be in training or absent)"
                                                if skipped else "")
        return out, where
    # No manifest (model not built yet): stdlib files. The default corpus trains on the stdlib, so these are
    # only a stand-in for pipeline checks, never the reported number.
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for p in sorted(stdlib.glob("*.py")):
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if _usable(text):
            out.append((f"stdlib/{p.name}", text))
    return out, f"stdlib files of {stdlib} (NO corpus manifest: not held out from the default corpus)"


def truncate(text: str, max_lines: int) -> str | None:
    """The longest head of `text` with at most max_lines lines that ends before a top-level statement and parses."""
    lines = text.splitlines(keepends=True)
    if len(lines) <= max_lines:
        try:
            ast.parse(text)
            return text
        except SyntaxError:
            return None
    tries = 0
    for cut in range(max_lines, max_lines // 3, -1):
        ln = lines[cut]
        if ln[:1].strip() and not ln.startswith(("#", ")", "]", "}")):
            head = "".join(lines[:cut])
            tries += 1
            try:
                ast.parse(head)
                return head
            except SyntaxError:
                if tries > 30:
                    return None
    return None


# ---------------------------------------------------------------- bugs


@dataclass
class Site:
    kind: str
    line: int  # 0-based
    start: int  # char offsets of the token
    end: int
    new: str


def candidate_sites(text: str, rng: random.Random) -> list[Site]:
    """Bug sites: operators, small integer constants, and *uses* of names / attributes. Names being bound
    (def/class names, parameters, assignment and loop targets, imports) are left alone: giving a new name a
    different spelling is not a swapped identifier, and review deliberately does not check bindings."""
    starts = tokenize_line_starts(text)
    bound = SpanSet(python_binding_spans(text))
    toks = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT)]
    names_by_line: dict[int, set[str]] = {}
    attrs: set[str] = set()
    for k, t in enumerate(toks):
        if t.type == tokenize.NAME and not keyword.iskeyword(t.string):
            if k and toks[k - 1].string == ".":
                attrs.add(t.string)
            else:
                names_by_line.setdefault(t.start[0] - 1, set()).add(t.string)
    sites = []
    for k, t in enumerate(toks):
        line = t.start[0] - 1
        a = starts[line] + t.start[1]
        b = starts[t.end[0] - 1] + t.end[1]
        prev = toks[k - 1].string if k else ""
        nxt = toks[k + 1].string if k + 1 < len(toks) else ""
        first = t.line.lstrip()
        if first.startswith(("import ", "from ", "@")):
            continue
        if t.type == tokenize.NAME and t.string in OPS:
            if t.string == "is" and nxt == "not" or t.string == "in" and prev == "not" or prev == "for":
                continue
            sites.append(Site("operator", line, a, b, OPS[t.string]))
        elif t.type == tokenize.OP and t.string in OPS:
            sites.append(Site("operator", line, a, b, OPS[t.string]))
        elif t.type == tokenize.NUMBER and t.string.isdigit() and len(t.string) <= 2:
            n = int(t.string)
            new = n + 1 if n == 0 or rng.random() < 0.5 else n - 1
            sites.append(Site("constant", line, a, b, str(new)))
        elif t.type == tokenize.NAME and not keyword.iskeyword(t.string) and a not in bound:
            if prev == ".":
                others = sorted(attrs - {t.string})
                if others and nxt not in ("=",):
                    sites.append(Site("attribute", line, a, b, rng.choice(others)))
            elif nxt != "=" or prev in ("(", ","):
                near = set()
                for ln in range(max(0, line - 30), line + 31):
                    near |= names_by_line.get(ln, set())
                near = sorted(n for n in near - {t.string, "self", "cls"} if len(n) > 1)
                if near and t.string not in ("self", "cls"):
                    sites.append(Site("identifier", line, a, b, rng.choice(near)))
    return sites


def inject(text: str, rng: random.Random, n_bugs: int, min_gap: int = 8) -> tuple[str, dict[int, str]] | None:
    """Apply up to n_bugs single-token bugs on distinct lines at least min_gap apart; the result parses."""
    try:
        sites = candidate_sites(text, rng)
    except (tokenize.TokenError, SyntaxError):
        return None
    by_kind = {k: [s for s in sites if s.kind == k] for k in KINDS}
    for v in by_kind.values():
        rng.shuffle(v)
    chosen: list[Site] = []
    kinds = list(KINDS)
    rng.shuffle(kinds)
    attempts = 0
    while len(chosen) < n_bugs and attempts < 200:
        attempts += 1
        kind = kinds[attempts % len(kinds)]
        if not by_kind[kind]:
            continue
        s = by_kind[kind].pop()
        if any(abs(s.line - c.line) < min_gap for c in chosen):
            continue
        trial = sorted(chosen + [s], key=lambda x: x.start, reverse=True)
        out = text
        for x in trial:
            out = out[:x.start] + x.new + out[x.end:]
        try:
            ast.parse(out)
        except SyntaxError:
            continue
        chosen.append(s)
    if not chosen:
        return None
    out = text
    for x in sorted(chosen, key=lambda x: x.start, reverse=True):
        out = out[:x.start] + x.new + out[x.end:]
    return out, {c.line: c.kind for c in chosen}


# ---------------------------------------------------------------- scoring and sweep


@dataclass
class Doc:
    label: str
    split: str  # tune | test
    clean: bool
    lines: int  # non-blank lines
    bugs: dict[int, str] = field(default_factory=dict)
    cands: list[tuple[int, float, float]] = field(default_factory=list)  # (line, surprisal bits, top prob)
    detail: list[dict] = field(default_factory=list)  # per candidate: texts, for --dump


def flagged(doc: Doc, s: float, p: float) -> set[int]:
    return {ln for ln, sb, tp in doc.cands if sb >= s and tp >= p}


def metrics(docs: list[Doc], s: float, p: float) -> dict:
    tp = fp = bugs = fp_clean = clean_lines = 0
    by_kind: dict[str, list[int]] = {k: [0, 0] for k in KINDS}
    for d in docs:
        f = flagged(d, s, p)
        if d.clean:
            fp_clean += len(f)
            clean_lines += d.lines
            continue
        bugs += len(d.bugs)
        tp += len(f & set(d.bugs))
        fp += len(f - set(d.bugs))
        for ln, kind in d.bugs.items():
            by_kind[kind][1] += 1
            by_kind[kind][0] += ln in f
    return {"S": s, "P": p, "precision": tp / (tp + fp) if tp + fp else None, "recall": tp / bugs if bugs else None,
            "tp": tp, "fp": fp, "bugs": bugs, "fp_per_1k_clean_lines": 1000 * fp_clean / clean_lines if clean_lines else None,
            "clean_lines": clean_lines, "recall_by_kind": {k: (v[0] / v[1] if v[1] else None) for k, v in by_kind.items()}}


def choose(docs: list[Doc], target: float, min_recall: float, max_fp_1k: float) -> tuple[dict, str]:
    """Thresholds: the largest recall with precision >= target; if that recall is below min_recall (the model
    cannot reach the target usefully), the largest recall whose false positives stay within max_fp_1k per 1,000
    clean lines (a noise budget for an editor)."""
    grid = [metrics(docs, s, p) for s in S_GRID for p in P_GRID]
    ok = [m for m in grid if m["precision"] is not None and m["precision"] >= target and m["recall"]]
    best = max(ok, key=lambda m: (m["recall"], m["precision"])) if ok else None
    if best is not None and best["recall"] >= min_recall:
        return best, f"largest recall with precision >= {target:.0%}"
    quiet = [m for m in grid if m["fp_per_1k_clean_lines"] is not None and m["fp_per_1k_clean_lines"] <= max_fp_1k
             and m["recall"]]
    if quiet:
        pick = max(quiet, key=lambda m: (m["recall"], m["precision"] or 0))
        return pick, (f"precision >= {target:.0%} only at recall < {min_recall:.0%}; largest recall with <= "
                      f"{max_fp_1k:g} false positives per 1,000 clean lines")
    return grid[0], "no threshold pair flags anything"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="'default' or an HF model dir")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--files", type=int, default=60, help="held-out files to use (hash-shuffled)")
    ap.add_argument("--max-lines", type=int, default=250, help="truncate each file (at a top-level statement)")
    ap.add_argument("--copies", type=int, default=2, help="mutated versions per file")
    ap.add_argument("--lines-per-bug", type=int, default=50, help="bug density: one bug per this many lines")
    ap.add_argument("--target-precision", type=float, default=0.5)
    ap.add_argument("--min-recall", type=float, default=0.1, help="below this, fall back to the noise budget")
    ap.add_argument("--max-fp-per-1k", type=float, default=5.0, help="noise budget for the fallback choice")
    ap.add_argument("--keep-vendored", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-budget-s", type=float, default=1500.0, help="stop scoring new files after this")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--dump", type=Path, help="write every document's candidates (texts) here, for analysis")
    ap.add_argument("--score-cache", type=Path,
                    help="pickle of engine scores by text hash: reruns (other filters) skip the model")
    a = ap.parse_args(argv)

    from engine import Engine
    from engine.engine import resolve_model_dir

    model_dir = resolve_model_dir(a.model)
    t0 = time.time()
    engine = Engine.load(str(model_dir), device=a.device, backend=a.backend)
    print(f"model {model_dir} loaded in {time.time() - t0:.1f}s: {engine.stats().get('params')} params, "
          f"backend {engine.stats().get('backend')}")
    files, where = held_out_files(model_dir, a.keep_vendored)
    files.sort(key=lambda f: hashlib.sha1(f"{a.seed}:{f[0]}".encode()).hexdigest())
    print(f"files: {len(files)} candidates from {where}")

    scorer = WindowedScorer(window=min(2048, engine.max_seq_len), context=256)
    cache: dict[str, tuple] = {}
    if a.score_cache and a.score_cache.exists():
        cache = pickle.loads(a.score_cache.read_bytes())
        print(f"score cache: {len(cache)} documents from {a.score_cache}")
    tok = engine.tokenizer
    skip = special_ids(tok)
    decode = {}

    def decode_one(i):
        if i not in decode:
            decode[i] = tok.decode([i])
        return decode[i]

    docs: list[Doc] = []
    n_files = scored_tokens = from_cache = 0
    t_score = time.time()
    for label, full in files:
        if n_files >= a.files or time.time() - t_score > a.time_budget_s:
            break
        text = truncate(full, a.max_lines)
        if text is None:
            continue
        split = "tune" if int(hashlib.sha1(label.encode()).hexdigest(), 16) % 2 == 0 else "test"
        n_lines = sum(1 for ln in text.splitlines() if ln.strip())
        versions = [(text, {}, True)]
        for c in range(a.copies):
            # One generator per (seed, file, copy): a file's bugs do not depend on which files came before.
            rng = random.Random(f"{a.seed}:{label}:{c}")
            m = inject(text, rng, max(1, n_lines // a.lines_per_bug))
            if m is not None:
                versions.append((m[0], m[1], False))
        if len(versions) == 1:
            continue
        n_files += 1
        for body, bugs, clean in versions:
            key = hashlib.sha1(f"{model_dir}\0{body}".encode("utf-8", "surrogatepass")).hexdigest()
            if key in cache:
                from_cache += 1
                ids, scores = cache[key]
                spans = token_char_spans(tok, ids)
            else:
                scored = score_document(engine, body, scorer)
                if scored is None:
                    continue
                ids, spans, scores = scored
                cache[key] = (ids, scores)
            scored_tokens += len(ids)
            cands = token_candidates(body, ids, spans, scores, LOOSE, decode_one, "python", skip)
            lines = body.splitlines()
            docs.append(Doc(label, split, clean, n_lines, bugs, [(f.line, f.surprisal_bits, f.expected_prob)
                                                               for f in cands],
                            [{"line": f.line, "bits": round(f.surprisal_bits, 2), "top_p": round(f.expected_prob, 3),
                              "actual": f.actual, "expected": f.expected, "text": lines[f.line],
                              "exp_in_doc": f.expected.strip() in body} for f in cands]
                            if a.dump else []))
        if a.score_cache and n_files % 5 == 0:
            a.score_cache.write_bytes(pickle.dumps(cache))
        el = time.time() - t_score
        print(f"  [{n_files}] {label}: {n_lines} lines, {len(versions) - 1} mutated, "
              f"{scored_tokens} tokens scored so far ({scored_tokens / el:.0f} tok/s)", flush=True)

    if a.score_cache:
        a.score_cache.write_bytes(pickle.dumps(cache))
    tune = [d for d in docs if d.split == "tune"]
    test = [d for d in docs if d.split == "test"]
    chosen, rule = choose(tune, a.target_precision, a.min_recall, a.max_fp_per_1k)
    S, P = chosen["S"], chosen["P"]
    result = {
        "model": str(model_dir), "files_from": where, "files": n_files, "max_lines": a.max_lines,
        "lines_per_bug": a.lines_per_bug, "copies": a.copies, "seed": a.seed,
        "scored_tokens": scored_tokens, "seconds": round(time.time() - t0, 1), "documents_from_score_cache": from_cache,
        "chosen_on_tune": {"min_surprisal_bits": S, "min_top_prob": P, "rule": rule},
        "tune": metrics(tune, S, P), "test": metrics(test, S, P), "all": metrics(docs, S, P),
        "default_thresholds_all": metrics(docs, ReviewOptions().min_surprisal_bits, ReviewOptions().min_top_prob),
        "sweep_all": [metrics(docs, s, p) for s in S_GRID for p in P_GRID],
    }
    print(f"\nthresholds chosen on tune half: surprisal >= {S} bits, top p >= {P} ({rule})")
    print(f"{'split':<8}{'files':>6}{'bugs':>6}{'prec':>8}{'recall':>8}{'FP/1k clean':>13}")
    for name in ("tune", "test", "all"):
        m = result[name]
        nf = len({d.label for d in (tune if name == "tune" else test if name == "test" else docs)})
        prec = "-" if m["precision"] is None else f"{m['precision']:.1%}"
        rec = "-" if m["recall"] is None else f"{m['recall']:.1%}"
        fpk = "-" if m["fp_per_1k_clean_lines"] is None else f"{m['fp_per_1k_clean_lines']:.1f}"
        print(f"{name:<8}{nf:>6}{m['bugs']:>6}{prec:>8}{rec:>8}{fpk:>13}")
    print("recall by bug kind (test):", {k: (None if v is None else round(v, 2))
                                        for k, v in result["test"]["recall_by_kind"].items()})
    slim = {k: v for k, v in result.items() if k != "sweep_all"}
    if a.json_out:
        a.json_out.write_text(json.dumps(result, indent=1))
    if a.dump:
        a.dump.write_text(json.dumps([{"label": d.label, "split": d.split, "clean": d.clean, "bugs": d.bugs,
                                       "cands": d.detail} for d in docs], indent=0))
    print(json.dumps(slim))
    return result


if __name__ == "__main__":
    main()
