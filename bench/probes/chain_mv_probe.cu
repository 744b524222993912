// The chain's small matvecs with their weights already in registers (session 31): the ATTNQ part rank's q rows, the
// k / v QKV rows and OPROJ's rows are a few rows per CTA whose weights the kernel loads before the instruction's wait
// (mv_load's early loads), so after the wait only the arithmetic is left: the trace puts it at 0.6-1.0 us (0.5B /
// 1.5B ATTNQ q matvec, patch 100's stamps) on the layer's chain. How much of that is the FMA loop itself, and would
// the tensor cores (the rows as mma A fragments, x as bf16 hi / lo in the B operand's columns 0 / 1) take less?
//
// Modes (132 CTAs of 512 threads at once; per call thread 0 stamps clock64 between the barrier after x is in shared
// memory and the barrier after out[0 .. R) is; the weights of the call were loaded into registers before, and a
// ~4,000-cycle spin lets them land, as the kernel's wait does; REPS calls after one warm-up; per call the median over
// CTAs, then the median over calls, in cycles and us at the measured clock):
//   fma    the kernel's own code: mv_load (issued before the start) and matvec() from kernels/csrc/mk_matvec.cuh
//          (batches of two rows x U chunks per warp, dot8x2, warp sums; K > 1024: partials and mv_reduce)
//   mma    rows in 16-row tiles as mma m16n8k16 A fragments: lane (g, t) of a warp holds, per 32-element k-group,
//          the 16 bytes of row g and of row g + 8 at k = 32 grp + 8 t (contiguous loads: a quad reads 64 bytes of a
//          row); the two k16 steps of a group use the permuted k order (t's elements 0-1 and 2-3, then 4-5 and 6-7)
//          and the B fragments follow the same order: lanes g = 0 / 1 build x's bf16 hi / lo from the fp32 x in
//          shared memory, the others give zeros. Warp w takes groups w, w + 16, ...; each warp's per-row partial goes
//          to shared memory and, after one barrier, thread r adds row r's 16 partials in warp order.
// Errors: per CTA max |out - ref| / max |ref| against a double reference on the host (bf16 weights exact; the mma
// mode's hi / lo split of x costs ~1e-5).
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -Xptxas -v -I kernels/csrc \
//        bench/probes/chain_mv_probe.cu -o /tmp/chain_mv_probe && /tmp/chain_mv_probe
// Prints one line per (shape, mode), then a JSON line.
// Session 32 (one H200), median cycles fma / mma: 0.5B ATTNQ q rows (12 x 896) 867 / 1,502, OPROJ (7 x 896) 700 /
// 1,485, k / v rows (8 x 896) 704 / 1,485; 1.5B 16 x 1,536 1,656 / 2,132, 12 x 1,536 1,411 / 2,104; 32 x 896 1,400 /
// 1,547. The FMA loop takes 0.35-0.84 us, and the mma mode's one barrier and cross-warp sums cost more than its
// arithmetic saves; patch 105 (the mma mode in the kernel) measured +50 / +85 us per token (bench/NOTES.md).
#include "mk_vendor.h"
#include "mk_isa.h"

#define NT 512
#define NW 16
#define U MK_MV_UNROLL
#define MK_TP 0
#include "mk_block.cuh"
#include "mk_matvec.cuh"
#include "probe_data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#define REPS 40
#define MAXG 3   // k-groups of 32 per warp in the mma mode (K <= 16 x 32 x MAXG = 1,536)
#define MAXT 2   // 16-row tiles (R <= 32)

__device__ __forceinline__ void spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}

// bf16 hi / lo of two fp32 values, packed as the mma operand pair (lower k in the low half)
__device__ __forceinline__ unsigned pack_hi(float a, float b) {
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(a)) |
           ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16);
}
__device__ __forceinline__ unsigned pack_lo(float a, float b) {
    const float ha = __bfloat162float(__float2bfloat16_rn(a)), hb = __bfloat162float(__float2bfloat16_rn(b));
    return pack_hi(a - ha, b - hb);
}

// mode 0: fma (the kernel's matvec); mode 1: mma. W: this launch's rows, CTA c's R rows from W + c R K.
__global__ void __launch_bounds__(NT, 1) probe(const mk_bf16* W, int R, int K, int mode, long long* cycles,
                                               float* outg) {
    extern __shared__ float4 smem4[];
    float* sm = (float*)smem4;
    float* sv = sm;                 // x, swizzled for the fma mode (svx), plain for mma: K floats
    float* xs = sm + 2048;          // x plain (mma)
    float* red = sm + 4096;         // partials: fma mv_reduce's R x ipr, mma's NW x 32
    float* out = sm + 4096 + 1024;  // R outputs
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const mk_bf16* base = W + (size_t)blockIdx.x * R * K;
    for (int k = threadIdx.x; k < K; k += NT) {
        const float v = x_val(k);
        sv[svx(k)] = v;
        xs[k] = v;
    }
    __syncthreads();
    for (int rep = 0; rep <= REPS; ++rep) {
        long long t0 = 0, t1 = 0;
        if (mode == 0) {
            RowMap m{base, 0, R, 0};
            uint4 w[2][U];
            MvBatch cb;
            mv_load(m, R, K, warp, w, cb);   // the early loads
            spin(4000);
            __syncthreads();
            if (threadIdx.x == 0) t0 = clock64();
            matvec(m, R, K, sv, red, out, w, cb, true);
            if (threadIdx.x == 0) t1 = clock64();
        } else {
            const int g = lane >> 2, t = lane & 3, G = K >> 5, T = (R + 15) >> 4;
            uint4 a[MAXG][MAXT][2];
#pragma unroll
            for (int j = 0; j < MAXG; ++j) {
                const int grp = warp + j * NW;
#pragma unroll
                for (int tt = 0; tt < MAXT; ++tt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int row = 16 * tt + g + 8 * h;
                        a[j][tt][h] = grp < G && tt < T && row < R
                                          ? mk_ld_stream16(base + (size_t)row * K + 32 * grp + 8 * t)
                                          : make_uint4(0, 0, 0, 0);
                    }
            }
            spin(4000);
            __syncthreads();
            if (threadIdx.x == 0) t0 = clock64();
            float d[MAXT][4] = {};
#pragma unroll
            for (int j = 0; j < MAXG; ++j) {
                const int grp = warp + j * NW;
                if (grp < G) {   // warp-uniform
                    unsigned b[4] = {0u, 0u, 0u, 0u};
                    if (g < 2) {
                        const float4 x0 = *(const float4*)(xs + 32 * grp + 8 * t);
                        const float4 x1 = *(const float4*)(xs + 32 * grp + 8 * t + 4);
                        if (g == 0) {
                            b[0] = pack_hi(x0.x, x0.y); b[1] = pack_hi(x0.z, x0.w);
                            b[2] = pack_hi(x1.x, x1.y); b[3] = pack_hi(x1.z, x1.w);
                        } else {
                            b[0] = pack_lo(x0.x, x0.y); b[1] = pack_lo(x0.z, x0.w);
                            b[2] = pack_lo(x1.x, x1.y); b[3] = pack_lo(x1.z, x1.w);
                        }
                    }
#pragma unroll
                    for (int tt = 0; tt < MAXT; ++tt) {
                        if (tt < T) {
                            // step A: k elements 0-1 (rows g / g + 8) and 2-3; step B: 4-5 and 6-7
                            const unsigned fa[4] = {a[j][tt][0].x, a[j][tt][1].x, a[j][tt][0].y, a[j][tt][1].y};
                            const unsigned fb[4] = {a[j][tt][0].z, a[j][tt][1].z, a[j][tt][0].w, a[j][tt][1].w};
                            const unsigned ba[2] = {b[0], b[1]}, bb[2] = {b[2], b[3]};
                            mk_mma_bf16(d[tt], fa, ba);
                            mk_mma_bf16(d[tt], fb, bb);
                        }
                    }
                }
            }
            // lane (g, 0): row g's hi / lo products in d[0], d[1], row g + 8's in d[2], d[3]
            if (t == 0)
#pragma unroll
                for (int tt = 0; tt < MAXT; ++tt) {
                    red[warp * 32 + 16 * tt + g] = d[tt][0] + d[tt][1];
                    red[warp * 32 + 16 * tt + g + 8] = d[tt][2] + d[tt][3];
                }
            __syncthreads();
            if (threadIdx.x < R) {
                float s = 0.f;
#pragma unroll
                for (int w = 0; w < NW; ++w) s += red[w * 32 + threadIdx.x];
                out[threadIdx.x] = s;
            }
            __syncthreads();
            if (threadIdx.x == 0) t1 = clock64();
        }
        if (threadIdx.x == 0 && rep > 0) cycles[(size_t)(rep - 1) * gridDim.x + blockIdx.x] = t1 - t0;
        if (rep == REPS)
            for (int r = threadIdx.x; r < R; r += NT) outg[(size_t)blockIdx.x * R + r] = out[r];
        __syncthreads();
    }
}

int main() {
    int nsm = 0, clk = 0;
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);   // kHz
    struct Shape { const char* what; int R, K; };
    const Shape shapes[] = {{"0.5B ATTNQ rank q rows", 12, 896}, {"0.5B OPROJ", 7, 896}, {"0.5B k/v QKV", 8, 896},
                            {"1.5B ATTNQ rank q rows", 16, 1536}, {"1.5B OPROJ", 12, 1536},
                            {"1.5B k/v QKV", 15, 1536}, {"32 rows", 32, 896}};
    const size_t maxe = (size_t)nsm * 32 * 1536;
    mk_bf16* W;
    float* outg;
    long long* cyc;
    cudaMalloc(&W, maxe * sizeof(mk_bf16));
    cudaMalloc(&outg, (size_t)nsm * 32 * sizeof(float));
    cudaMalloc(&cyc, (size_t)REPS * nsm * sizeof(long long));
    fill<<<1024, 256>>>(W, maxe);
    const int smem = (4096 + 1024 + 64) * 4;
    cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    std::string json = "{\"bench\": \"chain-mv-probe\", \"rows\": [";
    bool first = true;
    for (const Shape& s : shapes) {
        std::vector<float> hx;
        std::vector<double> ref, big;
        host_reference(0, nsm, s.R, s.K, hx, ref, big);
        for (int mode = 0; mode < 2; ++mode) {
            probe<<<nsm, NT, smem>>>(W, s.R, s.K, mode, cyc, outg);
            const cudaError_t e = cudaDeviceSynchronize();
            if (e != cudaSuccess) { printf("CUDA error %s\n", cudaGetErrorString(e)); return 1; }
            std::vector<long long> hc((size_t)REPS * nsm);
            std::vector<float> ho((size_t)nsm * s.R);
            cudaMemcpy(hc.data(), cyc, hc.size() * sizeof(long long), cudaMemcpyDeviceToHost);
            cudaMemcpy(ho.data(), outg, ho.size() * sizeof(float), cudaMemcpyDeviceToHost);
            std::vector<double> med, mx;
            for (int r = 0; r < REPS; ++r) {
                std::vector<long long> v(hc.begin() + (size_t)r * nsm, hc.begin() + (size_t)(r + 1) * nsm);
                std::sort(v.begin(), v.end());
                med.push_back((double)v[nsm / 2]);
                mx.push_back((double)v.back());
            }
            std::sort(med.begin(), med.end());
            std::sort(mx.begin(), mx.end());
            double err = 0.0;
            for (int c = 0; c < nsm; ++c)
                for (int r = 0; r < s.R; ++r)
                    err = std::max(err, std::fabs(ho[(size_t)c * s.R + r] - ref[(size_t)c * s.R + r]) /
                                            std::max(big[c], 1e-30));
            const double cm = med[REPS / 2], cx = mx[REPS / 2], us = cm / (clk * 1e-3);
            printf("%-24s R %2d K %4d  %-4s  median %6.0f cycles (%.2f us at %d MHz), slowest CTA %6.0f, err %.1e\n",
                   s.what, s.R, s.K, mode ? "mma" : "fma", cm, us, clk / 1000, cx, err);
            char buf[256];
            snprintf(buf, sizeof buf, "%s{\"shape\": \"%s\", \"R\": %d, \"K\": %d, \"mode\": \"%s\", \"cycles\": %.0f, "
                     "\"slowest\": %.0f, \"err\": %.2e}", first ? "" : ", ", s.what, s.R, s.K, mode ? "mma" : "fma",
                     cm, cx, err);
            json += buf;
            first = false;
        }
    }
    printf("%s]}\n", json.c_str());
    return 0;
}
