"""The reference model: Llama and Qwen2 decoders in plain torch (the source of truth every backend is tested against).

Weights live in fused tensors (QKV rows stacked, gate/up rows stacked) because one matmul per fused group costs
less Python and memory traffic than three; `Model.params` exposes Hugging Face names as *views* into those
tensors, so a HF state dict maps 1:1 (`model.layers.0.self_attn.q_proj.weight`, ...) and the checkpoint is
copied into place once, never held twice.

Activations: one sequence (batch size 1). The KV cache layout is the contract's
`[n_slots, n_layers, n_kv_heads, max_len, head_dim]` with keys stored after RoPE.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import CausalBias, causal_lower_right

from .config import ModelConfig


def llama3_scaled(inv: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                  original_max_position_embeddings: int) -> torch.Tensor:
    """Llama-3.1-style RoPE rescaling of inverse frequencies inv [hd/2]: long wavelengths (beyond the original
    context / low_freq_factor) are slowed down by `factor`, short ones (below original / high_freq_factor) are
    kept, the band between is interpolated."""
    lo, hi, orig = low_freq_factor, high_freq_factor, original_max_position_embeddings
    wavelen = 2 * math.pi / inv
    smooth = (orig / wavelen - lo) / (hi - lo)
    mid = (1 - smooth) * inv / factor + smooth * inv
    return torch.where(wavelen > orig / lo, inv / factor, torch.where(wavelen < orig / hi, inv, mid))


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """[head_dim/2] fp32 inverse frequencies, with llama3-style scaling when configured."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    sc = cfg.rope_scaling
    if sc and sc.get("rope_type") == "llama3":
        inv = llama3_scaled(inv, sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"],
                            sc["original_max_position_embeddings"])
    return inv


def rope_tables(cfg: ModelConfig, max_len: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin_signed: [max_len, head_dim] (half-dim frequencies repeated twice, HF's rotate_half convention;
    the sine's first half negated, see apply_rope)."""
    inv = rope_inv_freq(cfg)
    pos = torch.arange(max_len, dtype=torch.float32)
    freqs = torch.outer(pos, inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    sin = freqs.sin()
    sin_signed = torch.cat([-sin, sin], dim=-1)
    return emb.cos().to(dtype=dtype, device=device), sin_signed.to(dtype=dtype, device=device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x: [heads, T, hd]; cos/sin_signed: [T, hd] with sin_signed = cat(-sin, sin) over the two halves.

    HF's x*cos + rotate_half(x)*sin, where rotate_half(x) = cat(-x2, x1) = roll(x, half) * (-1 | +1):
    the sign lives in the table, so this is three ops instead of seven.
    """
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x: fp32 residual [.., d]; w: [d] in the weight dtype -> normalised x in the weight dtype."""
    if w.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    # Low precision: normalise in fp32, round to the weight dtype, then scale (HF's order). F.rms_norm without a
    # weight is one fused op where pow/mean/add/rsqrt/mul were five launches (x 2 per layer on every prefill).
    return F.rms_norm(x, (x.shape[-1],), None, eps).to(w.dtype) * w


# The causal-bias dispatch forwards enable_gqa only in newer torch; without it GQA would fail there.
_BIAS_GQA = "enable_gqa" in inspect.signature(CausalBias._dispatch).parameters


def causal_mask(T: int, end: int, device: torch.device, dtype: torch.dtype):
    """SDPA attn_mask for T queries at positions end-T..end-1 over keys 0..end-1 (query i sees keys <= end-T+i).

    None for one query (it sees every key). On CUDA in half precision: torch's lower-right causal bias, which
    SDPA runs as flash attention (GQA included) with no mask tensor; a materialised boolean mask would force
    the math backend (a dozen launches per layer, scores upcast to fp32). Elsewhere (CPU, the fp32 reference
    on GPU, where flash does not apply): the boolean [T, end] mask.
    """
    if T == 1:
        return None
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and _BIAS_GQA:
        return causal_lower_right(T, end)
    qpos = torch.arange(end - T, end, device=device)[:, None]
    return torch.arange(end, device=device)[None, :] <= qpos


@dataclass
class LayerWeights:
    ln1: torch.Tensor          # [d]
    wqkv: torch.Tensor         # [q_dim + 2 kv_dim, d]
    bqkv: torch.Tensor | None  # [q_dim + 2 kv_dim]
    wo: torch.Tensor           # [d, q_dim]
    bo: torch.Tensor | None
    ln2: torch.Tensor
    wgu: torch.Tensor          # [2 ffn, d]  (gate rows then up rows)
    bgu: torch.Tensor | None
    wd: torch.Tensor           # [d, ffn]
    bd: torch.Tensor | None


class Model:
    """Weights + forward for one sequence. Not an nn.Module: no autograd, no hooks, less per-call overhead."""

    def __init__(self, cfg: ModelConfig, device="cpu", dtype=torch.float32, max_len: int = 4096):
        self.cfg, self.device, self.dtype, self.max_len = cfg, torch.device(device), dtype, max_len
        d, q, kv, f = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.intermediate_size
        emp = lambda *s: torch.empty(*s, device=self.device, dtype=dtype)  # noqa: E731
        # Matrices are [out, in] as in HF. On CPU they are stored transposed ([in, out] contiguous, exposed as an
        # [out, in] view): a batch-1 F.linear then runs as x @ W_t, which MKL streams at ~18 GB/s on the 2-core
        # box versus ~11 GB/s for the row-major [out, in] gemv (decode went 11.3 -> ~7.5 ms/token on the default
        # model). Same shapes and names, only strides differ; GPU kernels keep the row-major layout they expect.
        if self.device.type == "cpu":
            mat = lambda o, i: emp(i, o).t()  # noqa: E731
        else:
            mat = emp
        self.params: dict[str, torch.Tensor] = {}
        self.embed = mat(cfg.vocab_size, d)
        self.params["model.embed_tokens.weight"] = self.embed
        self.layers: list[LayerWeights] = []
        for i in range(cfg.n_layers):
            p = f"model.layers.{i}."
            lw = LayerWeights(ln1=emp(d), wqkv=mat(q + 2 * kv, d), bqkv=emp(q + 2 * kv) if cfg.qkv_bias else None,
                              wo=mat(d, q), bo=emp(d) if cfg.o_bias else None, ln2=emp(d), wgu=mat(2 * f, d),
                              bgu=emp(2 * f) if cfg.mlp_bias else None, wd=mat(d, f),
                              bd=emp(d) if cfg.mlp_bias else None)
            self.layers.append(lw)
            P = self.params
            P[p + "input_layernorm.weight"] = lw.ln1
            P[p + "post_attention_layernorm.weight"] = lw.ln2
            a = p + "self_attn."
            P[a + "q_proj.weight"], P[a + "k_proj.weight"], P[a + "v_proj.weight"] = lw.wqkv.split([q, kv, kv])
            if lw.bqkv is not None:
                P[a + "q_proj.bias"], P[a + "k_proj.bias"], P[a + "v_proj.bias"] = lw.bqkv.split([q, kv, kv])
            P[a + "o_proj.weight"] = lw.wo
            if lw.bo is not None:
                P[a + "o_proj.bias"] = lw.bo
            m = p + "mlp."
            P[m + "gate_proj.weight"], P[m + "up_proj.weight"] = lw.wgu.split([f, f])
            P[m + "down_proj.weight"] = lw.wd
            if lw.bgu is not None:
                P[m + "gate_proj.bias"], P[m + "up_proj.bias"] = lw.bgu.split([f, f])
                P[m + "down_proj.bias"] = lw.bd
        self.norm = emp(d)
        self.params["model.norm.weight"] = self.norm
        if cfg.tie_word_embeddings:
            self.lm_head = self.embed
        else:
            self.lm_head = mat(cfg.vocab_size, d)
            self.params["lm_head.weight"] = self.lm_head
        self.cos, self.sin = rope_tables(cfg, max_len, dtype, self.device)
        self._decode_views: list | None = None     # per-layer transposed weight views, made on first decode

    def init_random(self, seed: int = 0, std: float = 0.02) -> "Model":
        """Random weights (for benchmarks and shape tests): normal(0, std), norms = 1, biases small."""
        g = torch.Generator(device="cpu").manual_seed(seed)
        for name, t in self.params.items():
            if name.endswith("norm.weight"):
                t.fill_(1.0)
            else:
                s = std * 0.1 if name.endswith(".bias") else std
                # Generate on CPU in chunks of rows so a large embedding does not need a second full copy.
                rows = t.shape[0]
                step = max(1, (1 << 22) // max(1, t[0].numel()))
                for r in range(0, rows, step):
                    chunk = t[r:r + step]
                    chunk.copy_(torch.randn(chunk.shape, generator=g) * s)
        return self

    def n_params(self) -> int:
        return sum(t.numel() for t in self.params.values())

    @torch.inference_mode()
    def forward(self, k_cache: torch.Tensor, v_cache: torch.Tensor, slot: int, ids: torch.Tensor, start: int,
                all_logits: bool = False) -> torch.Tensor:
        """ids: LongTensor [T] at positions start..start+T-1 of `slot`; k_cache/v_cache: [S, L, kvh, max_len, hd].

        Writes the T new keys/values into the cache and returns fp32 logits [T, V] (all_logits) or [V] (last).
        """
        cfg = self.cfg
        T = ids.shape[0]
        end = start + T
        if end > self.max_len:
            raise ValueError(f"sequence of {end} tokens exceeds max_seq_len {self.max_len}")
        if T == 1 and self.dtype == torch.float32 and self.device.type == "cpu":
            logits = self._decode_one(k_cache, v_cache, slot, ids, start)
            return logits[None] if all_logits else logits
        nh, nkv, hd, qd, kvd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.q_dim, cfg.kv_dim
        cos, sin = self.cos[start:end], self.sin[start:end]
        mask = causal_mask(T, end, self.device, self.dtype)
        # The residual stream stays fp32 whatever the weight dtype (cheap at [T, d]): rounding errors then do
        # not compound in it across layers; matmul inputs/outputs are in the weight dtype.
        x = F.embedding(ids, self.embed).float()  # [T, d]
        eps = cfg.rms_norm_eps
        for li, w in enumerate(self.layers):
            h = rms_norm(x, w.ln1, eps)
            qkv = F.linear(h, w.wqkv, w.bqkv)
            # RoPE on q and k heads together: one rotation for nh + nkv heads.
            qk = apply_rope(qkv[:, :qd + kvd].view(T, nh + nkv, hd).transpose(0, 1), cos, sin)
            kc, vc = k_cache[slot, li], v_cache[slot, li]  # [kvh, max_len, hd]
            kc[:, start:end] = qk[nh:]
            vc[:, start:end] = qkv[:, qd + kvd:].view(T, nkv, hd).transpose(0, 1)
            q = qk[:nh]
            o = F.scaled_dot_product_attention(q[None], kc[None, :, :end], vc[None, :, :end], attn_mask=mask,
                                               enable_gqa=nh != nkv)[0]        # [nh, T, hd]
            # (flash returns [nh, T, hd] as a transposed view of [T, nh, hd]: this reshape is then free)
            x = x + F.linear(o.transpose(0, 1).reshape(T, qd), w.wo, w.bo)
            h = rms_norm(x, w.ln2, eps)
            g, u = F.linear(h, w.wgu, w.bgu).chunk(2, dim=-1)
            x = x + F.linear(F.silu(g) * u, w.wd, w.bd)
        if not all_logits:
            x = x[-1]
        x = rms_norm(x, self.norm, eps)
        return F.linear(x, self.lm_head).float()

    def _decode_one(self, k_cache: torch.Tensor, v_cache: torch.Tensor, slot: int, ids: torch.Tensor,
                    pos: int) -> torch.Tensor:
        """The T == 1, fp32, CPU case of forward (every decode step): same math with fewer, cheaper torch ops.

        At batch 1 each op costs microseconds of dispatch while the 23M-param default model streams its weights
        in ~5 ms, so op count matters: no mask, no [T, heads] transposes, attention is two bmm + softmax over the
        live keys (no SDPA dispatch / GQA expansion), RMSNorm is plain ops (F.rms_norm is slower at [1, d]),
        and the [in, out] weight views are made once. The residual adds stay separate adds (an addmm into the
        residual rounds differently; tests/engine/test_graph_step.py holds K/V to 1e-6).
        ids: LongTensor [1]; k_cache/v_cache: [S, L, kvh, max_len, hd]; returns fp32 logits [V].
        """
        cfg = self.cfg
        nh, nkv, hd, qd, kvd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.q_dim, cfg.kv_dim
        grp, end, eps, scale = nh // nkv, pos + 1, cfg.rms_norm_eps, 1.0 / math.sqrt(cfg.head_dim)
        views = self._decode_views
        if views is None:
            views = self._decode_views = [(w.ln1, w.wqkv.t(), w.bqkv, w.wo.t(), w.bo, w.ln2, w.wgu.t(), w.bgu,
                                           w.wd.t(), w.bd) for w in self.layers]
        cos, sin = self.cos[pos], self.sin[pos]                       # [hd]
        x = F.embedding(ids, self.embed)                              # [1, d] fp32
        kcs, vcs = k_cache[slot], v_cache[slot]                       # [L, kvh, max_len, hd]
        for li, (ln1, wqkv, bqkv, wo, bo, ln2, wgu, bgu, wd, bd) in enumerate(views):
            h = _rms(x, ln1, eps)
            qkv = torch.addmm(bqkv, h, wqkv) if bqkv is not None else h @ wqkv     # [1, qd + 2 kvd]
            qk = qkv[0, :qd + kvd].view(nh + nkv, hd)
            qk = torch.addcmul(qk * cos, qk.roll(hd // 2, dims=-1), sin)           # RoPE, see apply_rope
            kc, vc = kcs[li], vcs[li]                                               # [kvh, max_len, hd]
            kc[:, pos] = qk[nh:]
            vc[:, pos] = qkv[0, qd + kvd:].view(nkv, hd)
            # Query head j*grp + i reads kv head j (GQA), so q viewed [nkv, grp, hd] lines up with the cache.
            att = torch.bmm(qk[:nh].view(nkv, grp, hd), kc[:, :end].transpose(1, 2))  # [nkv, grp, end]
            att = torch.softmax(att.mul_(scale), dim=-1)
            o = torch.bmm(att, vc[:, :end]).view(1, qd)                             # [1, qd]
            x = x + (torch.addmm(bo, o, wo) if bo is not None else o @ wo)
            h = _rms(x, ln2, eps)
            gu = torch.addmm(bgu, h, wgu) if bgu is not None else h @ wgu            # [1, 2 ffn]
            g, u = gu.chunk(2, dim=-1)
            a = F.silu(g).mul_(u)
            x = x + (torch.addmm(bd, a, wd) if bd is not None else a @ wd)
        x = rms_norm(x[0], self.norm, eps)
        return F.linear(x, self.lm_head)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """fp32 RMSNorm of x [.., d] with weight w [d] in HF's order (normalise, then scale). sum + div_ is what
    mean does inside, minus a dtype-cast copy that costs ~15 us at [1, d]."""
    return (x * torch.rsqrt((x * x).sum(-1, keepdim=True).div_(x.shape[-1]).add_(eps))).mul_(w)
