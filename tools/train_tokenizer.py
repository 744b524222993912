"""Train the byte-level BPE tokenizer of the default model (HF `tokenizers`).

The special tokens follow the Qwen2.5-Coder FIM convention so the server and the engine treat this model
like any Qwen FIM model: <|endoftext|> ends a document and a FIM middle; <|fim_prefix|>, <|fim_suffix|>,
<|fim_middle|> frame a fill-in-the-middle prompt (PSM order); <|file_sep|> / <|repo_name|> introduce
repository context. Pre-tokenization is Qwen2's split regex followed by the GPT-2 byte mapping, so any
byte string round-trips.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<|im_start|>", "<|im_end|>",
]
EOS = "<|endoftext|>"
# Qwen2's pre-tokenizer split: letters runs, single digits, punctuation runs (with trailing newlines),
# newline runs, and whitespace runs (so indentation becomes a few tokens, not one per space).
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def new_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int = 12288, min_frequency: int = 2) -> Tokenizer:
    """texts: an iterable of documents (strings). Special tokens take ids 0..8."""
    tok = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int = 4096, fim_order: str = "psm") -> None:
    """Writes tokenizer.json and a tokenizer_config.json that HF AutoTokenizer loads as a fast tokenizer.
    fim_order: the FIM prompt order the engine and server should use ("psm" or "spm", see kog_lsp/fim.py)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                       "single_word": False, "special": True} for t in SPECIAL_TOKENS}
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t != EOS],
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "split_special_tokens": False,
        "fim_order": fim_order,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
