// Attention-loop probe: how long the monokernel's per-split position loop (scores, softmax, values over one chunk
// of K/V rows already in shared memory) takes on its own, phase by phase. The kernel's trace says the loop of the
// slowest split takes 2.9 us (0.5B: 7 q heads, head_dim 64, 64 positions) to 3.9 us (1.5B: 6 heads, head_dim 128);
// counting instructions and dependent chains it should take well under 1 us. This separates the loop's own cost
// from what surrounds it in the kernel.
//
// One CTA per SM, 512 threads, every CTA runs the same loop on its own data (q in shared memory as rotated fp32,
// K and V rows as bf16), `reps` times; thread 0 stamps %globaltimer between the phases (each phase ends with the
// kernel's __syncthreads). Variants:
//   kernel      the kernel's own phase functions (kernels/csrc/mk_attn_loop.cuh)
//   values-4    the values phase with 4 independent accumulator pairs (positions interleaved), summed at the end
//   both-4      values-4 and the scores with 4 accumulators
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I kernels/csrc bench/probes/attn_probe.cu \
//        -o /tmp/attn_probe && /tmp/attn_probe
// Prints a line per (case, variant): median over CTAs of each phase's us per loop; then a JSON line.
#include "mk_vendor.h"
#include "mk_isa.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#define NT MK_NTHREADS
#define MAXG MK_MAX_GROUP
#define REPS 50

__device__ float g_sink;

MK_DEV float warp_max(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
MK_DEV float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#include "mk_attn_loop.cuh"

// ns[blockIdx.x * 4 + k]: scores, softmax, values, whole loop (per loop, averaged over REPS).
template <int HD, int VAR>
__global__ void __launch_bounds__(NT, 1) loop(int g, int C, unsigned long long* ns) {
    constexpr int W = HD / 2;
    extern __shared__ float4 smem4[];
    float* sq = (float*)smem4;                            // [MAXG][HD]
    mk_bf16* stk = (mk_bf16*)(sq + MAXG * HD);            // [C][HD]
    mk_bf16* stv = stk + (size_t)C * HD;                  // [C][HD]
    float* sc = (float*)(stv + (size_t)C * HD);           // [MAXG][C]
    float* sml = sc + MAXG * C;                           // [3][MAXG]
    for (int i = threadIdx.x; i < g * HD; i += NT) sq[i] = 0.01f * ((i * 7 + blockIdx.x) % 13 - 6);
    for (int i = threadIdx.x; i < C * HD; i += NT) {
        stk[i] = mk_f2bf(0.02f * ((i * 5 + blockIdx.x) % 11 - 5));
        stv[i] = mk_f2bf(0.03f * ((i * 3 + blockIdx.x) % 9 - 4));
    }
    const int oj = threadIdx.x / W, od = 2 * (threadIdx.x - oj * W);
    const bool owner = oj < g;
    unsigned long long acc[3] = {0, 0, 0}, t0 = 0, t1 = 0;
    float keep = 0.f;
    for (int rep = 0; rep <= REPS; ++rep) {
        if (threadIdx.x < MAXG) {
            sml[threadIdx.x] = -INFINITY;
            sml[MAXG + threadIdx.x] = 0.f;
        }
        __syncthreads();
        if (threadIdx.x == 0) t0 = mk_globaltimer();
        // scores: one thread per (q head, position), K words read rotated by the position
        if (VAR != 2) {
            attn_scores<HD>(sq, stk, sc, g, C, C);
        } else {   // 4 accumulators
            for (int t = threadIdx.x; t < g * C; t += NT) {
                const int j = t / C, pp = t - j * C;
                const unsigned* kr = (const unsigned*)(stk + (size_t)pp * HD);
                const float* qj = sq + j * HD;
                float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
                for (int w = 0; w < W; w += 2) {
                    const int w0 = (w + pp) & (W - 1), w1 = (w + 1 + pp) & (W - 1);
                    const unsigned u0 = kr[w0], u1 = kr[w1];
                    const float2 q0 = *(const float2*)(qj + 2 * w0), q1 = *(const float2*)(qj + 2 * w1);
                    s[0] += q0.x * __uint_as_float(u0 << 16);
                    s[1] += q0.y * __uint_as_float(u0 & 0xffff0000u);
                    s[2] += q1.x * __uint_as_float(u1 << 16);
                    s[3] += q1.y * __uint_as_float(u1 & 0xffff0000u);
                }
                sc[j * C + pp] = (s[0] + s[1]) + (s[2] + s[3]);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) { t1 = mk_globaltimer(); if (rep) acc[0] += t1 - t0; t0 = t1; }
        attn_softmax(sc, sml, g, C, C);   // one warp per q head
        __syncthreads();
        if (threadIdx.x == 0) { t1 = mk_globaltimer(); if (rep) acc[1] += t1 - t0; t0 = t1; }
        // values: one thread per (q head, pair of dims)
        if (owner) {
            float b0 = 0.f, b1 = 0.f;
            if (VAR >= 1) {   // 4 independent accumulator pairs
                const float* ej = sc + oj * C;
                const mk_bf16* vcol = stv + od;
                float c0[4] = {0.f, 0.f, 0.f, 0.f}, c1[4] = {0.f, 0.f, 0.f, 0.f};
                int pp = 0;
                for (; pp + 4 <= C; pp += 4) {
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        const unsigned x = *(const unsigned*)(vcol + (size_t)(pp + u) * HD);
                        const float e = ej[pp + u];
                        c0[u] += e * __uint_as_float(x << 16);
                        c1[u] += e * __uint_as_float(x & 0xffff0000u);
                    }
                }
                for (; pp < C; ++pp) {
                    const unsigned x = *(const unsigned*)(vcol + (size_t)pp * HD);
                    c0[0] += ej[pp] * __uint_as_float(x << 16);
                    c1[0] += ej[pp] * __uint_as_float(x & 0xffff0000u);
                }
                b0 = (c0[0] + c0[1]) + (c0[2] + c0[3]);
                b1 = (c1[0] + c1[1]) + (c1[2] + c1[3]);
            } else {
                attn_values<HD>(sc, stv, sml, oj, od, C, C, b0, b1);
            }
            keep += b0 + b1;
        }
        __syncthreads();
        if (threadIdx.x == 0) { t1 = mk_globaltimer(); if (rep) acc[2] += t1 - t0; }
    }
    if (threadIdx.x == 0)
        for (int k = 0; k < 3; ++k) ns[blockIdx.x * 4 + k] = acc[k] / REPS;
    if (threadIdx.x == 0) ns[blockIdx.x * 4 + 3] = (acc[0] + acc[1] + acc[2]) / REPS;
    if (keep == 1.2345f) g_sink = keep;
}

int main() {
    int nsm = 0;
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
    unsigned long long* ns;
    cudaMalloc(&ns, sizeof(unsigned long long) * 4 * nsm);
    std::vector<unsigned long long> h(4 * nsm);
    struct Case { const char* what; int g, hd, C; };
    const Case cases[] = {{"0.5B (g 7, hd 64)", 7, 64, 64}, {"Llama-1B (g 4, hd 64)", 4, 64, 64},
                          {"1.5B (g 6, hd 128)", 6, 128, 64}, {"1.5B, 128 positions", 6, 128, 128}};
    const char* vars[] = {"kernel", "values-4", "both-4"};
    printf("%-24s %-9s %8s %8s %8s %8s\n", "case", "variant", "scores", "softmax", "values", "loop us");
    std::string json = "{\"probe\": \"attn\", \"rows\": [";
    for (const Case& c : cases) {
        for (int v = 0; v < 3; ++v) {
            const int smem = (MAXG * c.hd + MAXG * c.C + 3 * MAXG) * 4 + 2 * c.C * c.hd * 2;
            void (*k)(int, int, unsigned long long*) =
                c.hd == 64 ? (v == 0 ? loop<64, 0> : v == 1 ? loop<64, 1> : loop<64, 2>)
                           : (v == 0 ? loop<128, 0> : v == 1 ? loop<128, 1> : loop<128, 2>);
            cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
            k<<<nsm, NT, smem>>>(c.g, c.C, ns);
            cudaMemcpy(h.data(), ns, sizeof(unsigned long long) * 4 * nsm, cudaMemcpyDeviceToHost);
            double med[4];
            for (int q = 0; q < 4; ++q) {
                std::vector<unsigned long long> s(nsm);
                for (int b = 0; b < nsm; ++b) s[b] = h[b * 4 + q];
                std::sort(s.begin(), s.end());
                med[q] = s[nsm / 2] / 1e3;
            }
            const cudaError_t e = cudaGetLastError();
            printf("%-24s %-9s %8.3f %8.3f %8.3f %8.3f %s\n", c.what, vars[v], med[0], med[1], med[2], med[3],
                   e == cudaSuccess ? "" : cudaGetErrorString(e));
            char b[256];
            snprintf(b, sizeof b, "%s{\"g\": %d, \"hd\": %d, \"C\": %d, \"variant\": \"%s\", \"scores_us\": %.3f, "
                     "\"softmax_us\": %.3f, \"values_us\": %.3f, \"loop_us\": %.3f}",
                     json.back() == '[' ? "" : ", ", c.g, c.hd, c.C, vars[v], med[0], med[1], med[2], med[3]);
            json += b;
        }
    }
    printf("%s]}\n", json.c_str());
    return 0;
}
