// Tensor-parallel exchange of the monokernel (exact mode, docs/dtp_kernel_plan.md). With tp_size == 1 every
// function here reduces to the single-GPU code it wraps (a uniform branch on a kernel parameter).
// Included by monokernel.cu only (one translation unit); relies on its includes and defines.
//
// Each rank runs the kernel on its shard (local heads, local FFN channels, full hidden size d). OPROJ and DOWN
// then produce a *partial* of all d residual rows. Protocol, per instruction producing rows [a0, a0 + R):
//   1. materialise: x[rows] = x[rows] + (P_0 + P_1 + ... + P_{N-1})[rows] of the previous exchanged stage
//      (DOWN of layer l - 1 for OPROJ of layer l, OPROJ of layer l for DOWN of layer l); the instruction already
//      waited (transitively) for those partials, and every local reader of x[rows] of the previous stage has
//      signalled before it (its wait), so the write races with nothing;
//   2. push: plain stores of its R partial values into recv[layer][stage][this rank][rows] of every rank
//      (peer-mapped pointers, this rank's own buffer included);
//   3. signal: one system-scope fence, then a relaxed add on the stage counter of every rank.
// Consumers of the residual (the RMSNorm of QKV (layer > 0), GATEUP and LMHEAD) wait at system scope until the
// counter holds every rank's producers, then normalise x + (P_0 + ... + P_{N-1}), ranks in that fixed order:
// the same fp32 operations on the same bits on every rank, so all residual streams stay bit-identical.
//
// Receive buffers are per (layer, stage): a rank writes recv[l] of step s + 1 only after it has seen every
// rank finish reading recv[l] of step s (it waited on their later partials of step s, or for the LM-head
// buffer, their OPROJ of the last layer at step s + 1), so no parity copies and no reset barrier.
#pragma once

// This rank's receive buffer of (layer, stage 0 = OPROJ | 1 = DOWN), source rank 0; source r is + r * d.
MK_DEV size_t xr_off(const MkParams& p, int layer, int stage) {
    return ((size_t)layer * 2 + stage) * (size_t)p.tp_size * p.d;
}

// The instruction's wait names a counter other ranks bump: a residual consumer after an exchange, or the
// sampler of a vocabulary-parallel LM head (every rank's records).
MK_DEV bool xr_exchanged_wait(const MkParams& p, int op, int layer) {
    return p.tp_size > 1 && (op == MK_OP_GATEUP || op == MK_OP_LMHEAD || (op == MK_OP_QKV && layer > 0) ||
                             (op == MK_OP_SAMPLE && p.lm_parallel));
}

// The partials (this rank's receive buffer, source 0) a residual consumer adds to x, or NULL (x is complete).
MK_DEV const float* xr_pending(const MkParams& p, int op, int layer) {
    if (p.tp_size <= 1) return nullptr;
    if (op == MK_OP_GATEUP) return p.recv + xr_off(p, layer, 0);
    if (op == MK_OP_LMHEAD) return p.recv + xr_off(p, p.n_layers - 1, 1);
    if (op == MK_OP_QKV && layer > 0) return p.recv + xr_off(p, layer - 1, 1);
    return nullptr;
}

// The instruction's wait (kernel main loop). Exchanged waits acquire at system scope and, with xwait set,
// add the nanoseconds thread 0 spent in them (from step 1 on: step 0 includes the launch skew between GPUs)
// to this CTA's total. The spin includes local producers too: it is the time the exchange stage cost, an upper
// bound on the exchange latency that was not hidden.
MK_DEV bool xr_wait(const MkParams& p, const int* ins, int step, int* sflag) {
    const unsigned* c = p.ctr + ins[MK_F_WAIT_CTR];
    const unsigned target = (unsigned)((step + 1) * ins[MK_F_WAIT_N]);
    if (!xr_exchanged_wait(p, ins[MK_F_OP], ins[MK_F_LAYER])) return wait_ctr(p, c, target, step, sflag);
    const unsigned long long t0 = threadIdx.x == 0 ? mk_globaltimer() : 0ull;
    const bool ok = wait_ctr(p, c, target, step, sflag, true);
    if (p.xwait && step > 0 && threadIdx.x == 0) p.xwait[blockIdx.x] += mk_globaltimer() - t0;
    return ok;
}

// dst = RMSNorm(x [+ sum of the pending partials]) * w over the d residual rows. Ends synced.
MK_DEV void xr_norm(const MkParams& p, float* dst, const float* w, int op, int layer, float* scr) {
    const float* rb = xr_pending(p, op, layer);
    if (rb == nullptr) { norm_vec(dst, p.x, w, p.d, p.eps, scr); return; }
    const int n = p.d;
    float ss = 0.f;
    for (int i = threadIdx.x * 4; i < n; i += NT * 4) {
        float4 s = mk_ld_cg4((const float4*)(rb + i));
#pragma unroll
        for (int r = 1; r < MK_MAX_TP; ++r) {
            if (r < p.tp_size) {
                const float4 b = mk_ld_cg4((const float4*)(rb + (size_t)r * n + i));
                s.x += b.x; s.y += b.y; s.z += b.z; s.w += b.w;
            }
        }
        float4 a = mk_ld_cg4((const float4*)(p.x + i));
        a.x += s.x; a.y += s.y; a.z += s.z; a.w += s.w;
        *(float4*)(dst + i) = a;
        ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    }
    ss = block_sum(ss, scr);
    const float r = rsqrtf(ss / (float)n + p.eps);
    for (int i = threadIdx.x; i < n; i += NT) dst[i] = dst[i] * r * w[i];
    __syncthreads();
}

// OPROJ / DOWN output of rows [a0, a0 + R) (out: shared memory). Single GPU: x[rows] += out. Tensor parallel:
// materialise the previous exchanged stage into x[rows], then push out to every rank (steps 1 and 2 above).
MK_DEV void xr_residual(const MkParams& p, int op, int layer, int a0, int R, const float* out) {
    if (p.tp_size <= 1) {
        for (int r = threadIdx.x; r < R; r += NT) p.x[a0 + r] = mk_ld_cg(p.x + a0 + r) + out[r];
        return;
    }
    const int stage = op == MK_OP_OPROJ ? 0 : 1;
    const float* prev = op == MK_OP_OPROJ ? (layer > 0 ? p.recv + xr_off(p, layer - 1, 1) : nullptr)
                                          : p.recv + xr_off(p, layer, 0);
    if (prev != nullptr) {
        for (int r = threadIdx.x; r < R; r += NT) {
            float s = mk_ld_cg(prev + a0 + r);
#pragma unroll
            for (int k = 1; k < MK_MAX_TP; ++k)
                if (k < p.tp_size) s += mk_ld_cg(prev + (size_t)k * p.d + a0 + r);
            p.x[a0 + r] = mk_ld_cg(p.x + a0 + r) + s;
        }
    }
    const size_t off = xr_off(p, layer, stage) + (size_t)p.tp_rank * p.d + a0;
#pragma unroll
    for (int k = 0; k < MK_MAX_TP; ++k) {
        if (k < p.tp_size) {
            float* dst = p.peer_recv[k] + off;
            for (int r = threadIdx.x; r < R; r += NT) dst[r] = out[r];
        }
    }
}

// Vocabulary-parallel LM head: thread 0 (which wrote this block's record in lm_record) copies it into the same
// slot of every other rank's record array; xr_signal then publishes it with the LMHEAD counter of every rank.
MK_DEV void xr_push_record(const MkParams& p, int aux) {
    if (p.tp_size <= 1 || !p.lm_parallel || threadIdx.x != 0) return;
    const size_t off = (size_t)(p.rec_off + aux) * MK_REC_WORDS;
    const unsigned* src = (const unsigned*)(p.lmrec + off);
#pragma unroll
    for (int k = 0; k < MK_MAX_TP; ++k) {
        if (k < p.tp_size && k != p.tp_rank) {
            unsigned* dst = (unsigned*)(p.peer_lmrec[k] + off);
            for (int w = 0; w < MK_REC_WORDS; ++w) dst[w] = src[w];
        }
    }
}

// The instruction's completion signal. OPROJ / DOWN (and LMHEAD when vocabulary-parallel) under tensor
// parallelism: every thread's pushes precede the barrier, thread 0's system-scope fence is cumulative over them,
// then one relaxed add per rank's counter.
MK_DEV void xr_signal(const MkParams& p, int op, int ctr) {
    const bool x = op == MK_OP_OPROJ || op == MK_OP_DOWN || (op == MK_OP_LMHEAD && p.lm_parallel);
    if (p.tp_size <= 1 || !x) { signal_ctr(p.ctr + ctr); return; }
    __syncthreads();
    if (threadIdx.x == 0) {
        mk_fence_sys();
#pragma unroll
        for (int k = 0; k < MK_MAX_TP; ++k)
            if (k < p.tp_size) mk_red_relaxed_sys(p.peer_ctr[k] + ctr, 1u);
    }
}

// SAMPLE's cancel check (thread 0). Single GPU: the host's flag. Tensor parallel: only rank 0 reads the host
// flag; seeing it at step s it tells every rank to cancel from step s + 1 on. Each rank's SAMPLE of step s + 1
// comes after it received rank 0's partials of step s + 1 (system-scope acquire), which rank 0 pushed after
// this store and fence, so every rank stops at the same step and no rank waits for a peer that has stopped.
MK_DEV int xr_cancelled(const MkParams& p, int step) {
    if (p.tp_size <= 1) return *(volatile const int*)p.cancel;
    const int at = *(volatile int*)(p.status + MK_STATUS_TP_CANCEL);
    if (at != 0 && step >= at - 1) return 1;
    if (p.tp_rank == 0 && at == 0 && *(volatile const int*)p.cancel) {
#pragma unroll
        for (int k = 0; k < MK_MAX_TP; ++k)
            if (k < p.tp_size) ((volatile int*)p.peer_status[k])[MK_STATUS_TP_CANCEL] = step + 2;
        __threadfence_system();
    }
    return 0;
}

// ---------------------------------------------------------------- host side (ctypes)
extern "C" {
// Let device `dev` access `peer`'s memory (NVLink / PCIe P2P). 0, the CUDA error, or -1 when the link has no
// native atomics (the exchange bumps peer counters with red.sys); "already enabled" is 0.
int mk_enable_peer(int dev, int peer) {
    int can = 0, atomics = 0;
    cudaError_t e = cudaDeviceCanAccessPeer(&can, dev, peer);
    if (e != cudaSuccess) return (int)e;
    if (!can) return (int)cudaErrorPeerAccessUnsupported;
    e = cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, dev, peer);
    if (e != cudaSuccess) return (int)e;
    if (!atomics) return -1;
    e = cudaSetDevice(dev);
    if (e != cudaSuccess) return (int)e;
    e = cudaDeviceEnablePeerAccess(peer, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();   // clear the sticky-free error so the next call does not report it
        return 0;
    }
    return (int)e;
}
}  // extern "C"
