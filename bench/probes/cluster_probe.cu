// Cluster handoff probe: what a producer -> consumer handoff costs inside a thread-block cluster (barrier.cluster +
// distributed shared memory) against the kernel's global counter, alone and while other SMs stream DRAM.
//
// Why: every stage of the monokernel hands its output over through L2 and a counter (~1.6 us per handoff, sync_probe)
// and any DRAM traffic in flight slows those L2 round trips by about its own duration (sessions 7, 11), which is why
// no weight prefetch has paid off. A chain whose handoffs stay inside one GPC (barrier.cluster, DSMEM reads) never
// touches L2; if it keeps its speed while the other SMs stream weights at full rate, a layout of chain clusters beside
// streaming SMs can overlap the weight stream with the latency chain. This probe measures exactly that.
//
// Launch: G CTAs of NT threads in clusters of CS (G = the most co-resident clusters x CS, so every CTA runs at once).
// The first NCC clusters are the chain; each chain CTA per stage reads the previous stage's outputs of its peers
// (CS x EO floats; EO = 8, and 64 for a few larger payloads), block-sums them and writes its EO outputs. Handoff modes:
//   global   the kernel's handoff among the chain CTAs (st, bar.sync, red.release.gpu; ld.acquire spin, bar.sync, ld.cg)
//   cluster  outputs in the CTA's own shared memory (double-buffered), barrier.cluster.arrive.release +
//            wait.acquire, peers read through DSMEM (mapa + ld.shared::cluster)
// Background on the other CTAs (they stop when the chain's CTA 0 sets the stop flag; their bytes / time is printed):
//   none     they exit
//   tma      thread 0 streams the weight buffer through a 4 x 32 KB shared-memory ring with bulk copies
//   loads    every thread keeps 8 16-byte streaming loads in flight (ld.global.nc, the kernel's weight load)
// and "self": each chain CTA's thread 32 also issues a 32 KB bulk copy into its own shared memory every stage
// (a chain SM preloading its next weights while it chains).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I kernels/csrc bench/probes/cluster_probe.cu \
//        -o /tmp/cluster_probe && /tmp/cluster_probe
// Prints the co-resident cluster counts, one line per configuration (us per stage, background TB/s), a JSON line.
// Recorded (bench/NOTES.md session 12, one H200): co-resident clusters at 128 KB of shared memory per CTA: size 2: 66
// (132 SMs), 4: 30 (120), 8: 15 (120), 16: 7 (112). us per stage: global among all 132 CTAs 1.80; cluster of 2 / 4 / 8
// / 16: 0.64 / 0.65 / 0.67 / 0.71 with no background, the same (+-0.02) with tma (3.7 TB/s) or loads (2.6-4.4 TB/s)
// streaming on the other SMs; global among the same 2-32 CTAs 1.11-1.35 idle, 1.41-2.00 with loads and 1.71-3.78
// with tma in the background; "self" (the chain CTAs' own 32 KB copies, waited two stages later) 1.63-1.84. 64 outputs
// per CTA: cluster of 8 / 16 0.78 / 0.98 (the same with tma), global 1.20 / 1.43 idle, 2.76 / 3.45 with tma.
#include "mk_vendor.h"
#include "mk_isa.h"
#include "probe_bulk.h"
#include "probe_launch.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#define NT 512
#define NW (NT / 32)
#define EMAX 64             // outputs per CTA per stage: at most
#define NS 2000             // chained stages
#include "mk_block.cuh"

enum Mode { GLOBAL, CLUSTER };
enum Bg { BG_NONE, BG_TMA, BG_LOADS };
#define SLOT 32768          // bulk-copy slot bytes
#define NSLOT 4
#define SMEM_DYN (NSLOT * SLOT)

__device__ float g_sink;

MK_DEV unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
MK_DEV unsigned cluster_id() {
    unsigned r;
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
    return r;
}
MK_DEV unsigned ld_volatile_u32(const unsigned* p) {
    unsigned v;
    asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Background CTA: stream W until *stop; returns bytes moved (thread 0 for tma, summed per thread for loads).
template <int BG>
MK_DEV unsigned long long background(const uint4* W, size_t wchunks, const unsigned* stop, char* ring,
                                     unsigned long long* bars, float& sink) {
    unsigned long long bytes = 0;
    if (BG == BG_TMA) {
        if (threadIdx.x == 0) {
            const size_t slot_chunks = SLOT / 16;
            size_t c = (size_t)blockIdx.x * 64 * slot_chunks % (wchunks - slot_chunks);
            unsigned i = 0;
            for (;; ++i) {
                const unsigned s = i % NSLOT;
                if (i >= NSLOT) probe_mbar_wait(&bars[s], ((i / NSLOT) - 1) & 1);
                if ((i & 3) == 0 && ld_volatile_u32(stop)) break;
                probe_bulk_copy(ring + (size_t)s * SLOT, W + c, SLOT, &bars[s]);
                bytes += SLOT;
                c += slot_chunks;
                if (c + slot_chunks > wchunks) c = 0;
            }
            for (unsigned j = i >= NSLOT ? i - NSLOT : 0; j < i; ++j)   // drain what is still landing
                probe_mbar_wait(&bars[j % NSLOT], (j / NSLOT) & 1);
        }
    } else if (BG == BG_LOADS) {
        constexpr int NL = 8;
        size_t base = (size_t)blockIdx.x * 4096 * NT % wchunks;
        for (int it = 0;; ++it) {
            if ((it & 7) == 0 && ld_volatile_u32(stop)) break;
            uint4 w[NL];
#pragma unroll
            for (int j = 0; j < NL; ++j) w[j] = mk_ld_stream16(W + (base + (size_t)j * NT + threadIdx.x) % wchunks);
#pragma unroll
            for (int j = 0; j < NL; ++j) sink += __uint_as_float(w[j].x ^ w[j].w);
            bytes += 16 * NL;
            base = (base + (size_t)NL * NT * gridDim.x) % wchunks;
        }
    }
    return bytes;
}

// buf: [2][NC * EO] (global mode); ctr: [NS]; stop: flag; res: [0] chain ns, [1 + b] background CTA b's bytes,
// [1 + G + b] its ns.
template <int MODE, int BG, bool SELF, int EO = 8>
__global__ void __launch_bounds__(NT, 1) probe(int ncc, float* buf, unsigned* ctr, unsigned* stop, const uint4* W,
                                               size_t wchunks, unsigned long long* res) {
    __shared__ float scr[NW + 1];
    __shared__ float outs[2][EO];
    __shared__ alignas(8) unsigned long long bars[NSLOT];
    extern __shared__ float4 ring4[];
    char* ring = (char*)ring4;
    unsigned csize;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(csize));
    const unsigned cid = cluster_id(), rank = cluster_rank();
    const bool chain = cid < (unsigned)ncc;
    const int nc = ncc * (int)csize;   // chain CTAs (global mode: they hand off among themselves)
    if (threadIdx.x == 0)
        for (int s = 0; s < NSLOT; ++s) probe_mbar_init(&bars[s]);
    __syncthreads();
    float sink = 0.f;
    if (!chain) {
        const unsigned long long t0 = mk_globaltimer();
        const unsigned long long bytes = background<BG>(W, wchunks, stop, ring, bars, sink);
        const unsigned long long t1 = mk_globaltimer();
        __shared__ unsigned long long tot;
        if (threadIdx.x == 0) tot = 0;
        __syncthreads();
        if (bytes) atomicAdd(&tot, bytes);
        __syncthreads();
        if (threadIdx.x == 0) {
            res[1 + blockIdx.x] = tot;
            res[1 + gridDim.x + blockIdx.x] = t1 - t0;
        }
        if (sink == 1.2345f) g_sink = sink;
        return;
    }
    const int me = MODE == GLOBAL ? (int)(cid * csize + rank) : (int)rank;
    unsigned long long t0 = 0;
    float carry = 1.f;
    unsigned self_i = 0;
    for (int s = 0; s < NS; ++s) {
        if (s == 1 && threadIdx.x == 0) t0 = mk_globaltimer();
        if (s > 0) {   // consume stage s - 1
            const int src = (s - 1) & 1;
            float acc = 0.f;
            if (MODE == GLOBAL) {
                if (threadIdx.x == 0)
                    while (mk_ld_acquire(ctr + s - 1) < (unsigned)nc) {}
                __syncthreads();
                for (int i = threadIdx.x; i < nc * EO; i += NT) acc += mk_ld_cg(buf + (size_t)src * nc * EO + i);
            } else {
                mk_cluster_wait();
                for (int i = threadIdx.x; i < (int)csize * EO; i += NT)
                    acc += mk_ld_cluster(mk_cluster_addr(&outs[src][i % EO], i / EO));
            }
            if (SELF && threadIdx.x == 32 && s >= 2) {   // the copy issued two stages ago has landed
                probe_mbar_wait(&bars[(self_i - 2) % NSLOT], ((self_i - 2) / NSLOT) & 1);
            }
            carry = block_sum(acc, scr) * 1e-3f + 1.f;
        }
        if (SELF && threadIdx.x == 32) {
            const size_t slot_chunks = SLOT / 16;
            const size_t c = ((size_t)s * gridDim.x + blockIdx.x) * slot_chunks % (wchunks - slot_chunks);
            probe_bulk_copy(ring + (size_t)(self_i % NSLOT) * SLOT, W + c, SLOT, &bars[self_i % NSLOT]);
            ++self_i;
        }
        const int dst = s & 1;
        if (threadIdx.x < EO) {
            const float v = carry * (1.f + threadIdx.x);
            if (MODE == GLOBAL) buf[(size_t)dst * nc * EO + me * EO + threadIdx.x] = v;
            else outs[dst][threadIdx.x] = v;
        }
        if (MODE == GLOBAL) {
            __syncthreads();
            if (threadIdx.x == 0) mk_red_release(ctr + s, 1u);
        } else {
            mk_cluster_arrive();
        }
    }
    if (MODE == CLUSTER) mk_cluster_wait();   // the last arrive's phase: no peer still reads our outputs
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        res[0] = mk_globaltimer() - t0;
        asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(stop), "r"(1u) : "memory");
    }
    if (SELF && threadIdx.x == 32)
        for (unsigned j = self_i >= 2 ? self_i - 2 : 0; j < self_i; ++j)
            probe_mbar_wait(&bars[j % NSLOT], (j / NSLOT) & 1);
    if (carry == 1.2345f) g_sink = carry;
}

struct Cfg { int mode, bg; bool self; int cs, ncc, eo = 8; };

// A launch of `grid` CTAs (NT threads, SMEM_DYN bytes) in clusters of cs; `at` holds the attribute cfg points to.
static cudaLaunchConfig_t cluster_config(int grid, int cs, cudaLaunchAttribute& at) {
    return probe_cluster_config(grid, NT, SMEM_DYN, cs, at);
}

int main() {
    int nsm = 0;
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
    float* buf;
    unsigned *ctr, *stop;
    unsigned long long* res;
    uint4* W;
    const size_t wbytes = (size_t)2 << 30;
    cudaMalloc(&buf, sizeof(float) * 2 * nsm * EMAX);
    cudaMalloc(&ctr, sizeof(unsigned) * NS);
    cudaMalloc(&stop, sizeof(unsigned));
    cudaMalloc(&res, sizeof(unsigned long long) * (1 + 2 * nsm));
    cudaMalloc(&W, wbytes);
    cudaMemset(W, 0x3c, wbytes);
    const size_t wchunks = wbytes / 16;

    // co-resident clusters per size, at this probe's shared memory
    int max_clusters[17] = {0};
    printf("co-resident clusters (%d KB dynamic shared memory per CTA):", SMEM_DYN / 1024);
    std::string json = "{\"probe\": \"cluster\", \"stages\": " + std::to_string(NS) + ", \"max_clusters\": {";
    for (int cs : {1, 2, 4, 8, 16}) {
        auto k = probe<CLUSTER, BG_NONE, false>;
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_DYN);
        cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        cudaLaunchAttribute at;
        const cudaLaunchConfig_t cfg = cluster_config(cs * 64, cs, at);
        int n = 0;
        const cudaError_t e = cudaOccupancyMaxActiveClusters(&n, (void*)k, &cfg);
        max_clusters[cs] = e == cudaSuccess ? n : 0;
        printf(" %d: %d (%d SMs)%s", cs, n, n * cs, e == cudaSuccess ? "" : cudaGetErrorString(e));
        json += (cs == 1 ? "\"" : ", \"") + std::to_string(cs) + "\": " + std::to_string(n);
        cudaGetLastError();
    }
    printf("\n");
    json += "}, \"runs\": [";

    const char* mname[] = {"global", "cluster"};
    const char* bname[] = {"none", "tma", "loads"};
    printf("%-8s %3s %4s %4s %3s %-6s %5s %11s %10s %s\n", "mode", "cs", "ncc", "ctas", "eo", "bg", "self", "us / stage",
           "bg TB/s", "");
    bool first = true;
    auto run = [&](auto kern, Cfg c) {
        const int ncl = std::min(max_clusters[c.cs], nsm / c.cs);
        if (ncl < c.ncc) { printf("cs %d: only %d clusters\n", c.cs, ncl); return; }
        const int G = ncl * c.cs;
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_DYN);
        cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        double best = 1e30, tbps = 0;
        cudaError_t e = cudaSuccess;
        for (int rep = 0; rep < 3; ++rep) {
            cudaMemset(ctr, 0, sizeof(unsigned) * NS);
            cudaMemset(stop, 0, sizeof(unsigned));
            cudaMemset(res, 0, sizeof(unsigned long long) * (1 + 2 * nsm));
            cudaLaunchAttribute at;
            const cudaLaunchConfig_t cfg = cluster_config(G, c.cs, at);
            e = cudaLaunchKernelEx(&cfg, kern, c.ncc, buf, ctr, stop, (const uint4*)W, wchunks, res);
            if (e == cudaSuccess) e = cudaDeviceSynchronize();
            if (e != cudaSuccess) break;
            std::vector<unsigned long long> h(1 + 2 * nsm);
            cudaMemcpy(h.data(), res, sizeof(unsigned long long) * h.size(), cudaMemcpyDeviceToHost);
            const double us = h[0] / 1e3 / (NS - 1);
            if (us < best) {
                best = us;
                unsigned long long bytes = 0, ns = 0;
                for (int b = c.ncc * c.cs; b < G; ++b) { bytes += h[1 + b]; ns = std::max(ns, h[1 + G + b]); }
                tbps = ns ? bytes / (double)ns / 1e3 : 0;
            }
        }
        printf("%-8s %3d %4d %4d %3d %-6s %5s %11.3f %10.2f %s\n", mname[c.mode], c.cs, c.ncc, c.ncc * c.cs, c.eo, bname[c.bg],
               c.self ? "yes" : "no", best, tbps, e == cudaSuccess ? "" : cudaGetErrorString(e));
        char b[256];
        snprintf(b, sizeof b, "%s{\"mode\": \"%s\", \"cs\": %d, \"ncc\": %d, \"eo\": %d, \"bg\": \"%s\", \"self\": %s, "
                 "\"us\": %.4f, \"bg_TBps\": %.3f}", first ? "" : ", ", mname[c.mode], c.cs, c.ncc, c.eo, bname[c.bg],
                 c.self ? "true" : "false", e == cudaSuccess ? best : -1.0, tbps);
        first = false;
        json += b;
        cudaGetLastError();
    };
    // reference: the kernel's handoff among every SM (sync_probe's "counter")
    run(probe<GLOBAL, BG_NONE, false>, {GLOBAL, BG_NONE, false, 1, nsm});
    for (int cs : {2, 4, 8, 16}) {
        for (int ncc : {1, 2}) {
            if (cs == 16 && ncc == 2 && max_clusters[16] < 2) continue;
            run(probe<CLUSTER, BG_NONE, false>, {CLUSTER, BG_NONE, false, cs, ncc});
            run(probe<CLUSTER, BG_TMA, false>, {CLUSTER, BG_TMA, false, cs, ncc});
            run(probe<CLUSTER, BG_LOADS, false>, {CLUSTER, BG_LOADS, false, cs, ncc});
            run(probe<CLUSTER, BG_NONE, true>, {CLUSTER, BG_NONE, true, cs, ncc});
            run(probe<GLOBAL, BG_NONE, false>, {GLOBAL, BG_NONE, false, cs, ncc});
            run(probe<GLOBAL, BG_TMA, false>, {GLOBAL, BG_TMA, false, cs, ncc});
            run(probe<GLOBAL, BG_LOADS, false>, {GLOBAL, BG_LOADS, false, cs, ncc});
        }
    }
    for (int cs : {8, 16}) {   // 64 outputs per CTA: 2-4 KB gathered per stage (q / k / v or attention partials)
        run(probe<CLUSTER, BG_NONE, false, 64>, {CLUSTER, BG_NONE, false, cs, 1, 64});
        run(probe<CLUSTER, BG_TMA, false, 64>, {CLUSTER, BG_TMA, false, cs, 1, 64});
        run(probe<GLOBAL, BG_NONE, false, 64>, {GLOBAL, BG_NONE, false, cs, 1, 64});
        run(probe<GLOBAL, BG_TMA, false, 64>, {GLOBAL, BG_TMA, false, cs, 1, 64});
    }
    printf("%s]}\n", json.c_str());
    return 0;
}
