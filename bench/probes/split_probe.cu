// Split-SM probe: does weight streaming on some SMs slow a handoff chain running on the others?
// sync_probe showed that DRAM traffic in flight on the chain's own SMs adds about its whole duration to each
// handoff (the chain's L2 round trips queue behind it). Whether that queue is per SM (the SM's return path) or
// chip-wide (L2 / crossbar) decides whether a kernel can stream weights on some SMs while others run the
// per-layer latency chain (norms, attention, small matvecs) without slowing it.
//
// CTAs [0, C): the monokernel's counter handoff (st, bar.sync, red.release.gpu; ld.acquire spin, bar.sync, ld.cg)
// chained over NS stages among themselves; CTA 0 times stages 1..NS-1 and then raises a stop flag.
// CTAs [C, nsm): streamers until the flag: either 16-byte loads (each warp keeps NL loads per thread in flight:
// NL x 8 KB per CTA) or thread 0's bulk copies into a ring of shared-memory slots (KS slots of 16 KB in flight).
// Each streamer CTA counts its bytes and its own start / end time; the line reports the chain's us per stage
// and the streamers' aggregate rate (bytes / (last end - first start)).
// Rows: the chain on all SMs (the sync probe's "counter"); the chain on C SMs alone; the same with streamers;
// the streamers alone (the chain CTAs only wait the same time, no handoffs).
// The chain's block sum is the kernel's (mk_block.cuh); session 9's numbers (bench/NOTES.md) were taken with a
// plain sum over the warps, as in the sync probe of that time.
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I kernels/csrc bench/probes/split_probe.cu \
//        -o /tmp/split_probe && /tmp/split_probe
// Prints one line per row, then a JSON line.
#include "mk_vendor.h"
#include "mk_isa.h"
#include "probe_bulk.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#define NT 512
#define E 8                 // outputs per chain CTA per stage
#define NS 2000             // chained stages
#define NW (NT / 32)
#include "mk_block.cuh"   // the kernel's block reductions (block_sum: scr holds NW + 1 floats)
#define SLOT 16384          // bulk-copy slot bytes
#define MAXKS 12

struct Args {
    float* buf;              // [2][C * E]
    unsigned* ctr;           // [NS]
    const uint4* W;          // weight buffer
    size_t wchunks;          // its 16-byte chunks
    unsigned* stop;
    unsigned long long* out; // [0] chain ns; then per CTA: bytes, start, end
    int C;                   // chain CTAs
    int handoffs;            // 0: chain CTAs only wait (streamers-alone row)
    int stream;              // 0 none, 1 loads, 2 bulk copies
    int ks;                  // bulk-copy slots in flight
};

__device__ float g_sink;


MK_DEV unsigned ld_relaxed(const unsigned* p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

MK_DEV void chain(const Args& a) {
    __shared__ float scr[NW + 1];
    const int D = a.C * E;
    unsigned long long t0 = 0;
    float carry = 1.f;
    for (int s = 0; s < NS; ++s) {
        if (s == 1 && threadIdx.x == 0) t0 = mk_globaltimer();
        if (!a.handoffs) continue;
        float acc = 0.f;
        if (s > 0) {
            const int src = (s - 1) & 1;
            if (threadIdx.x == 0)
                while (mk_ld_acquire(a.ctr + s - 1) < (unsigned)a.C) {}
            __syncthreads();
            for (int i = threadIdx.x; i < D; i += NT) acc += mk_ld_cg(a.buf + (size_t)src * D + i);
            carry = block_sum(acc, scr) * 1e-3f + 1.f;
        }
        if (threadIdx.x < E) a.buf[(size_t)(s & 1) * D + blockIdx.x * E + threadIdx.x] = carry * (1.f + threadIdx.x);
        __syncthreads();
        if (threadIdx.x == 0) mk_red_release(a.ctr + s, 1u);
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        if (!a.handoffs)   // the streamers-alone row: as long as a 1.6 us chain would take
            while (mk_globaltimer() - t0 < 1600ull * (NS - 1)) {}
        a.out[0] = mk_globaltimer() - t0;
        asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" :: "l"(a.stop), "r"(1u) : "memory");
    }
    if (carry == 1.2345f) g_sink = carry;
}

template <int NL>
MK_DEV void stream_loads(const Args& a, unsigned long long& bytes) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t per_warp = (size_t)32 * NL;
    size_t c = ((size_t)(blockIdx.x - a.C) * (NT / 32) + warp) * per_warp * 7 % a.wchunks;
    unsigned x = 0, done = 0;
    while (!done) {
        uint4 w[NL];
#pragma unroll
        for (int j = 0; j < NL; ++j) w[j] = mk_ld_stream16(a.W + (c + (size_t)j * 32 + lane) % a.wchunks);
        unsigned f = lane == 0 ? ld_relaxed(a.stop) : 0u;
#pragma unroll
        for (int j = 0; j < NL; ++j) x ^= w[j].x ^ w[j].w;
        done = __shfl_sync(0xffffffffu, f, 0);
        c = (c + (size_t)(gridDim.x - a.C) * (NT / 32) * per_warp) % a.wchunks;
        bytes += (unsigned long long)NL * 16;
    }
    if (x == 0x12345u) g_sink = (float)x;
}

MK_DEV void stream_bulk(const Args& a, unsigned long long& bytes, unsigned char* ring, unsigned long long* bars) {
    if (threadIdx.x != 0) return;
    for (int k = 0; k < a.ks; ++k) probe_mbar_init(bars + k);
    const size_t sc = SLOT / 16, span = (a.wchunks / sc) * sc;
    size_t c = (size_t)(blockIdx.x - a.C) * sc * 13 % span;
    unsigned phase = 0;   // bit k: the parity slot k's barrier completes next
    auto issue = [&](int k) {
        probe_bulk_copy(ring + (size_t)k * SLOT, a.W + c, SLOT, bars + k);
        c = (c + (size_t)(gridDim.x - a.C) * sc) % span;
    };
    for (int k = 0; k < a.ks; ++k) issue(k);
    auto wait = [&](int k) {
        probe_mbar_wait(bars + k, (phase >> k) & 1u);
        phase ^= 1u << k;
    };
    int k = 0;
    for (;; k = (k + 1) % a.ks) {
        wait(k);
        bytes += SLOT;
        if (ld_relaxed(a.stop) != 0u) break;
        issue(k);
    }
    for (int j = 1; j < a.ks; ++j) wait((k + j) % a.ks);   // the other slots are each in flight once
}

template <int NL>
__global__ void __launch_bounds__(NT, 1) probe(Args a) {
    extern __shared__ __align__(128) unsigned char ring[];
    __shared__ alignas(8) unsigned long long bars[MAXKS];
    if ((int)blockIdx.x < a.C) {
        chain(a);
        return;
    }
    unsigned long long bytes = 0;
    const unsigned long long t0 = mk_globaltimer();
    if (a.stream == 1) stream_loads<NL>(a, bytes);
    if (a.stream == 2) stream_bulk(a, bytes, ring, bars);
    const unsigned long long t1 = mk_globaltimer();
    if (a.stream == 1) {
        __shared__ unsigned long long tot;
        if (threadIdx.x == 0) tot = 0;
        __syncthreads();
        atomicAdd(&tot, bytes);
        __syncthreads();
        bytes = tot;
    }
    if (threadIdx.x == 0) {
        a.out[1 + 3 * blockIdx.x] = bytes;
        a.out[2 + 3 * blockIdx.x] = t0;
        a.out[3 + 3 * blockIdx.x] = t1;
    }
}

int main() {
    int nsm = 0;
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
    float* buf;
    unsigned *ctr, *stop;
    unsigned long long* out;
    uint4* W;
    const size_t wbytes = (size_t)1 << 30;
    cudaMalloc(&buf, sizeof(float) * 2 * nsm * E);
    cudaMalloc(&ctr, sizeof(unsigned) * NS);
    cudaMalloc(&stop, sizeof(unsigned));
    cudaMalloc(&out, sizeof(unsigned long long) * (1 + 3 * nsm));
    cudaMalloc(&W, wbytes);
    cudaMemset(W, 0x3c, wbytes);
    std::string json = "{\"probe\": \"split\", \"sms\": " + std::to_string(nsm) + ", \"rows\": [";
    printf("%-34s %10s %10s\n", "row", "us/stage", "TB/s");
    bool first = true;
    auto row = [&](auto kern, const char* name, int C, int handoffs, int stream, int ks) {
        double best = 1e30, rate = 0;
        const size_t smem = stream == 2 ? (size_t)ks * SLOT : 0;
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        for (int rep = 0; rep < 3; ++rep) {
            cudaMemset(ctr, 0, sizeof(unsigned) * NS);
            cudaMemset(stop, 0, sizeof(unsigned));
            cudaMemset(out, 0, sizeof(unsigned long long) * (1 + 3 * nsm));
            Args a{buf, ctr, W, wbytes / 16, stop, out, C, handoffs, stream, ks};
            void* args[] = {&a};
            cudaLaunchCooperativeKernel((const void*)kern, dim3(nsm), dim3(NT), args, smem, 0);
            std::vector<unsigned long long> h(1 + 3 * nsm);
            cudaMemcpy(h.data(), out, sizeof(unsigned long long) * h.size(), cudaMemcpyDeviceToHost);
            const double us = h[0] / 1e3 / (NS - 1);
            unsigned long long bytes = 0, lo = ~0ull, hi = 0;
            for (int b = C; b < nsm; ++b) {
                bytes += h[1 + 3 * b];
                lo = std::min(lo, h[2 + 3 * b]);
                hi = std::max(hi, h[3 + 3 * b]);
            }
            if (us < best) {
                best = us;
                rate = stream && hi > lo ? bytes / (double)(hi - lo) / 1e3 : 0.0;
            }
        }
        const cudaError_t e = cudaGetLastError();
        printf("%-34s %10.3f %10.3f %s\n", name, handoffs ? best : 0.0, rate, e == cudaSuccess ? "" : cudaGetErrorString(e));
        char b[200];
        snprintf(b, sizeof b, "%s{\"row\": \"%s\", \"us\": %.4f, \"tbs\": %.4f}", first ? "" : ", ", name,
                 handoffs ? best : 0.0, rate);
        first = false;
        json += b;
    };
    char n[64];
    row(probe<4>, "chain all SMs", nsm, 1, 0, 0);
    for (int C : {16, 32, 66}) {
        snprintf(n, sizeof n, "chain %d", C);
        row(probe<4>, n, C, 1, 0, 0);
        snprintf(n, sizeof n, "chain %d + loads 16k", C);
        row(probe<2>, n, C, 1, 1, 0);
        snprintf(n, sizeof n, "chain %d + loads 32k", C);
        row(probe<4>, n, C, 1, 1, 0);
        snprintf(n, sizeof n, "chain %d + loads 64k", C);
        row(probe<8>, n, C, 1, 1, 0);
        snprintf(n, sizeof n, "streamers %d loads 32k alone", nsm - C);
        row(probe<4>, n, C, 0, 1, 0);
        for (int ks : {2, 4, 8, 12}) {
            snprintf(n, sizeof n, "chain %d + bulk %dk", C, ks * SLOT / 1024);
            row(probe<4>, n, C, 1, 2, ks);
        }
        snprintf(n, sizeof n, "streamers %d bulk 64k alone", nsm - C);
        row(probe<4>, n, C, 0, 2, 4);
    }
    printf("%s]}\n", json.c_str());
    return 0;
}
