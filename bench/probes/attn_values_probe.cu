// Values-phase probe: where the attention loop's second phase (softmax weights, then the weighted sum of V rows, per
// q head) spends its time, and what the tensor cores would save there, for chunks of 64 to 512 positions. It
// answers two questions before any kernel change (bench/NOTES.md, session 8 "Next"): why patch 37's tensor-core
// values phase took as long as the fp32 one (1.14 us on the 0.5B shape), and whether fewer, longer attention splits
// (no combine at short contexts) can afford their longer values phase.
//
// One CTA per SM, 512 threads; the scores are given (restored before every repetition, outside the timed part);
// thread 0 stamps %globaltimer around the phase, `REPS` repetitions, the median over CTAs is printed. Modes:
//   fp32      the kernel's attn_head_values (warp j = q head j: max, exp in place, V sums, record; session 8's cut
//             of it at 64 positions: softmax 0.47 us, V sums 0.69 on the 0.5B shape)
//   mma       softmax into one 16-row bf16 weight tile (rows 0-7 hi, 8-15 lo, as the kernel's q tile), a barrier,
//             then warp w < HD / 8 sums dims 8w .. 8w + 7 over the positions with mma m16n8k16 (V rows padded by
//             MK_KPAD, ldmatrix .trans), and the records
//   mma-sm    its softmax-to-tile part alone;  mma-v  its mma part alone
// fp32 and mma outputs of CTA 0 are checked against a double-precision host reference (same bf16 V).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I kernels/csrc bench/probes/attn_values_probe.cu \
//        -o /tmp/attn_values_probe && /tmp/attn_values_probe
#include "mk_vendor.h"
#include "mk_isa.h"
#include "probe_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#define NT MK_NTHREADS
#define NW (NT / 32)
#define MAXG MK_MAX_GROUP
#define REPS 50

__device__ float g_sink;

#include "mk_attn_loop.cuh"

enum { FP32, MMA, MMA_SM, MMA_V, NMODES };
static const char* kModes[NMODES] = {"fp32", "mma", "mma-sm", "mma-v"};

MK_DEV void ldsm_x2_t(unsigned a, unsigned (&r)[2]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a)
                 : "memory");
}

// Weight-tile row stride (bf16) for C positions: a multiple of 64 plus MK_KPAD, so ldmatrix rows fall in 8 groups.
static __host__ __device__ int p_stride(int C) { return ((C + 63) & ~63) + MK_KPAD; }

// warp j < g: the softmax of head j's C scores into tile rows j (hi) and 8 + j (lo), zero up to C rounded to 16;
// max and sum to sml[j], sml[MAXG + j].
MK_DEV void softmax_tile(const float* sc, mk_bf16* ph, float* sml, int C, int cap) {
    const int j = threadIdx.x >> 5, lane = threadIdx.x & 31, ps = p_stride(C);
    const float* sj = sc + j * cap;
    float mx = -INFINITY;
    for (int pp = lane; pp < C; pp += 32) mx = fmaxf(mx, sj[pp]);
    mx = warp_max(mx);
    float ls = 0.f;
    for (int pp = lane; pp < ((C + 15) & ~15); pp += 32) {
        const float e = pp < C ? expf(sj[pp] - mx) : 0.f;
        const mk_bf16 hi = mk_f2bf(e);
        ph[j * ps + pp] = hi;
        ph[(MAXG + j) * ps + pp] = mk_f2bf(e - mk_bf2f(hi));
        ls += e;
    }
    ls = warp_sum(ls);
    if (lane == 0) { sml[j] = mx; sml[MAXG + j] = ls; }
}

// warp w < HD / 8: dims 8w .. 8w + 7 of every head, summed over the positions on the tensor cores; rows r < g go to
// the records rec[r * (HD + 2) + 2 + dim] with max and sum from sml (first chunk: stored, not accumulated).
template <int HD>
MK_DEV void values_mma(const mk_bf16* ph, const mk_bf16* stv, const float* sml, float* rec, int g, int C) {
    constexpr int VS = HD + MK_KPAD;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, ps = p_stride(C);
    const unsigned pa = mk_smem_addr(ph) + (unsigned)(((lane & 15) * ps + (lane >> 4) * 8) * 2);
    const unsigned vb = mk_smem_addr(stv) + (unsigned)(((lane & 15) * VS + w * 8) * 2);
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    for (int ks = 0; ks * 16 < C; ++ks) {
        unsigned a[4], b[2];
        ldsm_x2_t(vb + ks * 16 * VS * 2, b);
        mk_ldsm_x4(pa + ks * 32, a);
        mk_mma_bf16(d, a, b);
    }
    const int r = lane >> 2, dim = 8 * w + 2 * (lane & 3);
    if (r < g) *(float2*)(rec + r * (HD + 2) + 2 + dim) = make_float2(d[0] + d[2], d[1] + d[3]);
    if (w == 0 && lane < g) *(float2*)(rec + lane * (HD + 2)) = make_float2(sml[lane], sml[MAXG + lane]);
}

// The probe's data, the same on host and device (CTA b's copy).
static __host__ __device__ float s_val(int j, int pp, int b) { return 0.05f * ((j * 7 + pp * 3 + b) % 17 - 8); }
static __host__ __device__ float v_val(int i, int b) { return 0.03f * ((i * 3 + b) % 9 - 4); }

// ns[blockIdx.x]: the phase per repetition (ns); rec: per CTA MAXG head records; chk: CTA 0's normalised outputs.
template <int HD, int MODE>
__global__ void __launch_bounds__(NT, 1) values(int g, int C, unsigned long long* ns, float* rec, float* chk) {
    constexpr bool MMAV = MODE >= MMA;
    constexpr int VS = MMAV ? HD + MK_KPAD : HD;
    extern __shared__ float4 smem4[];
    const int cap = C, Cr = (C + 15) & ~15;
    float* s0 = (float*)smem4;                       // [MAXG][cap] the given scores
    float* sc = s0 + MAXG * cap;                     // [MAXG][cap] working copy
    float* sml = sc + MAXG * cap;                    // [2][MAXG]
    mk_bf16* stv = (mk_bf16*)(sml + 2 * MAXG);       // [Cr][VS]
    mk_bf16* ph = stv + (size_t)Cr * VS;             // [16][p_stride(C)]
    for (int e = threadIdx.x; e < MAXG * cap; e += NT) s0[e] = s_val(e / cap, e % cap, blockIdx.x);
    for (int e = threadIdx.x; e < Cr * HD; e += NT)
        stv[(e / HD) * VS + e % HD] = mk_f2bf(e / HD < C ? v_val(e, blockIdx.x) : 0.f);
    const int j = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* recb = rec + (size_t)blockIdx.x * MAXG * (HD + 2);
    unsigned long long acc = 0, t0 = 0;
    float keep = 0.f;
    for (int rep = 0; rep <= REPS; ++rep) {
        for (int e = threadIdx.x; e < MAXG * cap; e += NT) sc[e] = s0[e];
        if (MODE == MMA_V)   // the tile as the softmax leaves it
            for (int e = threadIdx.x; e < 2 * MAXG * Cr; e += NT) {
                const int row = e / Cr, pp = e % Cr;
                ph[row * p_stride(C) + pp] = mk_f2bf(pp < C ? 0.01f * (1 + (row + pp) % 5) : 0.f);
            }
        __syncthreads();
        if (threadIdx.x == 0) t0 = mk_globaltimer();
        if (MODE == FP32 && j < g) attn_head_values<HD>(sc, stv, C, cap, recb + j * (HD + 2), true);
        if ((MODE == MMA || MODE == MMA_SM) && j < g) softmax_tile(sc, ph, sml, C, cap);
        if (MODE == MMA) __syncthreads();
        if ((MODE == MMA || MODE == MMA_V) && j < HD / 8) values_mma<HD>(ph, stv, sml, recb, g, C);
        __syncthreads();
        if (threadIdx.x == 0 && rep) acc += mk_globaltimer() - t0;
        if (j < g) keep += recb[j * (HD + 2) + 2 + lane];
    }
    __syncthreads();
    if (blockIdx.x == 0 && j < g && (MODE == FP32 || MODE == MMA))
        for (int d = lane; d < HD; d += 32) chk[j * HD + d] = recb[j * (HD + 2) + 2 + d] / recb[j * (HD + 2) + 1];
    if (threadIdx.x == 0) ns[blockIdx.x] = acc / REPS;
    if (keep == 1.2345f) g_sink = keep;
}

// max relative error (against the largest output) of CTA 0's softmax(s) V
static double check(const std::vector<float>& got, int g, int hd, int C) {
    double err = 0.0, big = 1e-30;
    for (int j = 0; j < g; ++j) {
        double mx = -1e300, den = 0.0;
        for (int pp = 0; pp < C; ++pp) mx = std::max(mx, (double)s_val(j, pp, 0));
        for (int pp = 0; pp < C; ++pp) den += std::exp(s_val(j, pp, 0) - mx);
        for (int d = 0; d < hd; ++d) {
            double o = 0.0;
            for (int pp = 0; pp < C; ++pp) o += std::exp(s_val(j, pp, 0) - mx) * bf16_round(v_val(pp * hd + d, 0));
            o /= den;
            err = std::max(err, std::fabs(o - got[j * hd + d]));
            big = std::max(big, std::fabs(o));
        }
    }
    return err / big;
}

template <int HD, int MODE>
static void run(int g, int C, int nsm, unsigned long long* ns, float* rec, float* chk, double& med, double& err,
                cudaError_t& e) {
    constexpr int VS = MODE >= MMA ? HD + MK_KPAD : HD;
    const int Cr = (C + 15) & ~15;
    const int smem = (2 * MAXG * C + 2 * MAXG) * 4 + Cr * VS * 2 + 2 * MAXG * p_stride(C) * 2;
    cudaFuncSetAttribute(values<HD, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaMemset(chk, 0, sizeof(float) * MAXG * 128);
    values<HD, MODE><<<nsm, NT, smem>>>(g, C, ns, rec, chk);
    std::vector<unsigned long long> h(nsm);
    std::vector<float> got(MAXG * 128);
    cudaMemcpy(h.data(), ns, sizeof(unsigned long long) * nsm, cudaMemcpyDeviceToHost);
    cudaMemcpy(got.data(), chk, sizeof(float) * MAXG * 128, cudaMemcpyDeviceToHost);
    e = cudaGetLastError();
    std::sort(h.begin(), h.end());
    med = h[nsm / 2] / 1e3;
    err = (MODE == FP32 || MODE == MMA) ? check(got, g, HD, C) : NAN;
}

template <int HD>
static void run_mode(int mode, int g, int C, int nsm, unsigned long long* ns, float* rec, float* chk, double& med,
                     double& err, cudaError_t& e) {
    switch (mode) {
    case FP32: run<HD, FP32>(g, C, nsm, ns, rec, chk, med, err, e); break;
    case MMA: run<HD, MMA>(g, C, nsm, ns, rec, chk, med, err, e); break;
    case MMA_SM: run<HD, MMA_SM>(g, C, nsm, ns, rec, chk, med, err, e); break;
    default: run<HD, MMA_V>(g, C, nsm, ns, rec, chk, med, err, e); break;
    }
}

int main() {
    int nsm = 0;
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
    unsigned long long* ns;
    float *rec, *chk;
    cudaMalloc(&ns, sizeof(unsigned long long) * nsm);
    cudaMalloc(&rec, sizeof(float) * nsm * MAXG * 130);
    cudaMalloc(&chk, sizeof(float) * MAXG * 128);
    struct Case { const char* what; int g, hd; };
    const Case cases[] = {{"0.5B (g 7, hd 64)", 7, 64}, {"Llama-1B (g 4, hd 64)", 4, 64}, {"1.5B (g 6, hd 128)", 6, 128}};
    const int lens[] = {64, 128, 256, 512};
    printf("%-24s %5s", "case", "C");
    for (int m = 0; m < NMODES; ++m) printf(" %8s", kModes[m]);
    printf("  %9s %9s\n", "err fp32", "err mma");
    std::string json = "{\"probe\": \"attn_values\", \"rows\": [";
    bool ok = true;
    for (const Case& c : cases) {
        for (int C : lens) {
            if (c.hd == 128 && C > 256) continue;   // the staging region of one SM
            double med[NMODES], err[NMODES];
            printf("%-24s %5d", c.what, C);
            for (int m = 0; m < NMODES; ++m) {
                cudaError_t e;
                if (c.hd == 64) run_mode<64>(m, c.g, C, nsm, ns, rec, chk, med[m], err[m], e);
                else run_mode<128>(m, c.g, C, nsm, ns, rec, chk, med[m], err[m], e);
                if (e != cudaSuccess) { printf(" %s", cudaGetErrorString(e)); ok = false; }
                printf(" %8.3f", med[m]);
            }
            ok = ok && err[FP32] < 1e-4 && err[MMA] < 1e-4;
            printf("  %9.2e %9.2e\n", err[FP32], err[MMA]);
            char b[400];
            snprintf(b, sizeof b, "%s{\"g\": %d, \"hd\": %d, \"C\": %d", json.back() == '[' ? "" : ", ", c.g, c.hd, C);
            json += b;
            for (int m = 0; m < NMODES; ++m) {
                snprintf(b, sizeof b, ", \"%s_us\": %.3f", kModes[m], med[m]);
                json += b;
            }
            snprintf(b, sizeof b, ", \"err_fp32\": %.3e, \"err_mma\": %.3e}", err[FP32], err[MMA]);
            json += b;
        }
    }
    printf("%s], \"ok\": %s}\n", json.c_str(), ok ? "true" : "false");
    return ok ? 0 : 1;
}
