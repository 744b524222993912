import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.loader import load_model
from engine.testing import make_tiny_checkpoint


def test_tied_lm_head_absent_and_values_loaded(tiny_qwen):
    sd = load_file(str(tiny_qwen / "model.safetensors"))
    assert "lm_head.weight" not in sd
    m = load_model(tiny_qwen, max_len=16)
    for name, t in sd.items():
        assert torch.equal(m.params[name], t), name
    assert m.lm_head is m.embed


def test_sharded_checkpoint(tmp_path):
    d = make_tiny_checkpoint(tmp_path, arch="llama", shards=3, tie_word_embeddings=False)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    assert len(set(idx["weight_map"].values())) == 3
    m = load_model(d, max_len=16)
    assert not torch.equal(m.lm_head, m.embed)


def test_missing_extra_misshaped_listed_together(tmp_path, tiny_qwen):
    d = tmp_path / "bad"
    shutil.copytree(tiny_qwen, d)
    sd = load_file(str(d / "model.safetensors"))
    del sd["model.layers.0.mlp.up_proj.weight"]
    sd["model.layers.1.self_attn.q_proj.weight"] = torch.zeros(3, 3)
    sd["model.layers.9.extra.weight"] = torch.zeros(2)
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(ValueError) as e:
        load_model(d, max_len=16)
    msg = str(e.value)
    assert "missing tensor model.layers.0.mlp.up_proj.weight" in msg
    assert "model.layers.1.self_attn.q_proj.weight: shape [3, 3]" in msg
    assert "unexpected tensor model.layers.9.extra.weight" in msg


def test_truncated_file_names_the_file(tmp_path, tiny_qwen):
    d = tmp_path / "trunc"
    shutil.copytree(tiny_qwen, d)
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="corrupt or truncated.*model.safetensors"):
        load_model(d, max_len=16)
    f.write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match="model.safetensors"):
        load_model(d, max_len=16)


def test_missing_files(tmp_path, tiny_qwen):
    d = tmp_path / "nofile"
    shutil.copytree(tiny_qwen, d)
    (d / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no model.safetensors"):
        load_model(d, max_len=16)
    d2 = make_tiny_checkpoint(tmp_path / "sh", shards=2)
    (d2 / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match="model-00002-of-00002.safetensors"):
        load_model(d2, max_len=16)


def test_dtype_cast(tiny_qwen):
    m = load_model(tiny_qwen, dtype=torch.bfloat16, max_len=16)
    assert m.embed.dtype == torch.bfloat16 and m.layers[0].wqkv.dtype == torch.bfloat16
