// Stage-handoff probe: what one grid-wide producer -> consumer handoff costs, by how it is signalled.
// The monokernel hands every stage's output to the next stage through global memory and a counter: the producer
// CTA writes its rows, syncs, thread 0 adds to the counter with release semantics; the consumer's thread 0 spins
// on an acquire load, syncs, and reads the vector from L2. Per layer there are five such handoffs, and the traces
// (bench/NOTES.md) suggest each costs more than the ~0.35 us "hop" they show (the release waits for the stores).
//
// Every stage here: each of the 132 CTAs (one per SM, 512 threads) reads the whole previous-stage vector
// (132 x 8 floats), block-sums it and writes its 8 outputs; NS stages chained, CTA 0 times the chain. The block
// sum is the kernel's (mk_block.cuh) since session 9; the session 7 numbers used a plain sum over the warps.
// Modes:
//   counter       the monokernel's handoff (st, bar.sync, red.release.gpu; ld.acquire spin, bar.sync, ld.cg)
//   counter-nodata  the same handoff, the consumer reading nothing (signal latency alone)
//   ll            data and flag in one 8-byte store (value bits | stage tag << 32, st.relaxed.gpu); the consumer
//                 polls the elements it reads until their tag is the stage's (no counter, no fence)
//   counter+loads   counter, with 32 KB of weight loads per CTA in flight when thread 0 releases (consumed after
//                 the next wait): does the release wait for them? (patch 22's ATTN slowdown)
//   counter+loads-w1  the same with warp 0 issuing none of them (patch 23's premise)
//   ll+loads      ll with the loads in flight (no release: should cost nothing)
//   counter+l2pf  counter, each warp having asked for a 2 KB L2 bulk prefetch (cp.async.bulk.prefetch.L2) just
//                 before the release (patch 06's mechanism); counter+l2pf-w1: warp 0 asks for none
//   counter+tma   counter, thread 0 having issued a 32 KB bulk copy into shared memory (cp.async.bulk + mbarrier,
//                 patch 12's stash) just before its release; waited for after the next stage's wait;
//                 counter+tma-w1: thread 32 issues it
//   loads/deep/l2pf sweeps (session 7): 8, 16 and 32 KB per CTA in flight at the release, consumed after the next
//                 wait (loads), two stages later (deep: their latency is never on the chain, only their traffic),
//                 or fire-and-forget L2 prefetches (l2pf). If deep costs what loads cost, DRAM traffic itself slows
//                 the handoff (its L2 round trips queue behind the stream); if deep is free, only a consumer
//                 that needs its loads right after the wait pays.
//
//   fan<K>        (session 19) the counter in K copies 128 bytes apart: the producer's thread 0 fences once
//                 (fence.acq_rel.gpu) and adds to every copy with relaxed reds (a release pattern), each consumer
//                 polls copy blockIdx % K, so K times fewer CTAs poll one line; fan<K>-nodata reads no payload
//   fanin<K>-nodata  the other way round: the producer adds (red.release) to copy blockIdx % K only, and lanes
//                 0 .. K - 1 of the consumer's warp 0 poll one copy each until their sum is the count
//   relaxed-nodata  no fence and no acquire at all (relaxed red, relaxed polls; not a valid handoff of data): the
//                 floor the ordering costs sit on
//   rel-rlxpoll[-nodata]  the producer's release as the kernel's, the consumer polling with relaxed loads and no
//                 fence after (its payload loads are L2 loads, ld.global.cg, issued after the bar.sync that follows
//                 the poll): which side of the handoff the ordering costs sit on
//   rlxred-nodata the producer's add without the release (no fence), acquire polls as the kernel's
//   counter-rlx   the consumer polls with relaxed loads and fences once when the count is reached
//   counter-sleep the consumer backs off 32 ns between polls (fewer requests queued on the line)
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I kernels/csrc bench/probes/sync_probe.cu \
//        -o /tmp/sync_probe && /tmp/sync_probe
// Prints one line per mode (us per stage), then a JSON line.
#include "mk_vendor.h"
#include "mk_isa.h"
#include "probe_bulk.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#define NT 512
#define E 8                 // outputs per CTA per stage
#define NS 2000             // chained stages
#define NW (NT / 32)
#include "mk_block.cuh"   // the kernel's block reductions (block_sum: scr holds NW + 1 floats)
// NL: 16-byte weight loads per thread in flight at the release (the loads modes: 8 KB per CTA per unit);
// the l2pf modes ask for NL x 512 bytes per warp (the same bytes per CTA).
enum Mode { COUNTER, COUNTER_NODATA, LL, COUNTER_LOADS, COUNTER_LOADS_W1, LL_LOADS, COUNTER_PF, COUNTER_PF_W1,
            COUNTER_TMA, COUNTER_TMA_W1, COUNTER_DEEP, FAN, FAN_NODATA, COUNTER_RLX, COUNTER_SLEEP, FANIN_NODATA,
            RELAXED_NODATA, REL_RLXPOLL_NODATA, REL_RLXPOLL, RLXRED_NODATA };
#define FAN_STRIDE 32       // words between a counter's copies (one 128-byte line each)
#define FAN_MAX 16
#define TMA_BYTES 32768


__device__ float g_sink;

MK_DEV void st_relaxed_u64(unsigned long long* p, unsigned long long v) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
MK_DEV unsigned long long ld_relaxed_u64(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

MK_DEV unsigned ld_relaxed_u32(const unsigned* p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
MK_DEV void fence_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
MK_DEV void red_relaxed(unsigned* p, unsigned v) {
    asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}

// buf: [2][D] floats (counter modes) or [2][D] u64 (ll modes); ctr: [NS] counters (the fan modes: NS x FAN_MAX copies,
// FAN_STRIDE words apart); W: weight buffer (loads modes). NL: loads per thread (loads modes) or counter copies (fan).
template <int MODE, int NL = 4>
__global__ void __launch_bounds__(NT, 1) chain(float* buf, unsigned long long* llb, unsigned* ctr, const uint4* W,
                                               size_t wchunks, unsigned long long* out_ns) {
    __shared__ float scr[NW + 1];
    __shared__ alignas(8) unsigned long long bar;
    extern __shared__ float4 tma_buf[];   // TMA_BYTES (the +tma modes)
    constexpr bool kTma = MODE == COUNTER_TMA || MODE == COUNTER_TMA_W1;
    const bool tma_issuer = kTma && threadIdx.x == (MODE == COUNTER_TMA ? 0 : 32);
    if (kTma && threadIdx.x == 0) probe_mbar_init(&bar);
    __syncthreads();
    const int nb = gridDim.x, D = nb * E;
    constexpr bool kLL = MODE == LL || MODE == LL_LOADS;
    constexpr bool kDeep = MODE == COUNTER_DEEP;
    constexpr bool kFan = MODE == FAN || MODE == FAN_NODATA || MODE == FANIN_NODATA;
    constexpr bool kNoData = MODE == COUNTER_NODATA || MODE == FAN_NODATA || MODE == FANIN_NODATA ||
                             MODE == RELAXED_NODATA || MODE == REL_RLXPOLL_NODATA || MODE == RLXRED_NODATA;
    constexpr bool kRelaxedPoll = MODE == RELAXED_NODATA || MODE == REL_RLXPOLL_NODATA || MODE == REL_RLXPOLL;
    constexpr bool kLoads = !kFan && (MODE == COUNTER_LOADS || MODE == COUNTER_LOADS_W1 || MODE == LL_LOADS || kDeep);
    const bool loader = kLoads && !(MODE == COUNTER_LOADS_W1 && threadIdx.x < 32);
    constexpr bool kPf = MODE == COUNTER_PF || MODE == COUNTER_PF_W1;
    const bool prefetcher = kPf && !(MODE == COUNTER_PF_W1 && threadIdx.x < 32);
    unsigned long long t0 = 0;
    float carry = 1.f, sink = 0.f;
    uint4 w[NL], w2[NL];   // w2: the deep mode's second set (consumed two stages after its issue)
    for (int s = 0; s < NS; ++s) {
        if (s == 1 && threadIdx.x == 0) t0 = mk_globaltimer();
        float acc = 0.f;
        if (s > 0) {   // consume stage s - 1
            const int src = (s - 1) & 1;
            if (kLL) {
                for (int i = threadIdx.x; i < D; i += NT) {
                    const unsigned long long* p = llb + (size_t)src * D + i;
                    unsigned long long v;
                    do { v = ld_relaxed_u64(p); } while ((unsigned)(v >> 32) != (unsigned)s);
                    acc += __uint_as_float((unsigned)v);
                }
            } else {
                if (MODE == FANIN_NODATA && threadIdx.x < 32) {
                    const unsigned* c = ctr + ((size_t)(s - 1) * FAN_MAX + (threadIdx.x % NL)) * FAN_STRIDE;
                    const bool mine = threadIdx.x < NL;
                    while (__reduce_add_sync(0xffffffffu, mine ? mk_ld_acquire(c) : 0u) < (unsigned)nb) {}
                } else if (threadIdx.x == 0) {
                    if (MODE == FAN || MODE == FAN_NODATA) {
                        const unsigned* c = ctr + ((size_t)(s - 1) * FAN_MAX + blockIdx.x % NL) * FAN_STRIDE;
                        while (mk_ld_acquire(c) < (unsigned)nb) {}
                    } else if (kRelaxedPoll) {
                        while (ld_relaxed_u32(ctr + s - 1) < (unsigned)nb) {}
                    } else if (MODE == COUNTER_RLX) {
                        while (ld_relaxed_u32(ctr + s - 1) < (unsigned)nb) {}
                        fence_gpu();
                    } else if (MODE == COUNTER_SLEEP) {
                        while (mk_ld_acquire(ctr + s - 1) < (unsigned)nb) __nanosleep(32);
                    } else {
                        while (mk_ld_acquire(ctr + s - 1) < (unsigned)nb) {}
                    }
                }
                __syncthreads();
                if (!kNoData)
                    for (int i = threadIdx.x; i < D; i += NT) acc += mk_ld_cg(buf + (size_t)src * D + i);
            }
            if (loader && (!kDeep || s >= 2)) {   // deep: the set issued at stage s - 2
#pragma unroll
                for (int j = 0; j < NL; ++j)
                    sink += kDeep && (s & 1) ? __uint_as_float(w2[j].x ^ w2[j].w) : __uint_as_float(w[j].x ^ w[j].w);
            }
            if (kTma) probe_mbar_wait(&bar, (s - 1) & 1);   // the previous stage's copy has landed
            carry = block_sum(acc, scr) * 1e-3f + 1.f;
        }
        if (loader) {   // weight loads issued now, consumed after the next wait (deep: two stages later)
            const size_t base = ((size_t)s * nb + blockIdx.x) * NT * NL % wchunks;
#pragma unroll
            for (int j = 0; j < NL; ++j) {
                const uint4 v = mk_ld_stream16(W + (base + (size_t)j * NT + threadIdx.x) % wchunks);
                if (kDeep && (s & 1)) w2[j] = v;
                else w[j] = v;
            }
        }
        if (prefetcher && (threadIdx.x & 31) == 0) {   // NL x 512 bytes per warp (as the loads per CTA) into L2
            const size_t c = (((size_t)s * nb + blockIdx.x) * (NT / 32) + (threadIdx.x >> 5)) * 32 * NL % (wchunks - 128);
            mk_prefetch_l2(W + c, 512 * NL);
        }
        if (tma_issuer) {   // 32 KB of weights into shared memory by the bulk-copy engine
            const size_t c = ((size_t)s * nb + blockIdx.x) * (TMA_BYTES / 16) % (wchunks - TMA_BYTES / 16);
            probe_bulk_copy(tma_buf, W + c, TMA_BYTES, &bar);
        }
        const int dst = s & 1;
        if (threadIdx.x < E) {
            const float v = carry * (1.f + threadIdx.x);
            if (kLL) {
                st_relaxed_u64(llb + (size_t)dst * D + blockIdx.x * E + threadIdx.x,
                               ((unsigned long long)(s + 1) << 32) | __float_as_uint(v));
            } else {
                buf[(size_t)dst * D + blockIdx.x * E + threadIdx.x] = v;
            }
        }
        if (!kLL) {
            __syncthreads();
            if (MODE == FAN || MODE == FAN_NODATA) {
                if (threadIdx.x == 0) {
                    fence_gpu();
#pragma unroll
                    for (int k = 0; k < NL; ++k) red_relaxed(ctr + ((size_t)s * FAN_MAX + k) * FAN_STRIDE, 1u);
                }
            } else if (MODE == RELAXED_NODATA || MODE == RLXRED_NODATA) {
                if (threadIdx.x == 0) red_relaxed(ctr + s, 1u);
            } else if (MODE == FANIN_NODATA) {
                if (threadIdx.x == 0) mk_red_release(ctr + ((size_t)s * FAN_MAX + blockIdx.x % NL) * FAN_STRIDE, 1u);
            } else if (threadIdx.x == 0) {
                mk_red_release(ctr + s, 1u);
            }
        }
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) *out_ns = mk_globaltimer() - t0;
    if (kTma) probe_mbar_wait(&bar, (NS - 1) & 1);   // no bulk copy may still be landing when the CTA exits
    if (sink == 1.2345f || carry == 1.2345f) g_sink = sink + carry;
}

int main() {
    int nsm = 0;
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
    const int D = nsm * E;
    float* buf;
    unsigned long long *llb, *ns;
    unsigned* ctr;
    uint4* W;
    const size_t wbytes = (size_t)1 << 30;
    cudaMalloc(&buf, sizeof(float) * 2 * D);
    cudaMalloc(&llb, sizeof(unsigned long long) * 2 * D);
    const size_t nctr = (size_t)NS * FAN_MAX * FAN_STRIDE;   // the fan modes' copies; the others use the first NS
    cudaMalloc(&ctr, sizeof(unsigned) * nctr);
    cudaMalloc(&ns, sizeof(unsigned long long));
    cudaMalloc(&W, wbytes);
    cudaMemset(W, 0x3c, wbytes);
    const size_t wchunks = wbytes / 16;
    std::string json = "{\"probe\": \"sync\", \"stages\": " + std::to_string(NS) + ", \"modes\": {";
    printf("%-18s %12s\n", "mode", "us / stage");
    bool first = true;
    auto run = [&](auto kern, int mode, const char* name) {
        double best = 1e30;
        for (int rep = 0; rep < 3; ++rep) {
            cudaMemset(ctr, 0, sizeof(unsigned) * nctr);
            cudaMemset(llb, 0, sizeof(unsigned long long) * 2 * D);
            void* args[] = {&buf, &llb, &ctr, &W, (void*)&wchunks, &ns};
            const size_t smem = mode == COUNTER_TMA || mode == COUNTER_TMA_W1 ? TMA_BYTES : 0;
            cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            cudaLaunchCooperativeKernel((const void*)kern, dim3(nsm), dim3(NT), args, smem, 0);
            unsigned long long h = 0;
            cudaMemcpy(&h, ns, sizeof h, cudaMemcpyDeviceToHost);
            best = std::min(best, h / 1e3 / (NS - 1));
        }
        const cudaError_t e = cudaGetLastError();
        printf("%-18s %12.3f %s\n", name, best, e == cudaSuccess ? "" : cudaGetErrorString(e));
        char b[96];
        snprintf(b, sizeof b, "%s\"%s\": %.4f", first ? "" : ", ", name, best);
        first = false;
        json += b;
    };
    run(chain<COUNTER>, COUNTER, "counter");
    run(chain<COUNTER_NODATA>, COUNTER_NODATA, "counter-nodata");
    if (getenv("SYNC_NEW_ONLY") == nullptr) {   // SYNC_NEW_ONLY=1: the two counter modes and session 19's only
    run(chain<LL>, LL, "ll");
    // 8, 16 and 32 KB per CTA in flight (NL = 1, 2, 4); the 32 KB rows are the session-6 modes of the same name
    auto sweep = [&](auto k8, auto k16, auto k32, int mode, const std::string& name) {
        run(k8, mode, (name + "8k").c_str());
        run(k16, mode, (name + "16k").c_str());
        run(k32, mode, name.c_str());
    };
    sweep(chain<COUNTER_LOADS, 1>, chain<COUNTER_LOADS, 2>, chain<COUNTER_LOADS>, COUNTER_LOADS, "counter+loads");
    sweep(chain<COUNTER_DEEP, 1>, chain<COUNTER_DEEP, 2>, chain<COUNTER_DEEP>, COUNTER_DEEP, "counter+deep");
    sweep(chain<COUNTER_PF, 1>, chain<COUNTER_PF, 2>, chain<COUNTER_PF>, COUNTER_PF, "counter+l2pf");
    run(chain<COUNTER_LOADS_W1>, COUNTER_LOADS_W1, "counter+loads-w1");
    run(chain<LL_LOADS>, LL_LOADS, "ll+loads");
    run(chain<COUNTER_PF_W1>, COUNTER_PF_W1, "counter+l2pf-w1");
    run(chain<COUNTER_TMA>, COUNTER_TMA, "counter+tma");
    run(chain<COUNTER_TMA_W1>, COUNTER_TMA_W1, "counter+tma-w1");
    }
    // session 19: the signal's cost by how many CTAs poll one line, and by how they poll
    run(chain<RELAXED_NODATA>, RELAXED_NODATA, "relaxed-nodata");
    run(chain<REL_RLXPOLL_NODATA>, REL_RLXPOLL_NODATA, "rel-rlxpoll-nodata");
    run(chain<RLXRED_NODATA>, RLXRED_NODATA, "rlxred-nodata");
    run(chain<REL_RLXPOLL>, REL_RLXPOLL, "rel-rlxpoll");
    run(chain<COUNTER_RLX>, COUNTER_RLX, "counter-rlx");
    run(chain<COUNTER_SLEEP>, COUNTER_SLEEP, "counter-sleep");
    run(chain<FAN_NODATA, 1>, FAN_NODATA, "fan1-nodata");
    run(chain<FAN_NODATA, 2>, FAN_NODATA, "fan2-nodata");
    run(chain<FAN_NODATA, 4>, FAN_NODATA, "fan4-nodata");
    run(chain<FAN_NODATA, 8>, FAN_NODATA, "fan8-nodata");
    run(chain<FAN_NODATA, 16>, FAN_NODATA, "fan16-nodata");
    run(chain<FANIN_NODATA, 4>, FANIN_NODATA, "fanin4-nodata");
    run(chain<FANIN_NODATA, 16>, FANIN_NODATA, "fanin16-nodata");
    run(chain<FAN, 1>, FAN, "fan1");
    run(chain<FAN, 4>, FAN, "fan4");
    run(chain<FAN, 8>, FAN, "fan8");
    run(chain<FAN, 16>, FAN, "fan16");
    printf("%s}}\n", json.c_str());
    return 0;
}
