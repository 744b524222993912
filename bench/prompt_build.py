"""Host time of FIM prompt building per keystroke: uncached build_prompt vs the line-piece token cache.

At several cursors of a file (default: rich/markup.py, else a standard-library file) a line of code is typed
character by character (plus a few backspaces); after every keystroke the prompt is built as the server builds
it (line starts from the document, the server's default window budgets), once without and once with a
kog_lsp.token_cache.PromptTokenCache, and the two id lists are checked to be identical.

    python bench/prompt_build.py [--file PATH] [--model engine/models/default] [--repeat 3]

Prints a table (median / p95 microseconds per keystroke), then one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kog_lsp.fim import build_prompt  # noqa: E402
from kog_lsp.positions import line_starts  # noqa: E402
from kog_lsp.settings import Settings  # noqa: E402
from kog_lsp.stats import percentile  # noqa: E402
from kog_lsp.token_cache import PromptTokenCache  # noqa: E402

TYPED = "value = self._render(markup, style=None)  # typed"


def default_file() -> Path:
    try:
        import rich.markup

        return Path(rich.markup.__file__)
    except ImportError:
        import textwrap

        return Path(textwrap.__file__)


def keystrokes(text: str, cursor: int):
    """(text, cursor) after each keystroke of typing TYPED at `cursor` on a fresh line, with 3 backspaces
    and a retype midway (what a person does)."""
    text, cursor = text[:cursor] + "\n    " + text[cursor:], cursor + 5
    for k, ch in enumerate(TYPED):
        text, cursor = text[:cursor] + ch + text[cursor:], cursor + 1
        yield text, cursor
        if k == len(TYPED) // 2:
            for _ in range(3):
                text, cursor = text[:cursor - 1] + text[cursor:], cursor - 1
                yield text, cursor
            for c in TYPED[k - 2:k + 1]:
                text, cursor = text[:cursor] + c + text[cursor:], cursor + 1
                yield text, cursor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", default=None)
    ap.add_argument("--model", default=str(REPO / "engine" / "models" / "default"))
    ap.add_argument("--repeat", type=int, default=3, help="passes over all cursors (timings pooled)")
    args = ap.parse_args()

    from engine.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(args.model)
    path = Path(args.file) if args.file else default_file()
    doc = path.read_text()
    s = Settings()
    budgets = dict(prefix_tokens=s.prefix_tokens, suffix_tokens=s.suffix_tokens)
    starts0 = line_starts(doc)
    cursors = [starts0[int(len(starts0) * f)] - 1 for f in (0.1, 0.3, 0.5, 0.7, 0.9)]
    cache = PromptTokenCache()
    rows = {c: ([], []) for c in cursors}
    mismatches = 0
    for _ in range(args.repeat):
        for c in cursors:
            cache.forget(str(path))  # each pass starts cold, like a freshly opened document
            for text, cur in keystrokes(doc, c):
                starts = line_starts(text)
                t0 = time.perf_counter()
                a = build_prompt(tok, text, cur, starts=starts, **budgets)
                t1 = time.perf_counter()
                b = build_prompt(tok, text, cur, starts=starts, token_cache=cache, doc=str(path), **budgets)
                t2 = time.perf_counter()
                mismatches += a.ids != b.ids or a.window_start != b.window_start
                rows[c][0].append((t1 - t0) * 1e6)
                rows[c][1].append((t2 - t1) * 1e6)

    print(f"{path} ({len(doc)} chars), prefix/suffix tokens {budgets['prefix_tokens']}/{budgets['suffix_tokens']}, "
          f"{args.repeat} pass(es); microseconds per keystroke")
    print(f"{'cursor line':>11} {'keys':>5} {'uncached p50':>13} {'p95':>7} {'cached p50':>11} {'p95':>7} "
          f"{'speedup':>8}")
    all_u, all_c = [], []
    for c in cursors:
        u, k = rows[c]
        all_u += u
        all_c += k
        line = starts0.index(c + 1) if c + 1 in starts0 else -1
        speedup = statistics.median(u) / statistics.median(k)
        print(f"{line:>11} {len(u):>5} {statistics.median(u):>13.0f} {percentile(u, 95):>7.0f} "
              f"{statistics.median(k):>11.0f} {percentile(k, 95):>7.0f} {speedup:>7.1f}x")
    out = {"file": str(path), "keystrokes": len(all_u), "uncached_us": {"p50": round(statistics.median(all_u), 1),
           "p95": round(percentile(all_u, 95), 1)}, "cached_us": {"p50": round(statistics.median(all_c), 1),
           "p95": round(percentile(all_c, 95), 1)}, "mismatches": mismatches, "cache": cache.stats()}
    print(f"{'all':>11} {len(all_u):>5} {out['uncached_us']['p50']:>13.0f} {out['uncached_us']['p95']:>7.0f} "
          f"{out['cached_us']['p50']:>11.0f} {out['cached_us']['p95']:>7.0f}; ids identical: {mismatches == 0}")
    print(json.dumps(out))
    if mismatches:
        sys.exit(1)


if __name__ == "__main__":
    main()
