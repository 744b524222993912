import pytest
from tokenizers import Tokenizer as HFTok
from tokenizers import decoders, models, pre_tokenizers, trainers

from engine.tokenizer import ByteStreamDecoder, OffsetStreamDecoder, Tokenizer

TEXTS = ["def f(x):\n    return x  # 😀 done", "s = '日本語のテキスト' + \"中文\"", "🎉🚀✓ ünïcödé 👩‍👩‍👧 ok",
         "plain ascii only"]


def _bpe(specials):
    tok = HFTok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["def main(): return 1\n" * 5], trainer=tr)
    return tok


def test_qwen_fim_and_eos(tiny_qwen):
    t = Tokenizer.from_dir(tiny_qwen)
    assert t.fim is not None and t.fim.format == "qwen"
    assert t.fim.prefix == t.token_to_id("<|fim_prefix|>") and t.fim.middle == t.token_to_id("<|fim_middle|>")
    assert t.fim.file_sep == t.token_to_id("<|file_sep|>") and t.fim.repo_name == t.token_to_id("<|repo_name|>")
    assert t.token_to_id("<|endoftext|>") in t.eos_ids and t.bos_id is None
    assert t.encode("<|fim_prefix|>x") [0] == t.fim.prefix   # specials are matched in text, not added
    assert t.encode("def") == t.encode("def")
    assert 400 <= t.vocab_size <= 600


def test_fim_order_from_tokenizer_config(tiny_qwen, tmp_path):
    import json
    import shutil

    assert Tokenizer.from_dir(tiny_qwen).fim.order == "psm"   # the default: every public FIM model
    d = tmp_path / "tok"
    shutil.copytree(tiny_qwen, d)
    tc = json.loads((d / "tokenizer_config.json").read_text())
    for order, ok in (("spm", True), ("middle-first", False)):
        (d / "tokenizer_config.json").write_text(json.dumps({**tc, "fim_order": order}))
        if ok:
            assert Tokenizer.from_dir(d).fim.order == order
        else:
            with pytest.raises(ValueError, match="fim_order"):
                Tokenizer.from_dir(d)


def test_llama_bos(tiny_llama):
    t = Tokenizer.from_dir(tiny_llama)
    assert t.bos_id == t.token_to_id("<|begin_of_text|>")
    assert t.bos_id not in t.encode("hello")


def test_bos_from_post_processor():
    from tokenizers.processors import TemplateProcessing
    tok = _bpe(["<s>", "</s>"])
    tok.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    t = Tokenizer(tok, {})
    assert t.bos_id == tok.token_to_id("<s>") and tok.token_to_id("</s>") in t.eos_ids


@pytest.mark.parametrize("fmt,specials,role_names", [
    ("starcoder", ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<file_sep>"],
     ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")),
    ("codellama", ["</s>", "▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"], ("▁<PRE>", "▁<SUF>", "▁<MID>")),
    ("deepseek", ["<｜end▁of▁sentence｜>", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"],
     ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>")),
])
def test_fim_formats(fmt, specials, role_names):
    tok = _bpe(specials)
    t = Tokenizer(tok, {})
    assert t.fim.format == fmt
    assert (t.fim.prefix, t.fim.suffix, t.fim.middle) == tuple(tok.token_to_id(n) for n in role_names)
    assert t.fim.eos in t.eos_ids
    if fmt == "starcoder":
        assert t.fim.file_sep == tok.token_to_id("<file_sep>")
    else:
        assert t.fim.file_sep is None


def test_no_fim():
    t = Tokenizer(_bpe(["<|endoftext|>"]), {})
    assert t.fim is None


@pytest.mark.parametrize("cls", [ByteStreamDecoder, OffsetStreamDecoder])
def test_stream_decoder_utf8(tiny_qwen, cls):
    t = Tokenizer.from_dir(tiny_qwen)
    split_seen = False
    for text in TEXTS:
        ids = t.encode(text)
        assert t.decode(ids) == text
        d = cls(t)
        parts = [d.push(i) for i in ids]
        parts.append(d.flush())
        assert "".join(parts) == text
        assert all("\ufffd" not in p for p in parts)
        split_seen |= any(p == "" for p in parts[:-1])
    assert split_seen   # some token really ended inside a multi-byte character


def test_stream_decoder_default_is_byte_level(tiny_qwen):
    assert isinstance(Tokenizer.from_dir(tiny_qwen).stream_decoder(), ByteStreamDecoder)


def test_bad_tokenizer_file(tmp_path):
    with pytest.raises(ValueError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def test_encode_lone_surrogates_and_long_text(tiny_qwen):
    tok = Tokenizer.from_dir(tiny_qwen)
    # a lone surrogate becomes one U+FFFD: same length, so character offsets stay valid
    assert tok.decode(tok.encode("a\ud83db")) == "a\ufffdb"
    long_text = "def f(x):\n    return x + 1\n" * 1000       # over the GIL-free threshold
    assert tok.decode(tok.encode(long_text)) == long_text
    assert tok.encode(long_text[:300]) == tok.encode(long_text)[:len(tok.encode(long_text[:300]))]
