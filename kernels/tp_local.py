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


# ---- delayed mode: lane l of a Laneformer lane checkpoint on rank l (engine/lanes, mk_exchange.cuh) ----
@dataclass
class LanePlan:
    """What the kernel needs besides the rank models to run a lane model in delayed mode."""
    n_lanes: int
    delay: int
    modes: list[int]                 # isa.LANE_* of (layer, stage 0 = attention | 1 = MLP), layer-major
    agg: int                         # 1: LM head on the mean of the lanes' normed final states (replicate head)
    scale: float                     # sqrt(lanes): the NO_REDUCE factor
    vocab: list[tuple[int, int]]     # rank r's LM-head rows are global vocabulary ids vocab[r][0] .. vocab[r][1]
    head_type: str

    def describe(self) -> str:
        names = {isa.LANE_PRESENT: "P", isa.LANE_NO_REDUCE: "N", isa.LANE_PAST: "D", isa.LANE_PAST_OWN: "O"}
        m = "".join(names[v] for v in self.modes)
        return (f"delayed mode: {self.n_lanes} lanes, delay {self.delay}, head {self.head_type}"
                f"{' (mean of lane norms)' if self.agg else ''}, modes attn/mlp per layer {m}")


def lane_plan(cfg, n_ranks: int, max_len: int | None = None) -> LanePlan:
    """The delayed-mode plan of LaneConfig `cfg` on n_ranks GPUs (one lane each), or ShardError saying why the kernel
    cannot run it. Modes follow engine/lanes/config.py layer_modes / is_queued (ambiguity A1 included)."""
    from engine.lanes.config import ReduceMode
    L = cfg.num_lanes
    if n_ranks != L:
        raise ShardError(f"lane checkpoint has {L} lanes: delayed mode runs one lane per GPU, got {n_ranks} GPUs")
    if not 2 <= L <= isa.MAX_TP:
        raise ShardError(f"delayed mode holds 2..{isa.MAX_TP} lanes, got {L}")
    if cfg.lm_head_type == "lane" or cfg.pre_norm_lane_agg:
        raise ShardError(f"lm_head_type {cfg.lm_head_type!r} / pre_norm_lane_agg {cfg.pre_norm_lane_agg}: the kernel "
                         "runs 'replicate' (mean of lane norms) and 'vocab_parallel' heads only")
    if cfg.lm_head_type == "replicate" and not cfg.final_norm_shared:
        raise ShardError("replicate head with per-lane final norm gains: the kernel's lane mean takes one gain")
    if cfg.swa_layers and cfg.sliding_window is not None and (max_len is None or max_len > cfg.sliding_window):
        raise ShardError(f"sliding-window layers {list(cfg.swa_layers)} (window {cfg.sliding_window}): the kernel "
                         f"attends to every cached position, exact only while max_len <= the window "
                         f"(max_len {max_len})")
    if cfg.heads_per_lane // cfg.kv_heads_per_lane > isa.MAX_GROUP:
        raise ShardError(f"{cfg.heads_per_lane // cfg.kv_heads_per_lane} query heads per KV head > {isa.MAX_GROUP}")
    if cfg.ffn_per_lane % FFN_ALIGN:
        raise ShardError(f"{cfg.ffn_per_lane} FFN channels per lane, not a multiple of {FFN_ALIGN}")
    code = {ReduceMode.PRESENT: isa.LANE_PRESENT, ReduceMode.NO_REDUCE: isa.LANE_NO_REDUCE}
    modes = []
    for i in range(cfg.num_layers):
        for m in cfg.layer_modes(i):
            if m is ReduceMode.PAST:
                modes.append(isa.LANE_PAST if cfg.is_queued(i - cfg.broadcast_delay) else isa.LANE_PAST_OWN)
            else:
                modes.append(code[m])
    V = cfg.vocab_size
    if cfg.lm_head_type == "vocab_parallel":
        vocab = [(r * V // L, (r + 1) * V // L) for r in range(L)]
    else:   # replicate: any row split of the shared head; the LM head is vocabulary-parallel over the GPUs
        vocab = [(r * V // n_ranks, (r + 1) * V // n_ranks) for r in range(n_ranks)]
    # A PRESENT last MLP means every layer was PRESENT: the lane streams are identical, the mean of their norms is
    # each lane's own norm (no final-state exchange needed).
    agg = int(cfg.lm_head_type == "replicate" and modes[-1] != isa.LANE_PRESENT)
    return LanePlan(n_lanes=L, delay=cfg.broadcast_delay, modes=modes, agg=agg, scale=float(L) ** 0.5,
                    vocab=vocab, head_type=cfg.lm_head_type)


def lane_key_perm(hd: int) -> torch.Tensor:
    """Head-dimension order of the kernel's keys / query rows: even dims first, then odd. The lane model rotates
    adjacent RoPE pairs (2k, 2k + 1), the kernel rotates halves (k, k + hd/2); permuting every head's q and k rows
    alike leaves every q.k product unchanged."""
    return torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])


def lane_keys_to_kernel(k: torch.Tensor) -> torch.Tensor:
    """Rotated keys [..., hd] of the lane model (adjacent pairs) -> the kernel's half-rotation layout."""
    return k[..., lane_key_perm(k.shape[-1]).to(k.device)]


def lane_keys_from_kernel(k: torch.Tensor) -> torch.Tensor:
    """Inverse of lane_keys_to_kernel."""
    return k[..., torch.argsort(lane_key_perm(k.shape[-1])).to(k.device)]


def lane_kv_bounds(cfg, n_ranks: int) -> list[tuple[int, int]]:
    """The one sharding rule of a lane model's KV cache: the full cache holds all lanes' KV heads lane-major
    (global KV head l * kv_heads_per_lane + j), and rank r (= lane r) holds heads [r * kl, (r + 1) * kl)."""
    kl = cfg.kv_heads_per_lane
    return [(r * kl, (r + 1) * kl) for r in range(n_ranks)]


def lane_model_cfg(cfg, plan: LanePlan, rank: int) -> ModelConfig:
    """Rank `rank`'s local ModelConfig (a Llama-shaped lane: its heads, FFN channels and LM-head rows)."""
    s = cfg.rope_scaling
    return ModelConfig(arch="llama", vocab_size=plan.vocab[rank][1] - plan.vocab[rank][0], hidden_size=cfg.hidden_size,
                       n_layers=cfg.num_layers, n_heads=cfg.heads_per_lane, n_kv_heads=cfg.kv_heads_per_lane,
                       intermediate_size=cfg.ffn_per_lane, head_dim=cfg.head_dim, rms_norm_eps=cfg.norm_eps,
                       rope_theta=cfg.rope_theta, rope_scaling=None if s is None else {"rope_type": "llama3", **s},
                       max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=False,
                       name=f"laneformer lane {rank} of {plan.n_lanes}")


def lane_rank_model(cfg, weights, plan: LanePlan, rank: int, device=None, dtype=None) -> RankModel:
    """Lane `rank` of a lane checkpoint (`weights`: published key layout, spec §2) as the kernel's local model.
    The lane model rotates adjacent RoPE pairs (2k, 2k + 1), the kernel rotates halves (k, k + hd/2): the wq / wk rows
    of every head are permuted (even dims first, then odd), which leaves every q.k product unchanged."""
    from engine.lanes.model import norm_key
    dev = torch.device(device) if device is not None else weights["model.tok_embeddings.weight"].device
    hd = cfg.head_dim
    perm = lane_key_perm(hd)

    def t(x):
        return x.to(device=dev, dtype=dtype or x.dtype).contiguous()

    def gain(key):
        g = weights[key]
        return t(g[rank] if g.dim() == 2 else g)

    def rope_rows(w):   # [heads * hd, D]
        return w.reshape(-1, hd, w.shape[-1])[:, perm.to(w.device)].reshape(w.shape)

    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a, f = p + "attention.", p + "feed_forward."
        wqkv = torch.cat([rope_rows(weights[a + "wq.weight"][rank]), rope_rows(weights[a + "wk.weight"][rank]),
                          weights[a + "wv.weight"][rank]], 0)
        layers.append(LayerWeights(
            ln1=gain(norm_key(cfg, p + "attention_norm")), wqkv=t(wqkv), bqkv=None,
            wo=t(weights[a + "wo.weight"][rank]), bo=None, ln2=gain(norm_key(cfg, p + "ffn_norm")),
            wgu=t(torch.cat([weights[f + "w1.weight"][rank], weights[f + "w3.weight"][rank]], 0)), bgu=None,
            wd=t(weights[f + "w2.weight"][rank]), bd=None))
    v0, v1 = plan.vocab[rank]
    if cfg.lm_head_type == "vocab_parallel":
        head = weights["lm_head.weight"][rank]
    else:
        head = weights.get("lm_head.weight", weights["model.tok_embeddings.weight"])[v0:v1]
    return RankModel(cfg=lane_model_cfg(cfg, plan, rank), device=dev, layers=layers,
                     embed=t(weights["model.tok_embeddings.weight"]), lm_head=t(head),
                     norm=gain(norm_key(cfg, "model.norm", final=True)))


def lane_cache(ref_cache, cfg, rank: int, max_len: int, slots: int = 1, slot: int = 0, dtype=torch.float32,
               device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s kernel KV caches [slots, n_layers, kv heads per lane, max_len, hd] holding a reference
    LaneKVCache's keys / values (engine/lanes/model.py) in slot `slot`: keys permuted to the kernel's half-rotation
    layout (lane_keys_to_kernel), other positions NaN so a read of an unwritten position shows. The engine's full
    cache (engine/lanes/serving.py) is these parts concatenated over ranks on the head axis (lane_kv_bounds)."""
    shape = (slots, cfg.num_layers, cfg.kv_heads_per_lane, max_len, cfg.head_dim)
    k = torch.full(shape, float("nan"), dtype=dtype, device=device)
    v = torch.full(shape, float("nan"), dtype=dtype, device=device)
    for i in range(cfg.num_layers):
        t0 = ref_cache.start(i)
        if t0 != 0:
            raise ValueError(f"layer {i}'s reference cache starts at position {t0} (sliding window trimmed it)")
        T = ref_cache.k[i].shape[2]
        k[slot, i, :, :T] = lane_keys_to_kernel(ref_cache.k[i][rank]).to(dtype)
        v[slot, i, :, :T] = ref_cache.v[i][rank].to(dtype)
    return k, v
