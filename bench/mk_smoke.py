"""Monokernel smoke + bisect on a small model: one short teacher-forced run on the GPU, compared stage by stage
with the CPU twin (same weights upcast to fp32, same KV). The kernel's scratch buffers after the run hold the
last layer's qkv / attn / h, so the first buffer that disagrees names the broken stage.

    python bench/mk_smoke.py [--layers 2] [--hd 64] [--steps 3]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine.config import ModelConfig  # noqa: E402
from engine.model import rope_inv_freq  # noqa: E402
from kernels import schedule  # noqa: E402
from kernels.runtime import Monokernel  # noqa: E402
from kernels.testing import random_model, upcast  # noqa: E402
from kernels.twin import Twin  # noqa: E402


def rel(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hd", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--sms", type=int, default=0, help="CTAs (0 = all SMs)")
    ap.add_argument("--slow", action="store_true", help="long watchdog (under compute-sanitizer)")
    ap.add_argument("--early", type=int, default=1, help="early weight loads (1) or loads after the wait (0)")
    a = ap.parse_args()
    nh, nkv = 6, 2
    cfg = ModelConfig(arch="qwen2", vocab_size=1000, hidden_size=nh * a.hd, n_layers=a.layers, n_heads=nh,
                      n_kv_heads=nkv, intermediate_size=512, head_dim=a.hd, qkv_bias=True,
                      tie_word_embeddings=True, rope_theta=10000.0)
    P, N, ML = 20, a.steps, 64
    m16 = random_model(cfg, max_len=ML, seed=1, std=0.05)
    m32 = upcast(m16)
    shape = (1, cfg.n_layers, nkv, ML, a.hd)
    k32, v32 = torch.zeros(shape, device="cuda"), torch.zeros(shape, device="cuda")
    ids = torch.randint(0, cfg.vocab_size, (P + N,), generator=torch.Generator().manual_seed(0)).cuda()
    m32.forward(k32, v32, 0, ids[:P], 0)
    k16 = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    v16 = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    k16[:, :, :, :P], v16[:, :, :, :P] = k32[:, :, :, :P].bfloat16(), v32[:, :, :, :P].bfloat16()
    kt, vt = k16.float().cpu(), v16.float().cpu()      # twin works on the same (bf16-rounded) KV
    mk = Monokernel(m16, k16, v16, max_steps=16, n_sm=a.sms or None)
    mk.early_loads = a.early
    if a.slow:
        mk.watchdog_cycles = 400_000_000_000
    print(f"schedule: {mk.n_sm} CTAs, rows {mk.sched.rows}, counts {mk.sched.counts}, splits {mk.sched.n_splits}, "
          f"smem {mk.smem} B")
    out = torch.full((N, cfg.vocab_size), float("nan"), device="cuda")
    forced = ids[P:].tolist()
    toks, reason = mk.run(0, forced[0], P, N, forced=forced, logits_out=out, timeout_s=300 if a.slow else 30)
    print(f"kernel: reason {reason}, tokens {toks}, state {mk.debug_state()}")
    m32c = type(m32)(cfg, device="cpu", max_len=ML)
    for name, t in m32c.params.items():
        t.copy_(m32.params[name].cpu())
    sched_cpu = schedule.build(schedule.Dims.of(cfg), n_sm=mk.n_sm)
    env = {}
    tw = Twin(m32c, sched_cpu, rope_inv_freq(cfg))
    res = tw.run(kt, vt, 0, forced[0], P, N, forced=forced, capture=env)
    worst = 0.0
    for s in range(N):
        worst = max(worst, rel(out[s], res.logits[s]))
        print(f"step {s}: logits rel err vs twin {rel(out[s], res.logits[s]):.2e}  "
              f"kernel argmax {int(out[s].argmax())} twin argmax {int(res.logits[s].argmax())}")
    for nm, kbuf in (("qkv", mk.qkv), ("attn", mk.attn), ("h", mk.h)):
        print(f"last layer {nm:5s}: rel err {rel(kbuf, env[nm]):.2e}")
    end = P + N
    print(f"KV written: k rel {rel(k16[:, :, :, P:end].float(), kt[:, :, :, P:end]):.2e} "
          f"v rel {rel(v16[:, :, :, P:end].float(), vt[:, :, :, P:end]):.2e}; "
          f"beyond end still NaN: {bool(torch.isnan(k16[:, :, :, end:].float()).all())}")
    ok = reason == "length" and worst <= 1e-2
    print(f"SMOKE {'PASS' if ok else 'FAIL'} (worst logits rel err {worst:.2e})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
