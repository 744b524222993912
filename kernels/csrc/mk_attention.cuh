// Attention partial over a position split, K/V append, last-finisher combine.
// Included by monokernel.cu only (one translation unit); relies on its includes and defines.
#pragma once

// ---------------------------------------------------------------- attention
// Attention position splits in use at context length n (the rest only take their ticket): fewer, longer
// splits at short contexts keep the combine cheap (bench/NOTES.md, v3 sweep).
MK_DEV int attn_splits(const MkParams& p, int n) {
    return max(1, min(p.n_splits, (n + p.attn_min_pos - 1) / p.attn_min_pos));
}

// Positions [p0, p1) of a split at context length n = pos + 1 (p0 == p1: an idle split).
MK_DEV void attn_span(const MkParams& p, int split, int n, int& p0, int& p1) {
    const int S_eff = attn_splits(p, n);
    p0 = split < S_eff ? (int)((long long)split * n / S_eff) : 0;
    p1 = split < S_eff ? (int)((long long)(split + 1) * n / S_eff) : 0;
}

// Before the instruction's wait: start copying the cached K and V rows this split will read (positions written
// before this step, at most kv_stage_pos of them) into shared memory. They do not depend on this step's data,
// so, like a matvec's early weight loads, their latency hides behind the wait instead of lengthening the chain.
template <int HD>
MK_DEV void attn_prefetch(const MkParams& p, const int* ins, int pos, float* sm) {
    int p0, p1;
    attn_span(p, ins[MK_F_A1], pos + 1, p0, p1);
    const int rows = min(min(p1, pos) - p0, p.kv_stage_pos);
    if (rows <= 0) return;
    const size_t row0 = ((size_t)ins[MK_F_LAYER] * p.n_kv + ins[MK_F_A0]) * (size_t)p.max_len + p0;
    constexpr int CPR = HD * 2 / 16;   // 16-byte chunks per row
    mk_bf16* sk = (mk_bf16*)(sm + p.sm_kv);
    mk_bf16* sv = sk + (size_t)p.kv_stage_pos * HD;
    const mk_bf16* gk = p.k_cache + row0 * HD;
    const mk_bf16* gv = p.v_cache + row0 * HD;
    for (int c = threadIdx.x; c < rows * CPR; c += NT) {
        mk_cp_async16(sk + c * 8, gk + c * 8);
        mk_cp_async16(sv + c * 8, gv + c * 8);
    }
}

// One (kv head, split) partial over positions [p0, p1) of pos + 1. Only the first S_eff = attn_splits(n) splits
// have positions; split S_eff - 1 (the one holding position pos) appends this step's K/V. The last split to
// finish (ticket) combines the partials into attn[] and bumps ATTN_DONE.
template <int HD>
MK_DEV void op_attn(const MkParams& p, const int* ins, int ii, int step, int pos, float* sm, int* sflag) {
    constexpr int DPL = HD / 32, HALF = HD / 2;
    const int layer = ins[MK_F_LAYER], head = ins[MK_F_A0], split = ins[MK_F_A1];
    const int g = p.group, S = p.n_splits;
    const int n = pos + 1;
    const int S_eff = attn_splits(p, n);
    int p0, p1;
    attn_span(p, split, n, p0, p1);
    const int cap = p.kv_stage_pos;   // positions p0 .. p0 + cap - 1 come from the staged copy
    const mk_bf16* stk = (const mk_bf16*)(sm + p.sm_kv);
    const mk_bf16* stv = stk + (size_t)cap * HD;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t row0 = ((size_t)layer * p.n_kv + head) * (size_t)p.max_len;
    mk_bf16* kc = p.k_cache + row0 * HD;
    mk_bf16* vc = p.v_cache + row0 * HD;
    float* sq = sm;                               // [MAX_GROUP][HD] rotated, scaled q
    float* sw = sm + MK_MAX_GROUP * HD;           // [NW][g][HD + 2] per-warp partials
    if (split < S_eff) {   // CTA-uniform: the barriers inside are safe
        for (int e = threadIdx.x; e < g * HD; e += NT) {
            const int j = e / HD, i = e - j * HD;
            const float* q = p.qkv + (size_t)(head * g + j) * HD;
            const float a = mk_ld_cg(q + i), b = mk_ld_cg(q + (i < HALF ? i + HALF : i - HALF));
            float s, c;
            sincosf((float)pos * p.inv_freq[i % HALF], &s, &c);
            sq[e] = (i < HALF ? a * c - b * s : a * c + b * s) * p.attn_scale;
        }
        if (split == S_eff - 1) {
            const float* k = p.qkv + p.q_dim + head * HD;
            const float* v = p.qkv + p.q_dim + p.kv_dim + head * HD;
            for (int i = threadIdx.x; i < HD; i += NT) {
                const float a = mk_ld_cg(k + i), b = mk_ld_cg(k + (i < HALF ? i + HALF : i - HALF));
                float s, c;
                sincosf((float)pos * p.inv_freq[i % HALF], &s, &c);
                const mk_bf16 kb = mk_f2bf(i < HALF ? a * c - b * s : a * c + b * s), vb = mk_f2bf(mk_ld_cg(v + i));
                kc[(size_t)pos * HD + i] = kb;
                vc[(size_t)pos * HD + i] = vb;
                if (pos - p0 < cap) {   // this step's row joins the staged ones
                    ((mk_bf16*)stk)[(size_t)(pos - p0) * HD + i] = kb;
                    ((mk_bf16*)stv)[(size_t)(pos - p0) * HD + i] = vb;
                }
            }
        }
        mk_cp_async_wait_all();   // this thread's staged K/V rows; the barrier publishes everyone's
        __syncthreads();
        trace(p, step, ii, 4);   // rotated q (and this step's K/V) ready
        // q stays in shared memory (read per position, conflict-free): registers go to the accumulators.
        float acc[MK_MAX_GROUP][DPL], mx[MK_MAX_GROUP], l[MK_MAX_GROUP];
        const float* ql = sq + lane * DPL;
    #pragma unroll
        for (int j = 0; j < MK_MAX_GROUP; ++j) {
            mx[j] = -INFINITY;
            l[j] = 0.f;
    #pragma unroll
            for (int t = 0; t < DPL; ++t) acc[j][t] = 0.f;
        }
        for (int pp = p0 + warp; pp < p1; pp += NW) {
            float kf[DPL], vf[DPL];
            const bool staged = pp - p0 < cap;
            const mk_bf16* kr = (staged ? stk + (size_t)(pp - p0) * HD : kc + (size_t)pp * HD) + lane * DPL;
            const mk_bf16* vr = (staged ? stv + (size_t)(pp - p0) * HD : vc + (size_t)pp * HD) + lane * DPL;
            if (DPL == 2) {
                const unsigned ku = staged ? *(const unsigned*)kr : mk_ld_cg_u32(kr);
                const unsigned vu = staged ? *(const unsigned*)vr : mk_ld_cg_u32(vr);
                kf[0] = __uint_as_float(ku << 16); kf[1] = __uint_as_float(ku & 0xffff0000u);
                vf[0] = __uint_as_float(vu << 16); vf[1] = __uint_as_float(vu & 0xffff0000u);
            } else {
                const uint2 ku = staged ? *(const uint2*)kr : mk_ld_cg_u64(kr);
                const uint2 vu = staged ? *(const uint2*)vr : mk_ld_cg_u64(vr);
                kf[0] = __uint_as_float(ku.x << 16); kf[1] = __uint_as_float(ku.x & 0xffff0000u);
                kf[DPL > 2 ? 2 : 0] = __uint_as_float(ku.y << 16); kf[DPL - 1] = __uint_as_float(ku.y & 0xffff0000u);
                vf[0] = __uint_as_float(vu.x << 16); vf[1] = __uint_as_float(vu.x & 0xffff0000u);
                vf[DPL > 2 ? 2 : 0] = __uint_as_float(vu.y << 16); vf[DPL - 1] = __uint_as_float(vu.y & 0xffff0000u);
            }
    #pragma unroll
            for (int j = 0; j < MK_MAX_GROUP; ++j) {
                if (j < g) {
                    float s = 0.f;
    #pragma unroll
                    for (int t = 0; t < DPL; ++t) s += ql[j * HD + t] * kf[t];
                    s = warp_sum(s);
                    const float mn = fmaxf(mx[j], s);
                    const float corr = expf(mx[j] - mn), e = expf(s - mn);
                    l[j] = l[j] * corr + e;
    #pragma unroll
                    for (int t = 0; t < DPL; ++t) acc[j][t] = acc[j][t] * corr + e * vf[t];
                    mx[j] = mn;
                }
            }
        }
    #pragma unroll
        for (int j = 0; j < MK_MAX_GROUP; ++j) {
            if (j < g) {
                float* o = sw + (size_t)(warp * g + j) * (HD + 2);
    #pragma unroll
                for (int t = 0; t < DPL; ++t) o[2 + lane * DPL + t] = acc[j][t];
                if (lane == 0) { o[0] = mx[j]; o[1] = l[j]; }
            }
        }
        __syncthreads();
        trace(p, step, ii, 5);   // every warp's positions done
        float* part = p.part + (size_t)(head * S + split) * g * (HD + 2);
        for (int e = threadIdx.x; e < g * HD; e += NT) {
            const int j = e / HD, i = e - j * HD;
            float M = -INFINITY;
            for (int w = 0; w < NW; ++w) M = fmaxf(M, sw[(w * g + j) * (HD + 2)]);
            float num = 0.f, den = 0.f;
            if (M > -INFINITY) {
                for (int w = 0; w < NW; ++w) {
                    const float* o = sw + (size_t)(w * g + j) * (HD + 2);
                    const float c = expf(o[0] - M);
                    num += c * o[2 + i];
                    den += c * o[1];
                }
            }
            part[j * (HD + 2) + 2 + i] = num;
            if (i == 0) { part[j * (HD + 2)] = M; part[j * (HD + 2) + 1] = den; }
        }
        __syncthreads();
    }   // split < S_eff
    if (threadIdx.x == 0) {   // acq_rel: publishes this partial, and the last taker sees every other one
        const unsigned old = mk_atom_acq_rel(p.ctr + ins[MK_F_SIG_CTR], 1u);
        *sflag = old == (unsigned)((step + 1) * S - 1);
    }
    trace(p, step, ii, 3);   // partial done; the last finisher's combine follows
    __syncthreads();
    if (*sflag) {
        // Combine the S_eff partials of this head's g query heads: one thread per output element merges the
        // splits in order with the online-softmax rule. The loads of different splits do not depend on each
        // other, so (unrolled) they are all in flight at once: one L2 round trip, no barrier.
        const float* pbase = p.part + (size_t)head * S * g * (HD + 2);
        for (int e = threadIdx.x; e < g * HD; e += NT) {
            const int j = e / HD, i = e - j * HD;
            const float* o = pbase + (size_t)j * (HD + 2);
            float M = -INFINITY, den = 0.f, num = 0.f;
#pragma unroll 8
            for (int sp = 0; sp < S_eff; ++sp) {
                const float* q = o + (size_t)sp * g * (HD + 2);
                const float ms = mk_ld_cg(q), ls = mk_ld_cg(q + 1), as = mk_ld_cg(q + 2 + i);
                if (ms == -INFINITY) continue;
                const float mn = fmaxf(M, ms);
                const float c_old = expf(M - mn), c_new = expf(ms - mn);
                den = den * c_old + ls * c_new;
                num = num * c_old + as * c_new;
                M = mn;
            }
            p.attn[(size_t)(head * g + j) * HD + i] = num / den;
        }
        signal_ctr(p.ctr + ins[MK_F_AUX]);
    }
    __syncthreads();
}

