// Attention-loop probe: how long the monokernel's per-split position loop (mk_attn_loop.cuh: scores, then per q head
// the softmax weights and weighted V sum, over one chunk of K/V rows already in shared memory) takes on its own, and
// whether it computes the right thing. The kernel's trace shows the loop of the slowest split; this separates the
// loop's own cost from what surrounds it in the kernel (bench/NOTES.md, session 7: 2.6 -> 2.0 us on the 0.5B shape).
//
// One CTA per SM, 512 threads, every CTA runs the kernel's two phase functions on its own data (q in shared memory as
// the kernel's hi / lo bf16 tile, K rows padded by MK_KPAD and V rows as bf16, the head records in shared memory as
// the kernel keeps them) `REPS` times; thread 0 stamps %globaltimer after each phase's barrier. CTA 0's outputs
// (softmax-weighted V per q head and dim) are checked against a double-precision host reference on the same bf16
// data. Cases marked "tc" time a candidate instead (attn_chunk_tc below: scores, softmax weights and the weighted V
// sums of a chunk all on the tensor cores, warp w taking the 8-position tiles w, w + 16, ..., then one merge of the
// warps' partials; its time is in the values column).
// Session 25's candidate (two warps per q head, each over half of the positions) was slower at every size and is
// gone; its numbers are in bench/NOTES.md. Until session 26 the records were in global memory, which put a global
// round trip into every values time. Session 26 (one H200), loop us kernel / tc: 0.5B 32 positions 1.22 / 1.03,
// 40 1.39 / 1.27, 64 1.56 / 1.45, 75 1.74 / 1.73, 128 2.12 / 2.30; Llama 64 1.35 / 1.15; 1.5B 16 1.23 / 1.35, 64
// 2.00 / 2.21, 128 3.02 / 3.59 (errors 1e-7 / 1e-6): at most 0.2 us, not worth the kernel change. The split of a
// loop into its two columns rests on %globaltimer stamps per repetition; only the loop column (their sum) is solid.
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

MK_DEV void ldsm_x4_trans(unsigned a, unsigned (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
// d += a (16 x 8, rows 0-7 a0's, 8-15 a1's) x b (8 x 8), bf16 in, fp32 accumulate
MK_DEV void mma_k8(float (&d)[4], unsigned a0, unsigned a1, unsigned b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(b));
}
MK_DEV unsigned bf2_bits(__nv_bfloat162 v) { return *(const unsigned*)&v; }

// The candidate: one chunk of C staged positions, everything on the tensor cores. Warp w takes the 8-position tiles
// w, w + NW, ...: the scores as attn_scores_mma computes them (accumulator row r = q head r, lanes 4r .. 4r + 3 two
// positions each), the tile's max and exp in registers (online over a warp's tiles), then P x V with mma m16n8k8:
// the accumulator layout of the scores is the A fragment's, so row r of A is bf16(P) of head r and row r + 8 the
// rest P - bf16(P) (~16 bits of P in all), and ldmatrix.trans gives V's B fragments from the staged rows (padded as
// K's: no bank conflict). Positions past C: weight 0 and their V halves zeroed (staged rows past the chunk may hold
// anything). Then every active warp's (max, denominator, HD sums) per q head go to xw and one pass merges them (and
// the record's running state when not first) into the record, as attn_head_values leaves it.
template <int HD>
MK_DEV void attn_chunk_tc(const mk_bf16* qh, const mk_bf16* stk, const mk_bf16* stv, int g, int C, float* part,
                          bool first, float* xw) {
    constexpr int QS = HD + MK_KPAD, NJ = HD / 8, RS = HD + 2;
    static_assert(MK_MAX_GROUP == 8 && HD % 32 == 0, "one m16 tile of q heads; 32-dim V loads");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 2, t = lane & 3;
    const int ntiles = (C + 7) >> 3;
    const unsigned qa = attn_q_lane_addr<HD>(qh);
    float m = -INFINITY, l = 0.f, o[NJ][2];
#pragma unroll
    for (int j = 0; j < NJ; ++j) o[j][0] = o[j][1] = 0.f;
    for (int nt = warp; nt < ntiles; nt += NW) {   // warp-uniform
        const int row = nt * 8 + (lane & 7);
        float d[4];
        attn_score_tile<HD>(qa, stk, nt, d);
        const int pp = nt * 8 + 2 * t;
        const bool in0 = pp < C, in1 = pp + 1 < C;
        const float s0 = in0 ? d[0] + d[2] : -INFINITY, s1 = in1 ? d[1] + d[3] : -INFINITY;
        float mt = fmaxf(s0, s1);
        mt = fmaxf(mt, mk_shfl_xor(mt, 1));
        mt = fmaxf(mt, mk_shfl_xor(mt, 2));
        const float mn = fmaxf(m, mt), cor = expf(m - mn);
        const float p0 = expf(s0 - mn), p1 = expf(s1 - mn);
        float ls = p0 + p1;
        ls += mk_shfl_xor(ls, 1);
        ls += mk_shfl_xor(ls, 2);
        l = l * cor + ls;
        m = mn;
        const __nv_bfloat162 hi = __floats2bfloat162_rn(p0, p1);
        const float2 hf = __bfloat1622float2(hi);
        const unsigned a0 = bf2_bits(hi), a1 = bf2_bits(__floats2bfloat162_rn(p0 - hf.x, p1 - hf.y));
        const unsigned keep = (in0 ? 0x0000ffffu : 0u) | (in1 ? 0xffff0000u : 0u);
        const unsigned vb = mk_smem_addr(stv) + (unsigned)((row * QS + 8 * (lane >> 3)) * 2);
#pragma unroll
        for (int q = 0; q < HD / 32; ++q) {
            unsigned b[4];
            ldsm_x4_trans(vb + q * 64, b);
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                float c[4] = {0.f, 0.f, 0.f, 0.f};
                mma_k8(c, a0, a1, b[u] & keep);
                o[4 * q + u][0] = o[4 * q + u][0] * cor + (c[0] + c[2]);
                o[4 * q + u][1] = o[4 * q + u][1] * cor + (c[1] + c[3]);
            }
        }
    }
    if (warp < ntiles && r < g) {
        float* x = xw + (warp * MK_MAX_GROUP + r) * RS;
#pragma unroll
        for (int j = 0; j < NJ; ++j) *(float2*)(x + 2 + 8 * j + 2 * t) = make_float2(o[j][0], o[j][1]);
        if (t == 0) *(float2*)x = make_float2(m, l);
    }
    __syncthreads();
    const int nw = min(ntiles, NW), E = g * HD;
    constexpr int PER = MK_MAX_GROUP * HD / NT + 1;   // elements per thread, at most
    float rm[PER], rl[PER], ro[PER];
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int e = threadIdx.x + k * NT;
        if (e >= E) break;
        const int h = e / HD, i = e - h * HD;
        const float* pr = part + h * RS;
        float M = first ? -INFINITY : pr[0];
        for (int w = 0; w < nw; ++w) M = fmaxf(M, xw[(w * MK_MAX_GROUP + h) * RS]);
        float den = 0.f, num = 0.f;
        if (!first) {
            const float f = expf(pr[0] - M);
            den = pr[1] * f;
            num = pr[2 + i] * f;
        }
        for (int w = 0; w < nw; ++w) {
            const float* x = xw + (w * MK_MAX_GROUP + h) * RS;
            const float f = expf(x[0] - M);
            den += x[1] * f;
            num += x[2 + i] * f;
        }
        rm[k] = M;
        rl[k] = den;
        ro[k] = num;
    }
    if (!first) __syncthreads();   // every read of the record's old state before it changes
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int e = threadIdx.x + k * NT;
        if (e >= E) break;
        const int h = e / HD, i = e - h * HD;
        part[h * RS + 2 + i] = ro[k];
        if (i == 0) *(float2*)(part + h * RS) = make_float2(rm[k], rl[k]);
    }
}

// ns[blockIdx.x * 3 + k]: scores, values, whole loop (per loop, averaged over REPS). chk: CTA 0's outputs.
// tc: attn_chunk_tc (all of it in the values column) instead of the kernel's two phases.
template <int HD>
__global__ void __launch_bounds__(NT, 1) loop(int g, int C, unsigned long long* ns, float* chk, int tc) {
    constexpr int QS = HD + MK_KPAD, RS = HD + 2;
    extern __shared__ float4 smem4[];
    mk_bf16* qh = (mk_bf16*)smem4;                           // [2 MAXG][QS]
    mk_bf16* stk = qh + 2 * MAXG * QS;                       // [C][QS]
    mk_bf16* stv = stk + (size_t)C * QS;                     // [C][HD] (the kernel's V staging)
    mk_bf16* stvp = stv + (size_t)C * HD;                    // [C][QS] (tc: V rows padded as K's)
    float* sc = (float*)(stvp + (size_t)C * QS);             // [MAXG][C]
    float* rec = sc + MAXG * C;                              // [MAXG][RS]: the head records
    float* xw = rec + MAXG * RS;                             // [NW][MAXG][RS] (tc)
    for (int i = threadIdx.x; i < 2 * MAXG * QS; i += NT) qh[i] = mk_f2bf(0.f);
    for (int i = threadIdx.x; i < g * HD; i += NT) attn_q_store<HD>(qh, i / HD, i % HD, q_val(i, blockIdx.x));
    for (int i = threadIdx.x; i < C * HD; i += NT) {
        stk[(i / HD) * QS + i % HD] = mk_f2bf(k_val(i, blockIdx.x));
        stv[i] = mk_f2bf(v_val(i, blockIdx.x));
        stvp[(i / HD) * QS + i % HD] = mk_f2bf(v_val(i, blockIdx.x));
    }
    const int j = threadIdx.x >> 5, lane = threadIdx.x & 31;
    unsigned long long acc[2] = {0, 0}, t0 = 0, t1 = 0;
    float keep = 0.f;
    for (int rep = 0; rep <= REPS; ++rep) {
        __syncthreads();
        if (threadIdx.x == 0) t0 = mk_globaltimer();
        if (!tc) {
            attn_scores_mma<HD>(qh, stk, sc, g, C, C);
            __syncthreads();
        }
        if (threadIdx.x == 0) { t1 = mk_globaltimer(); if (rep) acc[0] += t1 - t0; t0 = t1; }
        if (tc) {
            attn_chunk_tc<HD>(qh, stk, stvp, g, C, rec, true, xw);
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
    struct Case { const char* what; int g, hd, C, tc; };
    // the kernel's phases, then the tensor-core candidate; 0.5B's cluster splits hold 32-40 positions at ctx 512
    // (session 26's split rule), up to 128 (one staged chunk) at long contexts; 1.5B's 32 splits 16 at ctx 512
    const Case cases[] = {{"0.5B, 32", 7, 64, 32, 0}, {"0.5B, 32, tc", 7, 64, 32, 1},
                          {"0.5B, 40", 7, 64, 40, 0}, {"0.5B, 40, tc", 7, 64, 40, 1},
                          {"0.5B, 64", 7, 64, 64, 0}, {"0.5B, 64, tc", 7, 64, 64, 1},
                          {"0.5B, 75", 7, 64, 75, 0}, {"0.5B, 75, tc", 7, 64, 75, 1},
                          {"0.5B, 128", 7, 64, 128, 0}, {"0.5B, 128, tc", 7, 64, 128, 1},
                          {"Llama-1B (g 4), 64", 4, 64, 64, 0}, {"Llama-1B (g 4), 64, tc", 4, 64, 64, 1},
                          {"1.5B (g 6, hd 128), 16", 6, 128, 16, 0}, {"1.5B (g 6, hd 128), 16, tc", 6, 128, 16, 1},
                          {"1.5B, 64", 6, 128, 64, 0}, {"1.5B, 64, tc", 6, 128, 64, 1},
                          {"1.5B, 128", 6, 128, 128, 0}, {"1.5B, 128, tc", 6, 128, 128, 1}};
    printf("%-24s %8s %8s %8s %10s\n", "case", "scores", "values", "loop us", "max rel e");
    std::string json = "{\"probe\": \"attn\", \"rows\": [";
    bool ok = true;
    for (const Case& c : cases) {
        const int qs = c.hd + MK_KPAD;
        const int smem = (2 * MAXG + 2 * c.C) * qs * 2 + c.C * c.hd * 2 + MAXG * c.C * 4 +
                         (1 + NW) * MAXG * (c.hd + 2) * 4;   // q tile, K, V (both forms), scores, records + partials
        void (*k)(int, int, unsigned long long*, float*, int) = c.hd == 64 ? loop<64> : loop<128>;
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        k<<<nsm, NT, smem>>>(c.g, c.C, ns, chk, c.tc);
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
        snprintf(b, sizeof b, "%s{\"g\": %d, \"hd\": %d, \"C\": %d, \"tc\": %d, \"scores_us\": %.3f, "
                 "\"values_us\": %.3f, \"loop_us\": %.3f, \"max_rel_err\": %.3e}",
                 json.back() == '[' ? "" : ", ", c.g, c.hd, c.C, c.tc, med[0], med[1], med[2], err);
        json += b;
    }
    printf("%s], \"ok\": %s}\n", json.c_str(), ok ? "true" : "false");
    return ok ? 0 : 1;
}
