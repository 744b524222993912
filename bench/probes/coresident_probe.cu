// Co-residency probe (bench/NOTES.md, session 22, next item 5): can a clustered persistent launch (clusters of 16:
// 112 of an H200's 132 SMs) and a second, plain persistent launch on the SMs it leaves idle run at once, hand off
// through the same global counters, and stream weights together?
//
// Both launches run the same kernel, one CTA per SM (512 threads, SMEM_KB of dynamic shared memory each, so no SM
// takes two). Launch A (clusters of CL) goes first on one stream, launch B (plain, n_sm - |A| CTAs) second on
// another. Three phases, every spin bounded by a timeout (a launch that never becomes resident ends the run with
// "no", not a hang):
//   1. handshake: every CTA adds 1 to a counter and waits until all of A + B have: resident together or not, and
//      how long after A's first CTA the last one arrived;
//   2. chain: NS stages, each CTA releasing a stage counter and waiting for all (the kernel's handoff, without a
//      payload): us per stage over A + B, against A alone;
//   3. stream: every CTA reads its share of a 2 GB buffer (16-byte loads, 8 per thread in flight): the aggregate
//      rate of A + B against A alone.
// Row "B, then A" (session 23): the plain launch goes first. Its CTAs (one per SM) may leave no GPC with CL free SMs,
// so that no cluster of A can start until they leave: then the handshake times out ("no") instead of finishing. It
// says whether the kernel's side launch needs the side's own timeout (mk_block.cuh side_verdict) in practice.
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I kernels/csrc bench/probes/coresident_probe.cu \
//        -o /tmp/coresident_probe && /tmp/coresident_probe
// Prints a table, then a JSON line.
#include "mk_vendor.h"

#include <cstdio>
#include <string>
#include <unistd.h>

#define NT 512
#define NS 2000
#define CL 16
#define SMEM_KB 120
#define STREAM_BYTES (2ull << 30)
#define TIMEOUT_NS 2000000000ull

struct Shared {
    unsigned arrived;
    unsigned failed;
    unsigned long long t_first, t_last;        // handshake: first arrival (A's CTA 0), last CTA seeing everyone
    unsigned long long chain_ns, stream_ns;    // measured by global CTA 0
    unsigned long long stream_end[2];          // last CTA of each launch done streaming (atomicMax)
    unsigned ctr[NS];
    unsigned stream_done;
};

__device__ float g_sink;

// Thread 0 spins until *c >= target or the timeout; false (and the failure flag set) on timeout.
MK_DEV bool spin(Shared* sh, const unsigned* c, unsigned target) {
    const unsigned long long t0 = mk_globaltimer();
    while (mk_ld_acquire(c) < target) {
        if (mk_globaltimer() - t0 > TIMEOUT_NS || *(volatile unsigned*)&sh->failed) {
            atomicExch(&sh->failed, 1u);
            return false;
        }
    }
    return true;
}

__global__ void __launch_bounds__(NT, 1) work(Shared* sh, int role, int n_a, int total, const uint4* W) {
    extern __shared__ float4 pad[];   // SMEM_KB, untouched: one CTA per SM
    __shared__ int ok;
    const int g = role == 0 ? blockIdx.x : n_a + blockIdx.x;   // global CTA index over both launches
    if (threadIdx.x == 0) {
        if (g == 0) sh->t_first = mk_globaltimer();
        atomicAdd(&sh->arrived, 1u);
        ok = spin(sh, &sh->arrived, (unsigned)total);
        if (ok) atomicMax(&sh->t_last, mk_globaltimer());
    }
    __syncthreads();
    if (!ok) return;
    unsigned long long t0 = 0;
    for (int s = 0; s < NS; ++s) {   // the kernel's handoff: bar.sync, release add; acquire spin, bar.sync
        if (s == 1 && g == 0 && threadIdx.x == 0) t0 = mk_globaltimer();
        __syncthreads();
        if (threadIdx.x == 0) {
            mk_red_release(&sh->ctr[s], 1u);
            ok = spin(sh, &sh->ctr[s], (unsigned)total);
        }
        __syncthreads();
        if (!ok) return;
    }
    if (g == 0 && threadIdx.x == 0) sh->chain_ns = mk_globaltimer() - t0;
    // stream this CTA's share
    const size_t chunks = STREAM_BYTES / 16, per = chunks / (size_t)total, c0 = per * (size_t)g;
    if (threadIdx.x == 0 && g == 0) sh->stream_ns = mk_globaltimer();
    float acc = 0.f;
    for (size_t c = c0 + threadIdx.x; c < c0 + per; c += (size_t)NT * 8) {
        uint4 w[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) w[j] = c + (size_t)j * NT < c0 + per ? mk_ld_stream16(W + c + (size_t)j * NT)
                                                                           : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc += __uint_as_float(w[j].x ^ w[j].w);
    }
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(&sh->stream_end[role], mk_globaltimer());
    if (acc == 1.2345f) g_sink = acc;
    (void)pad;
}

int main() {
    int nsm = 0;
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
    const int smem = SMEM_KB * 1024;
    cudaFuncSetAttribute(work, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaFuncSetAttribute(work, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = CL;
    at.val.clusterDim.y = 1;
    at.val.clusterDim.z = 1;
    cfg.blockDim = dim3(NT);
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    cfg.gridDim = dim3(nsm / CL * CL);
    int clusters = 0;
    cudaOccupancyMaxActiveClusters(&clusters, (void*)work, &cfg);
    const int n_a = clusters * CL, n_b = nsm - n_a;
    Shared* sh;
    uint4* W;
    cudaMalloc(&sh, sizeof(Shared));
    cudaMalloc(&W, STREAM_BYTES);
    cudaMemset(W, 0x3c, STREAM_BYTES);
    cudaStream_t sa, sb;
    cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking);
    printf("%d SMs; clusters of %d: %d resident (%d CTAs), the second launch: %d CTAs; %d KB shared memory each\n",
           nsm, CL, clusters, n_a, n_b, SMEM_KB);
    printf("%-10s %10s %14s %12s %12s\n", "launches", "resident", "handshake us", "us / stage", "stream TB/s");
    std::string json = "{\"probe\": \"coresident\", \"clusters\": " + std::to_string(clusters) + ", \"rows\": [";
    for (int both = 0; both < 3; ++both) {   // 0: A alone, 1: A then B, 2: B then A
        for (int rep = 0; rep < 3; ++rep) {
            cudaMemset(sh, 0, sizeof(Shared));
            cudaDeviceSynchronize();   // the launches' streams do not wait for the legacy stream
            const int total = both ? nsm : n_a;
            int role = 0, na = n_a;
            cfg.gridDim = dim3(n_a);
            cfg.stream = sa;
            cudaError_t e = cudaSuccess;
            if (both == 2) {
                work<<<n_b, NT, smem, sb>>>(sh, 1, na, total, W);
                e = cudaGetLastError();
                usleep(1000);   // the plain CTAs are resident before A is launched
            }
            if (e == cudaSuccess) e = cudaLaunchKernelEx(&cfg, work, sh, role, na, total, (const uint4*)W);
            if (both == 1 && e == cudaSuccess) {
                role = 1;
                work<<<n_b, NT, smem, sb>>>(sh, role, na, total, W);
                e = cudaGetLastError();
            }
            cudaDeviceSynchronize();
            if (e == cudaSuccess) e = cudaGetLastError();
            Shared h;
            cudaMemcpy(&h, sh, sizeof h, cudaMemcpyDeviceToHost);
            const bool res = e == cudaSuccess && !h.failed;
            const unsigned long long end = h.stream_end[0] > h.stream_end[1] ? h.stream_end[0] : h.stream_end[1];
            const double hs = res ? (h.t_last - h.t_first) / 1e3 : -1, st = res ? h.chain_ns / 1e3 / (NS - 1) : -1;
            const double bw = res ? (double)(STREAM_BYTES / total * total) / (end - h.stream_ns) / 1e3 : -1;
            printf("%-10s %10s %14.1f %12.3f %12.2f %s\n", both == 2 ? "B, then A" : both ? "A + B" : "A alone",
                   res ? "yes" : "no", hs, st, bw,
                   e == cudaSuccess ? "" : cudaGetErrorString(e));
            char b[200];
            snprintf(b, sizeof b, "%s{\"both\": %d, \"resident\": %s, \"handshake_us\": %.1f, \"stage_us\": %.4f, "
                     "\"stream_TBps\": %.3f}", both || rep ? ", " : "", both, res ? "true" : "false", hs, st, bw);
            json += b;
        }
    }
    printf("%s]}\n", json.c_str());
    return 0;
}
