// Weight-streaming matrix-vector product of one instruction (bf16 rows x fp32 vector in shared memory).
// Included by monokernel.cu only (one translation unit); relies on its includes and defines.
#pragma once

// ---------------------------------------------------------------- matvec
// Output row r < nfirst reads weight row row0 + r, else off2 + row0 + (r - nfirst) (gate rows then up rows).
struct RowMap {
    const mk_bf16* base;
    int row0, nfirst, off2;
};

MK_DEV const mk_bf16* row_ptr(const RowMap& m, int r, int K) {
    const int row = r < m.nfirst ? m.row0 + r : m.off2 + m.row0 + (r - m.nfirst);
    return m.base + (size_t)row * K;
}

MK_DEV float dot8(const uint4 w, const float* v) {
    float f[8];
    mk_unpack8(w, f);
    const float4 a = *(const float4*)v, b = *(const float4*)(v + 4);
    return f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w + f[4] * b.x + f[5] * b.y + f[6] * b.z + f[7] * b.w;
}

// One batch of a warp's weight loads: items base and base + NW (32 lanes x U 16-byte chunks each).
MK_DEV void mv_load(const RowMap& m, int R, int K, int base, uint4 (&w)[2][U], int (&cb)[2]) {
    const int nch = K >> 3;
    const int ipr = (nch + 32 * U - 1) / (32 * U);
    const int items = R * ipr;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int it = base + k * NW;
        const int r = it / ipr, g = it - r * ipr;
        cb[k] = it < items ? g * 32 * U + lane : nch;
        const mk_bf16* row = row_ptr(m, it < items ? r : 0, K);
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const int c = cb[k] + j * 32;
            w[k][j] = c < nch ? mk_ld_stream16(row + (size_t)c * 8) : make_uint4(0, 0, 0, 0);
        }
    }
}

// The dot products of one batch (items base and base + NW, as loaded by mv_load) into red[item].
MK_DEV void mv_dot(int items, int nch, int base, const float* sv, float* red, const uint4 (&w)[2][U],
                   const int (&cb)[2]) {
    float acc[2] = {0.f, 0.f};
#pragma unroll
    for (int k = 0; k < 2; ++k) {
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const int c = cb[k] + j * 32;
            if (c < nch) acc[k] += dot8(w[k][j], sv + c * 8);
        }
    }
    acc[0] = warp_sum(acc[0]);
    acc[1] = warp_sum(acc[1]);
    if ((threadIdx.x & 31) == 0) {
        red[base] = acc[0];
        if (base + NW < items) red[base + NW] = acc[1];
    }
}

// out[r] = W[row(r), :K] . sv for r < R (out, sv, red in shared memory). Work is split in items of
// 32 lanes x U 16-byte chunks; each warp takes two items per batch, so 2U loads per lane are in flight.
// Two loops, one per library build (kernels/build.py, the host picks per model: schedule.mv_pipelined_model):
// - one register set (U = MV_UNROLL): a batch's loads are issued after the previous batch's arithmetic;
// - pipelined (MK_MV_PIPE, U = MV_UNROLL_PIPE): two batches in two register sets, the next batch's loads in
//   flight while the current one is computed, so the stream has no gap between batches. Its U is smaller so
//   that both sets fit 128 registers, which wastes load slots when K fits U = 3 items badly (K = 896).
// preloaded: the caller already issued the first batch (mv_load with base = warp) into w/cb before its wait.
// Partial sums go to red[item] and are added in a fixed order: results are bit-reproducible.
MK_DEV void matvec(const RowMap& m, int R, int K, const float* sv, float* red, float* out, uint4 (&w)[2][U],
                   int (&cb)[2], bool preloaded) {
    const int nch = K >> 3;
    const int ipr = (nch + 32 * U - 1) / (32 * U);
    const int items = R * ipr;
    const int warp = threadIdx.x >> 5;
#if MK_MV_PIPE
    uint4 w2[2][U];
    int cb2[2];
    if (warp < items && !preloaded) mv_load(m, R, K, warp, w, cb);
    for (int base = warp; base < items; base += 4 * NW) {
        const int b2 = base + 2 * NW;
        if (b2 < items) mv_load(m, R, K, b2, w2, cb2);                    // in flight while batch `base` runs
        mv_dot(items, nch, base, sv, red, w, cb);
        if (b2 + 2 * NW < items) mv_load(m, R, K, b2 + 2 * NW, w, cb);    // in flight during batch b2
        if (b2 < items) mv_dot(items, nch, b2, sv, red, w2, cb2);
    }
#else
    for (int base = warp; base < items; base += 2 * NW) {
        if (!(preloaded && base == warp)) mv_load(m, R, K, base, w, cb);
        mv_dot(items, nch, base, sv, red, w, cb);
    }
#endif
    __syncthreads();
    for (int r = threadIdx.x; r < R; r += NT) {
        float s = 0.f;
        for (int g = 0; g < ipr; ++g) s += red[r * ipr + g];
        out[r] = s;
    }
    __syncthreads();
}
