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

// A warp's batch: rows 2 rp and 2 rp + 1 over the same U x 32 chunks of the row, from chunk c0 + lane on (c0 = nch
// when the batch is past the end). The two rows share every activation load. Their partial sums go to red[red0]
// and red[red1] (red1 = -1 for the missing second row of an odd R).
struct MvBatch {
    int c0, red0, red1;
};

// dot8 of one chunk of rows 0 and 1 with the same activations: a, b are the chunk's 8 fp32 activations. Each
// row's expression is the single-row one (one dependent chain), so every row's sum is what it was per row.
MK_DEV void dot8x2(const uint4 w0, const uint4 w1, const float4 a, const float4 b, float& acc0, float& acc1) {
    float f[8], h[8];
    mk_unpack8(w0, f);
    mk_unpack8(w1, h);
    acc0 += f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w + f[4] * b.x + f[5] * b.y + f[6] * b.z + f[7] * b.w;
    acc1 += h[0] * a.x + h[1] * a.y + h[2] * a.z + h[3] * a.w + h[4] * b.x + h[5] * b.y + h[6] * b.z + h[7] * b.w;
}

// One batch of a warp's weight loads: batch bi (32 lanes x U 16-byte chunks of two rows).
MK_DEV void mv_load(const RowMap& m, int R, int K, int bi, uint4 (&w)[2][U], MvBatch& b) {
    const int nch = K >> 3;
    const int ipr = (nch + 32 * U - 1) / (32 * U);
    const int nb = ((R + 1) >> 1) * ipr;
    const int lane = threadIdx.x & 31;
    int g;
    const int rp = divmod_small(bi, ipr, g);   // not an integer division: the next batch's loads wait for it
    const int nrows = bi < nb ? min(2, R - 2 * rp) : 0;
    b.c0 = nrows > 0 ? g * 32 * U + lane : nch;
    b.red0 = 2 * rp * ipr + g;
    b.red1 = nrows > 1 ? b.red0 + ipr : -1;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const bool ok = k < nrows;
        const mk_bf16* row = row_ptr(m, ok ? 2 * rp + k : 0, K);
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const int c = b.c0 + j * 32;
            w[k][j] = ok && c < nch ? mk_ld_stream16(row + (size_t)c * 8) : make_uint4(0, 0, 0, 0);
        }
    }
}

// The dot products of one batch (as loaded by mv_load) into red[row * ipr + g] (g: the batch's chunk group).
// sv is in the swizzled layout (svx): the 8 activations of chunk c are the 16-byte units 2c ^ s and (2c + 1) ^ s,
// s = bit 2 of c, so the lanes of a quarter-warp read 8 distinct bank groups (no conflict).
MK_DEV void mv_dot(int nch, const float* sv, float* red, const uint4 (&w)[2][U], const MvBatch& b) {
    const float4* sv4 = (const float4*)sv;
    float acc0 = 0.f, acc1 = 0.f;
#if MK_TP
#pragma unroll
    for (int j = 0; j < U; ++j) {
        const int c = b.c0 + j * 32;
        if (c < nch) {
            const int s = (c >> 2) & 1;
            dot8x2(w[0][j], w[1][j], sv4[(2 * c) ^ s], sv4[(2 * c + 1) ^ s], acc0, acc1);
        }
    }
#else
    // Past the row's end (c >= nch) mv_load left zero weights: such a chunk reads the last chunk's activations instead
    // of branching around it (acc += 0 x finite leaves acc: the same sums), so a batch's activation loads and
    // products are one straight block the compiler schedules together. Session 18 (bench/NOTES.md): 0.5B 654 -> 634,
    // Llama 847 -> 833 us/token. The tensor-parallel build (not yet measured with it on several GPUs) keeps the
    // branch.
#pragma unroll
    for (int j = 0; j < U; ++j) {
        const int c = min(b.c0 + j * 32, nch - 1);
        const int s = (c >> 2) & 1;
        dot8x2(w[0][j], w[1][j], sv4[(2 * c) ^ s], sv4[(2 * c + 1) ^ s], acc0, acc1);
    }
#endif
    acc0 = warp_sum(acc0);
    acc1 = warp_sum(acc1);
    if ((threadIdx.x & 31) == 0 && b.c0 < nch) {   // lane 0's c0 < nch exactly when the batch has rows
        red[b.red0] = acc0;
        if (b.red1 >= 0) red[b.red1] = acc1;
    }
}

// After every warp's batches: out[r] = the sum of row r's ipr partials in red, in chunk-group order. Syncs before
// and after.
MK_DEV void mv_reduce(int R, int ipr, const float* red, float* out) {
    __syncthreads();
    for (int r = threadIdx.x; r < R; r += NT) {
        float s = 0.f;
        for (int g = 0; g < ipr; ++g) s += red[r * ipr + g];
        out[r] = s;
    }
    __syncthreads();
}

// out[r] = W[row(r), :K] . sv for r < R (out, sv, red in shared memory; sv swizzled, svx). Work is split in
// batches of two rows x 32 lanes x U 16-byte chunks, so 2U loads per lane are in flight.
// One register set (U = MV_UNROLL): a batch's loads are issued after the previous batch's arithmetic (the other 15
// warps' loads are in flight meanwhile). A pipelined loop with two register sets (the next batch's loads in flight
// during the current one's arithmetic, a smaller U) was built for long rows until session 21, which measured it
// slower than this loop on every shape (bench/NOTES.md): removed.
// preloaded: the caller already issued the first batch (mv_load with bi = warp) into w/b before its wait.
// Partial sums go to red[row * ipr + chunk group] and are added in a fixed order (with one chunk group per row the
// warps write them to out directly): results are bit-reproducible.
MK_DEV void matvec(const RowMap& m, int R, int K, const float* sv, float* red, float* out, uint4 (&w)[2][U],
                   MvBatch& b, bool preloaded) {
    const int nch = K >> 3;
    const int ipr = (nch + 32 * U - 1) / (32 * U);
    const int nb = ((R + 1) >> 1) * ipr;
    const int warp = threadIdx.x >> 5;
    // The warp's first batch (usually preloaded) outside the loop, and with one chunk group per row (ipr 1) the
    // warp sums are the outputs themselves: one barrier, no reduction pass. bench/NOTES.md (session 11): ~-0.1 us
    // per matvec stage in the 0.5B trace against the loop over every batch followed by mv_reduce.
    float* dst = ipr == 1 ? out : red;
    if (warp < nb) {
        if (!preloaded) mv_load(m, R, K, warp, w, b);
        mv_dot(nch, sv, dst, w, b);
    }
    for (int bi = warp + NW; bi < nb; bi += NW) {
        mv_load(m, R, K, bi, w, b);
        mv_dot(nch, sv, dst, w, b);
    }
    if (ipr == 1) __syncthreads();
    else mv_reduce(R, ipr, red, out);
}
