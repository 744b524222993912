"""Exact-mode tensor-parallel sharding (tp_mode='exact', /work/shared/DTP.md) of an ordinary Llama/Qwen2 model
over N ranks (GPUs), for any N from 1 to n_heads.

What each rank holds (rank r of N):
- attention: a contiguous range of query heads and the KV heads those heads read (query heads travel with their
  KV heads). How query heads are dealt out (`TPPlan.head_split`):
    "kv"       n_kv % N == 0: rank r owns KV heads [r*k, (r+1)*k), k = n_kv/N, and all their query heads;
    "group"    N % n_kv == 0 (fewer KV heads than ranks): every KV head is replicated on m = N/n_kv ranks; the
               grp = n_heads/n_kv query heads of KV head j are split over ranks j*m .. j*m+m-1 as evenly as
               possible, earlier ranks taking the extra head (Qwen2.5-0.5B, 14q/2kv on 4 ranks: q 0-3 | 4-6 |
               7-10 | 11-13), so each rank holds exactly one KV head;
    "balanced" otherwise: the n_heads query heads are cut into N contiguous ranges whose sizes differ by at most
               one (earlier ranks larger); rank r holds every KV head one of its query heads reads, so a KV head
               whose group straddles a cut is replicated on both ranks (and a rank may hold two KV heads).
  Rows of q_proj/k_proj/v_proj (and their biases) for those heads; the matching *columns* of o_proj.
  A replicated KV head is computed and cached on every rank that holds it (same inputs, same values).
- MLP: a contiguous range of intermediate channels: rows of gate_proj/up_proj (and biases), columns of
  down_proj. Uneven when N does not divide ffn: sizes differ by one `ffn_align` unit at most, earlier ranks
  larger (ffn_align lets a kernel ask for tile-sized cuts; the last shard absorbs the remainder).
- Residual-side terms: the o_proj and down_proj biases (Llama attention_bias / mlp_bias) are added by rank 0
  only, inside its partial, so the sum of the N partials is the dense projection.
- replicated: RMSNorm gains, the final norm, the embedding table (one row read per token).
- LM head: vocabulary-parallel; rank r holds rows [v0, v1) (of the embedding when tied), balanced like ffn.

Reduction: every rank sums the N partials in rank order 0..N-1, then adds the sum to its residual:
x <- x + (((p_0 + p_1) + p_2) + ...). All ranks therefore hold bit-identical residual streams.
Greedy decoding: each rank takes (max logit, global index) of its vocabulary slice; the pairs are exchanged and
the largest value wins, ties going to the lowest rank (= the lowest index, like torch.argmax on full logits).

Per-rank weights (`shard_weights`) keep Hugging Face names and [out, in] row-major layout with local sizes;
`rank_layers` gives the fused per-layer form (engine.model.LayerWeights) the GPU model and kernels use.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping

import torch

from ..config import ModelConfig
from ..model import LayerWeights


class ShardError(ValueError):
    """The model cannot be split over the requested number of ranks."""


def split_range(total: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """Cut [0, total) into `parts` contiguous ranges of whole `align`-sized units whose unit counts differ by at
    most one (earlier parts larger); the last range ends at `total` (a partial last unit)."""
    units = -(-total // align)
    if parts < 1 or units < parts:
        raise ShardError(f"cannot split {total} (in units of {align}) into {parts} non-empty parts")
    base, extra = divmod(units, parts)
    out, u = [], 0
    for r in range(parts):
        n = base + (r < extra)
        out.append((min(u * align, total), min((u + n) * align, total)))
        u += n
    return out


@dataclass(frozen=True)
class RankShard:
    """The slices rank `rank` owns; every range is [start, stop) in global indices."""
    rank: int
    q_heads: tuple[int, int]
    kv_heads: tuple[int, int]
    ffn: tuple[int, int]
    vocab: tuple[int, int]
    kv_of_q: tuple[int, ...]      # local KV head index read by each local query head (GQA map)
    adds_bias: bool               # this rank adds the o_proj / down_proj biases to its partials

    @property
    def n_q(self) -> int:
        return self.q_heads[1] - self.q_heads[0]

    @property
    def n_kv(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]

    @property
    def n_ffn(self) -> int:
        return self.ffn[1] - self.ffn[0]

    @property
    def n_vocab(self) -> int:
        return self.vocab[1] - self.vocab[0]

    @property
    def group(self) -> int | None:
        """Query heads per local KV head when uniform (local q head j reads local KV head j // group), else None
        (a "balanced" split can give a rank e.g. 3 heads of KV head 0 and 1 of KV head 1)."""
        if self.n_q % self.n_kv:
            return None
        g = self.n_q // self.n_kv
        return g if self.kv_of_q == tuple(j // g for j in range(self.n_q)) else None


@dataclass(frozen=True)
class TPPlan:
    """How a model is split over `n_ranks` ranks (exact mode); see the module docstring for the rules."""
    n_ranks: int
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    head_split: str                      # "kv" | "group" | "balanced"
    ranks: tuple[RankShard, ...]
    reduce_order: tuple[int, ...]        # partials are summed in this rank order on every rank

    @property
    def kv_replicated(self) -> bool:
        return sum(r.n_kv for r in self.ranks) > self.n_kv_heads

    def kv_holders(self, kv_head: int) -> list[int]:
        """Ranks that compute and cache global KV head `kv_head`."""
        return [r.rank for r in self.ranks if r.kv_heads[0] <= kv_head < r.kv_heads[1]]

    def rank_weight_bytes(self, rank: int, bytes_per_el: int = 2) -> int:
        """Weight bytes rank `rank` streams per decode token: its matrices, the norm gains, one embedding row and
        its LM-head rows (biases left out: they are a few KB)."""
        s, d, hd = self.ranks[rank], self.hidden_size, self.head_dim
        attn = d * (s.n_q + 2 * s.n_kv) * hd + s.n_q * hd * d
        mlp = 3 * d * s.n_ffn
        per_layer = attn + mlp + 2 * d
        return bytes_per_el * (self.n_layers * per_layer + d + s.n_vocab * d + d)

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        parts = [f"rank {r.rank}: q {r.q_heads[0]}-{r.q_heads[1] - 1} kv {r.kv_heads[0]}-{r.kv_heads[1] - 1} "
                 f"ffn {r.ffn[0]}:{r.ffn[1]} vocab {r.vocab[0]}:{r.vocab[1]}" for r in self.ranks]
        return f"exact TP x{self.n_ranks} ({self.head_split} head split): " + "; ".join(parts)


def make_plan(cfg: ModelConfig, n_ranks: int, ffn_align: int = 1, vocab_align: int = 1) -> TPPlan:
    """The exact-mode split of `cfg` over `n_ranks` ranks. Raises ShardError when a rank would get no query
    head, no FFN channel or no vocabulary row."""
    N, nh, nkv = int(n_ranks), cfg.n_heads, cfg.n_kv_heads
    if N < 1:
        raise ShardError(f"tp must be >= 1, got {n_ranks}")
    if nh % nkv:
        raise ShardError(f"n_heads {nh} is not a multiple of n_kv_heads {nkv}")
    if N > nh:
        raise ShardError(f"tp={N} exceeds the {nh} attention heads: a rank would have no attention work")
    grp = nh // nkv
    if nkv % N == 0:
        split, k = "kv", nkv // N
        q_ranges = [(r * k * grp, (r + 1) * k * grp) for r in range(N)]
    elif N % nkv == 0:
        split, m = "group", N // nkv
        q_ranges = []
        for j in range(nkv):
            q_ranges += [(j * grp + a, j * grp + b) for a, b in split_range(grp, m)]
    else:
        split = "balanced"
        q_ranges = split_range(nh, N)
    ffn = split_range(cfg.intermediate_size, N, ffn_align)
    vocab = split_range(cfg.vocab_size, N, vocab_align)
    ranks = []
    for r, (q0, q1) in enumerate(q_ranges):
        kv0, kv1 = q0 // grp, (q1 - 1) // grp + 1
        ranks.append(RankShard(rank=r, q_heads=(q0, q1), kv_heads=(kv0, kv1), ffn=ffn[r], vocab=vocab[r],
                               kv_of_q=tuple(h // grp - kv0 for h in range(q0, q1)), adds_bias=(r == 0)))
    return TPPlan(n_ranks=N, n_layers=cfg.n_layers, hidden_size=cfg.hidden_size, n_heads=nh, n_kv_heads=nkv,
                  head_dim=cfg.head_dim, intermediate_size=cfg.intermediate_size, vocab_size=cfg.vocab_size,
                  head_split=split, ranks=tuple(ranks), reduce_order=tuple(range(N)))


def shard_weights(params: Mapping[str, torch.Tensor], plan: TPPlan, rank: int, dtype: torch.dtype | None = None,
                  device=None) -> dict[str, torch.Tensor]:
    """Rank `rank`'s weights from a full Hugging Face-named state dict (e.g. engine.model.Model.params).

    Same names, local shapes, [out, in] row-major and contiguous, always copies (never views of `params`), cast to `dtype` / moved to `device` if given.
    `lm_head.weight` is always present: this rank's vocabulary rows (of the embedding when tied).
    o_proj.bias / down_proj.bias appear only on the rank with `adds_bias`.
    """
    s = plan.ranks[rank]
    hd = plan.head_dim
    qs, ks, fs = slice(s.q_heads[0] * hd, s.q_heads[1] * hd), slice(s.kv_heads[0] * hd, s.kv_heads[1] * hd), \
        slice(*s.ffn)

    def put(t: torch.Tensor) -> torch.Tensor:
        # Always a fresh tensor: a rank never aliases the full model's storage (nor another rank's).
        return t.to(device=device or t.device, dtype=dtype or t.dtype, copy=True, memory_format=torch.contiguous_format)

    out: dict[str, torch.Tensor] = {}
    for name, t in params.items():
        if not name.startswith("model.layers."):
            continue
        leaf = name.split(".", 3)[3]        # e.g. "self_attn.q_proj.weight"
        if leaf.startswith("self_attn.q_proj."):
            out[name] = put(t[qs])
        elif leaf.startswith(("self_attn.k_proj.", "self_attn.v_proj.")):
            out[name] = put(t[ks])
        elif leaf == "self_attn.o_proj.weight":
            out[name] = put(t[:, qs])
        elif leaf.startswith(("mlp.gate_proj.", "mlp.up_proj.")):
            out[name] = put(t[fs])
        elif leaf == "mlp.down_proj.weight":
            out[name] = put(t[:, fs])
        elif leaf in ("self_attn.o_proj.bias", "mlp.down_proj.bias"):
            if s.adds_bias:
                out[name] = put(t)
        elif leaf.endswith("layernorm.weight"):
            out[name] = put(t)
        else:
            raise ShardError(f"no sharding rule for tensor {name}")
    emb = params["model.embed_tokens.weight"]
    out["model.embed_tokens.weight"] = put(emb)
    out["model.norm.weight"] = put(params["model.norm.weight"])
    head = params.get("lm_head.weight", emb)
    out["lm_head.weight"] = put(head[slice(*s.vocab)])
    return out


def rank_layers(shard: Mapping[str, torch.Tensor], n_layers: int) -> list[LayerWeights]:
    """Fused per-layer weights of one rank (QKV rows stacked, gate/up rows stacked), engine.model's layout with
    local sizes: wqkv [(n_q + 2 n_kv) hd, d], wo [d, n_q hd], wgu [2 n_ffn, d], wd [d, n_ffn]."""
    out = []
    for i in range(n_layers):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."

        def cat(names):
            ts = [shard.get(n) for n in names]
            return None if ts[0] is None else torch.cat(ts, 0).contiguous()

        out.append(LayerWeights(
            ln1=shard[p + "input_layernorm.weight"],
            wqkv=cat([a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"]),
            bqkv=cat([a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"]),
            wo=shard[a + "o_proj.weight"], bo=shard.get(a + "o_proj.bias"),
            ln2=shard[p + "post_attention_layernorm.weight"],
            wgu=cat([m + "gate_proj.weight", m + "up_proj.weight"]),
            bgu=cat([m + "gate_proj.bias", m + "up_proj.bias"]),
            wd=shard[m + "down_proj.weight"], bd=shard.get(m + "down_proj.bias")))
    return out
