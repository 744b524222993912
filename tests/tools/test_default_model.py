"""The shipped default model (engine/models/default): files, sizes, metrics, and the engine's reference
path giving the same greedy continuation as HF transformers."""
import json
from pathlib import Path

import pytest
import torch

MODEL_DIR = Path(__file__).resolve().parents[2] / "engine" / "models" / "default"
PROMPT = 'import os\n\n\ndef read_config(path):\n    """Read a key=value file into a dict."""\n    result = {}\n'


def test_model_dir_has_the_required_files_and_sizes():
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json",
                 "metrics.json", "corpus_manifest.json", "README.md"):
        assert (MODEL_DIR / name).is_file(), name
    index = json.loads((MODEL_DIR / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == sorted(p.name for p in MODEL_DIR.glob("model-*-of-*.safetensors"))
    assert all((MODEL_DIR / s).stat().st_size < 15_000_000 for s in shards)
    total = sum(p.stat().st_size for p in MODEL_DIR.iterdir() if p.is_file())
    assert total <= 60_000_000, total
    cfg = json.loads((MODEL_DIR / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["tie_word_embeddings"] is True
    assert "lm_head.weight" not in index["weight_map"]          # tied: stored once


def test_metrics_and_manifest_are_recorded():
    m = json.loads((MODEL_DIR / "metrics.json").read_text())
    ev = m["eval_heldout"]
    for key in ("fim_line_exact_match", "next_line_exact_match", "samples"):
        assert key in ev
    assert ev["perplexity"]["perplexity"] > 1.0 and ev["samples"] >= 100
    # Recorded as kog-lsp runs it on the 2-core machine (engine_threads: 1 thread there), against the 100 tok/s aim.
    from kog_lsp.cli import engine_threads
    assert m["cpu_decode"]["threads"] == engine_threads(None, cpu_count=2)
    assert m["cpu_decode"]["decode_tok_s"] >= 100 and len(m["cpu_decode"]["attempts"]) >= 3
    assert m["train"]["tokens_trained"] > 0 and m["train"]["final_loss"] > 0
    man = json.loads((MODEL_DIR / "corpus_manifest.json").read_text())
    used = [p for p in man["packages"] if p["used"] and p["bytes"] > 0]
    assert used and all(p["licence"] for p in used)
    assert not any("GPL" in p["licence"] for p in used)
    assert set(man["holdout"]) == {p["name"] for p in man["packages"] if p["split"] == "eval"}


def test_hf_transformers_loads_it_and_the_fim_tokens_are_qwen_style():
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(MODEL_DIR)
    for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>", "<|endoftext|>"):
        ids = tok.encode(t, add_special_tokens=False)
        assert len(ids) == 1, t
    assert tok.eos_token == "<|endoftext|>"


def test_engine_reference_matches_hf_greedy_32_tokens():
    transformers = pytest.importorskip("transformers")
    engine = pytest.importorskip("engine")
    eng = engine.Engine.load("default", device="cpu", backend="reference")
    assert eng.tokenizer.fim is not None and eng.tokenizer.fim.format == "qwen"
    ids = eng.tokenizer.encode(PROMPT)
    res = eng.complete(ids, max_new_tokens=32, sampling=engine.SamplingParams(temperature=0.0),
                       stop_ids=frozenset())
    hf = transformers.AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        g = hf.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=32, min_new_tokens=32,
                        do_sample=False, pad_token_id=0)
    assert res.token_ids == g[0, len(ids):].tolist()
    assert len(res.token_ids) == 32
