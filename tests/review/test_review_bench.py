"""bench/review.py's bug injection: single-token, parseable, on the recorded lines; the threshold sweep's counts."""

import ast
import io
import tokenize
import importlib.util
import random
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_review", Path(__file__).resolve().parents[2] / "bench" / "review.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_review"] = bench  # dataclasses look their module up while the class is built
_spec.loader.exec_module(bench)

SRC = '''import os


class Box:
    def __init__(self, width, height):
        self.width = width
        self.height = height

    def area(self):
        return self.width * self.height

    def grow(self, n):
        total = 0
        for i in range(n):
            if i > 2 and total < 10:
                total += i
        return total == 3


def main(items):
    count = 1
    for item in items:
        count -= item.width
    return count != 0
'''


@pytest.mark.parametrize("seed", range(5))
def test_inject_single_token_bugs_that_parse(seed):
    rng = random.Random(seed)
    out = bench.inject(SRC, rng, n_bugs=4, min_gap=2)
    assert out is not None
    text, bugs = out
    ast.parse(text)
    old, new = SRC.splitlines(), text.splitlines()
    assert len(old) == len(new)
    changed = {k for k, (a, b) in enumerate(zip(old, new)) if a != b}
    assert changed == set(bugs)
    for k in changed:  # exactly one token differs on each bug line
        ta = [t.string for t in tokenize.generate_tokens(io.StringIO(old[k].strip() + "\n").readline)]
        tb = [t.string for t in tokenize.generate_tokens(io.StringIO(new[k].strip() + "\n").readline)]
        diff = [(x, y) for x, y in zip(ta, tb) if x != y]
        assert len(diff) == 1 or (len(tb) == len(ta) + 1 and bugs[k] == "operator"), (old[k], new[k])
    assert set(bugs.values()) <= set(bench.KINDS)


def test_sites_cover_all_kinds_and_skip_definitions_and_imports():
    sites = bench.candidate_sites(SRC, random.Random(0))
    kinds = {s.kind for s in sites}
    assert kinds == set(bench.KINDS)
    lines = SRC.splitlines()
    for s in sites:
        assert not lines[s.line].lstrip().startswith("import")
        assert SRC[s.start:s.end] not in ("Box", "area", "grow", "main")  # def / class names are left alone


def test_metrics_counts():
    d_bug = bench.Doc("f", "test", False, 10, {3: "operator", 7: "constant"}, [(3, 12.0, 0.9), (5, 9.0, 0.8)])
    d_clean = bench.Doc("f", "test", True, 500, {}, [(1, 13.0, 0.95), (2, 5.0, 0.5)])
    m = bench.metrics([d_bug, d_clean], 8, 0.6)
    assert (m["tp"], m["fp"], m["bugs"]) == (1, 1, 2)
    assert m["precision"] == 0.5 and m["recall"] == 0.5
    assert m["fp_per_1k_clean_lines"] == 2.0
    assert m["recall_by_kind"]["operator"] == 1.0 and m["recall_by_kind"]["constant"] == 0.0


def test_truncate_keeps_parseable_head():
    text = SRC * 3
    head = bench.truncate(text, 30)
    assert head is not None and len(head.splitlines()) <= 30
    ast.parse(head)


def test_choose_prefers_target_precision_then_noise_budget():
    # One mutated doc: bug lines 1..4; strong candidates on 1, 2 (high bits), a weak one on 3, noise on 9.
    bug = bench.Doc("f", "tune", False, 200, {1: "identifier", 2: "attribute", 3: "operator", 4: "constant"},
                    [(1, 20.0, 0.9), (2, 19.0, 0.9), (3, 7.0, 0.9), (9, 8.0, 0.9)])
    clean = bench.Doc("f", "tune", True, 1000, {}, [(5, 8.0, 0.9)])
    m, rule = bench.choose([bug, clean], target=0.5, min_recall=0.1, max_fp_1k=5.0)
    assert m["recall"] == 0.75 and m["precision"] == 0.75 and "precision" in rule  # S <= 7 keeps 3 of 4 bugs
    m, rule = bench.choose([bug, clean], target=0.9, min_recall=0.6, max_fp_1k=0.5)
    assert m["fp_per_1k_clean_lines"] == 0.0 and m["recall"] == 0.5 and "false positives" in rule
