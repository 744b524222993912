// Bulk copies (cp.async.bulk, sm_90) with an mbarrier per slot, for the probes that time them (sync_probe's TMA
// modes, split_probe's streamers): thread 0 arms the barrier with the bytes to expect and issues the copy; a waiter
// spins on the phase parity. The kernel itself has no bulk copies (bench/NOTES.md, sessions 2, 5, 9).
#pragma once
#include "mk_vendor.h"

MK_DEV void probe_mbar_init(unsigned long long* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(mk_smem_addr(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Arm bar for `bytes` and copy them from global src into shared dst (16-byte aligned, bytes % 16 == 0).
MK_DEV void probe_bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}"
                 :: "r"(mk_smem_addr(bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(mk_smem_addr(dst)), "l"(src), "r"(bytes), "r"(mk_smem_addr(bar)) : "memory");
}
// Spin until the phase of bar with this parity has completed.
MK_DEV void probe_mbar_wait(unsigned long long* bar, unsigned parity) {
    unsigned ok = 0;
    while (!ok)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                     : "=r"(ok) : "r"(mk_smem_addr(bar)), "r"(parity) : "memory");
}
