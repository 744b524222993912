"""Per-rank local models for the tensor-parallel monokernel (exact mode, docs/dtp_kernel_plan.md).

Rank r of N runs the ordinary monokernel schedule on a smaller model of the same family: its query / KV heads and
FFN channels from engine/tp/shard.py's plan, the full hidden size, and either the full replicated LM head (every
rank computes the same logits from its bit-identical residual) or its vocabulary slice (vocab_parallel: the
sampling records are exchanged and every rank samples from all of them). `RankModel` carries exactly the
attributes kernels/runtime.py and kernels/twin.py read from an engine.model.Model.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.config import ModelConfig
from engine.model import LayerWeights
from engine.tp.shard import ShardError, TPPlan, make_plan, rank_layers, shard_weights

from . import isa

# FFN cuts on multiples of 8 channels: the kernel streams weight rows in 16-byte (8 x bf16) chunks.
FFN_ALIGN = 8


@dataclass
class RankModel:
    cfg: ModelConfig              # the local shape: n_heads / n_kv_heads / intermediate_size of this rank
    device: torch.device
    layers: list[LayerWeights]
    embed: torch.Tensor           # full table (replicated)
    lm_head: torch.Tensor         # full vocabulary (replicated); `is embed` when tied
    norm: torch.Tensor


def kernel_plan(cfg: ModelConfig, n_ranks: int) -> TPPlan:
    """The plan the kernel can run, or ShardError saying why not: every rank needs a uniform GQA map (local q head
    j reads local KV head j // group) with group <= MAX_GROUP, and no o_proj / down_proj bias (the kernel has none)."""
    if not 1 <= n_ranks <= isa.MAX_TP:
        raise ShardError(f"tp={n_ranks}: the monokernel exchange holds 1..{isa.MAX_TP} ranks")
    if cfg.o_bias or cfg.mlp_bias:
        raise ShardError("the monokernel has no o_proj / MLP bias terms (Llama attention_bias / mlp_bias)")
    plan = make_plan(cfg, n_ranks, ffn_align=FFN_ALIGN)
    for s in plan.ranks:
        if s.group is None:
            raise ShardError(f"tp={n_ranks}: rank {s.rank} gets query heads {s.q_heads} over KV heads {s.kv_heads}, "
                             f"not a uniform group ({plan.head_split} split); the kernel needs q heads per KV head "
                             "equal on a rank")
        if s.group > isa.MAX_GROUP:
            raise ShardError(f"rank {s.rank}: {s.group} query heads per KV head > {isa.MAX_GROUP}")
        if s.n_ffn % 8:
            raise ShardError(f"rank {s.rank}: {s.n_ffn} FFN channels, not a multiple of 8")
    return plan


def local_cfg(cfg: ModelConfig, plan: TPPlan, rank: int, vocab_parallel: bool = False) -> ModelConfig:
    """Rank `rank`'s shape; vocab_size is its LM-head rows (its vocabulary slice when vocab_parallel; the
    embedding table stays full either way)."""
    s = plan.ranks[rank]
    return replace(cfg, n_heads=s.n_q, n_kv_heads=s.n_kv, intermediate_size=s.n_ffn,
                   vocab_size=s.n_vocab if vocab_parallel else cfg.vocab_size,
                   name=f"{cfg.name or cfg.arch} tp{plan.n_ranks} rank {rank}")


def rank_model(model, plan: TPPlan, rank: int, device=None, dtype=None, vocab_parallel: bool = False) -> RankModel:
    """Rank `rank`'s local model (fresh tensors on `device`, in `dtype` when given). LM head: this rank's
    vocabulary rows when vocab_parallel (global ids plan.ranks[rank].vocab[0] + local row), else the full table."""
    cfg = model.cfg
    dev = torch.device(device) if device is not None else model.device
    sh = shard_weights(model.params, plan, rank, dtype=dtype, device=dev)
    layers = rank_layers(sh, cfg.n_layers)
    embed = sh["model.embed_tokens.weight"]
    if vocab_parallel:
        head = sh["lm_head.weight"]
    elif cfg.tie_word_embeddings or model.lm_head is model.embed:
        head = embed
    else:
        head = model.lm_head.to(device=dev, dtype=dtype or model.lm_head.dtype, copy=True).contiguous()
    return RankModel(cfg=local_cfg(cfg, plan, rank, vocab_parallel), device=dev, layers=layers, embed=embed,
                     lm_head=head, norm=sh["model.norm.weight"])


def shard_cache(cache: torch.Tensor, plan: TPPlan, rank: int) -> torch.Tensor:
    """A full KV cache [S, L, n_kv, max_len, hd] -> rank `rank`'s heads [S, L, n_kv_local, max_len, hd] (a copy)."""
    k0, k1 = plan.ranks[rank].kv_heads
    return cache[:, :, k0:k1].contiguous().clone()
