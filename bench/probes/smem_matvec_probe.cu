// Shared-memory matvec probe: the best rate one CTA (512 threads) reaches for out[r] = W[r, :K] . x when its R bf16
// rows already sit in shared memory, in a layout the host chose (a bulk copy lands rows in whatever order they have
// in HBM, so the weights can be stored pre-permuted).
//
// Why: every design that takes weight streaming off the latency chain (stash the next MLP's rows in shared memory
// while the chain runs; cluster_probe.cu says cluster-local chains keep their speed under full DRAM traffic) needs
// the matvec from shared memory to be much faster than the ~50-57 GB/s per SM measured so far (sessions 10-11: the
// kernel's row-pair loop). Shared memory delivers 128 B/clk per SM (~250 GB/s at 1.98 GHz).
//
// Modes (each call is a whole matvec: its loads, arithmetic, cross-warp reduction and the closing barrier):
//   fma-pairs  the kernel's structure: row-major rows, a warp per pair of rows, lanes along K (U = 4 16-byte chunks
//              per lane), fp32 x read from shared memory, warp-shuffle sums, partials reduced through shared memory
//   fma-col    chunk-major layout (chunk c of row r at (c R + r) x 16 bytes): a lane per row, warps split K, x read
//              as a broadcast; conflict-free 16-byte loads, no shuffles; partials of the K slices summed at the end
//   mma-frag   tensor cores, mma.m16n8k16 bf16 -> fp32, rows stored in A-fragment order (the 16 bytes lane l needs
//              for tile (row tile, k step) at ((tile) x 32 + l) x 16): one conflict-free 16-byte load per lane per
//              mma; B = x split into bf16 hi (column 0) and lo (column 1), built once per call into shared memory
//              (timed); row tiles < 16: warps split the k steps (all tiles each, partials summed at the end), else
//              warps split the row tiles (no reduction)
//   mma-grid   row tiles < 16: RT x P warps (P = 16 / RT k parts, two accumulators each), P partials per row; else
//              as mma-frag
//   mma-grid-b the same with the B table built once before the timed calls (as if x's producer had written it)
//   2 barriers two __syncthreads per call: the floor of a call's own overhead
// Timing: clock64 of thread 0 around NREP back-to-back calls, per CTA; median over the 132 CTAs (all run at once);
// ns = cycles / SM clock (read from the device). err: max |out - ref| / max |ref| against a double reference.
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -Xptxas -v -I kernels/csrc \
//        bench/probes/smem_matvec_probe.cu -o /tmp/smem_matvec_probe && /tmp/smem_matvec_probe
// Prints one line per (shape, mode), then a JSON line.
// Recorded (bench/NOTES.md session 12, one H200, cycles per call at 1980 MHz; the code of commit 554e081, before
// its shared helpers, same loops): 74 x 896 fma-pairs 5213, fma-col 4084,
// mma-frag 3704, mma-grid 4016, mma-grid-b 2854 (1.44 us, 92 GB/s per SM); 16 x 896 1729 / 2072 / 3249 / 2710 / 1610;
// 112 x 896 7215 / 4962 / 4037 / 4681 / 3530; 896 x 48 21012 / 3026 / 2488 / 2683 / 2683; 1536 x 64 35397 / 5467 /
// 4548 / 3986 / 4041; two barriers 88. Errors: fma 1-2e-7, mma 2-3e-6 of max |ref|.
#include "mk_vendor.h"
#include "probe_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#define NT 512
#define NW (NT / 32)
#define NREP 64
enum Mode { FMA_PAIRS, FMA_COL, MMA_FRAG, MMA_GRID, MMA_GRID_PREB, SYNC2, NMODES };
static const char* kModes[NMODES] = {"fma-pairs", "fma-col", "mma-frag", "mma-grid", "mma-grid-b", "2 barriers"};

struct Shape { int R, K; const char* what; };

// shared memory: x fp32 [K], hl (mma B table) [K/16 steps x 32 lanes x 2 u32], red [NW x Rpad], out [Rpad], rows
struct Lay { int xo, hlo, redo, outo, rowo, bytes, Rp, Kp; };
__host__ __device__ inline Lay layout(int R, int K) {
    Lay L;
    L.Rp = (R + 15) / 16 * 16;
    L.Kp = (K + 15) / 16 * 16;
    L.xo = 0;
    L.hlo = L.xo + 4 * L.Kp;
    L.redo = L.hlo + (L.Kp / 16) * 32 * 8;
    const int nch = K / 8, ipr = (nch + 127) / 128, ng = (R + 31) / 32, slices = NW / ng > 0 ? NW / ng : 1;
    const int p1 = ipr > slices ? ipr : slices, parts = L.Rp / 16 < NW && p1 < NW ? NW : p1;   // fma-pairs, fma-col, mma split-K
    L.outo = L.redo + 4 * parts * L.Rp;
    L.rowo = (L.outo + 4 * L.Rp + 127) / 128 * 128;
    L.bytes = L.rowo + L.Rp * L.Kp * 2;
    return L;
}

MK_DEV void unpack_fma8(const uint4 w, const float* x, float& acc) {
    const float4 a = *(const float4*)x, b = *(const float4*)(x + 4);
    acc = fmaf(__uint_as_float(w.x << 16), a.x, acc);
    acc = fmaf(__uint_as_float(w.x & 0xffff0000u), a.y, acc);
    acc = fmaf(__uint_as_float(w.y << 16), a.z, acc);
    acc = fmaf(__uint_as_float(w.y & 0xffff0000u), a.w, acc);
    acc = fmaf(__uint_as_float(w.z << 16), b.x, acc);
    acc = fmaf(__uint_as_float(w.z & 0xffff0000u), b.y, acc);
    acc = fmaf(__uint_as_float(w.w << 16), b.z, acc);
    acc = fmaf(__uint_as_float(w.w & 0xffff0000u), b.w, acc);
}

// out[r] = the sum of row r's `parts` partials red[p * stride + r], in part order; syncs before and after.
MK_DEV void sum_parts(const float* red, int parts, int stride, int R, float* out) {
    __syncthreads();
    for (int r = threadIdx.x; r < R; r += NT) {
        float s = 0.f;
        for (int p = 0; p < parts; ++p) s += red[p * stride + r];
        out[r] = s;
    }
    __syncthreads();
}

// fma-pairs: rows row-major with stride Kp; batches of 2 rows x 32 lanes x 4 chunks; partial g of row r at
// red[g * Rp + r]
MK_DEV void fma_pairs(const mk_bf16* rows, int R, int K, int Kp, int Rp, const float* x, float* red, float* out) {
    constexpr int U = 4;
    const int nch = K >> 3, ipr = (nch + 32 * U - 1) / (32 * U), nb = ((R + 1) >> 1) * ipr, lane = threadIdx.x & 31;
    for (int bi = threadIdx.x >> 5; bi < nb; bi += NW) {
        const int rp = bi / ipr, g = bi - rp * ipr, r0 = 2 * rp, r1 = min(2 * rp + 1, R - 1);
        float a0 = 0.f, a1 = 0.f;
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const int c = g * 32 * U + j * 32 + lane;
            if (c < nch) {
                const uint4 w0 = *(const uint4*)(rows + (size_t)r0 * Kp + 8 * c);
                const uint4 w1 = *(const uint4*)(rows + (size_t)r1 * Kp + 8 * c);
                unpack_fma8(w0, x + 8 * c, a0);
                unpack_fma8(w1, x + 8 * c, a1);
            }
        }
        a0 = warp_sum(a0);
        a1 = warp_sum(a1);
        if (lane == 0) {
            red[g * Rp + r0] = a0;
            if (2 * rp + 1 < R) red[g * Rp + 2 * rp + 1] = a1;
        }
    }
    sum_parts(red, ipr, Rp, R, out);
}

// fma-col: chunk c of row r at rows + (c * Rp + r) * 8; lane = row within a group of 32, warps split the chunks
MK_DEV void fma_col(const mk_bf16* rows, int R, int K, int Rp, const float* x, float* red, float* out) {
    const int nch = K >> 3, ng = (R + 31) / 32, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int slices = NW / ng > 0 ? NW / ng : 1;           // K slices per row group
    for (int item = w; item < ng * slices; item += NW) {
        const int grp = item / slices, sl = item - grp * slices, r = grp * 32 + lane, rl = min(r, Rp - 1);
        const int c0 = sl * nch / slices, c1 = (sl + 1) * nch / slices;
        float a0 = 0.f, a1 = 0.f;
        int c = c0;
        for (; c + 1 < c1; c += 2) {
            const uint4 w0 = *(const uint4*)(rows + ((size_t)c * Rp + rl) * 8);
            const uint4 w1 = *(const uint4*)(rows + ((size_t)(c + 1) * Rp + rl) * 8);
            unpack_fma8(w0, x + 8 * c, a0);
            unpack_fma8(w1, x + 8 * c + 8, a1);
        }
        if (c < c1) unpack_fma8(*(const uint4*)(rows + ((size_t)c * Rp + rl) * 8), x + 8 * c, a0);
        if (r < R) red[sl * Rp + r] = a0 + a1;
    }
    sum_parts(red, slices, Rp, R, out);
}

MK_DEV void mma16816(float (&d)[4], const uint4 a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}
MK_DEV unsigned pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(const unsigned*)&v;
}

// Row tile rt's k steps s0, s0 + step, ... < S into two accumulators (alternate steps), fragment-ordered A, B table.
MK_DEV void tile_steps(const uint4* A, const uint2* B, int rt, int S, int s0, int step, int lane, float (&d0)[4],
                       float (&d1)[4]) {
    int s = s0;
#pragma unroll 4
    for (; s + step < S; s += 2 * step) {
        const uint4 a0 = A[((size_t)rt * S + s) * 32 + lane], a1 = A[((size_t)rt * S + s + step) * 32 + lane];
        const uint2 b0 = B[s * 32 + lane], b1 = B[(s + step) * 32 + lane];
        mma16816(d0, a0, b0.x, b0.y);
        mma16816(d1, a1, b1.x, b1.y);
    }
    if (s < S) {
        const uint2 b0 = B[s * 32 + lane];
        mma16816(d0, A[((size_t)rt * S + s) * 32 + lane], b0.x, b0.y);
    }
}

// B table for k step s, lane l: (b0, b1) with column g = l / 4 (0: hi, 1: lo, else 0), rows k = 2t, 2t+1 (b0) and
// 2t+8, 2t+9 (b1), t = l % 4.
MK_DEV void build_b(const float* x, int K, int Kp, unsigned* hl) {
    for (int i = threadIdx.x; i < (Kp / 16) * 32; i += NT) {
        const int s = i >> 5, l = i & 31, g = l >> 2, t = l & 3;
        unsigned b[2] = {0u, 0u};
        if (g < 2) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float v[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int k = 16 * s + 2 * t + 8 * h + e;
                    const float xv = k < K ? x[k] : 0.f;
                    const float hi = __bfloat162float(__float2bfloat16_rn(xv));
                    v[e] = g == 0 ? hi : xv - hi;
                }
                b[h] = pack_bf16x2(v[0], v[1]);
            }
        }
        hl[2 * i] = b[0];
        hl[2 * i + 1] = b[1];
    }
    __syncthreads();
}

// mma-frag: tile (rt, s) = 32 lanes x 16 bytes at rows + ((rt * S + s) * 32 + l) * 8
MK_DEV void mma_frag(const mk_bf16* rows, int R, int K, int Rp, int Kp, const float* x, unsigned* hl, float* red,
                     float* out) {
    build_b(x, K, Kp, hl);
    const int RT = Rp / 16, S = Kp / 16, lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const uint4* A = (const uint4*)rows;
    const uint2* B = (const uint2*)hl;
    if (RT >= NW) {   // warps split the row tiles; each does every k step of its tiles
        for (int rt = w; rt < RT; rt += NW) {
            float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
            tile_steps(A, B, rt, S, 0, 1, lane, d0, d1);
            if (t == 0) {
                const int r = rt * 16 + g;
                if (r < R) out[r] = (d0[0] + d0[1]) + (d1[0] + d1[1]);
                if (r + 8 < R) out[r + 8] = (d0[2] + d0[3]) + (d1[2] + d1[3]);
            }
        }
        __syncthreads();
        return;
    }
    // warps split the k steps; every warp holds all RT (< 16) tiles' accumulators (unrolled up to 8 tiles at a time)
    for (int rt0 = 0; rt0 < RT; rt0 += 8) {
        float d[8][4];
#pragma unroll
        for (int i = 0; i < 8; ++i) d[i][0] = d[i][1] = d[i][2] = d[i][3] = 0.f;
        for (int s = w; s < S; s += NW) {
            const uint2 b = B[s * 32 + lane];
#pragma unroll
            for (int i = 0; i < 8; ++i)
                if (rt0 + i < RT) mma16816(d[i], A[((size_t)(rt0 + i) * S + s) * 32 + lane], b.x, b.y);
        }
        if (t == 0) {
#pragma unroll
            for (int i = 0; i < 8; ++i)
                if (rt0 + i < RT) {
                    red[w * Rp + (rt0 + i) * 16 + g] = d[i][0] + d[i][1];
                    red[w * Rp + (rt0 + i) * 16 + g + 8] = d[i][2] + d[i][3];
                }
        }
    }
    sum_parts(red, NW, Rp, R, out);
}

// mma-grid: RT < 16 row tiles on RT x P warps (P = 16 / RT k parts: warp w takes tile w / P, k steps w % P, + P, ...,
// two accumulators), P partials per row; RT >= 16 as mma-frag. PREB: the B table is built once before the timed
// calls (as if the stage that produced x had written it), not per call.
template <bool PREB>
MK_DEV void mma_grid(const mk_bf16* rows, int R, int K, int Rp, int Kp, const float* x, unsigned* hl, float* red,
                     float* out) {
    const int RT = Rp / 16;
    if (RT >= NW) { mma_frag(rows, R, K, Rp, Kp, x, hl, red, out); return; }
    if (!PREB) build_b(x, K, Kp, hl);
    const int S = Kp / 16, lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int P = NW / RT;
    const uint4* A = (const uint4*)rows;
    const uint2* B = (const uint2*)hl;
    if (w < RT * P) {
        const int rt = w / P, part = w - rt * P;
        float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
        tile_steps(A, B, rt, S, part, P, lane, d0, d1);
        if (t == 0) {
            red[part * Rp + rt * 16 + g] = (d0[0] + d0[1]) + (d1[0] + d1[1]);
            red[part * Rp + rt * 16 + g + 8] = (d0[2] + d0[3]) + (d1[2] + d1[3]);
        }
    }
    sum_parts(red, P, Rp, R, out);
}

template <int MODE>
__global__ void __launch_bounds__(NT, 1) probe(const mk_bf16* Wg, const float* xg, int R, int K, float* outg,
                                               long long* cyc) {
    extern __shared__ float4 smem4[];
    char* sm = (char*)smem4;
    const Lay L = layout(R, K);
    float* x = (float*)(sm + L.xo);
    unsigned* hl = (unsigned*)(sm + L.hlo);
    float* red = (float*)(sm + L.redo);
    float* out = (float*)(sm + L.outo);
    mk_bf16* rows = (mk_bf16*)(sm + L.rowo);
    for (int i = threadIdx.x; i < L.Kp; i += NT) x[i] = i < K ? xg[i] : 0.f;
    const uint4* src = (const uint4*)Wg;   // the host's layout for this mode, Rp x Kp bf16
    for (int i = threadIdx.x; i < L.Rp * L.Kp / 8; i += NT) ((uint4*)rows)[i] = src[i];
    __syncthreads();
    if (MODE == MMA_GRID_PREB) build_b(x, K, L.Kp, hl);
    long long t0 = 0;
    for (int rep = 0; rep <= NREP; ++rep) {
        if (rep == 1 && threadIdx.x == 0) t0 = clock64();
        if (MODE == FMA_PAIRS) fma_pairs(rows, R, K, L.Kp, L.Rp, x, red, out);
        else if (MODE == FMA_COL) fma_col(rows, R, K, L.Rp, x, red, out);
        else if (MODE == SYNC2) { __syncthreads(); __syncthreads(); }
        else if (MODE == MMA_FRAG) mma_frag(rows, R, K, L.Rp, L.Kp, x, hl, red, out);
        else mma_grid<MODE == MMA_GRID_PREB>(rows, R, K, L.Rp, L.Kp, x, hl, red, out);
    }
    if (threadIdx.x == 0) cyc[blockIdx.x] = clock64() - t0;
    for (int r = threadIdx.x; r < R; r += NT) outg[(size_t)blockIdx.x * R + r] = out[r];
}

// host: W [R][K] bf16 (as floats rounded), laid out per mode into Rp x Kp bf16 words
static std::vector<uint16_t> arrange(int mode, const std::vector<float>& W, int R, int K) {
    const Lay L = layout(R, K);
    std::vector<uint16_t> o((size_t)L.Rp * L.Kp, 0);
    auto bits = [&](int r, int k) -> uint16_t {
        if (r >= R || k >= K) return 0;
        unsigned u;
        memcpy(&u, &W[(size_t)r * K + k], 4);
        return (uint16_t)(u >> 16);
    };
    if (mode == FMA_PAIRS) {
        for (int r = 0; r < L.Rp; ++r)
            for (int k = 0; k < L.Kp; ++k) o[(size_t)r * L.Kp + k] = bits(r, k);
    } else if (mode == FMA_COL) {
        for (int c = 0; c < L.Kp / 8; ++c)
            for (int r = 0; r < L.Rp; ++r)
                for (int e = 0; e < 8; ++e) o[((size_t)c * L.Rp + r) * 8 + e] = bits(r, 8 * c + e);
    } else {   // mma modes: A fragment of m16n8k16 .row: a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
        const int S = L.Kp / 16;
        for (int rt = 0; rt < L.Rp / 16; ++rt)
            for (int s = 0; s < S; ++s)
                for (int l = 0; l < 32; ++l) {
                    const int g = l >> 2, t = l & 3;
                    const int rr[4] = {g, g + 8, g, g + 8}, kk[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
                    uint16_t* p = &o[(((size_t)rt * S + s) * 32 + l) * 8];
                    for (int q = 0; q < 4; ++q)
                        for (int e = 0; e < 2; ++e) p[2 * q + e] = bits(16 * rt + rr[q], 16 * s + kk[q] + e);
                }
    }
    return o;
}

int main() {
    int nsm = 0, clk_khz = 0, optin = 0;
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, 0);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    const Shape shapes[] = {{74, 896, "0.5B gate/up share"}, {16, 896, "16 rows"}, {72, 896, "QKV share, 16 SMs"},
                            {112, 896, "112 rows"}, {896, 48, "0.5B down^T share (37 -> 48)"},
                            {68, 1536, "1.5B gate/up half share"}, {1536, 64, "1.5B down^T share"}};
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> U(-1.f, 1.f);
    printf("%-30s %5s %5s %-10s %9s %9s %9s %9s\n", "shape", "R", "K", "mode", "cycles", "ns", "GB/s/SM", "err");
    std::string json = "{\"probe\": \"smem_matvec\", \"clock_MHz\": " + std::to_string(clk_khz / 1000) + ", \"runs\": [";
    bool first = true;
    for (const Shape& sh : shapes) {
        const int R = sh.R, K = sh.K;
        const Lay L = layout(R, K);
        if (L.bytes > optin) { printf("%s: %d bytes > %d\n", sh.what, L.bytes, optin); continue; }
        std::vector<float> W((size_t)R * K), x(K);
        for (auto& v : W) v = bf16_round(U(rng));
        for (auto& v : x) v = U(rng);
        std::vector<double> ref(R, 0.0);
        double rmax = 0;
        for (int r = 0; r < R; ++r) {
            for (int k = 0; k < K; ++k) ref[r] += (double)W[(size_t)r * K + k] * x[k];
            rmax = std::max(rmax, std::fabs(ref[r]));
        }
        mk_bf16* dW;
        float *dx, *dout;
        long long* dcyc;
        cudaMalloc(&dW, (size_t)L.Rp * L.Kp * 2);
        cudaMalloc(&dx, 4 * K);
        cudaMalloc(&dout, sizeof(float) * nsm * R);
        cudaMalloc(&dcyc, sizeof(long long) * nsm);
        cudaMemcpy(dx, x.data(), 4 * K, cudaMemcpyHostToDevice);
        for (int mode = 0; mode < NMODES; ++mode) {
            const std::vector<uint16_t> arr = arrange(mode, W, R, K);
            cudaMemcpy(dW, arr.data(), arr.size() * 2, cudaMemcpyHostToDevice);
            cudaError_t e;
            auto go = [&](auto kern) {
                cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, L.bytes);
                kern<<<nsm, NT, L.bytes>>>(dW, dx, R, K, dout, dcyc);
                return cudaDeviceSynchronize();
            };
            e = mode == FMA_PAIRS ? go(probe<FMA_PAIRS>) : mode == FMA_COL ? go(probe<FMA_COL>)
                : mode == MMA_FRAG ? go(probe<MMA_FRAG>) : mode == MMA_GRID ? go(probe<MMA_GRID>)
                : mode == MMA_GRID_PREB ? go(probe<MMA_GRID_PREB>) : go(probe<SYNC2>);
            std::vector<long long> cyc(nsm);
            std::vector<float> out((size_t)nsm * R);
            cudaMemcpy(cyc.data(), dcyc, sizeof(long long) * nsm, cudaMemcpyDeviceToHost);
            cudaMemcpy(out.data(), dout, sizeof(float) * nsm * R, cudaMemcpyDeviceToHost);
            double err = 0;
            for (int b = 0; mode != SYNC2 && b < nsm; ++b)
                for (int r = 0; r < R; ++r) err = std::max(err, std::fabs(out[(size_t)b * R + r] - ref[r]) / rmax);
            std::sort(cyc.begin(), cyc.end());
            const double c = cyc[nsm / 2] / (double)NREP, ns = c / (clk_khz / 1e6);
            const double gbs = (double)R * K * 2 / ns;
            printf("%-30s %5d %5d %-10s %9.0f %9.1f %9.1f %9.1e %s\n", sh.what, R, K, kModes[mode], c, ns, gbs, err,
                   e == cudaSuccess ? "" : cudaGetErrorString(e));
            char b[256];
            snprintf(b, sizeof b, "%s{\"R\": %d, \"K\": %d, \"mode\": \"%s\", \"cycles\": %.0f, \"ns\": %.1f, "
                     "\"GBps_per_SM\": %.1f, \"err\": %.2e}", first ? "" : ", ", R, K, kModes[mode], c, ns, gbs, err);
            first = false;
            json += b;
        }
        cudaFree(dW); cudaFree(dx); cudaFree(dout); cudaFree(dcyc);
    }
    printf("%s]}\n", json.c_str());
    return 0;
}
