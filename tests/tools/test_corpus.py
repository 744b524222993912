"""Licence filtering, file filters and dedupe of tools/corpus.py (synthetic packages, no real scan)."""
import corpus
from corpus import PackageInfo, build_corpus, classify_licence, content_key, keep_text

CODE = "def f(x):\n    return x + 1\n\n\nclass A:\n    pass\n" * 8


def test_licence_expression_is_authoritative():
    assert classify_licence("MIT", "GPL", [])[1]                       # expression wins over the field
    assert classify_licence("Apache-2.0 WITH LLVM-exception AND BSD-3-Clause", None, [])[1]
    assert classify_licence("MIT OR GPL-3.0-only", None, [])[1]          # a permissive alternative suffices
    assert classify_licence("(Apache-2.0 OR MIT) AND BSD-2-Clause", None, [])[1]
    assert not classify_licence("MPL-2.0 AND MIT", None, [])[1]          # tqdm: MPL part is not permissive
    assert not classify_licence("LicenseRef-NVIDIA-Proprietary", None, [])[1]


def test_licence_classifiers_and_field():
    assert classify_licence(None, None, ["License :: OSI Approved :: MIT License"])[1]
    assert classify_licence(None, "BSD", [])[1]
    assert classify_licence(None, "Apache License 2.0", ["License :: OSI Approved :: Apache Software License"])[1]
    assert classify_licence(None, "UNKNOWN", ["License :: OSI Approved :: ISC License (ISCL)"])[1]
    mixed = ["License :: Public Domain", "License :: OSI Approved :: GNU General Public License (GPL)"]
    assert not classify_licence(None, "public domain, Python, 2-Clause BSD, GPL", mixed)[1]   # docutils
    assert not classify_licence(None, "LGPL-2.1", [])[1]
    label, ok, reason = classify_licence(None, None, [])
    assert (label, ok) == ("unknown", False) and "no licence" in reason
    assert not classify_licence(None, "Some custom terms", [])[1]


def test_keep_text_filters():
    assert keep_text(CODE, "a.py") == CODE
    assert keep_text(CODE, "x_pb2.py") is None                           # protobuf output
    assert keep_text("# Auto-generated file, do not edit\n" + CODE, "a.py") is None
    assert keep_text("x = '" + "a" * 2000 + "'\n" + CODE, "a.py") is None   # data-like line
    assert keep_text(CODE + "TOKEN = '<|endoftext|>'\n", "a.py") is None   # would encode as a special token
    assert keep_text("x = 1\n", "a.py") is None                          # too small


def test_content_key_ignores_trailing_space_and_blank_lines():
    assert content_key(CODE) == content_key(CODE.replace("\n", "  \n").replace("\n\n", "\n\n\n"))
    assert content_key(CODE) != content_key(CODE + "x = 2\n")


def _pkg(tmp_path, name, files, permissive=True):
    info = PackageInfo(name, "1.0", "MIT" if permissive else "GPL-3.0", permissive, "test")
    for rel, text in files.items():
        p = tmp_path / name / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        info.files.append((str(p), rel, 0))
    return info


def test_build_corpus_dedupes_holds_out_and_skips_restricted(tmp_path, monkeypatch):
    shared = CODE + "# shared\n"
    pkgs = [
        _pkg(tmp_path, "alpha", {"alpha/a.py": CODE + "# a\n", "alpha/copy.py": shared}),
        _pkg(tmp_path, "beta", {"beta/b.py": CODE + "# b\n", "beta/vendored.py": shared + "   \n"}),
        _pkg(tmp_path, "gamma", {"gamma/g.py": CODE + "# g\n"}, permissive=False),
    ]
    monkeypatch.setattr(corpus, "discover_packages", lambda: pkgs)
    train, evald, man = build_corpus(holdout=["beta"], workers=2, log=lambda m: None)
    # beta is held out and read first, so the shared file stays in eval and is dropped from train
    assert sorted(d.path for d in evald) == ["beta/b.py", "beta/vendored.py"]
    assert sorted(d.path for d in train) == ["alpha/a.py"]
    assert man["duplicates_dropped"] == 1
    assert all(d.package != "gamma" for d in train + evald)
    by_name = {p["name"]: p for p in man["packages"]}
    assert by_name["gamma"]["used"] is False and by_name["beta"]["split"] == "eval"
    assert by_name["alpha"]["bytes"] == len((CODE + "# a\n").encode())


def test_choose_holdout_is_deterministic():
    pkgs = [PackageInfo(n, "1", "MIT", True, "", files=[("x", "y", 0)] * 3) for n in ("zz", "rich", "aa", "click")]
    assert corpus.choose_holdout(pkgs, want=4) == ["click", "rich"]
    other = [PackageInfo(n, "1", "MIT", True, "", files=[("x", "y", 0)] * 3) for n in ("p1", "p2", "p3")]
    assert corpus.choose_holdout(other, want=4) == corpus.choose_holdout(list(reversed(other)), want=4)
    assert len(corpus.choose_holdout(other, want=4)) == 2
