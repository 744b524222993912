// Attention-loop probe: how long the monokernel's per-split position loop (mk_attn_loop.cuh: scores, then per q head
// the softmax weights and weighted V sum, over one chunk of K/V rows already in shared memory) takes on its own, and
// whether it computes the right thing. The kernel's trace shows the loop of the slowest split; this separates the
// loop's own cost from what surrounds it in the kernel (bench/NOTES.md, session 7: 2.6 -> 2.0 us on the 0.5B shape).
//
// One CTA per SM, 512 threads, every CTA runs the kernel's two phase functions on its own data (q in shared memory as
// the kernel's hi / lo bf16 tile, K rows padded by MK_KPAD and V rows as bf16, the head records in global memory)
// `REPS` times;
// thread 0 stamps %globaltimer after each phase's barrier. CTA 0's outputs (softmax-weighted V per q head and dim)
// are checked against a double-precision host reference on the same bf16 data. Cases marked "pairs" time a candidate
// values phase instead (attn_head_values_pairs below: two warps per q head over halves of the positions).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I kernels/csrc bench/probes/attn_probe.cu \
//        -o /tmp/attn_probe && /tmp/attn_probe
// Prints a line per case: median over CTAs of each phase's us per loop and the max relative error; then a JSON line.
#include "mk_vendor.h"
#include "mk_isa.h"
#include "probe_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <string>
#include <vector>

#define NT MK_NTHREADS
#define NW (NT / 32)
#define MAXG MK_MAX_GROUP
#define REPS 50

__device__ float g_sink;

#include "mk_attn_loop.cuh"

// The probe's data, the same on host and device (CTA b's copy).
static __host__ __device__ float q_val(int i, int b) { return 0.01f * ((i * 7 + b) % 13 - 6); }
static __host__ __device__ float k_val(int i, int b) { return 0.02f * ((i * 5 + b) % 11 - 5); }
static __host__ __device__ float v_val(int i, int b) { return 0.03f * ((i * 3 + b) % 9 - 4); }

// A candidate for the kernel's values phase (not in mk_attn_loop.cuh; session 25's question): two warps per q head,
// each over half of the chunk's positions (warp j the first half, warp j + 8 the second), each with its own max,
// weights and V sums as attn_head_values computes them (same lane layout), then warp j + 8 hands (max, sum, HD
// weighted sums) over shared memory (xch: 8 x (HD + 2) floats) and a barrier of the pair, and warp j merges them with
// the online-softmax rule into the record. Splitting the dims instead (session 7's patch 31) left every warp's chain
// over all positions and gained nothing; this halves the chain. The caller runs it in warps j < g and j + 8.
template <int HD>
MK_DEV void attn_head_values_pairs(float* sc, const mk_bf16* stv, int C, int cap, float* rec, float* xch) {
    constexpr int CH = HD / 8;
    static_assert((CH & (CH - 1)) == 0, "head_dim 64 or 128 here");
    const int w = threadIdx.x >> 5, j = w & 7, half = w >> 3, lane = threadIdx.x & 31, c = lane % CH, s0 = lane / CH;
    const int p0 = half ? C / 2 : 0, p1 = half ? C : C / 2;
    float* ej = sc + j * cap;
    float mx = -INFINITY;
    for (int pp = p0 + lane; pp < p1; pp += 32) mx = fmaxf(mx, ej[pp]);
    const float mn = warp_max(mx);
    float ls = 0.f;
    for (int pp = p0 + lane; pp < p1; pp += 32) {
        const float e = expf(ej[pp] - mn);
        ej[pp] = e;
        ls += e;
    }
    __syncwarp();
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    attn_v_sums<HD>(ej, stv, p0 + s0, p1, c, acc);
#pragma unroll
    for (int o = CH; o < 32; o <<= 1)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
    ls = warp_sum(ls);
    float* x = xch + j * (HD + 2);
    if (half) {
        if (lane < CH)
#pragma unroll
            for (int i = 0; i < 8; ++i) x[2 + 8 * lane + i] = acc[i];
        if (lane == 0) { x[0] = mn; x[1] = ls; }
    }
    asm volatile("bar.sync %0, 64;" :: "r"(1 + j) : "memory");   // the pair only
    if (half) return;
    const float m2 = x[0], m = fmaxf(mn, m2);
    const float c1 = mn == -INFINITY ? 0.f : expf(mn - m), c2 = m2 == -INFINITY ? 0.f : expf(m2 - m);
    if (lane < CH) {
        float* o = rec + 2 + 8 * lane;
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] = acc[i] * c1 + x[2 + 8 * lane + i] * c2;
    }
    if (lane == 0) { rec[0] = m; rec[1] = ls * c1 + x[1] * c2; }
}

// ns[blockIdx.x * 3 + k]: scores, values, whole loop (per loop, averaged over REPS). rec: per CTA MAXG head records.
// pairs: the values phase by attn_head_values_pairs instead of the kernel's attn_head_values.
template <int HD>
__global__ void __launch_bounds__(NT, 1) loop(int g, int C, unsigned long long* ns, float* rec, float* chk,
                                              int pairs) {
    extern __shared__ float4 smem4[];
    mk_bf16* qh = (mk_bf16*)smem4;                           // [2 MAXG][HD + MK_KPAD]
    mk_bf16* stk = qh + 2 * MAXG * (HD + MK_KPAD);           // [C][HD + MK_KPAD]
    mk_bf16* stv = stk + (size_t)C * (HD + MK_KPAD);         // [C][HD]
    float* sc = (float*)(stv + (size_t)C * HD);              // [MAXG][C]
    float* xch = sc + MAXG * C;                              // [MAXG][HD + 2] (pairs)
    for (int i = threadIdx.x; i < g * HD; i += NT) attn_q_store<HD>(qh, i / HD, i % HD, q_val(i, blockIdx.x));
    for (int i = threadIdx.x; i < C * HD; i += NT) {
        stk[(i / HD) * (HD + MK_KPAD) + i % HD] = mk_f2bf(k_val(i, blockIdx.x));
        stv[i] = mk_f2bf(v_val(i, blockIdx.x));
    }
    const int j = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* pj = rec + ((size_t)blockIdx.x * MAXG + j) * (HD + 2);
    unsigned long long acc[2] = {0, 0}, t0 = 0, t1 = 0;
    float keep = 0.f;
    for (int rep = 0; rep <= REPS; ++rep) {
        __syncthreads();
        if (threadIdx.x == 0) t0 = mk_globaltimer();
        attn_scores_mma<HD>(qh, stk, sc, g, C, C);
        __syncthreads();
        if (threadIdx.x == 0) { t1 = mk_globaltimer(); if (rep) acc[0] += t1 - t0; t0 = t1; }
        if (pairs) {
            if ((j & 7) < g) attn_head_values_pairs<HD>(sc, stv, C, C, pj - (j >> 3) * 8 * (HD + 2), xch);
            if (j < g) keep += pj[2 + lane];
        } else if (j < g) {
            attn_head_values<HD>(sc, stv, C, C, pj, true);
            keep += pj[2 + lane];
        }
        __syncthreads();
        if (threadIdx.x == 0) { t1 = mk_globaltimer(); if (rep) acc[1] += t1 - t0; }
    }
    if (blockIdx.x == 0 && j < g)
        for (int d = lane; d < HD; d += 32) chk[j * HD + d] = pj[2 + d] / pj[1];
    if (threadIdx.x == 0) {
        ns[blockIdx.x * 3] = acc[0] / REPS;
        ns[blockIdx.x * 3 + 1] = acc[1] / REPS;
        ns[blockIdx.x * 3 + 2] = (acc[0] + acc[1]) / REPS;
    }
    if (keep == 1.2345f) g_sink = keep;
}

// max relative error (against the largest output) of CTA 0's outputs
static double check(const std::vector<float>& got, int g, int hd, int C) {
    double err = 0.0, big = 1e-30;
    for (int j = 0; j < g; ++j) {
        std::vector<double> s(C);
        double mx = -1e300;
        for (int pp = 0; pp < C; ++pp) {
            double t = 0.0;
            for (int d = 0; d < hd; ++d) t += (double)q_val(j * hd + d, 0) * bf16_round(k_val(pp * hd + d, 0));
            s[pp] = t;
            mx = std::max(mx, t);
        }
        double den = 0.0;
        for (int pp = 0; pp < C; ++pp) den += std::exp(s[pp] - mx);
        for (int d = 0; d < hd; ++d) {
            double o = 0.0;
            for (int pp = 0; pp < C; ++pp) o += std::exp(s[pp] - mx) * bf16_round(v_val(pp * hd + d, 0));
            o /= den;
            err = std::max(err, std::fabs(o - got[j * hd + d]));
            big = std::max(big, std::fabs(o));
        }
    }
    return err / big;
}

int main() {
    int nsm = 0;
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
    unsigned long long* ns;
    float *rec, *chk;
    cudaMalloc(&ns, sizeof(unsigned long long) * 3 * nsm);
    cudaMalloc(&rec, sizeof(float) * nsm * MAXG * 130);
    cudaMalloc(&chk, sizeof(float) * MAXG * 128);
    std::vector<unsigned long long> h(3 * nsm);
    std::vector<float> got(MAXG * 128);
    struct Case { const char* what; int g, hd, C, pairs; };
    // the kernel's values phase, then the pairs candidate; 0.5B at ctx ~600 holds ~75 positions per busy split
    // (8 of its 16 cluster ranks), 1.5B ~16-20 (32 splits)
    const Case cases[] = {{"0.5B (g 7, hd 64)", 7, 64, 64, 0}, {"Llama-1B (g 4, hd 64)", 4, 64, 64, 0},
                          {"1.5B (g 6, hd 128)", 6, 128, 64, 0}, {"1.5B, 128 positions", 6, 128, 128, 0},
                          {"0.5B, 32", 7, 64, 32, 0}, {"0.5B, 32, pairs", 7, 64, 32, 1},
                          {"0.5B, 64, pairs", 7, 64, 64, 1},
                          {"0.5B, 75", 7, 64, 75, 0}, {"0.5B, 75, pairs", 7, 64, 75, 1},
                          {"0.5B, 128", 7, 64, 128, 0}, {"0.5B, 128, pairs", 7, 64, 128, 1},
                          {"1.5B, 16", 6, 128, 16, 0}, {"1.5B, 16, pairs", 6, 128, 16, 1},
                          {"1.5B, 64, pairs", 6, 128, 64, 1}};
    printf("%-24s %8s %8s %8s %10s\n", "case", "scores", "values", "loop us", "max rel e");
    std::string json = "{\"probe\": \"attn\", \"rows\": [";
    bool ok = true;
    for (const Case& c : cases) {
        const int smem = MAXG * c.C * 4 + (2 * MAXG + c.C) * (c.hd + MK_KPAD) * 2 + c.C * c.hd * 2 + MAXG * (c.hd + 2) * 4;
        void (*k)(int, int, unsigned long long*, float*, float*, int) = c.hd == 64 ? loop<64> : loop<128>;
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        k<<<nsm, NT, smem>>>(c.g, c.C, ns, rec, chk, c.pairs);
        cudaMemcpy(h.data(), ns, sizeof(unsigned long long) * 3 * nsm, cudaMemcpyDeviceToHost);
        cudaMemcpy(got.data(), chk, sizeof(float) * MAXG * 128, cudaMemcpyDeviceToHost);
        const cudaError_t e = cudaGetLastError();
        double med[3];
        for (int q = 0; q < 3; ++q) {
            std::vector<unsigned long long> s(nsm);
            for (int b = 0; b < nsm; ++b) s[b] = h[b * 3 + q];
            std::sort(s.begin(), s.end());
            med[q] = s[nsm / 2] / 1e3;
        }
        const double err = check(got, c.g, c.hd, c.C);
        ok = ok && e == cudaSuccess && err < 1e-4;
        printf("%-24s %8.3f %8.3f %8.3f %10.2e %s\n", c.what, med[0], med[1], med[2], err,
               e == cudaSuccess ? "" : cudaGetErrorString(e));
        char b[256];
        snprintf(b, sizeof b, "%s{\"g\": %d, \"hd\": %d, \"C\": %d, \"pairs\": %d, \"scores_us\": %.3f, "
                 "\"values_us\": %.3f, \"loop_us\": %.3f, \"max_rel_err\": %.3e}",
                 json.back() == '[' ? "" : ", ", c.g, c.hd, c.C, c.pairs, med[0], med[1], med[2], err);
        json += b;
    }
    printf("%s], \"ok\": %s}\n", json.c_str(), ok ? "true" : "false");
    return ok ? 0 : 1;
}
