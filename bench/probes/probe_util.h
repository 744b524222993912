// Helpers shared by the standalone probes in bench/probes: the warp reductions that mk_block.cuh gives the kernel
// (a probe includes only the kernel headers it times), and the host's bf16 rounding for the reference checks.
#pragma once
#include "mk_vendor.h"

#include <cstring>

MK_DEV float warp_max(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
MK_DEV float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static inline float bf16_round(float x) {   // round to nearest even, as mk_f2bf
    unsigned u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    float r;
    memcpy(&r, &u, 4);
    return r;
}
