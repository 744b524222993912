// The attention partial's position loop over one chunk of staged positions (op_attn in mk_attention.cuh), phase by
// phase; shared memory only, so bench/probes/attn_probe.cu times exactly this code on its own. The includer
// defines NT, MK_MAX_GROUP, warp_max and warp_sum (mk_block.cuh). The caller syncs the CTA between the phases.
#pragma once

// scores: sc[j * cap + pp] = q_j . k_pp for q head j < g and position pp < C; one thread per (q head, position), the
// K row's words read rotated by the position so the 32 lanes of a warp hit 32 different banks.
template <int HD>
MK_DEV void attn_scores(const float* sq, const mk_bf16* stk, float* sc, int g, int C, int cap) {
    constexpr int W = HD / 2;   // bf16 pairs per row
    for (int t = threadIdx.x; t < g * C; t += NT) {
        const int j = t / C, pp = t - j * C;
        const unsigned* kr = (const unsigned*)(stk + (size_t)pp * HD);
        const float* qj = sq + j * HD;
        float s0 = 0.f, s1 = 0.f;
#pragma unroll 8
        for (int w = 0; w < W; ++w) {
            const int ww = (w + pp) & (W - 1);
            const unsigned u = kr[ww];
            const float2 qq = *(const float2*)(qj + 2 * ww);
            s0 += qq.x * __uint_as_float(u << 16);
            s1 += qq.y * __uint_as_float(u & 0xffff0000u);
        }
        sc[j * cap + pp] = s0 + s1;
    }
}

// softmax: one warp per q head: the chunk's max, the running max (sml[j]), the weights e = exp(s - max) in place,
// the running sum (sml[MK_MAX_GROUP + j]) and the rescale of the earlier chunks (sml[2 MK_MAX_GROUP + j]).
MK_DEV void attn_softmax(float* sc, float* sml, int g, int C, int cap) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp >= g) return;
    float* sj = sc + warp * cap;
    float mx = -INFINITY;
    for (int pp = lane; pp < C; pp += 32) mx = fmaxf(mx, sj[pp]);
    mx = warp_max(mx);
    const float m_old = sml[warp], m_new = fmaxf(m_old, mx);
    float sum = 0.f;
    for (int pp = lane; pp < C; pp += 32) {
        const float e = expf(sj[pp] - m_new);
        sj[pp] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    if (lane == 0) {
        const float corr = expf(m_old - m_new);   // 0 on the first chunk (m_old = -inf)
        sml[warp] = m_new;
        sml[MK_MAX_GROUP + warp] = sml[MK_MAX_GROUP + warp] * corr + sum;
        sml[2 * MK_MAX_GROUP + warp] = corr;
    }
}

// values: the owner of dims (od, od + 1) of q head oj adds sum_pp e_pp v_pp over the chunk to its running (a0, a1),
// rescaled by the chunk's correction.
template <int HD>
MK_DEV void attn_values(const float* sc, const mk_bf16* stv, const float* sml, int oj, int od, int C, int cap,
                        float& a0, float& a1) {
    const float* ej = sc + oj * cap;
    const mk_bf16* vcol = stv + od;
    float b0 = 0.f, b1 = 0.f;
#pragma unroll 4
    for (int pp = 0; pp < C; ++pp) {
        const unsigned u = *(const unsigned*)(vcol + (size_t)pp * HD);
        const float e = ej[pp];
        b0 += e * __uint_as_float(u << 16);
        b1 += e * __uint_as_float(u & 0xffff0000u);
    }
    const float corr = sml[2 * MK_MAX_GROUP + oj];
    a0 = a0 * corr + b0;
    a1 = a1 * corr + b1;
}
