// Fused MLP of the one-GPU schedule (isa.OPS["MLP"], schedule.build(fused_mlp=True)): an instruction runs the
// GATEUP rows [a0, a0 + a1) as before (the caller's matvec), then their share of DOWN: y = Wd[:, a0 .. a0 + a1) . h
// over all d rows, from Wd^T rows a0 .. a0 + a1 (contiguous), added to the fixed-point accumulator acc[]
// (mk_block.cuh). The layer's residual is then x + acc: no DOWN stage, no second counter handoff, no read of h.
// Built into the one-GPU library only (the tensor-parallel build exchanges x after DOWN instead).
// Included by monokernel.cu only (one translation unit); relies on its includes and defines.
#pragma once

// Wd^T loads in flight per thread in the DOWN share: a thread's rows take ceil(rows / (G x depth)) load rounds, one
// after the other. Overridable for experiments (KOG_NVCC_FLAGS="-DMLP_DOWN_DEPTH=12", part of the build's cache key):
// 12 still fits 128 registers without spills, 16 spills.
#ifndef MLP_DOWN_DEPTH
#define MLP_DOWN_DEPTH 8
#endif

// out: gate rows [0, a1) then up rows [a1, 2 a1) of the unscaled vector, rs their RMS factor; red: scratch of
// schedule.mlp_partial_floats(d) floats. Ends with this CTA's adds issued (the caller's signal releases them).
MK_DEV void mlp_down(const MkParams& p, const mk_bf16* wdt, int a0, int a1, float rs, float* out, float* red,
                     int step, int ii) {
    for (int r = threadIdx.x; r < a1; r += NT) {
        const float gt = out[r] * rs;
        out[r] = gt / (1.f + expf(-gt)) * (out[a1 + r] * rs);   // h[a0 + r], kept in shared memory
    }
    __syncthreads();
    // Thread u takes 16-byte chunk u % nch (8 of the d rows) of the slice's rows u / nch, + G, + 2G, ...; the G
    // row groups' partial sums go to red[g * d ..] and are added in group order (fixed: reproducible).
    const int d = p.d, nch = d >> 3;
    const int G = nch < NT ? div_small(NT, nch) : 1;   // div_small, divmod_small: these run on the layer's chain
    for (int u = threadIdx.x; u < G * nch; u += NT) {
        int c;
        const int g = divmod_small(u, nch, c);
        const mk_bf16* col = wdt + (size_t)a0 * d + (size_t)c * 8;
        float y[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int r0 = g; r0 < a1; r0 += MLP_DOWN_DEPTH * G) {
            uint4 w[MLP_DOWN_DEPTH];
#pragma unroll
            for (int k = 0; k < MLP_DOWN_DEPTH; ++k) {
                const int r = r0 + k * G;
                w[k] = r < a1 ? mk_ld_stream16(col + (size_t)r * d) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int k = 0; k < MLP_DOWN_DEPTH; ++k) {
                const int r = r0 + k * G;
                const float hv = r < a1 ? out[r] : 0.f;
                float f[8];
                mk_unpack8(w[k], f);
#pragma unroll
                for (int e = 0; e < 8; ++e) y[e] += hv * f[e];
            }
        }
        float4* dst = (float4*)(red + (size_t)g * d + c * 8);
        dst[0] = make_float4(y[0], y[1], y[2], y[3]);
        dst[1] = make_float4(y[4], y[5], y[6], y[7]);
    }
    __syncthreads();
    trace(p, step, ii, 5);
    // Every CTA adds into the same d words, whose atomics queue in a few L2 slices: each CTA starts at its own
    // element (Llama-1B -4 us/token; a sum over each cluster's ranks in shared memory first was slower: bench/NOTES.md,
    // session 17). Fixed-point integers: the order of the adds does not change a bit.
    int rot;
    divmod_small(64 * blockIdx.x, d, rot);   // 64 * blockIdx.x % d without an integer division
    for (int i = threadIdx.x; i < d; i += NT) {
        const int j = i + rot < d ? i + rot : i + rot - d;
        float s = 0.f;
        for (int g = 0; g < G; ++g) s += red[g * d + j];
        mk_red_add_u64(p.acc + j, (unsigned long long)__float2ll_rn(s * kAccScale));
    }
}
