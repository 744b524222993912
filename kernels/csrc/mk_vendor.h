// Vendor layer of the monokernel: every CUDA-specific primitive the kernel uses is defined here.
//
// HIP / MI300X port (what would change, all in this file plus the launch in monokernel.cu):
// - headers: <hip/hip_runtime.h>, <hip/hip_bf16.h>; cuda* -> hip* (hipLaunchCooperativeKernel,
//   hipHostMalloc(hipHostMallocMapped), hipHostGetDevicePointer, hipFuncSetAttribute).
// - wavefront of 64 lanes: MK_WARP becomes 64 and the shuffle masks go away (__shfl_xor without mask);
//   the matvec item size (32 lanes x MK_MV_UNROLL chunks) doubles unless the schedule is rebuilt for 64.
// - acquire/release: __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT) and
//   __hip_atomic_fetch_add(..., __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT) instead of the PTX below.
// - L2-coherent loads (ld.global.cg) become __builtin_nontemporal_load or plain loads with glc/slc bits;
//   streaming weight loads (ld.global.nc.L1::no_allocate) become nontemporal loads.
// - the L2 bulk prefetch (cp.async.bulk.prefetch.L2) has no direct equivalent: use __builtin_prefetch-style
//   global loads into a dummy register or drop it (it is only a hint).
// - __threadfence_system() exists in HIP; mapped host memory must be fine-grained (hipHostMallocCoherent).
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 mk_bf16;
#define MK_DEV __device__ __forceinline__
#define MK_WARP 32

// Spin target: a counter another CTA bumps with release semantics.
MK_DEV unsigned mk_ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
MK_DEV void mk_red_release(unsigned* p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
// Tensor parallelism: counters and data other GPUs write over NVLink (peer-mapped) need system scope.
MK_DEV unsigned mk_ld_acquire_sys(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// fence + relaxed add = a release pattern; one fence covers the adds to several GPUs' counters.
MK_DEV void mk_fence_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
MK_DEV void mk_red_relaxed_sys(unsigned* p, unsigned v) {
    asm volatile("red.relaxed.sys.global.add.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
MK_DEV unsigned mk_atom_acq_rel(unsigned* p, unsigned v) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
// Weights: read once per token, never written by the kernel -> non-coherent path, no L1 allocation.
// volatile keeps the issue order as written: loads meant to be in flight during a spin wait stay before it.
MK_DEV uint4 mk_ld_stream16(const void* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
// Hint: pull [p, p + bytes) into L2 (bulk copy engine, sm_90; bytes % 16 == 0, p 16-byte aligned).
MK_DEV void mk_prefetch_l2(const void* p, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p), "r"(bytes) : "memory");
}
// Data written by other CTAs during this launch: bypass L1 (not coherent across SMs), read from L2.
MK_DEV float mk_ld_cg(const float* p) { return __ldcg(p); }
MK_DEV float4 mk_ld_cg4(const float4* p) { return __ldcg(p); }
MK_DEV float2 mk_ld_cg2(const float2* p) { return __ldcg(p); }
MK_DEV int mk_ld_cg_i(const int* p) { return __ldcg(p); }
MK_DEV unsigned mk_ld_cg_u32(const void* p) { return __ldcg((const unsigned*)p); }
MK_DEV uint2 mk_ld_cg_u64(const void* p) { return __ldcg((const uint2*)p); }
MK_DEV long long mk_ld_cg_s64(const unsigned long long* p) { return __ldcg((const long long*)p); }
MK_DEV longlong2 mk_ld_cg_s64x2(const unsigned long long* p) { return __ldcg((const longlong2*)p); }
// Fire-and-forget integer add at gpu scope (the result is unused: RED); a later release orders it.
MK_DEV void mk_red_add_u64(unsigned long long* p, unsigned long long v) { atomicAdd(p, v); }
MK_DEV float mk_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
MK_DEV int mk_shfl_xor_i(int v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
MK_DEV float mk_shfl_down(float v, int d) { return __shfl_down_sync(0xffffffffu, v, d); }
MK_DEV float mk_bf2f(mk_bf16 v) { return __bfloat162float(v); }
MK_DEV mk_bf16 mk_f2bf(float v) { return __float2bfloat16(v); }
// 8 bf16 packed in a uint4 -> 8 floats (bf16 is the top half of an fp32).
MK_DEV void mk_unpack8(const uint4 w, float* f) {
    const unsigned u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(u[i] << 16);
        f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}
// 1 / x to about 1 ulp (one MUFU.RCP, no IEEE refinement): divmod_small's estimate.
MK_DEV float mk_rcp_approx(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
MK_DEV unsigned long long mk_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
// A shared-memory address as the shared-space instructions (cp.async, ldmatrix, mbarrier) take it.
MK_DEV unsigned mk_smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
// Thread-block clusters (sm_90): a barrier of every thread of every CTA in the cluster, in two halves (arrive with
// release: this CTA's memory accesses before it are ordered before the peers' accesses after their wait), and
// loads from a peer CTA's shared memory (distributed shared memory): the address of this CTA's variable at p in
// rank `rank`'s copy.
MK_DEV void mk_cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
MK_DEV void mk_cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
MK_DEV void mk_cluster_sync() {
    mk_cluster_arrive();
    mk_cluster_wait();
}
MK_DEV unsigned mk_cluster_addr(const void* p, unsigned rank) {
    unsigned a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(mk_smem_addr(p)), "r"(rank));
    return a;
}
MK_DEV float mk_ld_cluster(unsigned a) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
    return v;
}
// Pushes into a peer CTA's shared memory that complete on the peer's mbarrier (sm_90; the cluster combine,
// mk_attention.cuh): the owner arms its barrier once per round with the bytes it expects (arrive + expect_tx, the
// barrier's one arrival), each peer's st.async counts its bytes off on arrival, and the owner's try_wait on the
// round's parity sees the phase complete once every byte has landed (its loads after that see them).
MK_DEV void mk_mbar_init(unsigned long long* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(mk_smem_addr(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
MK_DEV void mk_mbar_expect(unsigned long long* bar, unsigned bytes) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}"
                 :: "r"(mk_smem_addr(bar)), "r"(bytes) : "memory");
}
MK_DEV bool mk_mbar_try_wait(unsigned long long* bar, unsigned parity) {
    unsigned ok;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                 : "=r"(ok) : "r"(mk_smem_addr(bar)), "r"(parity) : "memory");
    return ok != 0;
}
// 4 bytes to shared::cluster address a, counted off the mbarrier at shared::cluster address bar.
MK_DEV void mk_st_async1(unsigned a, float x, unsigned bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];"
                 :: "r"(a), "f"(x), "r"(bar) : "memory");
}
// 8 bytes to shared::cluster address a (mk_cluster_addr), counted off the mbarrier at shared::cluster address bar.
MK_DEV void mk_st_async2(unsigned a, float x, float y, unsigned bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
                 :: "r"(a), "f"(x), "f"(y), "r"(bar) : "memory");
}
// Asynchronous 16-byte global -> shared copy through L2 (data another CTA wrote earlier in the launch, ordered by
// a counter acquire before the copy is issued); mk_cp_async_wait_all() in the same thread, then a barrier,
// before any thread reads it.
MK_DEV void mk_cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                 :: "r"(mk_smem_addr(dst)), "l"(src) : "memory");
}
// The same for 4 bytes (through L1: .cg copies 16 bytes only); for data written before the launch.
MK_DEV void mk_cp_async4(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;"
                 :: "r"(mk_smem_addr(dst)), "l"(src) : "memory");
}
MK_DEV void mk_cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
#if MK_KV_OVERLAP
// This thread's copies issued so far form one group; wait until at most the newest group is still in flight.
MK_DEV void mk_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
MK_DEV void mk_cp_async_wait_but_newest() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
#endif
// Tensor cores (sm_80+): ldmatrix of four / two 8 x 8 bf16 tiles (each lane gives one 16-byte row address, lanes
// 0-7 tile 0, 8-15 tile 1, ...); mma m16n8k16, bf16 in, fp32 accumulate.
MK_DEV void mk_ldsm_x4(unsigned a, unsigned (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
MK_DEV void mk_ldsm_x2(unsigned a, unsigned (&r)[2]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a) : "memory");
}
MK_DEV void mk_mma_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
