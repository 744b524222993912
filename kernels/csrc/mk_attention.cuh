// Attention partial over a position split, K/V append, last-finisher combine.
// Included by monokernel.cu only (one translation unit); relies on its includes and defines.
#pragma once
#include "mk_attn_loop.cuh"

// ---------------------------------------------------------------- attention
// Attention position splits in use at context length n (the rest only take their ticket): fewer, longer
// splits at short contexts keep the combine cheap (bench/NOTES.md, v3 sweep), and at long contexts no more than
// one staged chunk per split needs (session 13). schedule.attn_splits_in_use is the host's copy.
MK_DEV int attn_splits(const MkParams& p, int n) {
    int s = min(p.n_splits, (n + p.attn_min_pos - 1) / p.attn_min_pos);
    if (p.attn_min_splits > 0) s = min(s, max(p.attn_min_splits, (n + p.kv_stage_pos - 1) / p.kv_stage_pos));
    return max(1, s);
}

// Positions [p0, p1) of a split at context length n = pos + 1 (p0 == p1: an idle split).
MK_DEV void attn_span(const MkParams& p, int split, int n, int& p0, int& p1) {
    const int S_eff = attn_splits(p, n);
    p0 = split < S_eff ? (int)((long long)split * n / S_eff) : 0;
    p1 = split < S_eff ? (int)((long long)(split + 1) * n / S_eff) : 0;
}

// Copy `rows` K and V cache rows (from gk / gv) into the staging buffers (cp.async; the caller waits + syncs).
// Staged K rows are HD + MK_KPAD bf16 apart (mk_attn_loop.cuh), V rows HD.
template <int HD>
MK_DEV void attn_stage(const mk_bf16* gk, const mk_bf16* gv, mk_bf16* sk, mk_bf16* sv, int rows) {
    constexpr int CPR = HD * 2 / 16;   // 16-byte chunks per row
    for (int c = threadIdx.x; c < rows * CPR; c += NT) {
        const int r = c / CPR;
        mk_cp_async16(sk + c * 8 + r * MK_KPAD, gk + c * 8);
        mk_cp_async16(sv + c * 8, gv + c * 8);
    }
}

// Before the instruction's wait: start copying the cached K and V rows this split will read (positions written
// before this step, at most kv_stage_pos of them) into shared memory. They do not depend on this step's data,
// so, like a matvec's early weight loads, their latency hides behind the wait instead of lengthening the chain.
template <int HD>
MK_DEV void attn_prefetch(const MkParams& p, const int* ins, int pos, float* sm) {
    int p0, p1;
    attn_span(p, ins[MK_F_A1], pos + 1, p0, p1);
    const int rows = min(min(p1, pos) - p0, p.kv_stage_pos);
    if (rows <= 0) return;
    const size_t row0 = ((size_t)ins[MK_F_LAYER] * p.n_kv + ins[MK_F_A0]) * (size_t)p.max_len + p0;
    mk_bf16* sk = (mk_bf16*)(sm + p.sm_kv);
    attn_stage<HD>(p.k_cache + row0 * HD, p.v_cache + row0 * HD, sk, sk + (size_t)p.kv_stage_pos * (HD + MK_KPAD),
                   rows);
}

#if MK_CLUSTER
// Cluster attention (schedule.build(cluster=NR)): a kv head's NR splits are ranks 0 .. NR - 1 of one cluster and
// each keeps its partial (per q head: max, denominator, HD weighted sums) in its CTA's partial-sum region. After a
// cluster barrier every rank merges its own 1 / NR of the head's g x HD outputs straight from the peers' regions
// (DSMEM): NR consecutive lanes per output element, one per split, combined with shuffles. Then it arrives on the
// next cluster barrier phase (it has finished reading its peers) and bumps ATTN_DONE; the matching wait is
// deferred to the CTA's next instruction (returns true), before it writes its partial-sum region again.
template <int HD>
MK_DEV bool attn_cluster_combine(const MkParams& p, const int* ins, int ii, int step, int head, int rank, int S_eff,
                                 float* sm) {
    const int g = p.group, NR = p.attn_cluster, E = g * HD, e0 = rank * (E / NR);
    const float* red = sm + p.sm_red;
    mk_cluster_sync();   // every split's partial is written
    trace(p, step, ii, 3);
    for (int t = threadIdx.x; t < E; t += NT) {   // E / NR elements x NR splits; warp-uniform (E % 32 == 0)
        const int s = t & (NR - 1), e = e0 + t / NR, j = e / HD, i = e - j * HD;
        float m = -INFINITY, l = 0.f, o = 0.f;
        if (s < S_eff) {
            const float* rec = red + j * (HD + 2);
            m = mk_ld_cluster(mk_cluster_addr(rec, s));
            l = mk_ld_cluster(mk_cluster_addr(rec + 1, s));
            o = mk_ld_cluster(mk_cluster_addr(rec + 2 + i, s));
        }
        float M = m;
        for (int d = 1; d < NR; d <<= 1) M = fmaxf(M, mk_shfl_xor(M, d));
        const float f = m == -INFINITY ? 0.f : expf(m - M);
        float den = f * l, num = f * o;
        for (int d = 1; d < NR; d <<= 1) {
            den += mk_shfl_xor(den, d);
            num += mk_shfl_xor(num, d);
        }
        if (s == 0) p.attn[(size_t)head * E + e] = num / den;
    }
    mk_cluster_arrive();   // done reading the peers; the wait comes before this CTA next writes its region
    signal_ctr(p.ctr + ins[MK_F_AUX]);
    return true;
}
#endif

// One (kv head, split) partial over positions [p0, p1) of pos + 1. Only the first S_eff = attn_splits(n) splits
// have positions; split S_eff - 1 (the one holding position pos) appends this step's K/V. The last split to
// finish (ticket) combines the partials into attn[] and bumps ATTN_DONE.
//
// The whole CTA works on one chunk of staged positions at a time (chunk 0 was copied before the wait), in two
// phases (mk_attn_loop.cuh): scores, one thread per (q head, position); then one warp per q head turns its scores
// into softmax weights and sums the weighted V rows (no block barrier between the two).
// Returns true when a cluster barrier wait is pending (MK_CLUSTER: attn_cluster_combine).
template <int HD>
MK_DEV bool op_attn(const MkParams& p, const int* ins, int ii, int step, int pos, float* sm, int* sflag) {
    constexpr int HALF = HD / 2;
    const int layer = ins[MK_F_LAYER], head = ins[MK_F_A0], split = ins[MK_F_A1];
    const int g = p.group, S = p.n_splits;
    const int n = pos + 1;
    const int S_eff = attn_splits(p, n);
    int p0, p1;
    attn_span(p, split, n, p0, p1);
    const int cap = p.kv_stage_pos;               // staged positions per chunk (>= 1)
    mk_bf16* stk = (mk_bf16*)(sm + p.sm_kv);                 // [cap][HD + MK_KPAD] bf16
    mk_bf16* stv = stk + (size_t)cap * (HD + MK_KPAD);       // [cap][HD] bf16
    float* sc = sm + p.sm_kv + (size_t)cap * (HD + MK_KPAD / 2);   // [MAX_GROUP][cap] scores, then weights
    const size_t row0 = ((size_t)layer * p.n_kv + head) * (size_t)p.max_len;
    mk_bf16* kc = p.k_cache + row0 * HD;
    mk_bf16* vc = p.v_cache + row0 * HD;
    mk_bf16* qh = (mk_bf16*)sm;                   // rotated, scaled q as hi / lo rows (attn_q_store)
    if (split < S_eff) {   // CTA-uniform: the barriers inside are safe
        for (int e = threadIdx.x; e < g * HD; e += NT) {
            const int j = e / HD, i = e - j * HD;
            const float* q = p.qkv + (size_t)(head * g + j) * HD;
            const float a = mk_ld_cg(q + i), b = mk_ld_cg(q + (i < HALF ? i + HALF : i - HALF));
            float s, c;
            sincosf((float)pos * p.inv_freq[i % HALF], &s, &c);
            attn_q_store<HD>(qh, j, i, (i < HALF ? a * c - b * s : a * c + b * s) * p.attn_scale);
        }
        if (split == S_eff - 1) {
            const float* k = p.qkv + p.q_dim + head * HD;
            const float* v = p.qkv + p.q_dim + p.kv_dim + head * HD;
            for (int i = threadIdx.x; i < HD; i += NT) {
                const float a = mk_ld_cg(k + i), b = mk_ld_cg(k + (i < HALF ? i + HALF : i - HALF));
                float s, c;
                sincosf((float)pos * p.inv_freq[i % HALF], &s, &c);
                const mk_bf16 kb = mk_f2bf(i < HALF ? a * c - b * s : a * c + b * s), vb = mk_f2bf(mk_ld_cg(v + i));
                kc[(size_t)pos * HD + i] = kb;
                vc[(size_t)pos * HD + i] = vb;
                if (pos - p0 < cap) {   // this step's row joins the staged chunk 0
                    stk[(size_t)(pos - p0) * (HD + MK_KPAD) + i] = kb;
                    stv[(size_t)(pos - p0) * HD + i] = vb;
                }
            }
        }
        mk_cp_async_wait_all();   // this thread's staged K/V rows; the barrier publishes everyone's
        __syncthreads();
        trace(p, step, ii, 4);   // rotated q (and this step's K/V) ready
        // Warp j < g owns q head j and its partial record (max, denominator, HD weighted sums), which also holds
        // the running state between chunks (attn_head_values).
        const int warp = threadIdx.x >> 5;
#if MK_CLUSTER   // the partial stays in this CTA's partial-sum region, which its cluster peers read
        float* part = sm + p.sm_red;
#else
        float* part = p.part + (size_t)(head * S + split) * g * (HD + 2);
#endif
        for (int c0 = p0; c0 < p1; c0 += cap) {
            const int C = min(cap, p1 - c0);
            if (c0 > p0) {   // a later chunk: after every reader of the previous one, copy it in
                __syncthreads();
                attn_stage<HD>(kc + (size_t)c0 * HD, vc + (size_t)c0 * HD, stk, stv, C);
                mk_cp_async_wait_all();
                __syncthreads();
            }
            attn_scores_mma<HD>(qh, stk, sc, g, C, cap);
            __syncthreads();
            if (warp < g) attn_head_values<HD>(sc, stv, C, cap, part + warp * (HD + 2), c0 == p0);
        }
        trace(p, step, ii, 5);   // every position done
        __syncthreads();
    }   // split < S_eff
#if MK_CLUSTER   // the head's splits are ranks 0 .. S - 1 of one cluster (schedule.build(cluster=S))
    return attn_cluster_combine<HD>(p, ins, ii, step, head, split, S_eff, sm);
#endif
    if (threadIdx.x == 0) {   // acq_rel: publishes this partial, and the last taker sees every other one
        const unsigned old = mk_atom_acq_rel(p.ctr + ins[MK_F_SIG_CTR], 1u);
        *sflag = old == (unsigned)((step + 1) * S - 1);
    }
    trace(p, step, ii, 3);   // partial done; the last finisher's combine follows
    __syncthreads();
    if (*sflag) {
        // Combine the S_eff partials of this head's g query heads. The partials (contiguous, per split g x (HD + 2)
        // floats) are copied into the staging region with all threads' loads in flight at once (one L2 round trip
        // per batch of splits that fits), then each thread merges its output elements (at most 2: g * HD <= 2 * NT)
        // over the splits in order with the online-softmax rule.
        constexpr int LB = 16;   // float2 loads in flight per thread
        const int per = g * (HD + 2);
        const int SB = max(1, min(S_eff, p.stage_floats / per));
        const float* pbase = p.part + (size_t)head * S * per;
        float* sp = sm + p.sm_kv;
        float M[2] = {-INFINITY, -INFINITY}, den[2] = {0.f, 0.f}, num[2] = {0.f, 0.f};
        for (int s0 = 0; s0 < S_eff; s0 += SB) {
            const int nb = min(SB, S_eff - s0);
            const int n2 = nb * per / 2;   // per is even
            const float2* src = (const float2*)(pbase + (size_t)s0 * per);
            for (int k0 = threadIdx.x; k0 < n2; k0 += NT * LB) {
                float2 r[LB];
#pragma unroll
                for (int u = 0; u < LB; ++u) {
                    const int k = k0 + u * NT;
                    r[u] = k < n2 ? mk_ld_cg2(src + k) : make_float2(0.f, 0.f);
                }
#pragma unroll
                for (int u = 0; u < LB; ++u) {
                    const int k = k0 + u * NT;
                    if (k < n2) ((float2*)sp)[k] = r[u];
                }
            }
            __syncthreads();
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const int e = threadIdx.x + t * NT;
                if (e < g * HD) {
                    const int j = e / HD, i = e - j * HD;
                    for (int sb = 0; sb < nb; ++sb) {
                        const float* q = sp + sb * per + j * (HD + 2);
                        const float ms = q[0];
                        if (ms == -INFINITY) continue;
                        const float mn = fmaxf(M[t], ms);
                        const float c_old = expf(M[t] - mn), c_new = expf(ms - mn);
                        den[t] = den[t] * c_old + q[1] * c_new;
                        num[t] = num[t] * c_old + q[2 + i] * c_new;
                        M[t] = mn;
                    }
                }
            }
            __syncthreads();
        }
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            const int e = threadIdx.x + t * NT;
            if (e < g * HD) p.attn[(size_t)head * g * HD + e] = num[t] / den[t];
        }
        signal_ctr(p.ctr + ins[MK_F_AUX]);
    }
    __syncthreads();
    return false;
}
