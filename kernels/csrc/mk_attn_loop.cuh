// The attention partial's position loop over one chunk of staged positions (op_attn in mk_attention.cuh), in two
// phases with one CTA barrier between them (the caller's); shared memory apart from the partial record, so
// bench/probes/attn_probe.cu times exactly this code on its own. The includer defines NT, warp_max and warp_sum
// (mk_block.cuh) and includes mk_isa.h (MK_KPAD) and mk_vendor.h (mk_shfl_xor).
#pragma once

// Staged K rows are padded to HD + MK_KPAD bf16 (MK_KPAD = 8: a 144- or 272-byte stride), so the 16-byte chunk ch
// of 8 consecutive positions falls in 8 different bank groups: no rotation needed, and the lanes of a warp (one q
// head, consecutive positions) read the same q chunk (a broadcast).

// scores: one thread per (q head j, position pp), 16 bytes of K and two broadcast float4 of q per step.
template <int HD>
MK_DEV void attn_scores(const float* sq, const mk_bf16* stk, float* sc, int g, int C, int cap) {
    for (int t = threadIdx.x; t < g * C; t += NT) {
        const int j = t / C, pp = t - j * C;
        const uint4* kr = (const uint4*)(stk + (size_t)pp * (HD + MK_KPAD));
        const float4* qj = (const float4*)(sq + j * HD);
        float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma unroll 2
        for (int ch = 0; ch < HD / 8; ++ch) {
            const uint4 u = kr[ch];
            const float4 a = qj[2 * ch], b = qj[2 * ch + 1];
            s0 += a.x * __uint_as_float(u.x << 16) + a.y * __uint_as_float(u.x & 0xffff0000u);
            s1 += a.z * __uint_as_float(u.y << 16) + a.w * __uint_as_float(u.y & 0xffff0000u);
            s2 += b.x * __uint_as_float(u.z << 16) + b.y * __uint_as_float(u.z & 0xffff0000u);
            s3 += b.z * __uint_as_float(u.w << 16) + b.w * __uint_as_float(u.w & 0xffff0000u);
        }
        sc[j * cap + pp] = (s0 + s1) + (s2 + s3);
    }
}

// Softmax weights and values of q head j = this warp (the caller runs it in warps j < g, after the scores), one
// chunk of positions: the warp finds the chunk's max, turns its head's scores into e = exp(s - max) in place, then
// lane (s, c) (c: a 16-byte chunk of the V row, s: every (32 / (HD / 8))-th position) adds e * v over its
// positions, and a butterfly over s sums them. The running state is the head's partial record itself (pj: max,
// denominator, HD weighted sums; written by this warp, read back by it for a later chunk), so no register holds
// anything across the scores.
template <int HD>
MK_DEV void attn_head_values(float* sc, const mk_bf16* stv, int C, int cap, float* pj, bool first) {
    constexpr int CH = HD / 8, S = 32 / CH;
    const int j = threadIdx.x >> 5, lane = threadIdx.x & 31, c = lane & (CH - 1), s0 = lane / CH;
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
#pragma unroll 4
    for (int pp = s0; pp < C; pp += S) {
        const uint4 u = *(const uint4*)(stv + (size_t)pp * HD + 8 * c);
        const float e = ej[pp];
        acc[0] += e * __uint_as_float(u.x << 16);
        acc[1] += e * __uint_as_float(u.x & 0xffff0000u);
        acc[2] += e * __uint_as_float(u.y << 16);
        acc[3] += e * __uint_as_float(u.y & 0xffff0000u);
        acc[4] += e * __uint_as_float(u.z << 16);
        acc[5] += e * __uint_as_float(u.z & 0xffff0000u);
        acc[6] += e * __uint_as_float(u.w << 16);
        acc[7] += e * __uint_as_float(u.w & 0xffff0000u);
    }
#pragma unroll
    for (int o = CH; o < 32; o <<= 1)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += mk_shfl_xor(acc[i], o);
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
