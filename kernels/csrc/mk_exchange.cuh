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

// Built twice (kernels/build.py): MK_TP=0 for one GPU, where every function below is exactly the single-GPU code
// (the exchange and lane paths are compiled out: with them present, the tp = 1 branches alone cost ~0.2 us per
// residual norm, bench/NOTES.md session 3), and MK_TP=1 for tensor parallelism.
#ifndef MK_TP
#define MK_TP 1
#endif
constexpr bool kTP = MK_TP != 0;
// The fused MLP schedule (mk_mlp.cuh, p.acc != NULL) exists in the one-GPU builds only.
constexpr bool kFusedMlp = !kTP;

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

// ---------------------------------------------------------------- delayed mode (Laneformer lanes)
// lane_mode != NULL: rank r runs lane r of a lane checkpoint (engine/lanes/model.py is the truth). Each rank keeps its
// own residual stream x. OPROJ / DOWN still push their raw partial p into recv[layer][stage][this rank] of every
// rank, but the update a stage (j, s) applies to this lane's stream depends on its reduce mode:
//   PRESENT   u = p_0 + ... + p_{N-1}                (the exact-mode sum: waits for every rank's stage j)
//   NO_REDUCE u = sqrt(N) * p_own
//   PAST      u = p_own + ((P_0 + ... + P_{N-1}) - P_own),  P = the partials of stage s of layer j - delay
//   PAST_OWN  u = p_own                              (PAST whose source layer was not queued, ambiguity A1)
// so a consumer waits for its own rank's producers of (j, s) (the ordinary local counter) and, for PAST, for every
// rank's producers of (j - delay, s) only (peer counter lane_x_ctr + 2 (j - delay) + s, bumped by all ranks):
// a peer up to `delay` layers behind costs no wait. Buffer reuse: rank r writes recv[*] of step t + 1 only after
// its sampler of step t saw every rank's LM-head records (the LM head is always exchanged in delayed mode), and a
// rank's LM head comes after all of its reads of step t (every stage waits for all of the previous one).
// Replicate LM head (lane_agg): the last DOWN also pushes this lane's final state x + u rows into fin[this rank]
// (after the recv blocks) of every rank; the LM head normalises each lane's final state and takes their mean.
MK_DEV size_t xr_fin_off(const MkParams& p) { return (size_t)p.n_layers * 2 * p.tp_size * p.d; }

// Peer counter (and its producers per step) a delayed-mode instruction waits for besides its own wait, or -1.
MK_DEV int xr_lane_wait(const MkParams& p, int op, int layer, unsigned* n) {
    int j, s;
    if (op == MK_OP_GATEUP) { j = layer; s = 0; }
    else if (op == MK_OP_QKV && layer > 0) { j = layer - 1; s = 1; }
    else if (op == MK_OP_LMHEAD && p.lane_agg) { *n = (unsigned)p.lane_xn_down; return p.lane_x_ctr + 2 * p.n_layers; }
    else if (op == MK_OP_LMHEAD) { j = p.n_layers - 1; s = 1; }
    else if (op == MK_OP_DOWN && p.lane_agg && layer == p.n_layers - 1) { j = layer; s = 1; }
    else return -1;
    const int m = p.lane_mode[2 * j + s];
    *n = (unsigned)(s == 0 ? p.lane_xn_oproj : p.lane_xn_down);
    if (m == MK_LANE_PRESENT && op != MK_OP_DOWN) return p.lane_x_ctr + 2 * j + s;
    if (m == MK_LANE_PAST) return p.lane_x_ctr + 2 * (j - p.lane_delay) + s;
    return -1;
}

// The update u (above) of stage (j, s) at rows i..i+3 / row i; own: this rank's partial there.
MK_DEV float4 xr_lane_upd4(const MkParams& p, int j, int s, int i, float4 own) {
    const int m = p.lane_mode[2 * j + s];
    const int src = m == MK_LANE_PAST ? j - p.lane_delay : j;
    const float* rb = p.recv + xr_off(p, src, s) + i;
    if (m == MK_LANE_NO_REDUCE) return make_float4(own.x * p.lane_scale, own.y * p.lane_scale,
                                                    own.z * p.lane_scale, own.w * p.lane_scale);
    if (m == MK_LANE_PAST_OWN) return own;
    float4 t = mk_ld_cg4((const float4*)rb);
#pragma unroll
    for (int r = 1; r < MK_MAX_TP; ++r) {
        if (r < p.tp_size) {
            const float4 b = mk_ld_cg4((const float4*)(rb + (size_t)r * p.d));
            t.x += b.x; t.y += b.y; t.z += b.z; t.w += b.w;
        }
    }
    if (m == MK_LANE_PRESENT) return t;
    const float4 me = mk_ld_cg4((const float4*)(rb + (size_t)p.tp_rank * p.d));
    return make_float4(own.x + (t.x - me.x), own.y + (t.y - me.y), own.z + (t.z - me.z), own.w + (t.w - me.w));
}

MK_DEV float xr_lane_upd1(const MkParams& p, int j, int s, int i, float own) {
    const int m = p.lane_mode[2 * j + s];
    const int src = m == MK_LANE_PAST ? j - p.lane_delay : j;
    const float* rb = p.recv + xr_off(p, src, s) + i;
    if (m == MK_LANE_NO_REDUCE) return own * p.lane_scale;
    if (m == MK_LANE_PAST_OWN) return own;
    float t = mk_ld_cg(rb);
#pragma unroll
    for (int r = 1; r < MK_MAX_TP; ++r)
        if (r < p.tp_size) t += mk_ld_cg(rb + (size_t)r * p.d);
    if (m == MK_LANE_PRESENT) return t;
    return own + (t - mk_ld_cg(rb + (size_t)p.tp_rank * p.d));
}

// Delayed-mode wait: the instruction's own (local) counter, then the peer counter of xr_lane_wait at system scope;
// with xwait set, thread 0's time in the peer wait alone (from step 1 on) is added to this CTA's total.
MK_DEV bool xr_lane_wait_all(const MkParams& p, const int* ins, int step, int* sflag) {
    const int op = ins[MK_F_OP];
    // the sampler's LM counter is bumped by every rank's LM-head blocks
    if (!wait_ctr(p, p.ctr + ins[MK_F_WAIT_CTR], (unsigned)((step + 1) * ins[MK_F_WAIT_N]), step, sflag,
                  op == MK_OP_SAMPLE))
        return false;
    unsigned n = 0;
    const int xc = xr_lane_wait(p, op, ins[MK_F_LAYER], &n);
    if (xc < 0) return true;
    const unsigned long long t0 = threadIdx.x == 0 ? mk_globaltimer() : 0ull;
    const bool ok = wait_ctr(p, p.ctr + xc, (unsigned)(step + 1) * n, step, sflag, true);
    if (p.xwait && step > 0 && threadIdx.x == 0) p.xwait[blockIdx.x] += mk_globaltimer() - t0;
    return ok;
}

// Rows i..i+3 of a residual consumer's norm input (xr_norm, xr_lane_norm): a times w when the RMS factor is left to
// the outputs (scaled: QKV / GATEUP); a as it is for the LM head, which xr_norm_finish normalises in place.
MK_DEV void xr_norm_store(float* dst, const float* w, int i, float4 a, bool scaled) {
    if (scaled) {
        const float4 g = *(const float4*)(w + i);
        a.x *= g.x; a.y *= g.y; a.z *= g.z; a.w *= g.w;
    }
    *(float4*)(dst + svx(i)) = a;
}

// The end of those norms, from each thread's sum of squares ss: scaled, the RMS factor for the outputs (one
// barrier); else dst normalised in place and 1. Ends synced.
MK_DEV float xr_norm_finish(const MkParams& p, float* dst, const float* w, float ss, bool scaled, float* scr) {
    if (scaled) return rms_factor(ss, p.d, p.eps, scr);
    ss = block_sum(ss, scr);
    const float r = rsqrtf(ss / (float)p.d + p.eps);
    for (int i = threadIdx.x; i < p.d; i += NT) dst[svx(i)] = dst[svx(i)] * r * w[i];
    __syncthreads();
    return 1.f;
}

// Delayed-mode RMSNorm input of a residual consumer (xr_norm): this lane's x + u of the stage it consumes, or with
// lane_agg at the LM head the mean over lanes of RMSNorm(fin[lane]) (each lane's final state). Returns the factor
// the outputs still need (QKV / GATEUP: the RMS scale, as xr_norm; the LM head: 1). Ends synced.
MK_DEV float xr_lane_norm(const MkParams& p, float* dst, const float* w, int op, int layer, float* scr) {
    const int n = p.d;
    if (op == MK_OP_LMHEAD && p.lane_agg) {
        const float* fin = p.recv + xr_fin_off(p);
        // lane by lane: dst accumulates fin[l] * rsqrt(mean(fin[l]^2) + eps) (each thread its own elements)
        for (int l = 0; l < p.tp_size; ++l) {
            const float* f = fin + (size_t)l * n;
            float ss = 0.f;
            for (int i = threadIdx.x * 4; i < n; i += NT * 4) {
                const float4 a = mk_ld_cg4((const float4*)(f + i));
                ss = sum_sq4(ss, a);
            }
            ss = block_sum(ss, scr);
            const float r = rsqrtf(ss / (float)n + p.eps);
            for (int i = threadIdx.x; i < n; i += NT) dst[svx(i)] = (l == 0 ? 0.f : dst[svx(i)]) + mk_ld_cg(f + i) * r;
        }
        for (int i = threadIdx.x; i < n; i += NT) dst[svx(i)] = dst[svx(i)] / (float)p.tp_size * w[i];
        __syncthreads();
        return 1.f;
    }
    const int j = op == MK_OP_GATEUP ? layer : op == MK_OP_QKV ? layer - 1 : p.n_layers - 1;
    const int s = op == MK_OP_GATEUP ? 0 : 1;
    const float* own = p.recv + xr_off(p, j, s) + (size_t)p.tp_rank * n;
    const bool scaled = op != MK_OP_LMHEAD;   // QKV / GATEUP leave the RMS factor to their outputs
    float ss = 0.f;
    for (int i = threadIdx.x * 4; i < n; i += NT * 4) {
        const float4 u = xr_lane_upd4(p, j, s, i, mk_ld_cg4((const float4*)(own + i)));
        float4 a = mk_ld_cg4((const float4*)(p.x + i));
        a.x += u.x; a.y += u.y; a.z += u.z; a.w += u.w;
        ss = sum_sq4(ss, a);
        xr_norm_store(dst, w, i, a, scaled);
    }
    return xr_norm_finish(p, dst, w, ss, scaled, scr);
}

// Delayed-mode OPROJ / DOWN rows [a0, a0 + R): materialise the previous stage's update of this lane into x[rows],
// push the raw partial to every rank; the last DOWN with lane_agg also pushes this lane's final state rows.
MK_DEV void xr_lane_residual(const MkParams& p, int op, int layer, int a0, int R, const float* out) {
    const int stage = op == MK_OP_OPROJ ? 0 : 1;
    const int j = op == MK_OP_OPROJ ? layer - 1 : layer, s = op == MK_OP_OPROJ ? 1 : 0;
    const bool fin = op == MK_OP_DOWN && p.lane_agg && layer == p.n_layers - 1;
    if (j >= 0) {
        const float* own = p.recv + xr_off(p, j, s) + (size_t)p.tp_rank * p.d;
        for (int r = threadIdx.x; r < R; r += NT) {
            const float v = mk_ld_cg(p.x + a0 + r) + xr_lane_upd1(p, j, s, a0 + r, mk_ld_cg(own + a0 + r));
            p.x[a0 + r] = v;
            if (fin) {   // this lane's final state: x + u of the last MLP, own partial straight from `out`
                const float f = v + xr_lane_upd1(p, layer, 1, a0 + r, out[r]);
                const size_t fo = xr_fin_off(p) + (size_t)p.tp_rank * p.d + a0 + r;
#pragma unroll
                for (int k = 0; k < MK_MAX_TP; ++k)
                    if (k < p.tp_size) p.peer_recv[k][fo] = f;
            }
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

// Delayed-mode completion of OPROJ / DOWN: fence, every rank's peer counter of (layer, stage) (and of the final
// state after the last DOWN with lane_agg), then this rank's own stage counter with release (its local consumers
// acquire it: the peer bumps precede it).
MK_DEV void xr_lane_signal(const MkParams& p, int op, int layer, int ctr) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const int xc = p.lane_x_ctr + 2 * layer + (op == MK_OP_OPROJ ? 0 : 1);
        const bool fin = op == MK_OP_DOWN && p.lane_agg && layer == p.n_layers - 1;
        mk_fence_sys();
#pragma unroll
        for (int k = 0; k < MK_MAX_TP; ++k) {
            if (k < p.tp_size) {
                mk_red_relaxed_sys(p.peer_ctr[k] + xc, 1u);
                if (fin) mk_red_relaxed_sys(p.peer_ctr[k] + p.lane_x_ctr + 2 * p.n_layers, 1u);
            }
        }
        mk_red_release(p.ctr + ctr, 1u);
    }
}

// The instruction's wait (kernel main loop). Exchanged waits acquire at system scope and, with xwait set,
// add the nanoseconds thread 0 spent in them (from step 1 on: step 0 includes the launch skew between GPUs)
// to this CTA's total. The spin includes local producers too: it is the time the exchange stage cost, an upper
// bound on the exchange latency that was not hidden.
MK_DEV bool xr_wait(const MkParams& p, const int* ins, int step, int* sflag) {
    if (!kTP) return wait_ctr(p, p.ctr + ins[MK_F_WAIT_CTR], (unsigned)((step + 1) * ins[MK_F_WAIT_N]), step, sflag);
    if (p.lane_mode != nullptr) return xr_lane_wait_all(p, ins, step, sflag);
    const unsigned* c = p.ctr + ins[MK_F_WAIT_CTR];
    const unsigned target = (unsigned)((step + 1) * ins[MK_F_WAIT_N]);
    if (!xr_exchanged_wait(p, ins[MK_F_OP], ins[MK_F_LAYER])) return wait_ctr(p, c, target, step, sflag);
    const unsigned long long t0 = threadIdx.x == 0 ? mk_globaltimer() : 0ull;
    const bool ok = wait_ctr(p, c, target, step, sflag, true);
    if (p.xwait && step > 0 && threadIdx.x == 0) p.xwait[blockIdx.x] += mk_globaltimer() - t0;
    return ok;
}

// dst = RMSNorm(x [+ sum of the pending partials]) * w over the d residual rows, dst swizzled (svx). Ends synced.
// Returns the factor the matvec's outputs still need: QKV and GATEUP leave the RMS scale to their outputs (one pass,
// one barrier: norm_vec_scale on one GPU, the same with the ranks' partials added under tensor parallelism); the LM
// head's dst is fully normalised and the factor is 1.
// The fused MLP schedule: QKV and LMHEAD normalise x + acc (the last MLP's output, mk_mlp.cuh).
MK_DEV float xr_norm_of_x(const MkParams& p, float* dst, const float* w, int op, float* scr) {
    const unsigned long long* acc = kFusedMlp && (op == MK_OP_QKV || op == MK_OP_LMHEAD) ? p.acc : nullptr;
    if (op != MK_OP_LMHEAD) return norm_vec_scale(dst, p.x, w, p.d, p.eps, scr, acc);
    norm_vec(dst, p.x, w, p.d, p.eps, scr, acc);
    return 1.f;
}

MK_DEV float xr_norm(const MkParams& p, float* dst, const float* w, int op, int layer, float* scr) {
    if (!kTP) return xr_norm_of_x(p, dst, w, op, scr);
    if (p.lane_mode != nullptr && (op != MK_OP_QKV || layer > 0)) {
        return xr_lane_norm(p, dst, w, op, layer, scr);
    }
    const float* rb = xr_pending(p, op, layer);
    if (rb == nullptr) return xr_norm_of_x(p, dst, w, op, scr);   // as on one GPU: tp = 1 stays bit-identical
    const int n = p.d;
    const bool scaled = op != MK_OP_LMHEAD;   // QKV / GATEUP leave the RMS factor to their outputs, as on one GPU
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
        ss = sum_sq4(ss, a);
        xr_norm_store(dst, w, i, a, scaled);
    }
    return xr_norm_finish(p, dst, w, ss, scaled, scr);
}

// OPROJ / DOWN output of rows [a0, a0 + R) (out: shared memory). Single GPU: x[rows] += out. Tensor parallel:
// materialise the previous exchanged stage into x[rows], then push out to every rank (steps 1 and 2 above).
MK_DEV void xr_residual(const MkParams& p, int op, int layer, int a0, int R, const float* out) {
    if (kFusedMlp && p.acc != nullptr) {   // fused MLP (OPROJ): x[rows] += the last MLP's output, then zero it there
        for (int r = threadIdx.x; r < R; r += NT) {
            p.x[a0 + r] = (mk_ld_cg(p.x + a0 + r) + acc_value(mk_ld_cg_s64(p.acc + a0 + r))) + out[r];
            p.acc[a0 + r] = 0ull;
        }
        return;
    }
    if (!kTP || p.tp_size <= 1) {
        for (int r = threadIdx.x; r < R; r += NT) p.x[a0 + r] = mk_ld_cg(p.x + a0 + r) + out[r];
        return;
    }
    if (p.lane_mode != nullptr) { xr_lane_residual(p, op, layer, a0, R, out); return; }
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
    if (!kTP || p.tp_size <= 1 || !p.lm_parallel || threadIdx.x != 0) return;
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
MK_DEV void xr_signal(const MkParams& p, int op, int layer, int ctr) {
    const bool x = op == MK_OP_OPROJ || op == MK_OP_DOWN || (op == MK_OP_LMHEAD && p.lm_parallel);
    if (!kTP || p.tp_size <= 1 || !x) { signal_ctr(p, p.ctr + ctr); return; }
    if (p.lane_mode != nullptr && op != MK_OP_LMHEAD) { xr_lane_signal(p, op, layer, ctr); return; }
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
    if (!kTP || p.tp_size <= 1) return *(volatile const int*)p.cancel;
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
