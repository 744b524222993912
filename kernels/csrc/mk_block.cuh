// Block-level helpers of the monokernel: reductions, counter wait (with watchdog) / signal, vector loads.
// Included by monokernel.cu only (one translation unit); relies on its includes and defines.
#pragma once

// ---------------------------------------------------------------- fixed-point accumulator (fused MLP)
// acc[i] holds value * 2^MK_ACC_FRAC_BITS as a two's-complement int64 (mk_mlp.cuh adds the MLP's partials).
constexpr float kAccScale = (float)(1ull << MK_ACC_FRAC_BITS);

MK_DEV float acc_value(long long v) { return __ll2float_rn(v) * (1.f / kAccScale); }

// a += acc[0..4) (16-byte aligned)
MK_DEV void acc_add4(float4& a, const unsigned long long* acc) {
    const longlong2 u = mk_ld_cg_s64x2(acc), v = mk_ld_cg_s64x2(acc + 2);
    a.x += acc_value(u.x); a.y += acc_value(u.y); a.z += acc_value(v.x); a.w += acc_value(v.y);
}

// ---------------------------------------------------------------- block helpers
// q = x / d, r = x % d for 0 <= x < 2^21 and 1 <= d < 2^21, exact: a float estimate from an approximate reciprocal
// (off by at most one there) corrected once. A divisor known only at run time otherwise costs an integer division
// (~20 dependent instructions); in the hot paths right after a wait those were ~0.3 us per instruction (ncu source
// counters, bench/NOTES.md session 24).
MK_DEV int divmod_small(int x, int d, int& r) {
    int q = __float2int_rz(__int2float_rn(x) * mk_rcp_approx(__int2float_rn(d)));
    r = x - q * d;
    if (r < 0) { --q; r += d; }
    else if (r >= d) { ++q; r -= d; }
    return q;
}
MK_DEV int div_small(int x, int d) {
    int r;
    return divmod_small(x, d, r);
}

MK_DEV float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += mk_shfl_xor(v, o);
    return v;
}

MK_DEV float warp_max(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, mk_shfl_xor(v, o));
    return v;
}

// Deterministic block sum (fixed tree); every thread gets the result. scr: >= NW + 1 floats.
MK_DEV float block_sum(float v, float* scr) {
    v = warp_sum(v);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) scr[w] = v;
    __syncthreads();
    if (w == 0) {
        float t = l < NW ? scr[l] : 0.f;
        t = warp_sum(t);
        if (l == 0) scr[NW] = t;
    }
    __syncthreads();
    return scr[NW];
}

MK_DEV bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// Block argmax, ties to the lowest index; every thread gets (value, index). scr: >= 2 * NW + 2 words.
MK_DEV void block_argmax(float& v, int& idx, float* scr) {
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float ov = mk_shfl_xor(v, o);
        const int oi = mk_shfl_xor_i(idx, o);
        if (better(ov, oi, v, idx)) { v = ov; idx = oi; }
    }
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    int* iscr = (int*)(scr + NW);
    __syncthreads();
    if (l == 0) { scr[w] = v; iscr[w] = idx; }
    __syncthreads();
    if (w == 0) {
        float tv = l < NW ? scr[l] : -INFINITY;
        int ti = l < NW ? iscr[l] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            const float ov = mk_shfl_xor(tv, o);
            const int oi = mk_shfl_xor_i(ti, o);
            if (better(ov, oi, tv, ti)) { tv = ov; ti = oi; }
        }
        if (l == 0) { scr[2 * NW] = tv; iscr[NW + 1] = ti; }
    }
    __syncthreads();
    v = scr[2 * NW];
    idx = iscr[NW + 1];
    __syncthreads();
}

// Block max (NaN ignored, as block_argmax's ties); every thread gets it. scr: as block_argmax.
MK_DEV float block_max(float v, float* scr) {
    int i = 0;
    block_argmax(v, i, scr);
    return v;
}

// Thread 0 spins until *c >= target. Returns false (in every thread) when the launch is aborted: this wait
// outlived the watchdog (it reports itself to the host and raises the abort flag) or another CTA's did.
// sys: the counter is also bumped by other GPUs (tensor parallelism, mk_exchange.cuh): acquire at system scope.
// seen (the step start's wait on the token counter): sflag[1] gets the value thread 0 saw last.
MK_DEV bool wait_ctr(const MkParams& p, const unsigned* c, unsigned target, int step, int* sflag, bool sys = false,
                     bool seen = false) {
    if (threadIdx.x == 0) {
        int ok = 1;
        unsigned v = sys ? mk_ld_acquire_sys(c) : mk_ld_acquire(c);
        if (v < target) {
            const long long t0 = clock64();
            unsigned it = 0;
            while ((v = sys ? mk_ld_acquire_sys(c) : mk_ld_acquire(c)) < target) {
                if ((++it & 255u) == 0) {
                    if (*(volatile int*)(p.status + MK_STATUS_ABORT)) { ok = 0; break; }
                    if ((unsigned long long)(clock64() - t0) > p.watchdog_cycles) {
                        ok = 0;
                        if (atomicExch(p.status + MK_STATUS_ABORT, 1) == 0) {
                            volatile int* hs = p.host_stat;
                            hs[MK_HOST_WD_BLOCK] = blockIdx.x + p.cta0;
                            hs[MK_HOST_WD_CTR] = (int)(c - p.ctr);
                            hs[MK_HOST_WD_TARGET] = (int)target;
                            hs[MK_HOST_WD_VALUE] = (int)v;
                            hs[MK_HOST_WD_STEP] = step;
                            hs[MK_HOST_REASON] = 4;
                            __threadfence_system();
                            hs[MK_HOST_DONE] = 1;
                        }
                        break;
                    }
                }
            }
        }
        sflag[2] = ok;
        if (seen) sflag[1] = (int)v;
    }
    __syncthreads();
    const bool ok = sflag[2] != 0;
    __syncthreads();
    return ok;
}

// The side launch's start (kernels/runtime.py Monokernel(side=True); p.n_resident > 0): every CTA of both launches
// counts itself in, and thread 0 of each main CTA spins until all n_resident have (verdict SIDE_BOTH) or until
// side_wait_ns have passed (SIDE_ALONE: the main launch runs its own lists, the side CTAs that come leave). The first
// compare-and-swap decides for everyone, so both launches follow one verdict. A side CTA waits for it: the main
// launch decides within side_wait_ns of its first CTA. But the side launch may be dispatched first, and its CTAs, one
// per SM, may leave no GPC room for a cluster of the main launch, which then never starts: so a side CTA that has
// waited kSideTimeout x side_wait_ns decides SIDE_ALONE itself and leaves (the main launch then runs alone once its
// clusters fit). Nothing else is read or written before the verdict. Returns it in every thread.
constexpr unsigned long long kSideTimeout = 5;
MK_DEV int side_verdict(const MkParams& p, int* sflag) {
    if (threadIdx.x == 0) {
        unsigned* arrived = (unsigned*)(p.status + MK_STATUS_ARRIVED);
        unsigned* verdict = (unsigned*)(p.status + MK_STATUS_VERDICT);
        atomicAdd(arrived, 1u);
        const unsigned long long t0 = mk_globaltimer();
        const unsigned long long wait_ns = (unsigned long long)p.side_wait_ns * (p.cta0 > 0 ? kSideTimeout : 1ull);
        unsigned v;
        while ((v = mk_ld_acquire(verdict)) == 0) {
            if (p.cta0 == 0 && mk_ld_acquire(arrived) >= (unsigned)p.n_resident)
                atomicCAS(verdict, 0u, (unsigned)MK_SIDE_BOTH);
            else if (mk_globaltimer() - t0 > wait_ns)
                atomicCAS(verdict, 0u, (unsigned)MK_SIDE_ALONE);
        }
        if (blockIdx.x == 0 && p.cta0 == 0) ((volatile int*)p.host_stat)[MK_HOST_ALONE] = v == MK_SIDE_ALONE;
        sflag[3] = (int)v;
    }
    __syncthreads();
    const int v = sflag[3];
    __syncthreads();
    return v;
}

// Every thread's writes precede the release (bar.sync orders them within the CTA; the release at gpu scope is
// cumulative, so a consumer's acquire of the counter sees them all: no separate fence). Lane 0 of warp
// p.signal_warp releases: a release is a MEMBAR that stalls its warp until the CTA's writes are visible, and with
// the last warp doing it, thread 0 starts the next instruction (its wait, the attention's staging, the trace)
// meanwhile (runtime default; 0: thread 0, as before).
MK_DEV void signal_ctr(const MkParams& p, unsigned* c, unsigned add = 1u) {
    __syncthreads();
    if (threadIdx.x == 32 * p.signal_warp) mk_red_release(c, add);
}

// Position of element i of a matvec input vector in shared memory: the two 16-byte halves of each 8-element chunk
// are swapped in every chunk with bit 2 set, so that the lanes of a quarter-warp, reading chunks c .. c + 7, hit 8
// distinct bank groups (mv_dot). Keeps 4-element groups together: svx(i) % 4 == i % 4.
MK_DEV int svx(int i) { return i ^ ((i >> 3) & 4); }

// dst[svx(0:n)] = src[0:n] (fp32, written by other CTAs; n % 4 == 0). Caller syncs.
MK_DEV void load_vec(float* dst, const float* src, int n) {
    for (int i = threadIdx.x * 4; i < n; i += NT * 4)
        *(float4*)(dst + svx(i)) = mk_ld_cg4((const float4*)(src + i));
}

// ss + a.x^2 + a.y^2 + a.z^2 + a.w^2 as explicit fmas: an expression like x * x + y * y lets the compiler pick which
// product to fuse, and its pick can differ between library builds, where the tensor-parallel build at tp_size 1 must
// give the one-GPU build's bits (tests/gpu/test_tp_monokernel.py).
MK_DEV float sum_sq4(float ss, const float4 a) {
    return fmaf(a.w, a.w, fmaf(a.z, a.z, fmaf(a.y, a.y, fmaf(a.x, a.x, ss))));
}

// rsqrt(mean of squares + eps) over a block's n rows from each thread's sum of squares ss: the warps' sums go to
// scr[0 .. NW) and one barrier later every thread adds them up. Ends synced.
MK_DEV float rms_factor(float ss, int n, float eps, float* scr) {
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) scr[threadIdx.x >> 5] = ss;
    __syncthreads();
    float t = 0.f;
#pragma unroll
    for (int k = 0; k < NW; ++k) t += scr[k];
    return rsqrtf(t / (float)n + eps);
}

// The RMSNorm input of a matvec with the scale left to its outputs (the matvec is linear): dst = src * w (swizzled)
// and the warps' partial sums of squares in scr[0 .. NW); returns rsqrt(mean(src^2) + eps), the factor of every
// output row. One pass and one barrier, where norm_vec needs three barriers and a second pass that reads w only
// after the reduction. Ends synced.
// acc (fused MLP schedule, else NULL): the fixed-point MLP output (acc_add4) added to src first.
MK_DEV float norm_vec_scale(float* dst, const float* src, const float* w, int n, float eps, float* scr,
                            const unsigned long long* acc = nullptr) {
    float ss = 0.f;
    for (int i = threadIdx.x * 4; i < n; i += NT * 4) {
        float4 a = mk_ld_cg4((const float4*)(src + i));
        if (acc != nullptr) acc_add4(a, acc + i);
        const float4 g = *(const float4*)(w + i);
        *(float4*)(dst + svx(i)) = make_float4(a.x * g.x, a.y * g.y, a.z * g.z, a.w * g.w);
        ss = sum_sq4(ss, a);
    }
    return rms_factor(ss, n, eps, scr);
}

// dst = RMSNorm(src) * w, fp32, n % 4 == 0, dst swizzled (svx). Ends synced.
MK_DEV void norm_vec(float* dst, const float* src, const float* w, int n, float eps, float* scr,
                     const unsigned long long* acc = nullptr) {
    float ss = 0.f;
    for (int i = threadIdx.x * 4; i < n; i += NT * 4) {
        float4 a = mk_ld_cg4((const float4*)(src + i));
        if (acc != nullptr) acc_add4(a, acc + i);
        *(float4*)(dst + svx(i)) = a;
        ss = sum_sq4(ss, a);
    }
    ss = block_sum(ss, scr);
    const float r = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += NT) dst[svx(i)] = dst[svx(i)] * r * w[i];
    __syncthreads();
}

