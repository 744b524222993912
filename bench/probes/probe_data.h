// Test data shared by the matvec probes (mma_matvec_probe.cu, mma_frag_probe.cu): W holds exact bf16 values n / 128,
// |n| <= 127, from a hash of the element index (< 2^32 elements); x is fp32 with a full 24-bit mantissa range (so
// its bf16 lo half matters to the tensor-core modes). The host's double references use the same functions.
#pragma once
#include "mk_vendor.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#define HOSTDEV __host__ __device__ __forceinline__

HOSTDEV unsigned mix(unsigned h) {
    h *= 0x9e3779b9u;
    h ^= h >> 15; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
    return h;
}
HOSTDEV float w_val(size_t e) { return (float)((int)(mix((unsigned)e) % 255u) - 127) * (1.f / 128.f); }
HOSTDEV float x_val(int k) { return (float)(mix(mix(k) + 0x51ed27u) & 0xffffffu) / 16777216.f - 0.5f; }

__global__ void fill(mk_bf16* p, size_t n) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        p[e] = mk_f2bf(w_val(e));
}

// Host reference of every CTA's rows: x = x_val(0 .. K), ref[c R + r] = sum_k w_val(base + (c R + r) K + k) x[k] in
// double for CTAs c < nsm, big[c] = max |ref| of CTA c (the probes' error scale).
static inline void host_reference(size_t base, int nsm, int R, int K, std::vector<float>& hx, std::vector<double>& ref,
                                  std::vector<double>& big) {
    hx.assign(K, 0.f);
    for (int k = 0; k < K; ++k) hx[k] = x_val(k);
    ref.assign((size_t)nsm * R, 0.0);
    big.assign(nsm, 0.0);
    for (int c = 0; c < nsm; ++c)
        for (int r = 0; r < R; ++r) {
            const size_t e0 = base + ((size_t)c * R + r) * K;
            double acc = 0.0;
            for (int k = 0; k < K; ++k) acc += (double)w_val(e0 + k) * hx[k];
            ref[(size_t)c * R + r] = acc;
            big[c] = std::max(big[c], std::fabs(acc));
        }
}
