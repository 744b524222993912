"""FIM prompt building from token windows around the cursor.

Prompt layout (PSM, the order Qwen2.5-Coder / StarCoder / DeepSeek-Coder / CodeLlama were trained on):

    [context chunks: <file_sep>path\\ncontent ...] [<file_sep>this/path\\n]
    <fim_prefix> prefix-window <fim_suffix> suffix-window <fim_middle>

Everything up to the cursor is a stable prefix of the previous keystroke's prompt, so the engine's
prefix KV cache only prefills the last word + the suffix window. Two choices keep it stable:
- the prefix window starts at a line boundary snapped to a multiple of STRIDE_LINES lines, so typing
  does not shift its start on every keystroke (a sliding "last N tokens" window would miss the cache
  every time once the file is longer than the window);
- context chunks come first, in a fixed order (see context.py).

A model whose tokenizer_config.json says "fim_order": "spm" (the shipped default model: it was trained on PSM but
finds the prefix end far better when the prefix comes last, engine/models/default/README.md) gets
    [context ...] <fim_prefix> <fim_suffix> suffix-window <fim_middle> prefix-window
which also keeps the suffix in the cached part of the prompt while typing.

A tokenizer without FIM tokens gets a prefix-only prompt: [bos] + prefix window.

Host time: the windows are re-encoded on every keystroke; with a token_cache.PromptTokenCache (the server's
Completer passes one) only the lines that changed are, with identical ids.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass

from kog_lsp.positions import line_starts

log = logging.getLogger(__name__)

STRIDE_LINES = 32
# First guess of characters per token for sizing the window before encoding (checked after encoding).
CHARS_PER_TOKEN_GUESS = 4


def safe_encode(tokenizer):
    """tokenizer.encode that accepts any document text. Editors can send lone UTF-16 surrogates (a
    half-deleted emoji); the HF tokenizer rejects such strings, so they become U+FFFD for the model
    while the document itself stays exact."""
    encode = tokenizer.encode

    def enc(text: str) -> list[int]:
        try:
            return encode(text)
        except (TypeError, UnicodeEncodeError):
            return encode(text.encode("utf-8", "surrogatepass").decode("utf-8", "replace"))

    return enc


def prefix_window(encode, text_before: str, budget: int, stride: int = STRIDE_LINES,
                  starts: list[int] | None = None) -> tuple[int, list[int]]:
    """Token ids of the tail of `text_before` (at most `budget` tokens) and the offset where it starts.

    The start is a line start whose line index is a multiple of `stride` (stable while typing); if even
    the cursor's own line does not fit, the last `budget` tokens are kept (rare: a huge single line).
    `starts`: line starts of a text that begins with text_before (the document's cached ones), so a big
    file is not rescanned on every keystroke.
    """
    cursor = len(text_before)
    if budget <= 0 or not text_before:
        return cursor, []
    if starts is None:
        starts = line_starts(text_before)
    cursor_line = bisect.bisect_right(starts, cursor) - 1
    limit_chars = budget * CHARS_PER_TOKEN_GUESS
    # First candidate: the first stride-aligned line that starts within limit_chars of the cursor.
    first_line = bisect.bisect_left(starts, cursor - limit_chars, 0, cursor_line + 1)
    line_idx = -(-first_line // stride) * stride
    ids: list[int] = []
    while line_idx < cursor_line:
        ids = encode(text_before[starts[line_idx]:])
        if len(ids) <= budget:
            return starts[line_idx], ids
        line_idx += stride
    start = starts[cursor_line]
    ids = encode(text_before[start:])
    if len(ids) > budget:
        log.debug("prefix window: cursor line alone exceeds %d tokens; keeping the last %d", budget, budget)
        ids = ids[-budget:]
    return start, ids


def suffix_window(encode, text_after: str, budget: int) -> list[int]:
    """Token ids of the head of `text_after`: whole lines while they fit, at most `budget` tokens."""
    if budget <= 0 or not text_after:
        return []
    limit_chars = budget * CHARS_PER_TOKEN_GUESS
    if len(text_after) > limit_chars:
        cut = text_after.rfind("\n", 0, limit_chars)
        text_after = text_after[: cut + 1] if cut > 0 else text_after[:limit_chars]
    ids = encode(text_after)
    return ids[:budget]


@dataclass
class Prompt:
    ids: list[int]
    window_start: int  # document offset where the prefix window starts
    prefix_tokens: int
    suffix_tokens: int
    context_tokens: int
    fim: bool


def has_fim(tokenizer) -> bool:
    fim = getattr(tokenizer, "fim", None)
    return not (fim is None or fim.prefix is None or fim.suffix is None or fim.middle is None)


def prompt_format(tokenizer) -> str:
    """What completion prompts look like for this tokenizer (logged at load, reported in kog/stats)."""
    if not has_fim(tokenizer):
        return "prefix-only (the tokenizer has no FIM tokens)"
    return f"fim:{tokenizer.fim.format}" + (":spm" if tokenizer.fim.order == "spm" else "")


def build_prompt(tokenizer, text: str, cursor: int, *, prefix_tokens: int, suffix_tokens: int,
                 context_ids: list[int] | None = None, path: str | None = None,
                 starts: list[int] | None = None, token_cache=None, doc=None) -> Prompt:
    """The token ids for a completion at string offset `cursor` of `text`.

    `context_ids` are the already-encoded chunks of other open documents (context.py); they are only
    used with FIM tokenizers that have a file separator.
    `token_cache` (token_cache.PromptTokenCache) with `doc` (the document's uri): reuse the encodings of
    unchanged lines from earlier calls for the same document. The ids are identical either way; a
    tokenizer for which that cannot be guaranteed always takes the uncached path.
    """
    encode = encode_pre = encode_suf = safe_encode(tokenizer)
    pieces = token_cache.pieces(tokenizer, encode, doc) if token_cache is not None else None
    if pieces is not None:
        encode_pre = pieces.encode
        encode_suf = lambda t: pieces.encode(t, keep_first=False)  # noqa: E731  (starts at the cursor)
    # Only bounded windows are copied out of the document (it may be megabytes).
    if starts is not None:
        # Start the copied region at a stride-aligned line so relative line indices stay aligned too.
        lo_line = bisect.bisect_right(starts, max(0, cursor - prefix_tokens * CHARS_PER_TOKEN_GUESS * 4)) - 1
        lo_line -= lo_line % STRIDE_LINES
        lo = starts[lo_line]
        window_starts = [x - lo for x in starts[lo_line:bisect.bisect_right(starts, cursor)]]
    else:
        lo, window_starts = 0, None
    before = text[lo:cursor]
    after = text[cursor:cursor + suffix_tokens * CHARS_PER_TOKEN_GUESS + 1]
    start, pre = prefix_window(encode_pre, before, prefix_tokens, starts=window_starts)
    start += lo
    fim = tokenizer.fim
    if not has_fim(tokenizer):
        bos = getattr(tokenizer, "bos_id", None)
        ids = ([bos] if bos is not None else []) + pre
        return Prompt(ids, start, len(pre), 0, 0, False)
    suf = suffix_window(encode_suf, after, suffix_tokens)
    head: list[int] = []
    ctx = 0
    if context_ids and fim.file_sep is not None:
        ctx = len(context_ids)
        head = list(context_ids) + [fim.file_sep] + encode((path or "untitled") + "\n")
    if fim.order == "spm":
        ids = head + [fim.prefix, fim.suffix] + suf + [fim.middle] + pre
    else:
        ids = head + [fim.prefix] + pre + [fim.suffix] + suf + [fim.middle]
    return Prompt(ids, start, len(pre), len(suf), ctx, True)


def stop_ids_for(tokenizer) -> frozenset[int]:
    """Ids that end a suggestion: the tokenizer's eos set plus every FIM special token."""
    ids = set(tokenizer.eos_ids or ())
    fim = tokenizer.fim
    if fim is not None:
        for name in ("prefix", "suffix", "middle", "file_sep", "repo_name", "eos"):
            v = getattr(fim, name, None)
            if isinstance(v, int):
                ids.add(v)
    return frozenset(ids)
