from kog_lsp.textmap import (SpanSet, language_of, scan_strings_and_comments, spans_match, strings_and_comments,
                             token_char_spans)


def _covered(text, spans):
    s = SpanSet(spans)
    return "".join("_" if k in s and c != "\n" else c for k, c in enumerate(text))


def test_token_spans_tile_text_with_astral_and_cjk(tiny_engine):
    tok = tiny_engine.tokenizer
    text = 'x = "😀 日本"  # ünï\nprint(x)\n'
    ids = tok.encode(text)
    spans = token_char_spans(tok, ids)
    assert spans_match(spans, text)
    assert len(spans) == len(ids)
    # Spans are contiguous and each non-empty span is the decoded text of its tokens.
    pos = 0
    for s, e in spans:
        assert s == pos
        pos = e
    assert "".join(text[s:e] for s, e in spans) == text
    # A byte-level vocab this small splits the emoji across tokens: the first pieces get empty spans.
    emoji = text.index("😀")
    owners = [k for k, (s, e) in enumerate(spans) if s <= emoji < e]
    assert len(owners) == 1


def test_spans_match_detects_mismatch():
    assert spans_match([(0, 2), (2, 5)], "abcde")
    assert not spans_match([(0, 2), (2, 4)], "abcde")
    assert spans_match([], "")


def test_python_strings_and_comments_via_tokenize():
    text = 'a = "s#x"  # note\nb = f"{a}" + \'q\'\nc = """doc\nstring"""\n'
    cov = _covered(text, strings_and_comments(text, "python"))
    lines = cov.split("\n")
    assert lines[0] == 'a = _____  ______'
    # 3.11 tokenizes the whole f-string as one STRING; 3.12 keeps `{a}` as code between FSTRING_* parts.
    assert lines[1].startswith("b = __") and lines[1].endswith(" + ___")
    assert lines[2] == "c = ______" and lines[3] == "_________"


def test_python_incomplete_code_falls_back_to_scanner():
    # Unterminated triple-quoted string and an open bracket: tokenize raises; the scanner covers the rest.
    text = 'x = foo(1,\ny = 2  # c\nz = """open\nstill open'
    spans = strings_and_comments(text, "python")
    cov = _covered(text, spans)
    assert "# c" not in cov
    assert cov.endswith("_" * len("still open"))
    assert cov.startswith("x = foo(1,")


def test_generic_scanner_c_like():
    text = 'int a = 1; // one\nchar *s = "a\\"b"; /* multi\nline */ int b;\n'
    cov = _covered(text, scan_strings_and_comments(text, "c"))
    assert cov.startswith("int a = 1; ")
    assert "// one" not in cov and "multi" not in cov and 'a\\"b' not in cov
    assert cov.rstrip().endswith("int b;")


def test_unterminated_single_quote_stops_at_line_end():
    text = "s = 'abc\nt = 1\n"
    cov = _covered(text, scan_strings_and_comments(text, "python"))
    assert cov.split("\n")[1] == "t = 1"


def test_language_of():
    assert language_of("file:///a/b.py") == "python"
    assert language_of("file:///a/b.rs") == "rust"
    assert language_of("file:///a/b.unknown") == ""
    assert language_of("file:///a/b.txt", "Python") == "python"


def test_python_binding_spans():
    from kog_lsp.textmap import python_binding_spans

    text = ("import os\nfrom a.b import c as d\nx = 1\nself.y: int = 2\na, (b, c) = f(k=v)\nd[key] = w\n"
            "count += 1\ndef foo(self, p: int = 3, *args, q=x, **kw) -> T:\n    for i, j in items: pass\n"
            "    g = lambda u, z=2: u + z\n    with open(p) as fh:\n        pass\nclass K(Base): pass\n")
    bound = [text[a:b] for a, b in python_binding_spans(text)]
    assert bound == ["import os", "from a.b import c as d", "x", "y", "a", "b", "c", "foo", "self", "p", "args",
                     "q", "kw", "i", "j", "g", "u", "z", "fh", "K"]
    # Uses stay reviewable: annotations, defaults, call arguments, subscripts, augmented targets.
    for used in ("int", "f", "k", "v", "key", "w", "count", "T", "items", "Base"):
        assert used not in bound


def test_declaration_spans_generic_imports():
    from kog_lsp.textmap import declaration_spans

    text = 'import { a } from "b";\nconst x = 1;\n#include <stdio.h>\n'
    assert [text[a:b] for a, b in declaration_spans(text, "javascript")] == ['import { a } from "b";',
                                                                             "#include <stdio.h>"]
