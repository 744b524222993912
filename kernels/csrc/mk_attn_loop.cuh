// The attention partial's position loop over one chunk of staged positions (op_attn in mk_attention.cuh), in two
// phases with one CTA barrier between them (the caller's); shared memory apart from the partial record, so
// bench/probes/attn_probe.cu times exactly this code on its own. The includer defines NT, warp_max and warp_sum
// (mk_block.cuh) and includes mk_isa.h (MK_KPAD, MK_MAX_GROUP) and mk_vendor.h (mk_shfl_xor, ldmatrix, mma).
#pragma once

// Staged K rows are padded to HD + MK_KPAD bf16 (MK_KPAD = 8: a 144- or 272-byte stride), as are the q tile's rows,
// so the 8 rows of an ldmatrix phase fall in 8 different bank groups.

// The rotated q for the tensor-core scores, one 16-row bf16 tile (rows HD + MK_KPAD apart): row j holds
// hi = bf16(x) of q head j, row MAX_GROUP + j holds lo = bf16(x - hi), so one mma gives both halves of each product
// (accumulator rows j and 8 + j: the same thread's d[0] / d[2] and d[1] / d[3]) and their sum keeps ~16 mantissa bits
// of q (K is bf16 already): ~1e-5 relative to the fp32 scores.
template <int HD>
MK_DEV void attn_q_store(mk_bf16* qh, int j, int i, float x) {
    const mk_bf16 hi = mk_f2bf(x);
    qh[j * (HD + MK_KPAD) + i] = hi;
    qh[(MK_MAX_GROUP + j) * (HD + MK_KPAD) + i] = mk_f2bf(x - mk_bf2f(hi));
}

// The q tile's lane address (qh: attn_q_store's tile) for attn_score_tile.
template <int HD>
MK_DEV unsigned attn_q_lane_addr(const mk_bf16* qh) {
    const int lane = threadIdx.x & 31;
    return mk_smem_addr(qh) + (unsigned)(((lane & 15) * (HD + MK_KPAD) + (lane >> 4) * 8) * 2);
}

// The raw accumulator of 8-position tile nt (positions nt * 8 ..): d[0] / d[1] hold q head lane / 4's hi-row
// products with positions nt * 8 + 2 (lane % 4) and + 1, d[2] / d[3] its lo-row ones (their sums are the scores).
template <int HD>
MK_DEV void attn_score_tile(unsigned qa, const mk_bf16* stk, int nt, float (&d)[4]) {
    const int lane = threadIdx.x & 31;
    const unsigned kb =
        mk_smem_addr(stk) + (unsigned)(((nt * 8 + (lane & 7)) * (HD + MK_KPAD) + ((lane >> 3) & 1) * 8) * 2);
    d[0] = d[1] = d[2] = d[3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks) {
        unsigned a[4], b[2];
        mk_ldsm_x2(kb + ks * 32, b);
        mk_ldsm_x4(qa + ks * 32, a);
        mk_mma_bf16(d, a, b);
    }
}

// scores on the tensor cores (mma m16n8k16): warp w takes the 8-position tiles w, w + NW, ...; per 16 dims one
// ldmatrix of K (8 positions x 16 dims: the B operand, K rows being its columns), one of the q tile, one mma. An
// output (row r, position n) depends on q row r and K row n only: rows of heads >= g and positions >= C hold
// whatever shared memory held (K rows past the chunk are read, inside the staging region) and are dropped.
template <int HD>
MK_DEV void attn_scores_mma(const mk_bf16* qh, const mk_bf16* stk, float* sc, int g, int C, int cap) {
    static_assert(MK_MAX_GROUP == 8, "hi rows 0-7, lo rows 8-15 of one m16 tile");
    const int lane = threadIdx.x & 31;
    const unsigned qa = attn_q_lane_addr<HD>(qh);
    for (int nt = threadIdx.x >> 5; nt * 8 < C; nt += NT / 32) {   // warp-uniform
        float d[4];
        attn_score_tile<HD>(qa, stk, nt, d);
        const int r = lane >> 2, pp = nt * 8 + 2 * (lane & 3);
        if (r < g) {
            if (pp < C) sc[r * cap + pp] = d[0] + d[2];
            if (pp + 1 < C) sc[r * cap + pp + 1] = d[1] + d[3];
        }
    }
}

// acc += e[pp] x (16-byte chunk c of V row pp) for pp = p, p + S, ... < p1 (S = 32 / (HD / 8) positions per warp
// pass): a lane's share of a head's weighted V sums.
template <int HD>
MK_DEV void attn_v_sums(const float* e, const mk_bf16* stv, int p, int p1, int c, float (&acc)[8]) {
    constexpr int S = 32 / (HD / 8);
#pragma unroll 4
    for (int pp = p; pp < p1; pp += S) {
        const uint4 u = *(const uint4*)(stv + (size_t)pp * HD + 8 * c);
        const float w = e[pp];
        acc[0] += w * __uint_as_float(u.x << 16);
        acc[1] += w * __uint_as_float(u.x & 0xffff0000u);
        acc[2] += w * __uint_as_float(u.y << 16);
        acc[3] += w * __uint_as_float(u.y & 0xffff0000u);
        acc[4] += w * __uint_as_float(u.z << 16);
        acc[5] += w * __uint_as_float(u.z & 0xffff0000u);
        acc[6] += w * __uint_as_float(u.w << 16);
        acc[7] += w * __uint_as_float(u.w & 0xffff0000u);
    }
}

// Softmax weights and values of q head j = this warp (the caller runs it in warps j < g, after the scores), one
// chunk of positions: the warp finds the chunk's max, turns its head's scores into e = exp(s - max) in place, then
// lane (s, c) (c: one of the CH = HD / 8 16-byte chunks of the V row, s: every S = 32 / CH-th position; head_dim
// 96 leaves lanes S x CH .. 31 idle here) adds e * v over its positions, and shuffles over s sum them (a butterfly
// when CH is a power of two, else S = 2 and one shuffle down by CH). The running state is the head's partial record itself (pj: max,
// denominator, HD weighted sums; written by this warp, read back by it for a later chunk), so no register holds
// anything across the scores.
template <int HD>
MK_DEV void attn_head_values(float* sc, const mk_bf16* stv, int C, int cap, float* pj, bool first) {
    constexpr int CH = HD / 8, S = 32 / CH;
    constexpr bool POW2 = (CH & (CH - 1)) == 0;
    static_assert(HD % 16 == 0 && (POW2 || S == 2), "head_dim 64, 96 or 128");
    const int j = threadIdx.x >> 5, lane = threadIdx.x & 31, c = lane % CH, s0 = lane / CH;
    float* ej = sc + j * cap;
    float mx = -INFINITY;
    for (int pp = lane; pp < C; pp += 32) mx = fmaxf(mx, ej[pp]);
    const float m_old = first ? -INFINITY : pj[0];
    const float mn = fmaxf(m_old, warp_max(mx));
    float ls = 0.f;
    for (int pp = lane; pp < C; pp += 32) {
        const float e = expf(ej[pp] - mn);
        ej[pp] = e;
        ls += e;
    }
    __syncwarp();
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    attn_v_sums<HD>(ej, stv, s0 < S ? s0 : C, C, c, acc);
    if constexpr (POW2) {
#pragma unroll
        for (int o = CH; o < 32; o <<= 1)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[i] += mk_shfl_xor(acc[i], o);
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += mk_shfl_down(acc[i], CH);
    }
    ls = warp_sum(ls);
    const float corr = expf(m_old - mn);   // 0 on the first chunk (m_old = -inf)
    if (lane < CH) {
        float* o = pj + 2 + 8 * lane;
#pragma unroll
        for (int i = 0; i < 8; i += 2) {
            float2 v = make_float2(acc[i], acc[i + 1]);
            if (!first) {
                const float2 prev = *(const float2*)(o + i);
                v.x += prev.x * corr;
                v.y += prev.y * corr;
            }
            *(float2*)(o + i) = v;
        }
    }
    if (lane == 0) *(float2*)pj = make_float2(mn, first ? ls : pj[1] * corr + ls);
    __syncwarp();
}
