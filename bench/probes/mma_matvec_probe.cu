// MMA matvec probe: how fast can one CTA (512 threads, one CTA per SM on every SM at once) compute
// out[r] = W[r, :K] . x for its own R bf16 rows (row-major) and an fp32 x, on the FMA units as the kernel does
// (mk_matvec.cuh) or on the tensor cores (mma m16n8k16, x split into bf16 hi + lo), with the rows already in shared
// memory or streamed from HBM.
//
// Modes (per call: thread 0 stamps %globaltimer between two barriers; one warm-up + REPS calls per launch; per call
// the median and max over CTAs, then the median of each over the calls):
//   fma-smem      the kernel's row-pair batches (2 rows x 32 lanes x U = 4 chunks of 8 bf16, its mv_dot on the
//                 swizzled fp32 activations), rows read from shared memory (raw layout, stride K: conflict-free)
//   fma-smem-rows (session 17) whole rows per warp, RBM independent row chains per lane, one warp_sum per row at
//                 the end (fma_smem_rows below); rows from shared memory as fma-smem
//   fma-l2        (session 18) fma-dram's code, but every call reads the same buffer: after the warm-up call the
//                 rows sit in L2 when every CTA's rows together fit it (the 0.5B and 16 x 896 shapes; 1.5B GATEUP's
//                 55 MB does not). Says whether weights staged in L2 ahead of a stage stream faster than from HBM
//                 at the kernel's bytes in flight (64 KB per SM), the premise of any L2 look-ahead
//   mma-l2        (session 18) the same for mma-dram
//   noop          (session 17) one barrier and nothing else: what the timing itself costs (two %globaltimer
//                 reads around a barrier), to subtract from every other mode
//   mma-smem      tensor cores (below), rows in shared memory in their raw row-major layout (stride K)
//   mma-smem-pad  a layout variant: the same with a row stride of KS = K rounded to 64, + 32 bf16. Lanes 0-7 (one
//                 phase of a 16-byte shared load) read 64 bytes of rows g = 0 and 1 at the same chunks: with a raw
//                 stride of 2 K bytes = 0 mod 128, as in every shape here, every A load conflicts two ways; padded
//                 (stride = 64 mod 128) none
//   mma-smem-acc  (session 18) mma-smem-pad with one accumulator per step of a batch (MMA_U independent mma
//                 chains instead of one: the mma's ~30-cycle latency no longer serialises a warp's share)
//   mma-ldsm      (session 18) tensor cores fed the standard way: ldmatrix.x4 of a 16-row x 16-k tile of the rows
//                 (row stride = 16 bytes mod 128: conflict-free), B = x hi / lo as columns 0 / 1, MMA_U independent
//                 accumulators; each 16-row tile's k-steps split evenly over NW / tiles warps, one partial per warp
//                 and row, summed in warp order. Needs K % 16 == 0 and at most NW tiles. The smem floor: 128 bytes
//                 per clock per SM, so 74 x 896 (132 KB) cannot take less than ~0.55 us
//   fma-dram      the kernel's matvec() itself (mk_matvec.cuh, one-set build: 2 rows x U = 8 16-byte streaming
//                 loads in flight per lane, then the arithmetic)
//   mma-dram      tensor cores with streaming loads, MMA_U = 4 steps = 8 16-byte loads in flight per lane
// DRAM modes: call i reads buffer i % nbuf of a 256 MiB pool (a buffer = every CTA's rows); at least two other
// buffers (>= 160 MB) are read between two reads of one buffer, L2 holds 50 MB, and 128 MB of scratch are written
// before every launch: the rows come from HBM.
// mma: per call, x (fp32, swizzled as the kernel's sv) -> bf16 hi = bf16(x), lo = bf16(x - hi) in shared memory
// (timed), step s's 32 k as one 128-byte row: 64 bytes hi, 64 bytes lo. A warp's tile is 16 rows; lane (g = lane / 4,
// t = lane % 4) loads 16 bytes of rows g and g + 8 at chunk 4 s + t (every row uses the same k permutation, so the
// fragment's k slots only need to agree between A and B): mma 0 takes values 0-3 of both chunks, mma 1 values 4-7.
// B: column 0 = hi, column 1 = lo (lanes g = 0, 1 load 16 bytes of the hi / lo row at chunk 4 s + t), columns 2-7
// zero; row g's result is d[0] + d[1] of lane (g, 0), row g + 8's d[2] + d[3]. The (tile, step) pairs are split
// evenly over the 16 warps in tile-major order; a warp stores its partial of a tile when it leaves the tile, the
// partials are added in warp order (bit-reproducible). Rows past R load zeros; chunks past K / 8 too.
// Rates: GB/s per SM = R K 2 / median time; TB/s (DRAM modes) = all CTAs' bytes / median time. err: per CTA
// max |out - ref| / max |ref| (ref in double on the host, same bf16 W and fp32 x), max over CTAs, last call.
// At start the host checks the fragment map (PTX ISA m16n8k16 .row.col bf16 layout) and the warp split: every
// (row < R, k < K) of every shape is used exactly once, A and B agree on the k of every slot.
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -Xptxas -v -I kernels/csrc \
//        bench/probes/mma_matvec_probe.cu -o /tmp/mma_matvec_probe && /tmp/mma_matvec_probe
// ptxas -v (nvcc 13.0, sm_90a), registers / spill bytes per kernel: fma-smem 71 / 0, mma-smem 100 / 0,
// mma-smem-pad 102 / 0, fma-dram 72 / 0, mma-dram 105 / 0 (probe<0> .. probe<4>, session 10); fma-smem-rows 56 / 0.
// Prints one line per (shape, mode), then a JSON line.
// Recorded (bench/NOTES.md session 10, one H200, us median per call): 0.5B GATEUP (74 x 896) fma-smem 2.69, mma-smem
// 3.81, mma-smem-pad 3.30, fma-dram 5.06, mma-dram 6.14; 0.5B DOWN (7 x 4864) 1.76 / 3.71 / 3.55 / 3.23 / 5.28; 1.5B
// GATEUP (136 x 1536, DRAM only) fma 13.98, mma 15.14; 16 x 896 fma-smem 0.90, mma-smem 1.54. The fragment map check
// passed, mma errors 4-5e-6 (fma 1-3e-7): the tensor-core loop as written is slower than the FMA loop in every mode.
// Session 18 (calls 1, 3, 4; the fma modes still with the branchy mv_dot of before a1e3c25): 74 x 896 fma-smem-rows
// 2.21, mma-smem-acc 3.42, mma-ldsm 2.37, fma-dram 4.99 against fma-l2 4.67; 7 x 4864 fma-dram 3.30 / fma-l2 2.85;
// 16 x 896 1.38 / 0.99: rows in L2 stream only 6-14 % faster than from HBM at the kernel's bytes in flight.
// ptxas -v: mma-smem-acc 114 / 0, mma-ldsm 76 / 0.
#include "mk_vendor.h"
#include "probe_data.h"
#include "mk_isa.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#define NT MK_NTHREADS
#define NW MK_NWARPS
#define U MK_MV_UNROLL      // the kernel's one-set matvec unroll (chunks per lane per row of a batch)
#define MMA_U 4             // mma-dram / mma-smem: steps (2 16-byte loads each) per lane per batch
#define REPS 50
#include "mk_block.cuh"     // warp_sum, svx (the activations' swizzle)
#include "mk_matvec.cuh"    // MvBatch, mv_dot, mv_reduce, matvec: the kernel's FMA matvec

enum { FMA_SMEM, FMA_SMEM_ROWS, MMA_SMEM, MMA_SMEM_PAD, MMA_SMEM_ACC, MMA_LDSM, FMA_DRAM, MMA_DRAM, FMA_L2, MMA_L2,
       NOOP, NMODES };
static const char* kModes[NMODES] = {"fma-smem", "fma-smem-rows", "mma-smem", "mma-smem-pad", "mma-smem-acc",
                                     "mma-ldsm", "fma-dram", "mma-dram", "fma-l2", "mma-l2", "noop"};
#define RBM 8               // fma-smem-rows: rows per warp at once (independent chains)
__host__ __device__ constexpr bool is_smem(int m) { return m <= MMA_LDSM; }
HOSTDEV int row_stride(int m, int K) {
    if (m == MMA_LDSM) return (K + 63) / 64 * 64 + 8;   // 16 bytes mod 128: an ldmatrix phase's 8 rows, 8 bank groups
    return m == MMA_SMEM_PAD || m == MMA_SMEM_ACC ? (K + 31) / 64 * 64 + 32 : K;
}

// ---- the mma fragment map, shared by the device code and the host check. PTX ISA, m16n8k16 .bf16 (g = lane / 4,
// t = lane % 4): A register j holds row g + 8 (j & 1), k slots 2t + 8 (j >> 1) + {0, 1}; B register j column g,
// k slots 2t + 8 j + {0, 1}; D: d[0], d[1] row g, columns 2t, 2t + 1; d[2], d[3] row g + 8. Lane (g, t) holds 16
// bytes (4 words, values 0-7) of rows g and g + 8 and of the hi / lo activations, all at chunk 4 s + t; mma m:
HOSTDEV int a_row8(int j) { return j & 1; }                   // A register j: the chunk of row g (0) or g + 8 (1)
HOSTDEV int a_word(int m, int j) { return 2 * m + (j >> 1); } // ... its word (values 2 word, 2 word + 1)
HOSTDEV int b_word(int m, int j) { return 2 * m + j; }        // B register j: word of the hi (g = 0) / lo (g = 1) chunk
HOSTDEV int hilo_at(int k) { return (k >> 5) * 64 + (k & 31); } // bf16 index of hi(k); lo(k) is 32 further
// warp w's share [w T / NW, (w + 1) T / NW) of the T = tiles x steps (tile, step) pairs, tile-major
HOSTDEV int share_lo(int w, int T) { return w * T / NW; }
HOSTDEV bool share_has_tile(int w, int T, int ns, int tile) {
    const int lo = share_lo(w, T), hi = share_lo(w + 1, T);
    return lo < hi && lo < (tile + 1) * ns && hi > tile * ns;
}
// (tile, step) of the pair j places after (tile, s0) in tile-major order, j <= ns
HOSTDEV void pair_at(int tile, int s0, int j, int ns, int& tj, int& sj) {
    sj = s0 + j;
    tj = tile;
    if (sj >= ns) { sj -= ns; ++tj; }
}

// Shared memory (byte offsets): sv fp32 [Kp], hi/lo [Kp x 2 bf16], red, out [R], rows [R x KS bf16] (smem modes).
struct Lay { int hl, red, out, rows, bytes; };
HOSTDEV Lay layout(int R, int K, int KS, bool rows) {
    const int ns = (K / 8 + 3) / 4, Kp = ns * 32, ipr = (K / 8 + 32 * U - 1) / (32 * U);
    const int mred = NW * ((R + 15) / 16 * 16), redn = mred > R * ipr ? mred : R * ipr;
    Lay l;
    l.hl = Kp * 4;
    l.red = l.hl + Kp * 4;
    l.out = l.red + (redn + 3) / 4 * 16;
    l.rows = l.out + (R + 3) / 4 * 16;
    l.bytes = l.rows + (rows ? (R + 15) / 16 * 16 * KS * 2 : 0);   // whole 16-row tiles (mma-ldsm reads them)
    return l;
}

MK_DEV unsigned word(const uint4& u, int q) { return q == 0 ? u.x : q == 1 ? u.y : q == 2 ? u.z : u.w; }
MK_DEV unsigned pack_bf16x2(float lo_half, float hi_half) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(lo_half, hi_half);
    return *(const unsigned*)&p;
}

// 16 bytes of row r at chunk c: rows in shared memory (stride KS) or streamed from W (stride K); zeros if !ok.
template <bool SMEM>
MK_DEV uint4 load_row(const mk_bf16* W, const mk_bf16* rows, int KS, int K, int r, int c, bool ok) {
    if (!ok) return make_uint4(0, 0, 0, 0);
    if (SMEM) return *(const uint4*)(rows + r * KS + 8 * c);
    return mk_ld_stream16(W + (size_t)r * K + 8 * c);
}

// fma-smem: the kernel's batches (mv_load's split, mv_dot's arithmetic and partials) with rows from shared memory.
MK_DEV void fma_smem(const mk_bf16* rows, int KS, int R, int K, const float* sv, float* red, float* out) {
    const int nch = K >> 3, ipr = (nch + 32 * U - 1) / (32 * U), nb = ((R + 1) >> 1) * ipr, lane = threadIdx.x & 31;
    for (int bi = threadIdx.x >> 5; bi < nb; bi += NW) {
        const int rp = bi / ipr, gi = bi - rp * ipr, nrows = min(2, R - 2 * rp);
        MvBatch b;
        b.c0 = gi * 32 * U + lane;
        b.red0 = 2 * rp * ipr + gi;
        b.red1 = nrows > 1 ? b.red0 + ipr : -1;
        uint4 w[2][U];
#pragma unroll
        for (int k = 0; k < 2; ++k)
#pragma unroll
            for (int j = 0; j < U; ++j)
                w[k][j] = load_row<true>(nullptr, rows, KS, K, 2 * rp + k, b.c0 + 32 * j,
                                         k < nrows && b.c0 + 32 * j < nch);
        mv_dot(nch, sv, red, w, b);
    }
    mv_reduce(R, ipr, red, out);
}

// fma-smem-rows (session 17): whole rows per warp instead of the kernel's row-pair batches with their cross-warp
// partials. Warp w takes rows w, w + NW, ... (RBM at a time, one independent fp32 chain each), its lanes the 16-byte
// chunks lane, lane + 32, ... of every row, each chunk's 8 activations loaded once for all RBM rows; one warp_sum per
// row at the end and lane 0 writes out[r]: no partials in shared memory, no reduction pass, one barrier. If this is
// much faster than fma-smem, the FMA loop was bound by its batch structure (short chains, a shuffle reduction and a
// partial store per 2 rows), and weights kept on chip (a stash) could be consumed at a far higher rate.
MK_DEV void fma_smem_rows(const mk_bf16* rows, int KS, int R, int K, const float* sv, float* out) {
    const int nch = K >> 3, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float4* sv4 = (const float4*)sv;
    for (int r0 = warp; r0 < R; r0 += NW * RBM) {
        float acc[RBM];
#pragma unroll
        for (int j = 0; j < RBM; ++j) acc[j] = 0.f;
        for (int c = lane; c < nch; c += 32) {
            const int s = (c >> 2) & 1;   // svx: chunk c's 16-byte halves swapped when bit 2 of c is set
            const float4 a = sv4[(2 * c) ^ s], b = sv4[(2 * c + 1) ^ s];
#pragma unroll
            for (int j = 0; j < RBM; ++j) {
                const int r = r0 + j * NW;
                if (r < R) {   // warp-uniform
                    float f[8];
                    mk_unpack8(*(const uint4*)(rows + r * KS + 8 * c), f);
                    acc[j] += f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w + f[4] * b.x + f[5] * b.y +
                              f[6] * b.z + f[7] * b.w;
                }
            }
        }
#pragma unroll
        for (int j = 0; j < RBM; ++j) acc[j] = warp_sum(acc[j]);
        if (lane == 0)
#pragma unroll
            for (int j = 0; j < RBM; ++j)
                if (r0 + j * NW < R) out[r0 + j * NW] = acc[j];
    }
    __syncthreads();
}

// lanes t = 0 store the tile's rows g, g + 8 (columns 0 + 1: hi + lo products, summed over the NA accumulators)
// to this warp's partials
template <int NA>
MK_DEV void mma_flush(float* redw, float (&d)[NA][4], int g, int t) {
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int a = 0; a < NA; ++a) {
        s0 += d[a][0] + d[a][1];
        s1 += d[a][2] + d[a][3];
        d[a][0] = d[a][1] = d[a][2] = d[a][3] = 0.f;
    }
    if (t == 0) { redw[g] = s0; redw[g + 8] = s1; }
}

// x -> bf16 hi = bf16(x), lo = bf16(x - hi) at hilo_at (the mma modes' B operand); chunks past nch zero
MK_DEV void make_hilo(const float* sv, mk_bf16* hl, int nch, int ns) {
    const float4* sv4 = (const float4*)sv;
    for (int c = threadIdx.x; c < 4 * ns; c += NT) {
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
        if (c < nch) {
            const int s = (c >> 2) & 1;   // svx: chunk c's 16-byte halves swapped when bit 2 of c is set
            a = sv4[(2 * c) ^ s];
            b = sv4[(2 * c + 1) ^ s];
        }
        const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        unsigned h[4], l[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            h[q] = pack_bf16x2(v[2 * q], v[2 * q + 1]);
            l[q] = pack_bf16x2(v[2 * q] - __uint_as_float(h[q] << 16),
                               v[2 * q + 1] - __uint_as_float(h[q] & 0xffff0000u));
        }
        *(uint4*)(hl + hilo_at(8 * c)) = make_uint4(h[0], h[1], h[2], h[3]);
        *(uint4*)(hl + hilo_at(8 * c) + 32) = make_uint4(l[0], l[1], l[2], l[3]);
    }
}

// mma-smem / mma-dram (see the header); red: NW x RT * 16 partials, out: R results. Needs ns >= MMA_U.
template <bool SMEM, int NA = 1>
MK_DEV void mma_matvec(const mk_bf16* W, const mk_bf16* rows, int KS, int R, int K, const float* sv, mk_bf16* hl,
                       float* red, float* out) {
    const int nch = K >> 3, ns = (nch + 3) >> 2, RT = (R + 15) >> 4, T = RT * ns, RP = RT * 16;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    make_hilo(sv, hl, nch, ns);
    __syncthreads();
    const int lo = share_lo(warp, T), hi = share_lo(warp + 1, T);
    int tile = lo / ns, s0 = lo - tile * ns, cur = tile;
    float d[NA][4] = {};
    for (int base = lo; base < hi; base += MMA_U) {
        uint4 wa[MMA_U], wb[MMA_U];   // rows g, g + 8 of MMA_U steps: all loads issued before any mma
#pragma unroll
        for (int j = 0; j < MMA_U; ++j) {
            int tj, sj;
            pair_at(tile, s0, j, ns, tj, sj);
            const int c = 4 * sj + t, ra = tj * 16 + g;
            const bool ok = base + j < hi && c < nch;
            wa[j] = load_row<SMEM>(W, rows, KS, K, ra, c, ok && ra < R);
            wb[j] = load_row<SMEM>(W, rows, KS, K, ra + 8, c, ok && ra + 8 < R);
        }
#pragma unroll
        for (int j = 0; j < MMA_U; ++j) {
            int tj, sj;
            pair_at(tile, s0, j, ns, tj, sj);
            if (base + j < hi) {   // warp-uniform
                if (tj != cur) { mma_flush(red + warp * RP + cur * 16, d, g, t); cur = tj; }
                const uint4 x = g < 2 ? *(const uint4*)(hl + hilo_at(32 * sj + 8 * t) + 32 * g)   // hi / lo
                                      : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    unsigned a[4], b[2];
#pragma unroll
                    for (int q = 0; q < 4; ++q) a[q] = word(a_row8(q) ? wb[j] : wa[j], a_word(m, q));
                    b[0] = word(x, b_word(m, 0));
                    b[1] = word(x, b_word(m, 1));
                    mk_mma_bf16(d[NA > 1 ? j % NA : 0], a, b);
                }
            }
        }
        pair_at(tile, s0, MMA_U, ns, tile, s0);
    }
    if (lo < hi) mma_flush(red + warp * RP + cur * 16, d, g, t);
    __syncthreads();
    for (int r = threadIdx.x; r < R; r += NT) {
        float s = 0.f;
        for (int w = 0; w < NW; ++w)
            if (share_has_tile(w, T, ns, r >> 4)) s += red[w * RP + r];
        out[r] = s;
    }
    __syncthreads();
}

// mma-ldsm (see the header). rows: (R + 15) / 16 whole tiles, stride KS; red: NW x 16 partials; out: R results.
MK_DEV void mma_ldsm(const mk_bf16* rows, int KS, int R, int K, const float* sv, mk_bf16* hl, float* red,
                     float* out) {
    const int nch = K >> 3, ns = (nch + 3) >> 2, S = K >> 4, T = (R + 15) >> 4, WPT = NW / T;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    make_hilo(sv, hl, nch, ns);
    __syncthreads();
    if (warp < T * WPT) {
        const int tile = warp / WPT, part = warp - tile * WPT;
        const int s0 = part * S / WPT, s1 = (part + 1) * S / WPT;
        // lane l: row l % 16 of the tile, k half (l / 16) * 8 of the step (ldmatrix tiles m0..m3 = the A fragment)
        const unsigned abase = mk_smem_addr(rows + (tile * 16 + (lane & 15)) * KS + (lane >> 4) * 8);
        const mk_bf16* bsrc = hl + 32 * (g & 1);
        float d[MMA_U][4] = {};
        int s = s0;
        for (; s + MMA_U <= s1; s += MMA_U) {
            unsigned a[MMA_U][4], b[MMA_U][2];
#pragma unroll
            for (int j = 0; j < MMA_U; ++j) {
                mk_ldsm_x4(abase + (s + j) * 32, a[j]);
                const int k = 16 * (s + j) + 2 * t;
                b[j][0] = g < 2 ? *(const unsigned*)(bsrc + hilo_at(k)) : 0u;
                b[j][1] = g < 2 ? *(const unsigned*)(bsrc + hilo_at(k + 8)) : 0u;
            }
#pragma unroll
            for (int j = 0; j < MMA_U; ++j) mk_mma_bf16(d[j], a[j], b[j]);
        }
        for (; s < s1; ++s) {
            unsigned a[4], b[2];
            mk_ldsm_x4(abase + s * 32, a);
            const int k = 16 * s + 2 * t;
            b[0] = g < 2 ? *(const unsigned*)(bsrc + hilo_at(k)) : 0u;
            b[1] = g < 2 ? *(const unsigned*)(bsrc + hilo_at(k + 8)) : 0u;
            mk_mma_bf16(d[0], a, b);
        }
        float lo8 = 0.f, hi8 = 0.f;
#pragma unroll
        for (int j = 0; j < MMA_U; ++j) {
            lo8 += d[j][0] + d[j][1];
            hi8 += d[j][2] + d[j][3];
        }
        if (t == 0) {
            red[warp * 16 + g] = lo8;
            red[warp * 16 + g + 8] = hi8;
        }
    }
    __syncthreads();
    for (int r = threadIdx.x; r < R; r += NT) {
        const int tile = r >> 4;
        float v = 0.f;
        for (int q = 0; q < WPT; ++q) v += red[(tile * WPT + q) * 16 + (r & 15)];
        out[r] = v;
    }
    __syncthreads();
}

// One CTA per SM. CTA b's rows of buffer i: pool + i * buf + b R K. ns: [REPS][grid] per-call times; out_g: the
// last call's results (buffer REPS % nbuf; the smem modes copy that buffer's rows once, before the calls).
template <int MODE>
__global__ void __launch_bounds__(NT, 1) probe(const mk_bf16* pool, size_t buf, int nbuf, const float* x, int R,
                                               int K, unsigned long long* ns, float* out_g) {
    extern __shared__ float4 smem4[];
    char* sm = (char*)smem4;
    const int KS = row_stride(MODE, K);
    const Lay L = layout(R, K, KS, is_smem(MODE));
    float* sv = (float*)sm;
    mk_bf16* hl = (mk_bf16*)(sm + L.hl);
    float* red = (float*)(sm + L.red);
    float* out = (float*)(sm + L.out);
    mk_bf16* rows = (mk_bf16*)(sm + L.rows);
    const size_t cta = (size_t)blockIdx.x * R * K;
    for (int i = threadIdx.x; i < L.hl / 4; i += NT) sv[svx(i)] = i < K ? x[i] : 0.f;
    if (is_smem(MODE)) {
        const mk_bf16* src = pool + (size_t)(REPS % nbuf) * buf + cta;
        for (int e = threadIdx.x; e < R * (K >> 3); e += NT) {
            const int r = e / (K >> 3), c = e - r * (K >> 3);
            *(uint4*)(rows + r * KS + 8 * c) = *(const uint4*)(src + (size_t)r * K + 8 * c);
        }
        for (int e = R * KS + threadIdx.x; e < (R + 15) / 16 * 16 * KS; e += NT) rows[e] = mk_f2bf(0.f);

    }
    uint4 w[2][U];   // fma-dram: the kernel matvec's registers
    MvBatch b;
    unsigned long long t0 = 0;
    for (int rep = 0; rep <= REPS; ++rep) {
        const mk_bf16* Wr = pool + (size_t)(rep % nbuf) * buf + cta;
        __syncthreads();
        if (threadIdx.x == 0) t0 = mk_globaltimer();
        if (MODE == FMA_SMEM) fma_smem(rows, KS, R, K, sv, red, out);
        else if (MODE == FMA_SMEM_ROWS) fma_smem_rows(rows, KS, R, K, sv, out);
        else if (MODE == NOOP) __syncthreads();
        else if (MODE == MMA_LDSM) mma_ldsm(rows, KS, R, K, sv, hl, red, out);
        else if (MODE == FMA_DRAM) matvec(RowMap{Wr, 0, R, 0}, R, K, sv, red, out, w, b, false);
        else mma_matvec<is_smem(MODE), MODE == MMA_SMEM_ACC ? MMA_U : 1>(Wr, rows, KS, R, K, sv, hl, red, out);
        if (threadIdx.x == 0 && rep > 0) ns[(size_t)(rep - 1) * gridDim.x + blockIdx.x] = mk_globaltimer() - t0;
    }
    for (int r = threadIdx.x; r < R; r += NT) out_g[(size_t)blockIdx.x * R + r] = out[r];
}

// Host emulation of mma_matvec's indexing for one shape: A and B agree on every k slot, and every (row < R, k < K)
// is multiplied exactly once (by hi and lo), the reduction picks exactly the warps that touched each tile.
static bool check_map(int R, int K) {
    const int nch = K / 8, ns = (nch + 3) / 4, RT = (R + 15) / 16, T = RT * ns;
    int koff[2][16];   // mma m, k slot -> k offset within the step (32 s + koff)
    for (int m = 0; m < 2; ++m) {
        for (int q = 0; q < 16; ++q) koff[m][q] = -1;
        for (int lane = 0; lane < 32; ++lane) {
            const int g = lane / 4, t = lane % 4;
            for (int i = 0; i < 8; ++i) {   // A element a_i: register i / 2, half i % 2
                const int j = i / 2, slot = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
                const int ptx_row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
                const int k = 8 * t + 2 * a_word(m, j) + (i & 1);
                if (g + 8 * a_row8(j) != ptx_row || (koff[m][slot] >= 0 && koff[m][slot] != k)) return false;
                koff[m][slot] = k;
            }
        }
        for (int lane = 0; lane < 8; ++lane) {   // B element b_i of columns 0 (hi), 1 (lo): same k as A's slot
            const int t = lane % 4;
            for (int i = 0; i < 4; ++i) {
                const int slot = 2 * t + (i & 1) + (i >= 2 ? 8 : 0);
                if (koff[m][slot] != 8 * t + 2 * b_word(m, i / 2) + (i & 1)) return false;
            }
        }
    }
    std::vector<int> cov((size_t)R * K, 0), hl(ns * 64, 0);
    for (int k = 0; k < ns * 32; ++k) {   // 16-byte chunks contiguous in the hi / lo rows, hi and lo disjoint
        if (hilo_at(k) != hilo_at(k & ~7) + (k & 7) || hilo_at(k) % 64 >= 32) return false;
        ++hl[hilo_at(k)];
        ++hl[hilo_at(k) + 32];
    }
    for (int v : hl)
        if (v != 1) return false;
    for (int w = 0; w < NW; ++w) {
        const int lo = share_lo(w, T), hi = share_lo(w + 1, T);
        int tile = lo / ns, s0 = lo - tile * ns;
        for (int base = lo; base < hi; base += MMA_U) {
            for (int j = 0; j < MMA_U && base + j < hi; ++j) {
                int tj, sj;
                pair_at(tile, s0, j, ns, tj, sj);
                if (tj * ns + sj != base + j || !share_has_tile(w, T, ns, tj)) return false;
                for (int m = 0; m < 2; ++m)
                    for (int q = 0; q < 16; ++q)
                        for (int r = tj * 16; r < tj * 16 + 16; ++r) {
                            const int k = 32 * sj + koff[m][q];
                            if (r < R && k / 8 < nch) ++cov[(size_t)r * K + k];
                        }
            }
            pair_at(tile, s0, MMA_U, ns, tile, s0);
        }
    }
    for (int tile = 0; tile < RT; ++tile)   // a warp whose share misses the tile must not be selected
        for (int w = 0; w < NW; ++w) {
            bool touches = false;
            for (int p = share_lo(w, T); p < share_lo(w + 1, T); ++p) touches |= p / ns == tile;
            if (touches != share_has_tile(w, T, ns, tile)) return false;
        }
    for (int v : cov)
        if (v != 1) return false;
    return ns >= MMA_U;
}

template <int MODE>
static cudaError_t launch(int nsm, int smem, const mk_bf16* pool, size_t buf, int nbuf, const float* x, int R, int K,
                          unsigned long long* ns, float* out) {
    cudaFuncSetAttribute(probe<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    probe<MODE><<<nsm, NT, smem>>>(pool, buf, nbuf, x, R, K, ns, out);
    cudaDeviceSynchronize();
    return cudaGetLastError();
}

int main() {
    int nsm = 0, optin = 0;
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    struct Shape { int R, K; const char* what; };
    const Shape shapes[] = {{74, 896, "0.5B GATEUP"}, {7, 4864, "0.5B DOWN"}, {136, 1536, "1.5B GATEUP"},
                            {16, 896, "16 x 896"}, {64, 4864, "64 x 4864"}};
    for (const Shape& s : shapes)
        if (s.K % 8 || !check_map(s.R, s.K)) { printf("fragment map check failed: R %d K %d\n", s.R, s.K); return 2; }
    printf("fragment map check passed (every row x k once, A / B k slots agree)\n");
    const size_t pool_n = (size_t)128 << 20;   // 256 MiB of bf16 rows
    mk_bf16* pool;
    float *x, *out;
    unsigned long long* ns;
    char* scratch;   // written before every launch: no earlier launch's rows stay in L2
    cudaMalloc(&pool, pool_n * 2);
    cudaMalloc(&scratch, 128 << 20);
    cudaMalloc(&x, sizeof(float) * 8192);
    cudaMalloc(&out, sizeof(float) * nsm * 256);
    cudaMalloc(&ns, sizeof(unsigned long long) * REPS * nsm);
    fill<<<1024, 256>>>(pool, pool_n);
    if (cudaDeviceSynchronize() != cudaSuccess) {
        printf("setup: %s\n", cudaGetErrorString(cudaGetLastError()));
        return 2;
    }
    // one CTA per SM even where the probe needs little shared memory: ask for more than half an SM's
    const int min_smem = std::min(optin, 120 * 1024);
    printf("%-12s %4s %5s %-13s %8s %8s %8s %7s %9s  (%d SMs, %d calls, mma unroll %d, fma unroll %d)\n", "shape", "R",
           "K", "mode", "med us", "max us", "GB/s/SM", "TB/s", "err", nsm, REPS, MMA_U, U);
    std::string json = "{\"probe\": \"mma_matvec\", \"reps\": " + std::to_string(REPS) +
                       ", \"mma_unroll\": " + std::to_string(MMA_U) + ", \"fma_unroll\": " + std::to_string(U) +
                       ", \"rows\": [";
    bool ok = true;
    for (const Shape& sh : shapes) {
        const int R = sh.R, K = sh.K;
        const size_t buf = (size_t)nsm * R * K;
        const int nbuf = (int)(pool_n / buf), last = REPS % nbuf;
        std::vector<float> hx;
        std::vector<double> ref, big;
        host_reference((size_t)last * buf, nsm, R, K, hx, ref, big);
        cudaMemcpy(x, hx.data(), sizeof(float) * K, cudaMemcpyHostToDevice);
        for (int mode = 0; mode < NMODES; ++mode) {
            const Lay L = layout(R, K, row_stride(mode, K), is_smem(mode));
            char b[512];
            if (L.bytes > optin) {
                printf("%-12s %4d %5d %-13s skipped: %d KB of shared memory > %d KB\n", sh.what, R, K, kModes[mode],
                       L.bytes / 1024, optin / 1024);
                snprintf(b, sizeof b, "%s{\"R\": %d, \"K\": %d, \"mode\": \"%s\", \"skipped\": true}",
                         json.back() == '[' ? "" : ", ", R, K, kModes[mode]);
                json += b;
                continue;
            }
            const int smem = std::max(L.bytes, min_smem);
            cudaMemset(out, 0, sizeof(float) * nsm * R);
            cudaMemset(scratch, mode, 128 << 20);
            cudaError_t e;
            switch (mode) {
            case FMA_SMEM: e = launch<FMA_SMEM>(nsm, smem, pool, buf, nbuf, x, R, K, ns, out); break;
            case FMA_SMEM_ROWS: e = launch<FMA_SMEM_ROWS>(nsm, smem, pool, buf, nbuf, x, R, K, ns, out); break;
            case MMA_SMEM: e = launch<MMA_SMEM>(nsm, smem, pool, buf, nbuf, x, R, K, ns, out); break;
            case MMA_SMEM_PAD: e = launch<MMA_SMEM_PAD>(nsm, smem, pool, buf, nbuf, x, R, K, ns, out); break;
            case MMA_SMEM_ACC: e = launch<MMA_SMEM_ACC>(nsm, smem, pool, buf, nbuf, x, R, K, ns, out); break;
            case MMA_LDSM: e = launch<MMA_LDSM>(nsm, smem, pool, buf, nbuf, x, R, K, ns, out); break;
            case FMA_DRAM: e = launch<FMA_DRAM>(nsm, smem, pool, buf, nbuf, x, R, K, ns, out); break;
            case MMA_DRAM: e = launch<MMA_DRAM>(nsm, smem, pool, buf, nbuf, x, R, K, ns, out); break;
            // the L2 modes: the DRAM kernels on one buffer (the one the reference sums), read by every call
            case FMA_L2: e = launch<FMA_DRAM>(nsm, smem, pool + (size_t)last * buf, buf, 1, x, R, K, ns, out); break;
            case MMA_L2: e = launch<MMA_DRAM>(nsm, smem, pool + (size_t)last * buf, buf, 1, x, R, K, ns, out); break;
            default: e = launch<NOOP>(nsm, smem, pool, buf, nbuf, x, R, K, ns, out); break;
            }
            std::vector<unsigned long long> h((size_t)REPS * nsm);
            std::vector<float> got((size_t)nsm * R);
            cudaMemcpy(h.data(), ns, sizeof(unsigned long long) * h.size(), cudaMemcpyDeviceToHost);
            cudaMemcpy(got.data(), out, sizeof(float) * got.size(), cudaMemcpyDeviceToHost);
            std::vector<double> med(REPS), mx(REPS);
            for (int i = 0; i < REPS; ++i) {
                std::vector<unsigned long long> c(h.begin() + (size_t)i * nsm, h.begin() + (size_t)(i + 1) * nsm);
                std::sort(c.begin(), c.end());
                med[i] = c[nsm / 2] / 1e3;
                mx[i] = c[nsm - 1] / 1e3;
            }
            std::sort(med.begin(), med.end());
            std::sort(mx.begin(), mx.end());
            const double mus = med[REPS / 2], xus = mx[REPS / 2], bytes = 2.0 * R * K;
            double err = 0.0;
            for (int c = 0; c < nsm; ++c)
                for (int r = 0; r < R; ++r)
                    err = std::max(err, std::fabs(got[(size_t)c * R + r] - ref[(size_t)c * R + r]) / big[c]);
            const bool good = e == cudaSuccess && (mode == NOOP || err < 1e-4);   // a wrong map gives O(1) errors
            ok = ok && good;
            const double gbs = mode == NOOP || mus <= 0.0 ? 0.0 : bytes / (mus * 1e-6) / 1e9;
            char tb[32] = "-";   // aggregate rate: DRAM modes only
            if (!is_smem(mode) && mode != NOOP) snprintf(tb, sizeof tb, "%.2f", gbs * nsm / 1e3);
            printf("%-12s %4d %5d %-13s %8.2f %8.2f %8.1f %7s %9.2e %s\n", sh.what, R, K, kModes[mode], mus, xus, gbs,
                   tb, err, e != cudaSuccess ? cudaGetErrorString(e) : good ? "" : "WRONG");
            snprintf(b, sizeof b,
                     "%s{\"R\": %d, \"K\": %d, \"mode\": \"%s\", \"median_us\": %.3f, \"max_us\": %.3f, "
                     "\"gbps_sm\": %.1f, \"tbps\": %s, \"err\": %.3e, \"nbuf\": %d}",
                     json.back() == '[' ? "" : ", ", R, K, kModes[mode], mus, xus, gbs,
                     is_smem(mode) || mode == NOOP ? "null" : tb, err, nbuf);
            json += b;
        }
    }
    printf("%s], \"ok\": %s}\n", json.c_str(), ok ? "true" : "false");
    return ok ? 0 : 1;
}
