from kog_lsp.postprocess import Policy, block_end, make_stop_fn, postprocess, trim_duplicate_closers

SINGLE = Policy(False, 0)
TYPING = Policy(False, 4, next_line=False, blank_line=False)  # in a line being typed


def test_policy_decide():
    assert Policy.decide("auto", "    ", "").multiline
    assert not Policy.decide("auto", "    x = ", "").multiline
    assert not Policy.decide("always", "x = f(", ")").multiline  # mid-line is always one line
    assert Policy.decide("always", "def f():", "").multiline
    assert not Policy.decide("never", "", "").multiline
    assert Policy.decide("auto", "        ", "").cursor_indent == 8
    assert Policy.decide("auto", "    x = f()", "").next_line
    assert not Policy.decide("never", "    x = f()", "").next_line
    assert not Policy.decide("auto", "    x = f(", ")").next_line
    assert not Policy.decide("auto", "    def ", "").next_line and not Policy.decide("auto", "x = f(a,", "").next_line
    assert Policy.decide("auto", "    def f(self):", "").next_line


def test_next_line_suggestions_at_the_end_of_a_finished_line():
    pol = Policy.decide("auto", "    total = sum(xs)", "")
    stop = make_stop_fn(pol)
    assert not stop("\n    return") and stop("\n    return total\n") and stop(" + 1\n")
    after = "\n    def other(self):\n        pass\n"
    assert postprocess("\n    return total\n", pol, "", after).text == "\n    return total"
    # the model skipped the line break: it is put back
    assert postprocess("    return total", pol, "", after).text == "\n    return total"
    # a plain continuation of the line stays on the line
    assert postprocess(" + 1", pol, "", after).text == " + 1"
    # suggesting the line that follows anyway is no suggestion
    assert postprocess("\n    def other(self):", pol, "", after) is None
    assert postprocess("\n\n", pol, "", after) is None


def test_indented_line_start_mid_line_is_dropped():
    assert postprocess("        return x", TYPING, "", "") is None
    assert postprocess(" x", TYPING, "", "").text == " x"
    assert postprocess("    return x", Policy(False, 0), "", "").text == "    return x"  # blank line: fine


def test_single_line_cut_and_stop_fn():
    assert postprocess("foo(1)\nbar()", SINGLE, "", "").text == "foo(1)"
    stop = make_stop_fn(SINGLE)
    assert not stop("foo(") and stop("foo(1)\n")


def test_whitespace_only_is_dropped():
    assert postprocess("   \n  ", SINGLE, "", "") is None
    assert postprocess("\nfoo", SINGLE, "", "") is None


def test_block_end_dedent_blank_pair_and_sibling():
    text = "x = 1\n    y = 2\n    return y\nprint(3)\n"
    assert text[: block_end(text, 4)] == "x = 1\n    y = 2\n    return y\n"
    text = "a()\n\n\nb()"
    assert block_end(text, 0) == len("a()\n\n")
    text = "def f():\n    return 1\n\ndef g():\n"
    assert text[: block_end(text, 0)] == "def f():\n    return 1\n\n"
    assert block_end("return x\n", 4) is None  # nothing decided until a later line arrives
    stop = make_stop_fn(Policy(True, 4))
    assert not stop("if x:\n        y()\n") and stop("if x:\n        y()\nz()\n")


def test_multiline_block_postprocess_drops_lines_repeating_the_document():
    pol = Policy(True, 4)
    raw = "total = 0\n    for i in xs:\n        total += i\n    return total\n\n\ndef other():"
    after = "\n    return total\n"
    s = postprocess(raw, pol, "", after)
    assert s.text == "total = 0\n    for i in xs:\n        total += i" and not s.replace_to_eol


def test_suffix_covered_replaces_rest_of_line():
    s = postprocess('"hello")', SINGLE, ")", ")\n")
    assert s.text == '"hello")' and s.replace_to_eol


def test_bracket_balance_against_suffix():
    assert trim_duplicate_closers("a, b)", ")") == "a, b"
    assert trim_duplicate_closers("x))", "))\n") == "x"
    assert trim_duplicate_closers("x))", ")") == "x)"
    assert trim_duplicate_closers("1])", ")") == "1]"
    assert trim_duplicate_closers("f(x)", ")") == "f(x)"  # its own bracket pair stays
    assert trim_duplicate_closers("x)", "  # comment") == "x)"
    s = postprocess("a, b)", SINGLE, ")  # note", ")  # note\n")
    assert s.text == "a, b" and not s.replace_to_eol
    assert postprocess(")", SINGLE, ")", ")") is None


def test_crlf_output_normalised():
    assert postprocess("a\r\nb", Policy(True, 0), "", "").text == "a\nb"
