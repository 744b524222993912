// Attention partial over a position split, K/V append, last-finisher combine.
// Included by monokernel.cu only (one translation unit); relies on its includes and defines.
#pragma once

// ---------------------------------------------------------------- attention
// One (kv head, split) partial over positions [p0, p1) of pos + 1; the last split appends this step's K/V.
// The last split to finish (ticket) combines the partials into attn[] and bumps ATTN_DONE.
template <int HD>
MK_DEV void op_attn(const MkParams& p, const int* ins, int step, int pos, float* sm, int* sflag) {
    constexpr int DPL = HD / 32, HALF = HD / 2;
    const int layer = ins[MK_F_LAYER], head = ins[MK_F_A0], split = ins[MK_F_A1];
    const int g = p.group, S = p.n_splits;
    const int n = pos + 1;
    const int p0 = (int)((long long)split * n / S), p1 = (int)((long long)(split + 1) * n / S);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t row0 = ((size_t)layer * p.n_kv + head) * (size_t)p.max_len;
    mk_bf16* kc = p.k_cache + row0 * HD;
    mk_bf16* vc = p.v_cache + row0 * HD;
    float* sq = sm;                               // [MAX_GROUP][HD] rotated, scaled q
    float* sw = sm + MK_MAX_GROUP * HD;           // [NW][g][HD + 2] per-warp partials
    for (int e = threadIdx.x; e < g * HD; e += NT) {
        const int j = e / HD, i = e - j * HD;
        const float* q = p.qkv + (size_t)(head * g + j) * HD;
        const float a = mk_ld_cg(q + i), b = mk_ld_cg(q + (i < HALF ? i + HALF : i - HALF));
        float s, c;
        sincosf((float)pos * p.inv_freq[i % HALF], &s, &c);
        sq[e] = (i < HALF ? a * c - b * s : a * c + b * s) * p.attn_scale;
    }
    if (split == S - 1) {
        const float* k = p.qkv + p.q_dim + head * HD;
        const float* v = p.qkv + p.q_dim + p.kv_dim + head * HD;
        for (int i = threadIdx.x; i < HD; i += NT) {
            const float a = mk_ld_cg(k + i), b = mk_ld_cg(k + (i < HALF ? i + HALF : i - HALF));
            float s, c;
            sincosf((float)pos * p.inv_freq[i % HALF], &s, &c);
            kc[(size_t)pos * HD + i] = mk_f2bf(i < HALF ? a * c - b * s : a * c + b * s);
            vc[(size_t)pos * HD + i] = mk_f2bf(mk_ld_cg(v + i));
        }
    }
    __syncthreads();
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
        const mk_bf16* kr = kc + (size_t)pp * HD + lane * DPL;
        const mk_bf16* vr = vc + (size_t)pp * HD + lane * DPL;
        if (DPL == 2) {
            const unsigned ku = mk_ld_cg_u32(kr), vu = mk_ld_cg_u32(vr);
            kf[0] = __uint_as_float(ku << 16); kf[1] = __uint_as_float(ku & 0xffff0000u);
            vf[0] = __uint_as_float(vu << 16); vf[1] = __uint_as_float(vu & 0xffff0000u);
        } else {
            const uint2 ku = mk_ld_cg_u64(kr), vu = mk_ld_cg_u64(vr);
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
    if (threadIdx.x == 0) {
        __threadfence();
        const unsigned old = mk_atom_acq_rel(p.ctr + ins[MK_F_SIG_CTR], 1u);
        const int last = old == (unsigned)((step + 1) * S - 1);
        if (last) __threadfence();
        *sflag = last;
    }
    __syncthreads();
    if (*sflag) {
        // Combine the S partials of this head's g query heads. v0 walked the splits with two dependent loops
        // of L2 loads per element (~2S round trips, ~40 us per layer at S = 64); now: (1) every (split, head)
        // m and l in parallel into shared memory, (2) per head the max, weights and denominator, (3) each
        // element sums S accumulators with the loads unrolled so several are in flight.
        const float* pbase = p.part + (size_t)head * S * g * (HD + 2);
        float* cm = sm;                 // [S][g] m, then the weight exp(m - M)
        float* cl = sm + S * g;         // [S][g] l
        float* cden = sm + 2 * S * g;   // [g]
        for (int t = threadIdx.x; t < S * g; t += NT) {
            const float* o = pbase + (size_t)t * (HD + 2);   // t = s * g + j
            cm[t] = mk_ld_cg(o);
            cl[t] = mk_ld_cg(o + 1);
        }
        __syncthreads();
        if (threadIdx.x < g) {
            const int j = threadIdx.x;
            float M = -INFINITY;
            for (int s = 0; s < S; ++s) M = fmaxf(M, cm[s * g + j]);
            float den = 0.f;
            for (int s = 0; s < S; ++s) {
                const float ms = cm[s * g + j];
                const float wgt = ms == -INFINITY ? 0.f : expf(ms - M);
                cm[s * g + j] = wgt;
                den += wgt * cl[s * g + j];
            }
            cden[j] = den;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < g * HD; e += NT) {
            const int j = e / HD, i = e - j * HD;
            const float* o = pbase + (size_t)j * (HD + 2) + 2 + i;
            float num = 0.f;
#pragma unroll 8
            for (int s = 0; s < S; ++s) num += cm[s * g + j] * mk_ld_cg(o + (size_t)s * g * (HD + 2));
            p.attn[(size_t)(head * g + j) * HD + i] = num / cden[j];
        }
        signal_ctr(p.ctr + ins[MK_F_AUX]);
    }
    __syncthreads();
}

