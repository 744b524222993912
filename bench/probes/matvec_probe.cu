// Matvec probe: how fast does one CTA per SM (all SMs at once, 512 threads) turn R x K bf16 weight rows into R dot
// products with an fp32 vector in shared memory, by where the weights come from and how the arithmetic is shaped.
// Session 5 measured the monokernel's GATEUP at ~29 GB/s per SM with every row already in shared memory (the stash,
// bench/NOTES.md): no faster than from DRAM. This probe separates the two costs.
//
// Modes (each times R rows per CTA, median / max over CTAs of the matvec alone, then GB/s per SM and for the GPU):
//   dram      the monokernel's one-set loop before patch 17: 2 items x U = 4 chunks per lane, loads then 8-FMA
//             chains, a 5-shuffle reduction per item (streaming loads)
//   smem      the same loop reading rows already in shared memory (16-byte shared loads)
//   smem-ilp  shared memory, each dot8 as two 4-FMA chains and one accumulator per chunk (no chain across chunks)
//   smem-tr   shared memory, lane partials of 32 items kept in registers and reduced together by a transposed
//             butterfly (31 shuffles for 32 items instead of 5 per item)
//   dram-ilp / dram-tr   the last two with streaming loads
//   dram-pair / smem-pair  the monokernel's loop since patch 17: batches of two rows over the same chunks share
//             each activation load, activations swizzled in shared memory (no bank conflicts)
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I kernels/csrc bench/probes/matvec_probe.cu \
//        -o /tmp/matvec_probe && /tmp/matvec_probe
// Prints one line per (K, mode), then a JSON line.
#include "mk_vendor.h"
#include "probe_util.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#define NT 512
#define NW 16
#define U 4

__device__ float g_sink;

MK_DEV float dot8_chain(const uint4 w, const float* v) {   // the monokernel's order: one dependent chain
    float f[8];
    mk_unpack8(w, f);
    const float4 a = *(const float4*)v, b = *(const float4*)(v + 4);
    return f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w + f[4] * b.x + f[5] * b.y + f[6] * b.z + f[7] * b.w;
}

MK_DEV float dot8_two(const uint4 w, const float* v) {     // two independent 4-FMA chains
    float f[8];
    mk_unpack8(w, f);
    const float4 a = *(const float4*)v, b = *(const float4*)(v + 4);
    const float s0 = fmaf(f[6], b.z, fmaf(f[4], b.x, fmaf(f[2], a.z, f[0] * a.x)));
    const float s1 = fmaf(f[7], b.w, fmaf(f[5], b.y, fmaf(f[3], a.w, f[1] * a.y)));
    return s0 + s1;
}

// Weight chunk c of row r: from global (streaming) or from the shared-memory copy of the CTA's rows.
template <bool SMEM>
MK_DEV uint4 load_chunk(const mk_bf16* g, unsigned s, int r, int K, int c) {
    if (SMEM) {
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(s + (unsigned)(r * K + c * 8) * 2u));
        return v;
    }
    return mk_ld_stream16(g + (size_t)r * K + (size_t)c * 8);
}

// mode 0: the monokernel's loop before patch 17 (chain dot8, reduction per item); 1: ILP dot; 2: ILP dot + transposed reduction;
// 3: row pairs sharing swizzled activation loads.
template <bool SMEM, int MODE>
MK_DEV void matvec(const mk_bf16* g, unsigned s, int R, int K, const float* sv, float* red) {
    const int nch = K >> 3;
    const int ipr = (nch + 32 * U - 1) / (32 * U);
    const int items = R * ipr;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (MODE < 2) {
        for (int base = warp; base < items; base += 2 * NW) {
            uint4 w[2][U];
            int cb[2];
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const int it = base + k * NW;
                const int r = it / ipr, gg = it - r * ipr;
                cb[k] = it < items ? gg * 32 * U + lane : nch;
#pragma unroll
                for (int j = 0; j < U; ++j) {
                    const int c = cb[k] + j * 32;
                    w[k][j] = c < nch ? load_chunk<SMEM>(g, s, it < items ? r : 0, K, c) : make_uint4(0, 0, 0, 0);
                }
            }
            float acc[2];
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                if (MODE == 0) {
                    acc[k] = 0.f;
#pragma unroll
                    for (int j = 0; j < U; ++j) {
                        const int c = cb[k] + j * 32;
                        if (c < nch) acc[k] += dot8_chain(w[k][j], sv + c * 8);
                    }
                } else {
                    float pj[U];
#pragma unroll
                    for (int j = 0; j < U; ++j) {
                        const int c = cb[k] + j * 32;
                        pj[j] = c < nch ? dot8_two(w[k][j], sv + c * 8) : 0.f;
                    }
                    acc[k] = (pj[0] + pj[1]) + (pj[2] + pj[3]);
                }
            }
            acc[0] = warp_sum(acc[0]);
            acc[1] = warp_sum(acc[1]);
            if (lane == 0) {
                red[base] = acc[0];
                if (base + NW < items) red[base + NW] = acc[1];
            }
        }
    } else if (MODE == 3) {
        // the kernel's batches since patch 17: two rows over the same chunks share each activation load, and the
        // activations sit swizzled (chunk c's 16-byte halves swapped when bit 2 of c is set: no bank conflict)
        const float4* sv4 = (const float4*)sv;
        const int nb = ((R + 1) >> 1) * ipr;
        for (int bi = warp; bi < nb; bi += NW) {
            const int rp = bi / ipr, gr = bi - rp * ipr;
            const int nrows = min(2, R - 2 * rp);
            const int c0 = gr * 32 * U + lane;
            uint4 w[2][U];
#pragma unroll
            for (int k = 0; k < 2; ++k)
#pragma unroll
                for (int j = 0; j < U; ++j) {
                    const int c = c0 + j * 32;
                    w[k][j] = k < nrows && c < nch ? load_chunk<SMEM>(g, s, 2 * rp + k, K, c)
                                                   : make_uint4(0, 0, 0, 0);
                }
            float a0 = 0.f, a1 = 0.f;
#pragma unroll
            for (int j = 0; j < U; ++j) {
                const int c = c0 + j * 32;
                if (c < nch) {
                    const int x = (c >> 2) & 1;
                    const float4 a = sv4[(2 * c) ^ x], b = sv4[(2 * c + 1) ^ x];
                    float f[8], h[8];
                    mk_unpack8(w[0][j], f);
                    mk_unpack8(w[1][j], h);
                    a0 += f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w + f[4] * b.x + f[5] * b.y + f[6] * b.z +
                          f[7] * b.w;
                    a1 += h[0] * a.x + h[1] * a.y + h[2] * a.z + h[3] * a.w + h[4] * b.x + h[5] * b.y + h[6] * b.z +
                          h[7] * b.w;
                }
            }
            a0 = warp_sum(a0);
            a1 = warp_sum(a1);
            if (lane == 0) {
                red[2 * rp * ipr + gr] = a0;
                if (nrows > 1) red[(2 * rp + 1) * ipr + gr] = a1;
            }
        }
    } else {
        // 32 items per warp round (items base + q * NW, q < 32): lane partials in part[q], then a transposed
        // butterfly leaves item (base + lane * NW)'s sum in lane `lane`.
        for (int base = warp; base < items; base += 32 * NW) {
            float part[32];
#pragma unroll
            for (int q = 0; q < 32; ++q) {
                const int it = base + q * NW;
                float a = 0.f;
                if (it < items) {
                    const int r = it / ipr, gg = it - r * ipr;
#pragma unroll
                    for (int j = 0; j < U; ++j) {
                        const int c = gg * 32 * U + j * 32 + lane;
                        if (c < nch) a += dot8_two(load_chunk<SMEM>(g, s, r, K, c), sv + c * 8);
                    }
                }
                part[q] = a;
            }
            // step o: lanes with bit o set keep the upper half of the live entries, others the lower half
#pragma unroll
            for (int o = 16, n = 32; o; o >>= 1, n >>= 1) {
                const bool up = lane & o;
#pragma unroll
                for (int q = 0; q < n / 2; ++q) {
                    const float send = up ? part[q] : part[q + n / 2];
                    const float keep = up ? part[q + n / 2] : part[q];
                    part[q] = keep + __shfl_xor_sync(0xffffffffu, send, o);
                }
            }
            const int it = base + lane * NW;   // after 5 steps part[0] of lane l holds item q = l (bit-reversed
            if (it < items) red[it] = part[0];  // order is not needed: each step keeps q's bit o = lane's bit o)
        }
    }
}

// One CTA per SM: stage sv (and with SMEM the rows) in shared memory, then time `reps` matvecs (globaltimer stamps;
// with reps > 1 the first is a warm-up; reps = 1 times a cold read, what the DRAM modes need).
template <bool SMEM, int MODE>
__global__ void __launch_bounds__(NT, 1) probe(const mk_bf16* W, int R, int K, int reps, unsigned long long* ns) {
    extern __shared__ float4 smem4[];
    float* sv = (float*)smem4;
    float* red = sv + K;
    mk_bf16* rows = (mk_bf16*)(red + 8192);
    const mk_bf16* g = W + (size_t)blockIdx.x * R * K;
    for (int i = threadIdx.x; i < K; i += NT) sv[i] = 1.f / (1 + i % 7);
    if (SMEM)
        for (int i = threadIdx.x * 8; i < R * K; i += NT * 8) *(uint4*)(rows + i) = *(const uint4*)(g + i);
    __syncthreads();
    const unsigned s = mk_smem_addr(rows);
    unsigned long long t0 = 0;
    float keep = 0.f;
    for (int rep = 0; rep < reps; ++rep) {
        __syncthreads();
        if (rep == (reps > 1 ? 1 : 0)) t0 = mk_globaltimer();
        matvec<SMEM, MODE>(g, s, R, K, sv, red);
        __syncthreads();
        keep += red[threadIdx.x % 64];
    }
    if (threadIdx.x == 0) ns[blockIdx.x] = (mk_globaltimer() - t0) / (reps > 1 ? reps - 1 : 1);
    if (keep == 1.2345f) g_sink = keep;
}

int main() {
    int nsm = 0;
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
    struct Case { int K, R; const char* what; };
    // rows per CTA as the monokernel's schedule gives them on 132 SMs (bytes per CTA <= ~150 KB so SMEM fits)
    const std::vector<Case> cases = {{896, 74, "0.5B GATEUP"}, {1536, 48, "1.5B GATEUP (48 of 136 rows)"},
                                     {2048, 36, "Llama GATEUP (36 of 126 rows)"}, {8960, 8, "1.5B DOWN (8 of 12)"}};
    const size_t max_bytes = (size_t)nsm * 160 * 1024;
    mk_bf16* W;
    cudaMalloc(&W, max_bytes * 40);   // 40 distinct buffers per case so DRAM runs miss L2
    cudaMemset(W, 0x3c, max_bytes * 40);
    unsigned long long* ns;
    cudaMalloc(&ns, sizeof(unsigned long long) * nsm);
    std::vector<unsigned long long> h(nsm);
    printf("%-30s %-9s %9s %9s %10s %9s\n", "case", "mode", "med us", "max us", "GB/s/SM", "TB/s");
    std::string json = "{\"probe\": \"matvec\", \"rows\": [";
    for (const auto& c : cases) {
        const size_t bytes = (size_t)c.R * c.K * 2;
        const int smem = (c.K + 8192) * 4 + (int)bytes;
        auto run = [&](auto kern, const char* mode, bool dram) {
            cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
            std::vector<double> us;
            // DRAM modes: one cold pass per launch over a buffer no earlier launch of this mode read (L2 holds
            // 50 MB; consecutive buffers are distinct), averaged over 40 launches; shared-memory modes: 19 timed
            // passes after a warm-up
            for (int b = 0; b < (dram ? 40 : 1); ++b) {
                const mk_bf16* Wb = W + (size_t)b * max_bytes / 2;
                kern<<<nsm, NT, smem>>>(Wb, c.R, c.K, dram ? 1 : 20, ns);
                cudaMemcpy(h.data(), ns, sizeof(unsigned long long) * nsm, cudaMemcpyDeviceToHost);
                std::vector<unsigned long long> s(h);
                std::sort(s.begin(), s.end());
                us.push_back(s[nsm / 2] / 1e3);
                us.push_back(s[nsm - 1] / 1e3);
            }
            double med = 0, mx = 0;
            for (size_t i = 0; i < us.size(); i += 2) { med += us[i]; mx = std::max(mx, us[i + 1]); }
            med /= us.size() / 2;
            const cudaError_t e = cudaGetLastError();
            printf("%-30s %-9s %9.2f %9.2f %10.1f %9.2f %s\n", c.what, mode, med, mx, bytes / (med * 1e-6) / 1e9,
                   bytes * nsm / (med * 1e-6) / 1e12, e == cudaSuccess ? "" : cudaGetErrorString(e));
            char buf[256];
            snprintf(buf, sizeof buf, "%s{\"K\": %d, \"R\": %d, \"mode\": \"%s\", \"median_us\": %.3f, \"max_us\": %.3f}",
                     json.back() == '[' ? "" : ", ", c.K, c.R, mode, med, mx);
            json += buf;
        };
        run(probe<false, 0>, "dram", true);
        run(probe<false, 1>, "dram-ilp", true);
        run(probe<false, 2>, "dram-tr", true);
        run(probe<true, 0>, "smem", false);
        run(probe<true, 1>, "smem-ilp", false);
        run(probe<true, 2>, "smem-tr", false);
        run(probe<false, 3>, "dram-pair", true);
        run(probe<true, 3>, "smem-pair", false);
    }
    printf("%s]}\n", json.c_str());
    return 0;
}
