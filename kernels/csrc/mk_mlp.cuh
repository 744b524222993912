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
    // The row loop below is mlp_rows_dot's (the cluster builds' paired share). Calling it here changed every one-GPU
    // build's SASS (session 33, unmeasured), so this hot loop stays written out.
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

#if MK_CLUSTER
// One thread's wait for the round's phase of a paired MLP's mbarrier; false once the launch is aborted (another
// CTA's watchdog: a partner that never sends leaves the grid waiting on counters, whose watchdog fires).
MK_DEV bool mlp_pair_wait(const MkParams& p, unsigned long long* bar, unsigned parity) {
    unsigned it = 0;
    while (!mk_mbar_try_wait(bar, parity))
        if ((++it & 1023u) == 0 && *(volatile int*)(p.status + MK_STATUS_ABORT)) return false;
    return true;
}

// y[0 .. 8) += h[r] x (the 16 bytes at col + r d: 8 bf16 of the slice's Wd^T row r) over r = g, g + G, ... < n: a
// thread's share of one slice in a paired MLP's DOWN half (mlp_down_pair), loads in batches of MLP_DOWN_DEPTH as
// mlp_down's.
MK_DEV void mlp_rows_dot(const mk_bf16* col, int d, int n, const float* h, int g, int G, float (&y)[8]) {
    for (int q0 = g; q0 < n; q0 += MLP_DOWN_DEPTH * G) {
        uint4 w[MLP_DOWN_DEPTH];
#pragma unroll
        for (int k = 0; k < MLP_DOWN_DEPTH; ++k) {
            const int r = q0 + k * G;
            w[k] = r < n ? mk_ld_stream16(col + (size_t)r * d) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < MLP_DOWN_DEPTH; ++k) {
            const int r = q0 + k * G;
            const float hv = r < n ? h[r] : 0.f;
            float f[8];
            mk_unpack8(w[k], f);
#pragma unroll
            for (int e = 0; e < 8; ++e) y[e] += hv * f[e];
        }
    }
}

// A paired MLP instruction (isa.OPS["MLP"] aux, schedule.build mlp_pairs) on cluster rank r, paired with rank r ^ 1
// (rows [b0, b0 + b1), from aux). It sends its h rows into the partner's cr.h (st.async, counted off the partner's
// cr.hbar), then adds half of the d outputs (rank parity 0: [0, d / 2), else [d / 2, d)) over both slices:
// y = Wd[half, own rows] . h_own + Wd[half, partner rows] . h_partner, the same Wd^T bytes an unpaired share reads,
// with half its atomics per output element. Each thread runs its own rows first, then waits on the mbarrier itself
// (no CTA barrier) and runs the partner's: the partner's h has the own rows' time to land. The partner's next round
// comes from its next layer's MLP, after this one's adds through the counters, so one buffer and one mbarrier serve
// every round. Returns -1 when the launch was aborted while waiting, else 0 (this CTA's adds issued; the caller's
// signal releases them).
MK_DEV int mlp_down_pair(const MkParams& p, const mk_bf16* wdt, int a0, int a1, int aux, float rs, float* out,
                         float* red, ClusterRecv& cr, int step, int ii) {
    const int b0 = aux & ((1 << MK_AUX_PAIR_ROWS_SHIFT) - 1);
    const int b1 = (aux & (MK_AUX_PAIR - 1)) >> MK_AUX_PAIR_ROWS_SHIFT;
    const unsigned rank = blockIdx.x & (unsigned)(p.attn_cluster - 1), peer = rank ^ 1u;
    if (threadIdx.x == 0) mk_mbar_expect(cr.hbar, 4u * (unsigned)b1);
    for (int r = threadIdx.x; r < a1; r += NT) {
        const float gt = out[r] * rs;
        const float hv = gt / (1.f + expf(-gt)) * (out[a1 + r] * rs);
        out[r] = hv;   // h[a0 + r]
        mk_st_async1(mk_cluster_addr(cr.h + r, peer), hv, mk_cluster_addr(cr.hbar, peer));
    }
    __syncthreads();
    // As mlp_down over the half: thread u takes 16-byte chunk u % nch of the half (8 outputs) and the rows u / nch,
    // + G, ... of each slice; the G groups' partial sums go to red[g * dh ..], added in group order.
    const int d = p.d, dh = d >> 1, nch = dh >> 3;
    const int G = nch < NT ? div_small(NT, nch) : 1;
    const unsigned parity = cr.hphase & 1u;
    ++cr.hphase;
    bool ok = true;
    for (int u = threadIdx.x; u < G * nch; u += NT) {
        int c;
        const int g = divmod_small(u, nch, c);
        const mk_bf16* col = wdt + (size_t)(rank & 1u) * dh + (size_t)c * 8;
        float y[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        mlp_rows_dot(col + (size_t)a0 * d, d, a1, out, g, G, y);
        ok = ok && mlp_pair_wait(p, cr.hbar, parity);
        if (ok) mlp_rows_dot(col + (size_t)b0 * d, d, b1, cr.h, g, G, y);
        float4* dst = (float4*)(red + (size_t)g * dh + c * 8);
        dst[0] = make_float4(y[0], y[1], y[2], y[3]);
        dst[1] = make_float4(y[4], y[5], y[6], y[7]);
    }
    if (__syncthreads_or(!ok)) return -1;
    trace(p, step, ii, 5);
    int rot;
    divmod_small(64 * blockIdx.x, dh, rot);   // each CTA starts its adds at its own element, as mlp_down's
    unsigned long long* acc = p.acc + (size_t)(rank & 1u) * dh;
    for (int i = threadIdx.x; i < dh; i += NT) {
        const int j = i + rot < dh ? i + rot : i + rot - dh;
        float s = 0.f;
        for (int g = 0; g < G; ++g) s += red[g * dh + j];
        mk_red_add_u64(acc + j, (unsigned long long)__float2ll_rn(s * kAccScale));
    }
    return 0;
}

#endif
