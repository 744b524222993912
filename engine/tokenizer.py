"""Tokenizer wrapper: encode/decode without implicit specials, BOS policy, FIM tokens, EOS ids, stream decoding."""
from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

# FIM special tokens per format (from the models' tokenizers; see shared/LSP.md). Candidates are tried in
# order; CodeLlama's sentencepiece vocab spells them with a leading "▁".
_FIM_FORMATS = {
    "qwen": dict(prefix=["<|fim_prefix|>"], suffix=["<|fim_suffix|>"], middle=["<|fim_middle|>"],
                 file_sep=["<|file_sep|>"], repo_name=["<|repo_name|>"], pad=["<|fim_pad|>"],
                 eos=["<|endoftext|>"]),
    "starcoder": dict(prefix=["<fim_prefix>"], suffix=["<fim_suffix>"], middle=["<fim_middle>"],
                      file_sep=["<file_sep>"], repo_name=["<repo_name>", "<reponame>"], pad=["<fim_pad>"],
                      eos=["<|endoftext|>"]),
    "codellama": dict(prefix=["▁<PRE>", "<PRE>"], suffix=["▁<SUF>", "<SUF>"], middle=["▁<MID>", "<MID>"],
                      file_sep=[], repo_name=[], pad=[], eos=["▁<EOT>", "<EOT>"]),
    "deepseek": dict(prefix=["<｜fim▁begin｜>"], suffix=["<｜fim▁hole｜>"], middle=["<｜fim▁end｜>"],
                     file_sep=[], repo_name=[], pad=[], eos=["<｜end▁of▁sentence｜>"]),
}
# Tokens that end a generation wherever they exist in a vocabulary.
_END_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>", "<|fim_pad|>",
               "<fim_pad>", "</s>", "<｜end▁of▁sentence｜>", "<EOT>", "▁<EOT>")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_GIL_FREE_CHARS = 8192


@dataclass(frozen=True)
class FimTokens:
    format: str
    prefix: int
    suffix: int
    middle: int
    file_sep: int | None
    repo_name: int | None
    eos: int | None
    pad: int | None = None
    # Prompt order the model was made for: "psm" (prefix, suffix, middle: every public FIM model) or "spm"
    # (suffix first, the prefix right before the middle). From tokenizer_config.json "fim_order" (default psm).
    order: str = "psm"

    def marker_ids(self) -> frozenset[int]:
        """Ids that must never be generated as content of a completion."""
        return frozenset(i for i in (self.prefix, self.suffix, self.middle, self.file_sep, self.repo_name,
                                     self.pad, self.eos) if i is not None)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to code points from 256 on."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_DECODER = {c: b for b, c in _bytes_to_unicode().items()}


class Tokenizer:
    def __init__(self, tok: HFTokenizer, tokenizer_config: dict | None = None, eos_ids=()):
        self.tok = tok
        tc = tokenizer_config or {}
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self._added = {t.content: i for i, t in tok.get_added_tokens_decoder().items()} if hasattr(
            tok, "get_added_tokens_decoder") else {}
        self._added_ids = {i: c for c, i in self._added.items()}
        self.bos_id = self._detect_bos(tc)
        self.fim = self._detect_fim(tc.get("fim_order", "psm"))
        eos = set(int(e) for e in eos_ids)
        for name in _END_TOKENS:
            i = tok.token_to_id(name)
            if i is not None:
                eos.add(i)
        cfg_eos = tc.get("eos_token")
        if isinstance(cfg_eos, dict):
            cfg_eos = cfg_eos.get("content")
        if isinstance(cfg_eos, str) and tok.token_to_id(cfg_eos) is not None:
            eos.add(tok.token_to_id(cfg_eos))
        self.eos_ids = frozenset(eos)
        self._byte_level = self._is_byte_level()
        self._piece_bytes: dict[int, bytes] = {}

    # ---- construction ----
    @classmethod
    def from_dir(cls, path: str | Path, eos_ids=()) -> "Tokenizer":
        path = Path(path)
        tj = path / "tokenizer.json"
        if not tj.exists():
            raise ValueError(f"no tokenizer.json in {path}")
        try:
            tok = HFTokenizer.from_file(str(tj))
        except Exception as e:  # tokenizers raises a generic Exception on bad JSON
            raise ValueError(f"cannot read {tj}: {e}") from e
        tc = {}
        tcp = path / "tokenizer_config.json"
        if tcp.exists():
            tc = json.loads(tcp.read_text())
        return cls(tok, tc, eos_ids)

    def _detect_bos(self, tc: dict) -> int | None:
        bos = tc.get("bos_token")
        if isinstance(bos, dict):
            bos = bos.get("content")
        if tc.get("add_bos_token") and isinstance(bos, str):
            return self.tok.token_to_id(bos)
        # Llama 3 style: the post-processor template prepends the BOS when specials are added.
        with_sp = self.tok.encode("a", add_special_tokens=True).ids
        without = self.tok.encode("a", add_special_tokens=False).ids
        if len(with_sp) > len(without) and with_sp[1:1 + len(without)] == without:
            return with_sp[0]
        return None

    def _detect_fim(self, order: str) -> FimTokens | None:
        if order not in ("psm", "spm"):
            raise ValueError(f"tokenizer_config.json: fim_order must be 'psm' or 'spm', not {order!r}")
        for fmt, names in _FIM_FORMATS.items():
            found = {}
            for role, cands in names.items():
                found[role] = next((self.tok.token_to_id(c) for c in cands if self.tok.token_to_id(c) is not None),
                                   None)
            if found["prefix"] is not None and found["suffix"] is not None and found["middle"] is not None:
                return FimTokens(format=fmt, **found, order=order)
        return None

    def _is_byte_level(self) -> bool:
        try:
            dec = json.loads(self.tok.to_str()).get("decoder") or {}
        except Exception:
            return False
        if dec.get("type") == "ByteLevel":
            return True
        return dec.get("type") == "Sequence" and any(d.get("type") == "ByteLevel" for d in dec.get("decoders", []))

    # ---- surface ----
    def encode(self, text: str) -> list[int]:
        # Lone surrogates (a UTF-16 editor can send half a pair) are rejected by `tokenizers`: one U+FFFD each
        # keeps character offsets unchanged.
        text = _LONE_SURROGATE.sub("\ufffd", text)
        if len(text) > _GIL_FREE_CHARS:
            # encode_batch releases the GIL, so a long document does not freeze the server's event loop
            return self.tok.encode_batch([text], add_special_tokens=False)[0].ids
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, s: str) -> int | None:
        return self.tok.token_to_id(s)

    def id_to_token(self, i: int) -> str | None:
        return self.tok.id_to_token(i)

    def stream_decoder(self) -> "StreamDecoder":
        return ByteStreamDecoder(self) if self._byte_level else OffsetStreamDecoder(self)

    def piece_bytes(self, i: int) -> bytes:
        """Raw bytes of one byte-level token (added/special tokens: their text)."""
        b = self._piece_bytes.get(i)
        if b is None:
            if i in self._added_ids:
                b = self._added_ids[i].encode()
            else:
                piece = self.tok.id_to_token(i) or ""
                try:
                    b = bytes(_BYTE_DECODER[c] for c in piece)
                except KeyError:  # not a byte-level piece after all: let the tokenizer decode it
                    b = self.tok.decode([i], skip_special_tokens=False).encode()
            self._piece_bytes[i] = b
        return b


class StreamDecoder:
    """push(token_id) -> newly completed text (never half a UTF-8 character); flush() -> the rest."""

    def push(self, token_id: int) -> str:  # pragma: no cover - interface
        raise NotImplementedError

    def flush(self) -> str:  # pragma: no cover - interface
        raise NotImplementedError


class ByteStreamDecoder(StreamDecoder):
    """Byte-level BPE: map each token to its bytes and run an incremental UTF-8 decoder (exact, O(1) per token)."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self.dec.decode(self.tok.piece_bytes(token_id))

    def flush(self) -> str:
        return self.dec.decode(b"", final=True)


class OffsetStreamDecoder(StreamDecoder):
    """Generic fallback (sentencepiece etc.): re-decode a short window and emit the new suffix once it no
    longer ends in U+FFFD (an incomplete multi-byte character)."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prev = self.tok.decode(self.ids[self.prefix_offset:self.read_offset])
        full = self.tok.decode(self.ids[self.prefix_offset:])
        if full.endswith("\ufffd") or len(full) <= len(prev):
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return full[len(prev):]

    def flush(self) -> str:
        prev = self.tok.decode(self.ids[self.prefix_offset:self.read_offset])
        full = self.tok.decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prev):]
