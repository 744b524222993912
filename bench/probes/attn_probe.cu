// Attention-loop probe: how long the monokernel's per-split position loop (mk_attn_loop.cuh: scores, then per q head
// the softmax weights and weighted V sum, over one chunk of K/V rows already in shared memory) takes on its own, and
// whether it computes the right thing. The kernel's trace shows the loop of the slowest split; this separates the
// loop's own cost from what surrounds it in the kernel (bench/NOTES.md, session 7: 2.6 -> 2.0 us on the 0.5B shape).
//
// One CTA per SM, 512 threads, every CTA runs the kernel's two phase functions on its own data (q in shared memory as
// the kernel's hi / lo bf16 tile, K rows padded by MK_KPAD and V rows as bf16, the head records in shared memory as
// the kernel keeps them) `REPS` times; thread 0 stamps %globaltimer after each phase's barrier. CTA 0's outputs
// (softmax-weighted V per q head and dim) are checked against a double-precision host reference on the same bf16
// data. Each chunk size runs twice: the kernel's values phase (attn_head_values, one warp per q head), then
// attn_values_wide (each q head's positions over W warps, then a merge of their partials). Session 32 (one H200),
// loop us one warp / every warp: 0.5B part (g 3) 32 positions 1.07 / 1.59, 128 1.72 / 1.93, 324 3.19 / 3.00; 1.5B
// part (g 2) 16 1.14 / 1.80, 137 2.82 / 2.76; Llama (g 4) 128 1.75 / 2.12. The one-warp phase is ~0.7 us fixed plus
// 5-8 ns per position, and the merge costs ~0.5 us: not kept (bench/NOTES.md, session 32).
// Earlier candidates, gone (numbers in bench/NOTES.md): two warps per q head over halves of the positions (session
// 25: slower at 16-75 positions) and the whole chunk on the tensor cores (session 26, loop us kernel / candidate:
// 0.5B (g 7) 32 positions 1.22 / 1.03, 128 2.12 / 2.30; 1.5B (g 6) 16 1.23 / 1.35, 128 3.02 / 3.59). Until session
// 26 the records were in global memory, which put a global round trip into every values time. The split of a loop
// into its two columns rests on %globaltimer stamps per repetition; only the loop column (their sum) is solid.
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

// The candidate (session 32; bench/experiments/106-mk-attn-values-wide.patch puts it in the kernel, in
// mk_attn_loop.cuh): the values phase of one chunk spread over the CTA's warps. Where attn_head_values leaves all but
// g warps idle, each q head's positions go to W warps (W the largest
// power of two with g W <= NW; warp w: head w / W, the (w % W)-th of W contiguous ranges). Each such warp finds its
// range's max, turns its scores into e = exp(s - its max) in place and sums e * v over its range as attn_head_values
// does; its (max, denominator, HD sums) go to xw[w (HD + 2) ..]. After a barrier, one pass over the g x HD outputs
// merges, per output and in warp order, the head's W partials and the record's running state into the record.
// Called by every thread (it syncs); ends with the record written (the caller's next barrier publishes it).
template <int HD>
MK_DEV void attn_values_wide(float* sc, const mk_bf16* stv, int C, int cap, float* part, bool first, int g,
                             float* xw) {
    constexpr int CH = HD / 8, S = 32 / CH, RS = HD + 2;
    constexpr bool POW2 = (CH & (CH - 1)) == 0;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c = lane % CH, s0 = lane / CH;
    int lw = 0;   // log2 W, without a division (g <= MK_MAX_GROUP)
    while ((g << (lw + 1)) <= NW) ++lw;
    const int W = 1 << lw;
    if (warp < g << lw) {
        const int j = warp >> lw, k = warp & (W - 1);
        const int a = (C * k) >> lw, b = (C * (k + 1)) >> lw;
        float* ej = sc + j * cap;
        float mx = -INFINITY;
        for (int pp = a + lane; pp < b; pp += 32) mx = fmaxf(mx, ej[pp]);
        const float mw = warp_max(mx);
        float ls = 0.f;
        for (int pp = a + lane; pp < b; pp += 32) {
            const float e = expf(ej[pp] - mw);
            ej[pp] = e;
            ls += e;
        }
        __syncwarp();
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        attn_v_sums<HD>(ej, stv, s0 < S ? a + s0 : b, b, c, acc);
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
        float* x = xw + warp * RS;
        if (lane < CH) {
#pragma unroll
            for (int i = 0; i < 8; i += 2) *(float2*)(x + 2 + 8 * lane + i) = make_float2(acc[i], acc[i + 1]);
        }
        if (lane == 0) *(float2*)x = make_float2(mw, ls);   // an empty range: (-inf, 0) and zero sums
    }
    __syncthreads();
    constexpr int PER = (MK_MAX_GROUP * HD + NT - 1) / NT;   // outputs per thread, at most
    float rm[PER], rl[PER], ro[PER];
    const int E = g * HD;
#pragma unroll
    for (int t = 0; t < PER; ++t) {
        const int e = threadIdx.x + t * NT;
        if (e >= E) break;
        const int h = e / HD, i = e - h * HD;
        const float* pr = part + h * RS;
        const float* xh = xw + (h << lw) * RS;
        float M = first ? -INFINITY : pr[0];
        for (int w = 0; w < W; ++w) M = fmaxf(M, xh[w * RS]);
        float den = 0.f, num = 0.f;
        if (!first) {
            const float f = expf(pr[0] - M);
            den = pr[1] * f;
            num = pr[2 + i] * f;
        }
        for (int w = 0; w < W; ++w) {
            const float f = expf(xh[w * RS] - M);   // 0 for an empty range
            den += xh[w * RS + 1] * f;
            num += xh[w * RS + 2 + i] * f;
        }
        rm[t] = M;
        rl[t] = den;
        ro[t] = num;
    }
    if (!first) __syncthreads();   // every read of the record's old state before it changes
#pragma unroll
    for (int t = 0; t < PER; ++t) {
        const int e = threadIdx.x + t * NT;
        if (e >= E) break;
        const int h = e / HD, i = e - h * HD;
        part[h * RS + 2 + i] = ro[t];
        if (i == 0) *(float2*)(part + h * RS) = make_float2(rm[t], rl[t]);
    }
}

// The probe's data, the same on host and device (CTA b's copy).
static __host__ __device__ float q_val(int i, int b) { return 0.01f * ((i * 7 + b) % 13 - 6); }
static __host__ __device__ float k_val(int i, int b) { return 0.02f * ((i * 5 + b) % 11 - 5); }
static __host__ __device__ float v_val(int i, int b) { return 0.03f * ((i * 3 + b) % 9 - 4); }

// ns[blockIdx.x * 3 + k]: scores, values, whole loop (per loop, averaged over REPS). chk: CTA 0's outputs.
// wide: attn_values_wide (every warp) instead of attn_head_values (warps j < g) for the values.
template <int HD>
__global__ void __launch_bounds__(NT, 1) loop(int g, int C, unsigned long long* ns, float* chk, int wide) {
    constexpr int QS = HD + MK_KPAD, RS = HD + 2;
    extern __shared__ float4 smem4[];
    mk_bf16* qh = (mk_bf16*)smem4;                           // [2 MAXG][QS]
    mk_bf16* stk = qh + 2 * MAXG * QS;                       // [C][QS]
    mk_bf16* stv = stk + (size_t)C * QS;                     // [C][HD] (the kernel's V staging)
    float* sc = (float*)(stv + (size_t)C * HD);              // [MAXG][C]
    float* rec = sc + MAXG * C;                              // [MAXG][RS]: the head records
    float* xw = rec + MAXG * RS;                             // [NW][RS]: attn_values_wide's warp partials
    for (int i = threadIdx.x; i < 2 * MAXG * QS; i += NT) qh[i] = mk_f2bf(0.f);
    for (int i = threadIdx.x; i < g * HD; i += NT) attn_q_store<HD>(qh, i / HD, i % HD, q_val(i, blockIdx.x));
    for (int i = threadIdx.x; i < C * HD; i += NT) {
        stk[(i / HD) * QS + i % HD] = mk_f2bf(k_val(i, blockIdx.x));
        stv[i] = mk_f2bf(v_val(i, blockIdx.x));
    }
    const int j = threadIdx.x >> 5, lane = threadIdx.x & 31;
    unsigned long long acc[2] = {0, 0}, t0 = 0, t1 = 0;
    float keep = 0.f;
    for (int rep = 0; rep <= REPS; ++rep) {
        __syncthreads();
        if (threadIdx.x == 0) t0 = mk_globaltimer();
        attn_scores_mma<HD>(qh, stk, sc, g, C, C);
        __syncthreads();
        if (threadIdx.x == 0) { t1 = mk_globaltimer(); if (rep) acc[0] += t1 - t0; t0 = t1; }
        if (wide) {
            attn_values_wide<HD>(sc, stv, C, C, rec, true, g, xw);
        } else if (j < g) {
            attn_head_values<HD>(sc, stv, C, C, rec + j * RS, true);
        }
        __syncthreads();
        if (threadIdx.x == 0) { t1 = mk_globaltimer(); if (rep) acc[1] += t1 - t0; }
        if (j < g) keep += rec[j * RS + 2 + lane];
    }
    if (blockIdx.x == 0 && j < g)
        for (int d = lane; d < HD; d += 32) chk[j * HD + d] = rec[j * RS + 2 + d] / rec[j * RS + 1];
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
    float* chk;
    cudaMalloc(&ns, sizeof(unsigned long long) * 3 * nsm);
    cudaMalloc(&chk, sizeof(float) * MAXG * 128);
    std::vector<unsigned long long> h(3 * nsm);
    std::vector<float> got(MAXG * 128);
    struct Case { const char* what; int g, hd, C; };
    // the ATTNQ parts' q heads (0.5B: 3 / 2 / 2 of a kv head's 7, 1.5B: 2 of 6) and the plain launch's whole groups
    // (Llama 4); C: one staged chunk, from ctx 512's 32-40 positions per split to the longest chunks the staging holds
    // (0.5B 324, 1.5B 137 positions with an 8,400-position cache); each size with the kernel's values phase, then
    // attn_values_wide
    const Case sizes[] = {{"0.5B part (g 3)", 3, 64, 32}, {"0.5B part (g 3)", 3, 64, 64},
                          {"0.5B part (g 3)", 3, 64, 128}, {"0.5B part (g 3)", 3, 64, 256},
                          {"0.5B part (g 3)", 3, 64, 324}, {"0.5B part (g 2)", 2, 64, 32},
                          {"0.5B part (g 2)", 2, 64, 128}, {"0.5B part (g 2)", 2, 64, 324},
                          {"Llama-1B (g 4)", 4, 64, 64}, {"Llama-1B (g 4)", 4, 64, 128},
                          {"1.5B part (g 2)", 2, 128, 16}, {"1.5B part (g 2)", 2, 128, 32},
                          {"1.5B part (g 2)", 2, 128, 64}, {"1.5B part (g 2)", 2, 128, 128},
                          {"1.5B part (g 2)", 2, 128, 137}, {"1.5B plain (g 6)", 6, 128, 128}};
    printf("%-28s %8s %8s %8s %10s\n", "case", "scores", "values", "loop us", "max rel e");
    std::string json = "{\"probe\": \"attn\", \"rows\": [";
    bool ok = true;
    for (int ci = 0; ci < 2 * (int)(sizeof sizes / sizeof sizes[0]); ++ci) {
        const Case& c = sizes[ci / 2];
        const int wide = ci & 1;
        const int qs = c.hd + MK_KPAD;
        const int smem = (2 * MAXG + c.C) * qs * 2 + c.C * c.hd * 2 + MAXG * c.C * 4 +
                         (MAXG + NW) * (c.hd + 2) * 4;   // q tile, K, V, scores, records, warp partials
        void (*k)(int, int, unsigned long long*, float*, int) = c.hd == 64 ? loop<64> : loop<128>;
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        k<<<nsm, NT, smem>>>(c.g, c.C, ns, chk, wide);
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
        char what[64];
        snprintf(what, sizeof what, "%s, %d%s", c.what, c.C, wide ? ", wide" : "");
        printf("%-28s %8.3f %8.3f %8.3f %10.2e %s\n", what, med[0], med[1], med[2], err,
               e == cudaSuccess ? "" : cudaGetErrorString(e));
        char b[256];
        snprintf(b, sizeof b, "%s{\"g\": %d, \"hd\": %d, \"C\": %d, \"wide\": %d, \"scores_us\": %.3f, "
                 "\"values_us\": %.3f, \"loop_us\": %.3f, \"max_rel_err\": %.3e}",
                 json.back() == '[' ? "" : ", ", c.g, c.hd, c.C, wide, med[0], med[1], med[2], err);
        json += b;
    }
    printf("%s], \"ok\": %s}\n", json.c_str(), ok ? "true" : "false");
    return ok ? 0 : 1;
}
