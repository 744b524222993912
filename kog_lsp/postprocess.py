"""Turn raw generated text into a ghost-text suggestion: policy, early stop, trimming, dedupe.

All functions are pure (strings in, strings out) so they are unit-tested without a model. The same
`block_end` logic drives the engine's stop_fn (stop generating) and the final cut (what is shown).
"""

from __future__ import annotations

from dataclasses import dataclass

OPENERS = {"(": ")", "[": "]", "{": "}"}
CLOSERS = {")": "(", "]": "[", "}": "{"}


def indent_of(line: str) -> int:
    """Indentation width of a line (tabs count as 4 columns)."""
    width = 0
    for c in line:
        if c == " ":
            width += 1
        elif c == "\t":
            width += 4
        else:
            break
    return width


@dataclass(frozen=True)
class Policy:
    """How much to suggest at one cursor."""

    multiline: bool
    cursor_indent: int  # indentation of the cursor's line (block mode compares against it)
    # At the end of a finished code line a one-line suggestion may be the *next* line ("\n" + line),
    # shown below the cursor as editors do; the model may also skip the line break (see postprocess).
    next_line: bool = False
    blank_line: bool = True  # nothing but indentation before the cursor

    @staticmethod
    def decide(setting: str, line_before: str, line_after: str) -> "Policy":
        """setting is kog.multiline. Mid-line (code after the cursor) is always single-line; 'auto'
        suggests a block only on an otherwise empty line; 'always' also at the end of a code line."""
        mid_line = line_after.strip() != ""
        if setting == "never" or mid_line:
            multi = False
        elif setting == "always":
            multi = True
        else:
            multi = line_before.strip() == ""
        next_line = setting == "auto" and not multi and not mid_line and line_looks_finished(line_before)
        return Policy(multi, indent_of(line_before), next_line, line_before.strip() == "")


def line_looks_finished(line_before: str) -> bool:
    """True when the cursor ends a line that could be complete (`x = f()`, `def f():`), not one still
    being typed (`def `, `x = `, `f(a,`): only then may a suggestion start on the next line."""
    if not line_before.strip() or line_before[-1] in " \t":
        return False
    return line_before.rstrip()[-1] not in "([{,.=+-*/%<>&|^~!@\\"


def block_end(text: str, cursor_indent: int, final: bool = False) -> int | None:
    """Offset in `text` where a multi-line suggestion's block ends, or None if not ended yet.

    Lines after the first (the first continues the cursor's line) end the block when they
    - dedent below the cursor's indentation (the enclosing block is over), or
    - start a sibling statement after a blank line (a new top-level def / paragraph), or
    - are the second of two blank lines.
    Only complete lines are judged unless `final` (generation over: the last line is complete too).
    """
    lines = text.split("\n")
    complete = lines if final else lines[:-1]
    offset = len(lines[0]) + 1
    seen_content = lines[0].strip() != ""
    blank_run = 0
    for line in complete[1:]:
        if line.strip() == "":
            blank_run += 1
            if blank_run >= 2 and seen_content:
                return offset
        else:
            ind = indent_of(line)
            if seen_content and (ind < cursor_indent or (blank_run >= 1 and ind <= cursor_indent)):
                return offset
            blank_run = 0
            seen_content = True
        offset += len(line) + 1
    return None


def make_stop_fn(policy: Policy):
    """stop_fn(text_so_far) for engine.generate: end of line (single-line) or end of block."""
    if policy.next_line:
        # "\n" first: the suggestion is the next line, so stop at the line break after it.
        return lambda text: "\n" in (text[1:] if text.startswith("\n") else text)
    if not policy.multiline:
        return lambda text: "\n" in text
    return lambda text: block_end(text, policy.cursor_indent) is not None


def _trailing_unmatched_closers(text: str) -> str:
    """The run of closing brackets at the end of `text` that close something opened before `text`."""
    stack: list[str] = []
    unmatched: list[int] = []  # indices of closers with no opener inside text
    for i, c in enumerate(text):
        if c in OPENERS:
            stack.append(c)
        elif c in CLOSERS:
            if stack and stack[-1] == CLOSERS[c]:
                stack.pop()
            else:
                unmatched.append(i)
    tail = ""
    j = len(text) - 1
    while j >= 0 and (text[j] in CLOSERS or text[j] in " \t"):
        if text[j] in CLOSERS:
            if j not in unmatched:
                break
            tail = text[j] + tail
        j -= 1
    return tail


def trim_duplicate_closers(text: str, suffix: str) -> str:
    """Drop closing brackets at the end of `text` that the document already has right after the cursor.

    Example: `print(|)` with suggestion `x)` -> `x` (the `)` is already there).
    """
    tail = _trailing_unmatched_closers(text)
    if not tail:
        return text
    head = ""
    for c in suffix.lstrip():
        if c in CLOSERS:
            head += c
        elif c in " \t\r\n":
            continue
        else:
            break
    # Longest prefix of the suffix's closers that the suggestion's tail ends with.
    for k in range(min(len(tail), len(head)), 0, -1):
        if tail.endswith(head[:k]):
            cut = text.rstrip(" \t")
            for _ in range(k):
                cut = cut.rstrip(" \t")[:-1]
            return cut.rstrip(" \t")
    return text


def drop_repeated_lines(text: str, following: list[str]) -> str:
    """Remove trailing suggestion lines that repeat the document's next non-blank lines."""
    lines = text.split("\n")
    nxt = [ln.strip() for ln in following if ln.strip()]
    for k in range(min(len(lines) - 1, len(nxt)), 0, -1):
        tail = [ln.strip() for ln in lines[-k:] if ln.strip()]
        if tail and tail == nxt[: len(tail)]:
            return "\n".join(lines[:-k]).rstrip()
    return text


@dataclass(frozen=True)
class Suggestion:
    text: str  # what to insert at the cursor
    replace_to_eol: bool  # True: the item's range runs from the cursor to the end of the line


def postprocess(raw: str, policy: Policy, line_after: str, text_after: str) -> Suggestion | None:
    """raw generated text -> Suggestion, or None when nothing worth showing is left.

    line_after: rest of the cursor's line; text_after: the document after the cursor (a bounded head).
    """
    text = raw.replace("\r\n", "\n").replace("\r", "\n")
    if policy.multiline:
        end = block_end(text, policy.cursor_indent, final=True)
        if end is not None:
            text = text[:end]
        following = text_after.split("\n")[1:40] if "\n" in text_after else []
        text = drop_repeated_lines(text.rstrip(), following)
    elif policy.next_line and (text.startswith("\n") or text.startswith(("  ", "\t"))):
        # A next-line suggestion. A leading indent with no line break at the end of a finished line is
        # the model skipping the break (its training middles start at line starts): add it back.
        line = (text[1:] if text.startswith("\n") else text).split("\n", 1)[0].rstrip()
        following = [ln for ln in text_after.split("\n")[1:40] if ln.strip()]
        if not line.strip() or (following and following[0].strip() == line.strip()):
            return None  # blank, or the line that is already there
        return Suggestion("\n" + line, False)
    else:
        text = text.split("\n", 1)[0]
        if text.startswith(("  ", "\t")) and not policy.blank_line:
            return None  # an indented line start in the middle of a line: the model lost its place
    text = text.rstrip()
    if not text.strip():
        return None
    rest = line_after.rstrip()
    if rest.strip() and text.endswith(rest) and len(text) > len(rest):
        # The suggestion already contains what follows the cursor: replace the rest of the line.
        return Suggestion(text, True)
    text = trim_duplicate_closers(text, text_after)
    if not text.strip():
        return None
    return Suggestion(text, False)
