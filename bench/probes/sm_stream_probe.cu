// Per-SM streaming rate: does every SM stream weights at the same rate? The kernel's streaming stages end with a
// spread (session 26 table: LM head 2-7 us of 33-66, the fused MLP 0.6-2.1 us per layer); if some SMs (e.g. those of
// the GPCs with more SMs) streamed slower, equal rows per SM would leave them last and rows per SM should follow
// the rate. One CTA per SM (512 threads, every CTA at once), each reading its own 8 MB (far beyond L2) with the
// kernel's weight loads (mk_ld_stream16, 4 x 16 bytes per thread in flight per round), REPS passes; each CTA records
// %smid and its us per pass (globaltimer). Prints the distribution over SMs (min / median / max, the slowest and
// fastest SMs) and the chip's rate at the slowest SM, then a JSON line.
// Session 26 (one H200): every SM at 33.5-34.5 GB/s (242.8 / 247.3 / 250.5 us per pass min / median / max, 4.42 TB/s):
// the rate is uniform (3 % from the fastest SM to the slowest).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I kernels/csrc bench/probes/sm_stream_probe.cu \
//        -o /tmp/sm_stream_probe && /tmp/sm_stream_probe
#include "mk_vendor.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#define NT 512
#define REPS 5

MK_DEV unsigned smid() {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}

// CTA b streams bytes [b * per, (b + 1) * per) of w, REPS passes; out[b] = smid, ns[b] = mean ns per pass.
__global__ void __launch_bounds__(NT, 1) stream(const uint4* w, size_t per16, unsigned* out, unsigned long long* ns,
                                                float* sink) {
    const uint4* base = w + (size_t)blockIdx.x * per16;
    float acc = 0.f;
    unsigned long long t0 = 0;
    for (int rep = 0; rep <= REPS; ++rep) {
        __syncthreads();
        if (rep == 1 && threadIdx.x == 0) t0 = mk_globaltimer();
        for (size_t i = threadIdx.x; i < per16; i += 4 * NT) {
            uint4 u[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const size_t j = i + (size_t)k * NT;
                u[k] = j < per16 ? mk_ld_stream16(base + j) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int k = 0; k < 4; ++k) acc += __uint_as_float(u[k].x ^ u[k].y ^ u[k].z ^ u[k].w);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        ns[blockIdx.x] = (mk_globaltimer() - t0) / REPS;
        out[blockIdx.x] = smid();
    }
    if (acc == 1.2345f) *sink = acc;
}

int main() {
    int nsm = 0;
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
    const size_t per = 8u << 20, per16 = per / 16;
    uint4* w;
    cudaMalloc(&w, per * nsm);
    cudaMemset(w, 1, per * nsm);
    unsigned* d_sm;
    unsigned long long* d_ns;
    float* sink;
    cudaMalloc(&d_sm, sizeof(unsigned) * nsm);
    cudaMalloc(&d_ns, sizeof(unsigned long long) * nsm);
    cudaMalloc(&sink, sizeof(float));
    const int smem = 160 << 10;   // unused: it keeps the launch at one CTA per SM
    cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    stream<<<nsm, NT, smem>>>(w, per16, d_sm, d_ns, sink);   // warm-up
    stream<<<nsm, NT, smem>>>(w, per16, d_sm, d_ns, sink);
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) { printf("error: %s\n", cudaGetErrorString(e)); return 1; }
    std::vector<unsigned> sm(nsm);
    std::vector<unsigned long long> ns(nsm);
    cudaMemcpy(sm.data(), d_sm, sizeof(unsigned) * nsm, cudaMemcpyDeviceToHost);
    cudaMemcpy(ns.data(), d_ns, sizeof(unsigned long long) * nsm, cudaMemcpyDeviceToHost);
    std::vector<std::pair<double, unsigned>> v;   // (us per pass, smid)
    for (int b = 0; b < nsm; ++b) v.push_back({ns[b] / 1e3, sm[b]});
    std::sort(v.begin(), v.end());
    const double med = v[nsm / 2].first;
    printf("%d SMs, %zu MB per SM per pass: us per pass min %.1f median %.1f max %.1f (%.1f GB/s per SM at the "
           "median); chip %.2f TB/s at the slowest SM\n", nsm, per >> 20, v.front().first, med, v.back().first,
           per / (med * 1e-6) / 1e9, per * nsm / (v.back().first * 1e-6) / 1e12);
    printf("fastest smid:");
    for (int i = 0; i < 8; ++i) printf(" %u (%.1f)", v[i].second, v[i].first);
    printf("\nslowest smid:");
    for (int i = nsm - 8; i < nsm; ++i) printf(" %u (%.1f)", v[i].second, v[i].first);
    printf("\n{\"probe\": \"sm_stream\", \"sms\": %d, \"min_us\": %.2f, \"median_us\": %.2f, \"max_us\": %.2f}\n", nsm,
           v.front().first, med, v.back().first);
    return 0;
}
