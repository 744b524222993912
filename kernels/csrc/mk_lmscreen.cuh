// The screened LM head (kernels/lm_screen.py: the rule and why its pick is the exact head's pick). One-GPU build.
// Included by monokernel.cu only (one translation unit); relies on its includes and defines.
#pragma once

// Element (k, j) of a screen batch (4 rows x 2 chunks) in the matvec's register set w[2][U].
#define LM8_W(w, k, j) w[(2 * (k) + (j)) / U][(2 * (k) + (j)) % U]
static_assert(2 * U == 8, "a screen batch is 8 chunks: the matvec's one register set");

// Batch bi of the screen's loop (rows 4 rq .. 4 rq + 3, chunk group g of ipr per row) of rows [row0, row0 + R).
MK_DEV void lm8_load(const signed char* q8, int row0, int R, int K, int bi, uint4 (&w)[2][U]) {
    const int lane = threadIdx.x & 31, nch = K >> 4, ipr = (nch + 63) >> 6;
    int g;
    const int rq = divmod_small(bi, ipr, g);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int r = 4 * rq + k;
        const signed char* row = q8 + (size_t)(row0 + min(r, R - 1)) * K;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int c = g * 64 + j * 32 + lane;
            LM8_W(w, k, j) = r < R && c < nch ? mk_ld_stream16(row + (size_t)c * 16) : make_uint4(0, 0, 0, 0);
        }
    }
}

// The bound on |approximate - exact logit| of a row (lm_screen.py): nx c + ex d, where nx, ex already carry their
// slack, plus 2^-20 |a| for the rounding of a -/+ the bound itself.
MK_DEV float lm8_bound(float a, float nx, float c, float ex, float d) {
    return fmaf(fabsf(a), 9.5367431640625e-7f, fmaf(ex, d, nx * c));
}

// The LMHEAD instruction's rows [row0, row0 + R) of K = d, screened. The block quantizes its input vector to int8
// in chunks of 16 (qx = round(x / s_c), s_c = max |x in chunk c| / 127), the int8 rows give exact integer dot
// products per chunk (dp4a) and a_r = s_r sum_c s_c (q_r . qx)_c; rows that can still win (lm_screen.candidates)
// get their exact logit with the exact head's arithmetic (matvec's mv_load / mv_dot, partial sums in group order)
// in out[r]; every other row gets NaN, which lm_record never picks (no candidate at all, e.g. NaN inputs: no
// token, as in the exact head). q8 / scale / cc / cd: the int8 copy and its per-row factors (kernels/lm_screen.py
// quantize); lmw: the bf16 LM head; st: the attention staging region, free here (runtime.Monokernel checks it
// holds lm_screen.staging_floats). More than MK_LM_CAND_MAX candidates: every row exactly, and *over = 1.
// w / pre: the matvec's register set, holding this warp's first batch when pre (lm8_load before the instruction's
// wait, so those loads are in flight through the wait, the final norm and x's quantization).
MK_DEV void lm_screen(const signed char* q8, const float* scale, const float* cc, const float* cd, const mk_bf16* lmw,
                      int row0, int R, int K, float T, unsigned long long seed, int step, const float* sv, float* red,
                      float* out, float* st, float* scr, int* over, uint4 (&w)[2][U], bool pre) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* gum = st + 3 * R;
    int* cand = (int*)(st + 4 * R);
    int* ncand = cand + MK_LM_CAND_MAX;
    uint4* qx = (uint4*)(st + ((4 * R + MK_LM_CAND_MAX + 4) & ~3));   // K int8, 16-byte aligned
    float* sxc = (float*)qx + K / 4;                                    // K / 16 chunk scales
    for (int r = threadIdx.x; r < R; r += NT) {   // in flight with the weight loads below
        mk_cp_async4(st + r, scale + row0 + r);
        mk_cp_async4(st + R + r, cc + row0 + r);
        mk_cp_async4(st + 2 * R + r, cd + row0 + r);
    }
    // x in int8 by chunks of 16 (4 threads x 4 elements); nx = ||x||, ex = ||x - dequantized x|| plus the fp32
    // accumulation's share (lm_screen.py), both with their slack
    float ss = 0.f, es = 0.f;
    for (int i = threadIdx.x * 4; i < K; i += NT * 4) {
        const float4 v = *(const float4*)(sv + svx(i));
        float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
        m = fmaxf(m, mk_shfl_xor(m, 1));
        m = fmaxf(m, mk_shfl_xor(m, 2));
        const float inv = m > 0.f ? 127.f / m : 0.f, sc = m / 127.f;
        if ((threadIdx.x & 3) == 0) sxc[i >> 4] = sc;
        const int a = max(-127, min(127, __float2int_rn(v.x * inv))), b = max(-127, min(127, __float2int_rn(v.y * inv)));
        const int c = max(-127, min(127, __float2int_rn(v.z * inv))), d = max(-127, min(127, __float2int_rn(v.w * inv)));
        ((int*)qx)[i >> 2] = (a & 0xff) | (b & 0xff) << 8 | (c & 0xff) << 16 | (d & 0xff) << 24;
        ss = sum_sq4(ss, v);
        es = sum_sq4(es, make_float4(v.x - sc * a, v.y - sc * b, v.z - sc * c, v.w - sc * d));
    }
    // the warps' partial sums now, their totals after the loop (x's norms are needed only by the bounds)
    ss = warp_sum(ss);
    es = warp_sum(es);
    if (lane == 0) {
        scr[warp] = ss;
        scr[NW + warp] = es;
    }
    __syncthreads();   // qx, sxc and the partial sums are in
    // Batches of four rows x 32 lanes x two 16-byte chunks (the bf16 matvec's bytes per batch; ipr chunk groups
    // per row when K > 1024), one set of registers: a warp's next loads follow its products.
    const int nch = K >> 4, ipr = (nch + 63) >> 6, nb = ((R + 3) >> 2) * ipr;
    float* dst = ipr == 1 ? out : red;
    for (int bi = warp; bi < nb; bi += NW) {
        int g;
        const int rq = divmod_small(bi, ipr, g);
        if (!pre || bi != warp) lm8_load(q8, row0, R, K, bi, w);   // pre: the first batch is in w already
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int c = min(g * 64 + j * 32 + lane, nch - 1);   // past the row: weights 0
            const uint4 a = qx[c];
            const float sc = sxc[c];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const uint4 wk = LM8_W(w, k, j);
                int q = __dp4a((int)wk.x, (int)a.x, 0);   // exact: |q| <= 16 x 127^2
                q = __dp4a((int)wk.y, (int)a.y, q);
                q = __dp4a((int)wk.z, (int)a.z, q);
                q = __dp4a((int)wk.w, (int)a.w, q);
                acc[k] = fmaf((float)q, sc, acc[k]);
            }
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            acc[k] = warp_sum(acc[k]);
            if (lane == 0 && 4 * rq + k < R) dst[(4 * rq + k) * ipr + g] = acc[k];
        }
    }
    mk_cp_async_wait_all();
    __syncthreads();
    // every warp totals the partial sums as block_sum's warp 0 does (same order, same bits): no barrier
    const float nx = sqrtf(warp_sum(lane < NW ? scr[lane] : 0.f)) * 1.001953125f;   // NORM_SLACK
    float ex = (sqrtf(warp_sum(lane < NW ? scr[NW + lane] : 0.f)) + nx * 9.5367431640625e-7f) * 1.001953125f;
    ex += (float)((K >> 4) + 3) * 5.9604645e-8f * (nx + ex) * 1.001953125f;
    float lmax = -INFINITY, gmax = -INFINITY;
    for (int r = threadIdx.x; r < R; r += NT) {
        float q = 0.f;
        for (int g = 0; g < ipr; ++g) q += dst[r * ipr + g];
        const float a = q * st[r];
        out[r] = a;
        const float lo = a - lm8_bound(a, nx, st[R + r], ex, st[2 * R + r]);
        lmax = fmaxf(lmax, lo);
        if (T > 0.f) {
            const float gr = mk_gumbel(seed, step, row0 + r);
            gum[r] = gr;
            gmax = fmaxf(gmax, lo / T + gr);
        }
    }
    lmax = block_max(lmax, scr);
    if (T > 0.f) gmax = block_max(gmax, scr);
    if (threadIdx.x == 0) *ncand = 0;
    __syncthreads();
    for (int r = threadIdx.x; r < R; r += NT) {
        const float a = out[r], hi = a + lm8_bound(a, nx, st[R + r], ex, st[2 * R + r]);
        const bool keep = hi >= lmax || (T > 0.f && hi / T + gum[r] >= gmax);
        if (keep) {
            const int k = atomicAdd(ncand, 1);
            if (k < MK_LM_CAND_MAX) cand[k] = r;
        }
    }
    __syncthreads();
    const int n = *ncand;
    if (n > MK_LM_CAND_MAX) {   // a flat distribution or a loose bound: every row exactly
        if (threadIdx.x == 0) *(volatile int*)over = 1;
        MvBatch b;
        matvec(RowMap{lmw, row0, R, 0}, R, K, sv, red, out, w, b, false);
        return;
    }
    for (int r = threadIdx.x; r < R; r += NT) out[r] = NAN;
    __syncthreads();
    // The candidates two by two per warp, each row's sum as the exact head's matvec computes it.
    const int nchb = K >> 3, iprb = (nchb + 32 * U - 1) / (32 * U);
    float* wred = red + warp * 2 * iprb;
    for (int pr = warp; 2 * pr < n; pr += NW) {
        const bool two = 2 * pr + 1 < n;
        const int r0 = cand[2 * pr], r1 = two ? cand[2 * pr + 1] : r0;
        const RowMap m{lmw, row0 + r0, 1, r1 - r0};
        for (int g = 0; g < iprb; ++g) {
            uint4 w[2][U];
            MvBatch b;
            mv_load(m, two ? 2 : 1, K, g, w, b);
            mv_dot(nchb, sv, wred, w, b);
        }
        __syncwarp();
        if (lane == 0) {
            float s0 = 0.f, s1 = 0.f;
            for (int g = 0; g < iprb; ++g) {
                s0 += wred[g];
                s1 += wred[iprb + g];
            }
            out[r0] = s0;
            if (two) out[r1] = s1;
        }
        __syncwarp();
    }
    __syncthreads();
}
