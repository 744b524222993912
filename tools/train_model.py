"""Model shape and training loop of the default model (HF transformers Qwen2ForCausalLM).

Sized for CPU decode: the reference path streams every weight once per token, so the parameter count
bounds tok/s on the 2-core machine (~20 GB/s of fp32 -> ~25M params for >= 100 tok/s with Python
overhead). The tied embedding is also the largest single tensor and must fit one shard (< 15 MB in bf16).
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

SHAPES = {
    # d_model 512, 6 layers, 8 query heads / 2 KV heads of 64, SwiGLU 1408, vocab 12288 tied: ~23M params.
    "full": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=6, num_attention_heads=8,
                 num_key_value_heads=2),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
}


def make_config(scale: str, vocab_size: int, eos_id: int, max_positions: int = 4096):
    from transformers import Qwen2Config
    vocab = (vocab_size + 63) // 64 * 64     # rows past the tokenizer's vocab are never produced as inputs
    return Qwen2Config(vocab_size=vocab, max_position_embeddings=max_positions, rope_theta=10000.0,
                       rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
                       hidden_act="silu", initializer_range=0.02, attention_dropout=0.0,
                       bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
                       **SHAPES[scale])


def build_model(config, seed: int):
    from transformers import Qwen2ForCausalLM
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.config.use_cache = True
    return model


def lr_at(step: int, total: int, peak: float, warmup: int, floor_frac: float = 0.1) -> float:
    """Linear warm-up, then cosine decay to floor_frac * peak at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor_frac + (1 - floor_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def train(model, stream: np.ndarray, *, seq_len: int, batch: int, device: str, seed: int,
          train_seconds: float, max_steps: int, peak_lr: float = 1.5e-3, warmup: int = 200,
          weight_decay: float = 0.1, calib_steps: int = 20, loss_mask: np.ndarray | None = None,
          compile_backend: str | None = None, log=print) -> dict:
    """stream: int32 [N] packed token ids. Trains on non-overlapping windows of seq_len, reshuffled
    each epoch with a seeded generator. The step count is max_steps, or fewer when the time measured
    over the first calib_steps says train_seconds would be exceeded; the LR schedule spans the final
    count, which is logged (rerun with --max-steps N and a large --train-seconds to reproduce it).
    loss_mask: bool [N] or None; False positions are not trained as targets (padding).
    compile_backend: run the forward through torch.compile with this backend ("inductor" on the GPU); if the
    first compiled step fails, training goes on eagerly from the same weights, and stats["compile"] says why."""
    dev = torch.device(device)
    use_cuda = dev.type == "cuda"
    if use_cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    n_win = (len(stream) - 1) // seq_len
    assert n_win >= batch, f"corpus too small: {n_win} windows of {seq_len} for batch {batch}"
    data = torch.from_numpy(stream[: n_win * seq_len].astype(np.int64)).view(n_win, seq_len).to(dev)
    masks = None
    if loss_mask is not None:
        masks = torch.from_numpy(loss_mask[: n_win * seq_len]).view(n_win, seq_len).to(dev)
    model.to(dev).train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=peak_lr, betas=(0.9, 0.95), eps=1e-8, fused=use_cuda)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    order = torch.randperm(n_win, generator=gen)
    cursor, epoch = 0, 0
    total = max_steps
    losses: list[float] = []
    comp = _Compiled(model, compile_backend, log) if compile_backend else None
    compile_info = comp.info if comp is not None else {"backend": None, "used": False, "error": None}
    t_start = time.time()
    step = 0
    while step < total:
        if cursor + batch > n_win:
            order, cursor, epoch = torch.randperm(n_win, generator=gen), 0, epoch + 1
        idx = order[cursor: cursor + batch].to(dev)
        cursor += batch
        x = data[idx]                                       # [B, T]
        labels = x if masks is None else x.masked_fill(~masks[idx], -100)   # -100: ignored by the HF loss
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, peak_lr, warmup)
        out = comp.step(x, labels, use_cuda) if comp is not None else _step(model, x, labels, use_cuda)
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step == 5:
            if use_cuda:
                torch.cuda.synchronize()
            t5 = time.time()                                # steady-state timing starts after warm-up
        if step == calib_steps or step % 50 == 0 or step == total:
            loss = out.loss.item()                          # syncs; only on logging steps
            losses.append(loss)
            el = time.time() - t_start
            if step == calib_steps:
                per_step = (time.time() - t5) / (calib_steps - 5)
                fit = step + int((train_seconds - el) / per_step)
                if fit < total:
                    log(f"train: {per_step*1000:.1f} ms/step; {train_seconds:.0f}s budget fits {fit} of "
                        f"{total} steps -> total_steps={fit}")
                    total = max(fit, step + 1)
            log(f"train: step {step}/{total} epoch {epoch} loss {loss:.4f} gnorm {float(gnorm):.2f} "
                f"lr {opt.param_groups[0]['lr']:.2e} {el:.0f}s "
                f"{step * batch * seq_len / max(el, 1e-9) / 1e6:.2f}M tok/s")
    if use_cuda:
        torch.cuda.synchronize()
    wall = time.time() - t_start
    final = float(np.mean(losses[-3:])) if losses else float("nan")
    return {"steps": step, "tokens_trained": step * batch * seq_len, "epochs": round(step * batch / n_win, 2),
            "seq_len": seq_len, "batch": batch, "peak_lr": peak_lr, "warmup": warmup,
            "weight_decay": weight_decay, "train_wall_s": round(wall, 1), "final_loss": round(final, 4),
            "loss_curve": [round(l, 4) for l in losses], "stream_tokens": int(len(stream)), "compile": compile_info}


def _step(model, x, labels, use_cuda: bool):
    """Forward (bf16 autocast on the GPU) and backward of one batch; returns the model output."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=use_cuda):
        out = model(input_ids=x, labels=labels, use_cache=False)
    out.loss.backward()
    return out


class _Compiled:
    """The training step through torch.compile(model): same parameters, fused kernels. A failure (compilers,
    unsupported ops) is caught on the step it happens, logged and recorded in `info`; that step is redone
    eagerly from cleared gradients, and so is every later one."""

    def __init__(self, model, backend: str, log):
        self.model, self.log = model, log
        self.info = {"backend": backend, "used": True, "error": None}
        self.fn = torch.compile(model, backend=backend)

    def step(self, x, labels, use_cuda: bool):
        if self.info["used"]:
            try:
                return _step(self.fn, x, labels, use_cuda)
            except Exception as exc:      # noqa: BLE001 - any compile/runtime failure means: train eagerly
                self.info.update(used=False, error=f"{type(exc).__name__}: {exc}"[:500])
                self.log(f"train: torch.compile ({self.info['backend']}) failed, training eagerly: "
                         f"{self.info['error']}")
                self.model.zero_grad(set_to_none=True)     # a partial backward may have left gradients
        return _step(self.model, x, labels, use_cuda)
