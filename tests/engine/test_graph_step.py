"""The graph backend's static-shape decode step, run eagerly on CPU against the reference model."""
import pytest
import torch

from engine.backends.graph import MIN_BUCKET, bucket_for, decode_step
from engine.kv_cache import KVCache
from engine.loader import load_model
from engine.testing import make_tiny_checkpoint


def test_bucket_for():
    assert bucket_for(0, 4096) == MIN_BUCKET and bucket_for(MIN_BUCKET - 1, 4096) == MIN_BUCKET
    assert bucket_for(MIN_BUCKET, 4096) == 2 * MIN_BUCKET
    assert bucket_for(4000, 4096) == 4096 and bucket_for(10, 64) == 64


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_decode_step_matches_reference_with_poisoned_cache(tmp_path, arch):
    kw = {} if arch == "qwen2" else dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                       "high_freq_factor": 4.0,
                                                       "original_max_position_embeddings": 32})
    d = make_tiny_checkpoint(tmp_path, arch=arch, seed=3, **kw)
    max_len = 2 * MIN_BUCKET + 16
    m = load_model(d, max_len=max_len)
    cfg = m.cfg
    ref = KVCache(2, cfg.n_layers, cfg.n_kv_heads, max_len, cfg.head_dim)
    stat = KVCache(2, cfg.n_layers, cfg.n_kv_heads, max_len, cfg.head_dim)
    stat.k.fill_(float("nan"))   # poison: every position not yet written, and the other slot entirely
    stat.v.fill_(float("nan"))
    g = torch.Generator().manual_seed(0)
    n0 = MIN_BUCKET - 4          # decode crosses the first bucket boundary
    ids = torch.randint(0, cfg.vocab_size, (n0 + 12,), generator=g)
    m.forward(ref.k, ref.v, 1, ids[:n0], 0)
    m.forward(stat.k, stat.v, 1, ids[:n0], 0)
    tok, pos = torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
    arange = torch.arange(max_len)
    for p in range(n0, n0 + 12):
        want = m.forward(ref.k, ref.v, 1, ids[p:p + 1], p)
        tok.fill_(int(ids[p]))
        pos.fill_(p)
        got = decode_step(m, stat.k, stat.v, 1, bucket_for(p, max_len), tok, pos, arange)
        assert torch.isfinite(got).all()
        assert (got - want).abs().max().item() <= 1e-5, p
    assert torch.isnan(stat.k[0]).all()                              # the other slot was never touched
    assert torch.allclose(stat.k[1, :, :, :n0 + 12], ref.k[1, :, :, :n0 + 12], atol=1e-6, rtol=0)
    assert torch.allclose(stat.v[1, :, :, :n0 + 12], ref.v[1, :, :, :n0 + 12], atol=1e-6, rtol=0)
    assert torch.isnan(stat.k[1, :, :, n0 + 12:]).all()              # nothing written past the last position


def test_graph_backend_refuses_cpu(tiny_qwen):
    from engine.backends.base import BackendUnavailable
    from engine.backends.graph import GraphBackend
    m = load_model(tiny_qwen, max_len=32)
    c = m.cfg
    with pytest.raises(BackendUnavailable, match="needs CUDA"):
        GraphBackend(m, KVCache(1, c.n_layers, c.n_kv_heads, 32, c.head_dim))
