"""Prefill attention variants for the graph prefill's static step: the current masked_attention (two matmuls around a
masked softmax) against SDPA backends with a boolean window mask; accuracy against fp32, per-call time, and the
whole graph prefill with each variant patched in ("current" is engine.backends.graph.masked_attention as it is).
usage: python3 bench/experiments/prefill-attn-sdpa.py qwen2.5-coder-1.5b [qwen2.5-coder-0.5b ...]"""
import sys, time, torch, torch.nn.functional as F
sys.path.insert(0, ".")
from torch.nn.attention import sdpa_kernel, SDPBackend
import engine.backends.graph as graph
from engine.config import preset
from engine.kv_cache import KVCache
from kernels.testing import random_model
cur = graph.masked_attention

def make_sdpa(backends):
    def attn(q, k, v, valid):
        nh, T, hd = q.shape; nkv, W, _ = k.shape; g = nh // nkv
        v = torch.where(valid[-1][:, None], v, 0.0)
        with sdpa_kernel(backends):
            o = F.scaled_dot_product_attention(q.reshape(1, nkv, g * T, hd), k[None], v[None],
                                               attn_mask=valid.repeat(g, 1))
        return o[0].unflatten(1, (g, T)).permute(2, 0, 1, 3).reshape(T, nh * hd)
    return attn
VARIANTS = {"current": cur, "efficient": make_sdpa([SDPBackend.EFFICIENT_ATTENTION]),
            "cudnn": make_sdpa([SDPBackend.CUDNN_ATTENTION]), "flash": make_sdpa([SDPBackend.FLASH_ATTENTION])}

def timeit(fn, n=50):
    for _ in range(3): fn()
    torch.cuda.synchronize(); a = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - a) / n * 1e6

for name in sys.argv[1:]:
    cfg = preset(name); nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    for T, W, start in [(32, 2048, 1024), (512, 4096, 3000)]:
        q = torch.randn(nh, T, hd, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(nkv, W, hd, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(nkv, W, hd, device="cuda", dtype=torch.bfloat16)
        v[:, start + T:] = float("nan")   # never read: must not reach the output
        pos = start + torch.arange(T, device="cuda")
        valid = torch.arange(W, device="cuda")[None, :] <= pos[:, None]
        ref = cur(q.float(), k.float(), torch.where(valid[-1][:, None], v, 0.0).float(), valid)
        for vn, fn in VARIANTS.items():
            try:
                o = fn(q, k, v, valid)
                err = ((o.float() - ref).norm() / ref.norm()).item()
                us = timeit(lambda: fn(q, k, v, valid))
                print(f"{name} T {T} W {W}: {vn:10s} {us:8.1f} us  rel L2 to fp32 {err:.2e}  nan {bool(o.isnan().any())}", flush=True)
            except Exception as e:
                print(f"{name} T {T} W {W}: {vn:10s} failed: {type(e).__name__}: {str(e)[:150]}", flush=True)
    # the whole graph prefill, each variant patched in
    ML = 4096
    model = random_model(cfg, max_len=ML)
    cache = KVCache(1, cfg.n_layers, nkv, ML, hd, dtype=torch.bfloat16, device=torch.device("cuda"))
    ids = torch.randint(0, cfg.vocab_size, (1600,), device="cuda")
    model.forward(cache.k, cache.v, 0, ids[:1024], 0)
    base = None
    for vn, fn in VARIANTS.items():
        graph.masked_attention = fn
        try:
            pg = graph.PrefillGraphs(model, cache)
            res = []
            for n in (1, 12, 32, 128, 512):
                chunk = ids[1024:1024 + n]
                out = pg.prefill(0, chunk, 1024)
                ts = []
                for _ in range(15):
                    torch.cuda.synchronize(); a = time.perf_counter(); pg.prefill(0, chunk, 1024); torch.cuda.synchronize()
                    ts.append(time.perf_counter() - a)
                ts.sort()
                res.append(f"{n}: {ts[7]*1e3:.3f}")
                if n == 12:
                    if base is None: base = out.float()
                    err = ((out.float() - base).norm() / base.norm()).item()
            print(f"{name} graph prefill [{vn}] ms by chunk: {'  '.join(res)}  (chunk 12 logits vs current: {err:.2e})", flush=True)
            del pg
        except Exception as e:
            print(f"{name} graph prefill [{vn}] failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        graph.masked_attention = cur
    del model, cache; torch.cuda.empty_cache()
