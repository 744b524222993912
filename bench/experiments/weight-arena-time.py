"""Does where the weights lie in GPU memory matter? (bench/NOTES.md, session 28: no.) After Monokernel construction,
every bf16 matrix the kernel streams is copied into one arena in stream order (per layer W_qkv, W_o, W_gate/up, then
Wd^T for the fused MLP or Wd; the arena starts on a 2 MB boundary, each matrix at an ALIGN-byte boundary) and the
layer table points at the copies (same bytes: the same tokens); then us/token and the per-stage table as
one-launch-time.py prints them. mode base: the allocator's placement, untouched.
usage: python3 bench/experiments/weight-arena-time.py <shape> base|arena <align bytes> [name=value ...]"""
import ast
import os
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch
from bench.decode import random_setup
from bench.mk_trace import time_and_trace
from kernels.runtime import Monokernel
from kernels.schedule import Dims, attn_cluster_model

PAGE = 2 << 20
name, mode, align = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode not in ("base", "arena") or align < 16 or align % 16:
    raise SystemExit(__doc__)
kw = {k: ast.literal_eval(v) for k, v in (a.split("=", 1) for a in sys.argv[4:])}
CTXS = [int(c) for c in os.environ.get("KOG_CTXS", "512,2048").split(",")]
cfg, model, cache = random_setup(name, max(CTXS) + 256 + 64)
kw.setdefault("attn_cluster", attn_cluster_model(Dims.of(cfg)))
mk = Monokernel(model, cache.k, cache.v, max_steps=256 + 64, **kw)
if mode == "arena":
    by_ptr = {t.data_ptr(): t for t in mk._keep}   # every tensor the runtime handed the kernel
    order = [(i, f, by_ptr[getattr(mk.layer_tab[i], f)]) for i in range(cfg.n_layers)
             for f in ("wqkv", "wo", "wgu", "wdt" if mk.layer_tab[i].wdt else "wd")]
    a, offs, n = align // 2, [], 0
    for _, _, t in order:
        n = -(-n // a) * a
        offs.append(n)
        n += t.numel()
    raw = torch.empty(n + PAGE // 2, dtype=torch.bfloat16, device="cuda")
    start = (-raw.data_ptr() % PAGE) // 2
    for (i, f, t), o in zip(order, offs):
        dst = raw[start + o:start + o + t.numel()]
        dst.copy_(t.reshape(-1))
        setattr(mk.layer_tab[i], f, dst.data_ptr())
    mk._keep.append(raw)
    mk.layers_dev = torch.frombuffer(bytearray(bytes(mk.layer_tab)), dtype=torch.uint8).to("cuda")
    torch.cuda.synchronize()
print(f"{name} {mode} {align}: layer 0 offsets in a 2 MB page: "
      + " ".join(f"{f} {(getattr(mk.layer_tab[0], f) or 0) % PAGE}" for f in ("wqkv", "wo", "wgu", "wdt", "wd")))
time_and_trace(mk, f"{name} {mode} {align}", CTXS, n=256)
