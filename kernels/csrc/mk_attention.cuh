// Attention partial over a position split, K/V append, last-finisher combine.
// Included by monokernel.cu only (one translation unit); relies on its includes and defines.
#pragma once
#include "mk_attn_loop.cuh"

// ---------------------------------------------------------------- attention
// Attention position splits in use at context length n (the rest only publish an empty partial): fewer, longer
// splits at short contexts keep the combine cheap (bench/NOTES.md, v3 sweep), and at long contexts no more than
// one staged chunk per split needs (session 13). schedule.attn_splits_in_use is the host's copy.
MK_DEV int attn_splits(const MkParams& p, int n) {
    int s = min(p.n_splits, (n + p.attn_min_pos - 1) / p.attn_min_pos);
    if (p.attn_min_splits > 0) s = min(s, max(p.attn_min_splits, (n + p.kv_stage_pos - 1) / p.kv_stage_pos));
    return max(1, s);
}

// The splits' bounds at one step (context length n = pos + 1): s_eff = attn_splits(n) splits have positions, split
// s < s_eff takes positions [p0[s], p0[s + 1]) and (the plain launch's merge) outputs [e0[s], e0[s + 1]) of the
// head's g x HD; p0[s_eff] = n, e0[s_eff] = g x HD. Filled once per step at its start (attn_step_fill; the step's
// first wait syncs it), read by every ATTN instruction of the step: computing them per instruction after its wait
// took ~0.45 us of each layer's chain (integer divisions, ncu source counters: bench/NOTES.md, session 24).
// rc / rs: RoPE's cos and sin of the step's position (n - 1) per frequency, for every layer's q and K rotation
// (rope_rotate), computed before the step's first wait instead of by each attention on the chain: the same sincosf
// of the same arguments (the same bits), the q stage -0.06..-0.15 us per layer (bench/NOTES.md, session 29).
struct AttnStep {
    int s_eff;
    int p0[MK_MAX_SPLITS + 1];
    int e0[MK_MAX_SPLITS + 1];
    float rc[MK_HEAD_DIM / 2];
    float rs[MK_HEAD_DIM / 2];
};

MK_DEV void attn_step_fill(const MkParams& p, int n, AttnStep& a) {
    const int S = attn_splits(p, n), E = p.group * MK_HEAD_DIM;
    for (int s = threadIdx.x; s <= S; s += NT) {
        a.p0[s] = (int)((long long)s * n / S);
        a.e0[s] = (int)((long long)s * E / S);
    }
    for (int i = threadIdx.x; i < MK_HEAD_DIM / 2; i += NT) sincosf((float)(n - 1) * p.inv_freq[i], &a.rs[i], &a.rc[i]);
    if (threadIdx.x == 0) a.s_eff = S;
}

// Positions [p0, p1) of a split at this step (p0 == p1: an idle split).
MK_DEV void attn_span(const AttnStep& a, int split, int& p0, int& p1) {
    const bool busy = split < a.s_eff;
    p0 = busy ? a.p0[split] : 0;
    p1 = busy ? a.p0[split + 1] : 0;
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

// The K / V restaging overlap (bench/experiments/107-mk-kv-restage-overlap.patch, session 32; bench/NOTES.md).
#if MK_KV_OVERLAP
// `rows` cached rows of one of K (stride HD + MK_KPAD: the staged K layout) or V (stride HD) into the staging, by
// threads t0 .. NT - 1 (cp.async; the caller commits, waits + syncs).
template <int HD>
MK_DEV void attn_stage_rows(const mk_bf16* g, mk_bf16* s, int rows, int stride, int t0) {
    constexpr int CPR = HD * 2 / 16;   // 16-byte chunks per row
    for (int c = threadIdx.x - t0; c < rows * CPR; c += NT - t0) {
        const int r = c / CPR;
        mk_cp_async16(s + (size_t)r * stride + (c - r * CPR) * 8, g + c * 8);
    }
}
#endif

// Before the instruction's wait: start copying the cached K and V rows this split will read (positions written
// before this step, at most kv_stage_pos of them) into shared memory. They do not depend on this step's data,
// so, like a matvec's early weight loads, their latency hides behind the wait instead of lengthening the chain.
template <int HD>
MK_DEV void attn_prefetch(const MkParams& p, const int* ins, int pos, float* sm, const AttnStep& as) {
    int p0, p1;
    attn_span(as, ins[MK_F_A1], p0, p1);
    const int rows = min(min(p1, pos) - p0, p.kv_stage_pos);
    if (rows <= 0) return;
    const size_t row0 = ((size_t)ins[MK_F_LAYER] * p.n_kv + ins[MK_F_A0]) * (size_t)p.max_len + p0;
    mk_bf16* sk = (mk_bf16*)(sm + p.sm_kv);
    attn_stage<HD>(p.k_cache + row0 * HD, p.v_cache + row0 * HD, sk, sk + (size_t)p.kv_stage_pos * (HD + MK_KPAD),
                   rows);
}

#if MK_CLUSTER
// attn_prefetch of an ATTNQ instruction (its kv head and split are in sig_ctr: isa.OPS).
template <int HD>
MK_DEV void attnq_prefetch(const MkParams& p, const int* ins, int pos, float* sm, const AttnStep& as) {
    const int sig = ins[MK_F_SIG_CTR];
    int p0, p1;
    attn_span(as, sig >> 24, p0, p1);
    const int rows = min(min(p1, pos) - p0, p.kv_stage_pos);
    if (rows <= 0) return;
    const size_t row0 = ((size_t)ins[MK_F_LAYER] * p.n_kv + ((sig >> 16) & 255)) * (size_t)p.max_len + p0;
    mk_bf16* sk = (mk_bf16*)(sm + p.sm_kv);
    attn_stage<HD>(p.k_cache + row0 * HD, p.v_cache + row0 * HD, sk, sk + (size_t)p.kv_stage_pos * (HD + MK_KPAD),
                   rows);
}
#endif

// W consecutive lanes (W a power of two <= 32, groups aligned in the warp) each hold an online-softmax state over
// their splits (max M, denominator den, weighted sum num; M = -inf: none): butterflies over the group leave every
// lane with the group's den and num at the group's max.
MK_DEV void attn_lanes_combine(float M, float& den, float& num, int W) {
    float Mx = M;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1)
        if (d < W) Mx = fmaxf(Mx, mk_shfl_xor(Mx, d));
    const float f = M == -INFINITY ? 0.f : expf(M - Mx);
    den *= f;
    num *= f;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1)
        if (d < W) {
            den += mk_shfl_xor(den, d);
            num += mk_shfl_xor(num, d);
        }
}

#if MK_CLUSTER
// This CTA's side of the cluster combine (kernel static shared memory): recv holds, for each split s of the round,
// the EL = g HD / NR o values of the elements this rank owns (recv[s EL ..]) and then every q head's max and
// denominator (recv[NR_MAX EL_MAX + s 2 MAX_GROUP ..]); bar is the mbarrier the peers' pushes count off; phase counts
// the rounds this CTA has owned (the parity its next wait needs).
// ATTNQ (schedule qkv_parts): qkv receives the part's q / k / v rows from every rank (rank r's share at r x its
// row count), counted off qbar; qphase counts those rounds. A paired MLP (mk_mlp.cuh mlp_down_pair): h receives the
// partner rank's h rows, counted off hbar; hphase counts those rounds.
struct ClusterRecv {
    float* recv;
    unsigned long long* bar;
    unsigned phase;
    float* qkv;
    unsigned long long* qbar;
    unsigned qphase;
    float* h;
    unsigned long long* hbar;
    unsigned hphase;
};
#define MK_RECV_O_FLOATS (MK_MAX_GROUP * MK_HEAD_DIM)          // NR x EL = g x HD
#define MK_RECV_FLOATS (MK_RECV_O_FLOATS + 16 * 2 * MK_MAX_GROUP)   // + up to 16 splits' (max, denominator) pairs
#define MK_QKV_RECV_FLOATS ((MK_MAX_GROUP + 2) * MK_HEAD_DIM)          // an ATTNQ part's rows, at most

// Thread 0 waits for the round's phase of bar (parity) with the watchdog of wait_ctr (a timeout reports counter
// -2); false in every thread when the launch is aborted. Ends synced.
MK_DEV bool wait_pushes(const MkParams& p, unsigned long long* bar, unsigned parity, int step, int* sflag) {
    if (threadIdx.x == 0) {
        int ok = 1;
        if (!mk_mbar_try_wait(bar, parity)) {
            const long long t0 = clock64();
            unsigned it = 0;
            while (!mk_mbar_try_wait(bar, parity)) {
                if ((++it & 255u) == 0) {
                    if (*(volatile int*)(p.status + MK_STATUS_ABORT)) { ok = 0; break; }
                    if ((unsigned long long)(clock64() - t0) > p.watchdog_cycles) {
                        ok = 0;
                        if (atomicExch(p.status + MK_STATUS_ABORT, 1) == 0) {
                            volatile int* hs = p.host_stat;
                            hs[MK_HOST_WD_BLOCK] = blockIdx.x + p.cta0;
                            hs[MK_HOST_WD_CTR] = -2;
                            hs[MK_HOST_WD_TARGET] = (int)parity;
                            hs[MK_HOST_WD_VALUE] = 0;
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
    }
    __syncthreads();
    const bool ok = sflag[2] != 0;
    __syncthreads();
    return ok;
}

// Cluster attention (schedule.build(cluster=NR)): a kv head's NR splits are ranks 0 .. NR - 1 of one cluster. Rank r
// owns the head's outputs [r EL, (r + 1) EL). A split with positions pushes its partial (kept in its partial-sum
// region by the position loop) to the owners: each output's o value to the element's owner, every q head's max
// and denominator to every owner, 8 bytes per st.async, counted off the owner's mbarrier. Each rank arms its
// mbarrier with the bytes of the S_eff splits, waits for them, merges its slice from its own shared memory (NR
// consecutive lanes per output, one per split, combined with shuffles: the same values and order as the pull over
// DSMEM it replaces, so the same bits) and bumps ATTN_DONE. No cluster barrier: a push for a later round of this
// cluster comes from an ATTN several layers on, after this CTA's ATTN_DONE through the counters. Returns 0, or -1
// when the launch was aborted during the wait. g: the q heads of the partial (ATTN: the group; ATTNQ: its part's),
// dst: where their g x HD outputs go in attn[].
template <int HD>
MK_DEV int attn_cluster_combine(const MkParams& p, const int* ins, int ii, int step, int g, float* dst_o, int rank,
                                 int S_eff, float* sm, ClusterRecv& cr, int* sflag) {
    // NR is a power of two (schedule.build): its divisions are shifts; the others divmod_small (not integer
    // divisions: this runs between the position loop and the pushes, on the layer's chain).
    const int lnr = __ffs(p.attn_cluster) - 1;
    const int NR = 1 << lnr, E = g * HD, EL = E >> lnr, e0 = rank * EL;
    float* rml = cr.recv + MK_RECV_O_FLOATS;
    if (rank < S_eff) {   // CTA-uniform; the caller synced after the position loop
        const float* part = sm + p.sm_red;
        for (int t = threadIdx.x; t < E / 2 + NR * g; t += NT) {
            int r;
            float* dst;
            const float* src;
            if (t < E / 2) {   // o values 2t, 2t + 1: one owner, one q head (EL and HD even)
                const int e = 2 * t, j = e / HD;
                int er;
                r = divmod_small(e, EL, er);
                dst = cr.recv + rank * EL + er;
                src = part + j * (HD + 2) + 2 + (e - j * HD);
            } else {           // (max, denominator) of q head j to owner r
                int j;
                r = divmod_small(t - E / 2, g, j);
                dst = rml + rank * 2 * MK_MAX_GROUP + 2 * j;
                src = part + j * (HD + 2);
            }
            mk_st_async2(mk_cluster_addr(dst, r), src[0], src[1], mk_cluster_addr(cr.bar, r));
        }
    }
    if (threadIdx.x == 0) mk_mbar_expect(cr.bar, (unsigned)S_eff * (4u * EL + 8u * g));
    if (!wait_pushes(p, cr.bar, cr.phase & 1u, step, sflag)) return -1;
    ++cr.phase;
    trace(p, step, ii, 3);
    for (int t = threadIdx.x; t < E; t += NT) {   // EL elements x NR splits; warp-uniform (E % 32 == 0)
        const int s = t & (NR - 1), el = t >> lnr, e = e0 + el, j = e / HD;
        float m = -INFINITY, l = 0.f, o = 0.f;
        if (s < S_eff) {
            m = rml[s * 2 * MK_MAX_GROUP + 2 * j];
            l = rml[s * 2 * MK_MAX_GROUP + 2 * j + 1];
            o = cr.recv[s * EL + el];
        }
        float den = l, num = o;
        attn_lanes_combine(m, den, num, NR);
        if (s == 0) dst_o[e] = num / den;
    }
    signal_ctr(p, p.ctr + (ins[MK_F_AUX] & ((1 << MK_AUX_KV_SHIFT) - 1)));   // ATTNQ: k / v producers above
    return 0;
}
#endif

// Split `split` of S_eff merges its slice [e0, e1) of the head's g x HD outputs from the S_eff partials (written
// by the head's splits, published on its counter) with the online-softmax rule. W lanes per element (a power of two,
// as many as the slice leaves threads for, at most the splits' next power of two): lane s takes splits s, s + W, ...
// in order, MB of them with their loads in flight at once, so at the usual split counts the merge costs one L2 round
// trip; then a butterfly over the W lanes combines them.
template <int HD>
MK_DEV void attn_merge_slice(const MkParams& p, int head, int split, const AttnStep& as) {
    constexpr int MB = 2;
    const int S_eff = as.s_eff, g = p.group, E = g * HD, per = g * (HD + 2);
    const int e0 = as.e0[split], e1 = as.e0[split + 1];
    int W = 1;
    while (W < S_eff && W < 32 && 2 * W * (e1 - e0) <= NT) W <<= 1;
    const int lw = 31 - __clz(W);   // log2 W
    const float* base = p.part + (size_t)head * p.n_splits * per;
    const int n = (e1 - e0) << lw;   // (element, lane) pairs; the loop runs whole warps for the butterfly
    for (int t = threadIdx.x; t < ((n + 31) & ~31); t += NT) {
        const int ln = t & (W - 1), e = e0 + (t >> lw), j = e / HD, i = e - j * HD;
        const bool live = t < n;
        float M = -INFINITY, den = 0.f, num = 0.f;
        for (int s0 = ln; s0 < S_eff; s0 += MB * W) {   // batches of MB splits: 3 MB loads in flight
            float ms[MB], ls[MB], os[MB];
#pragma unroll
            for (int u = 0; u < MB; ++u) {
                const int s = s0 + u * W;
                const float* q = base + (size_t)s * per + j * (HD + 2);
                const bool in = live && s < S_eff;
                ms[u] = in ? mk_ld_cg(q) : -INFINITY;
                ls[u] = in ? mk_ld_cg(q + 1) : 0.f;
                os[u] = in ? mk_ld_cg(q + 2 + i) : 0.f;
            }
#pragma unroll
            for (int u = 0; u < MB; ++u) {
                if (ms[u] == -INFINITY) continue;
                const float mn = fmaxf(M, ms[u]);
                const float c_old = expf(M - mn), c_new = expf(ms[u] - mn);
                den = den * c_old + ls[u] * c_new;
                num = num * c_old + os[u] * c_new;
                M = mn;
            }
        }
        attn_lanes_combine(M, den, num, W);
        if (live && ln == 0) p.attn[(size_t)head * E + e] = num / den;
    }
}

// RoPE of element i of a head at the step's position (rotate-half pairing): a = x[i], b = x[i + HD / 2] for
// i < HD / 2, else x[i - HD / 2]; cos / sin from the step's table (attn_step_fill).
template <int HD>
MK_DEV float rope_rotate(const AttnStep& as, float a, float b, int i) {
    constexpr int HALF = HD / 2;
    const float c = as.rc[i % HALF], s = as.rs[i % HALF];
    return i < HALF ? a * c - b * s : a * c + b * s;
}

// The split's rotated, scaled q heads (attn_q_store) and, in the split holding position pos (append), this step's
// K / V row rotated into the cache and into staged chunk 0: one flat list of (g + append) x HD elements over the
// threads, so the append's loads go out with the q loads (threads without a q element take it).
template <int HD>
MK_DEV void attn_q_and_append(const MkParams& p, const AttnStep& as, int head, int pos, int p0, int cap, mk_bf16* qh,
                              mk_bf16* kc, mk_bf16* vc, mk_bf16* stk, mk_bf16* stv, bool append) {
    constexpr int HALF = HD / 2;
    const int nq = p.group * HD, nt = nq + (append ? HD : 0);
    for (int t = threadIdx.x; t < nt; t += NT) {
        const bool isq = t < nq;
        const int i = isq ? t % HD : t - nq;
        const float* src = isq ? p.qkv + (size_t)head * nq + t - i : p.qkv + p.q_dim + head * HD;
        const float a = mk_ld_cg(src + i), b = mk_ld_cg(src + (i < HALF ? i + HALF : i - HALF));
        const float v = isq ? 0.f : mk_ld_cg(p.qkv + p.q_dim + p.kv_dim + head * HD + i);
        const float r = rope_rotate<HD>(as, a, b, i);
        if (isq) {
            attn_q_store<HD>(qh, t / HD, i, r * p.attn_scale);
            continue;
        }
        const mk_bf16 kb = mk_f2bf(r), vb = mk_f2bf(v);
        kc[(size_t)pos * HD + i] = kb;
        vc[(size_t)pos * HD + i] = vb;
        if (pos - p0 < cap) {   // this step's row joins the staged chunk 0
            stk[(size_t)(pos - p0) * (HD + MK_KPAD) + i] = kb;
            stv[(size_t)(pos - p0) * HD + i] = vb;
        }
    }
}

// The position loop of a split with positions [p0, p1), g q heads in the q tile, chunk 0 staged (its cp.async still
// in flight): chunk by chunk into the partial records part[j (HD + 2) ..] of q heads j < g. Ends synced.
// qh: the q tile; stk / stv: the staging (cap positions); sc: the scores.
template <int HD>
MK_DEV void attn_chunks(const MkParams& p, int step, int ii, int g, int p0, int p1, int cap, const mk_bf16* qh,
                        mk_bf16* stk, mk_bf16* stv, float* sc, const mk_bf16* kc, const mk_bf16* vc, float* part) {
    mk_cp_async_wait_all();   // this thread's staged K/V rows; the barrier publishes everyone's
    __syncthreads();
    trace(p, step, ii, 4);   // rotated q (and this step's K/V) ready
    // Warp j < g owns q head j and its partial record (max, denominator, HD weighted sums), which also holds
    // the running state between chunks (attn_head_values).
    const int warp = threadIdx.x >> 5;
#if MK_KV_OVERLAP
    // A later chunk's K rows are copied in while the chunk before it runs its values phase (the warps >= g issue
    // them once the scores no longer need the K buffer), its V rows while its own scores run (issued once the
    // previous values no longer need the V buffer): the copies' latency overlaps the loop instead of adding to it.
    for (int c0 = p0; c0 < p1; c0 += cap) {
        const int C = min(cap, p1 - c0), n1 = min(cap, p1 - c0 - cap);   // n1 > 0: a next chunk
        if (c0 > p0) {   // this chunk's K (its V may still be in flight)
            mk_cp_async_wait_but_newest();
            __syncthreads();
        }
        attn_scores_mma<HD>(qh, stk, sc, g, C, cap);
        if (c0 > p0) mk_cp_async_wait_all();   // this chunk's V
        __syncthreads();
        if (n1 > 0 && warp >= g) attn_stage_rows<HD>(kc + (size_t)(c0 + cap) * HD, stk, n1, HD + MK_KPAD, g * 32);
        mk_cp_async_commit();
        if (warp < g) attn_head_values<HD>(sc, stv, C, cap, part + warp * (HD + 2), c0 == p0);
        if (n1 > 0) {
            __syncthreads();
            attn_stage_rows<HD>(vc + (size_t)(c0 + cap) * HD, stv, n1, HD, 0);
            mk_cp_async_commit();
        }
    }
#else
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
#endif
    trace(p, step, ii, 5);   // every position done
    __syncthreads();
}

// One (kv head, split) partial over positions [p0, p1) of pos + 1. Only the first S_eff = attn_splits(n) splits
// have positions; split S_eff - 1 (the one holding position pos) appends this step's K/V. Once every split of the
// head has published its partial, each split with positions merges its slice of attn[] (attn_merge_slice, or
// attn_cluster_combine over DSMEM in a cluster launch) and every split bumps ATTN_DONE.
//
// The whole CTA works on one chunk of staged positions at a time (chunk 0 was copied before the wait), in two
// phases (mk_attn_loop.cuh): scores, one thread per (q head, position); then one warp per q head turns its scores
// into softmax weights and sums the weighted V rows (no block barrier between the two).
// Returns -1 when the launch was aborted during the wait for the head's partials, else 0. cr: the cluster build's
// receive region (attn_cluster_combine).
template <int HD>
#if MK_CLUSTER
MK_DEV int op_attn(const MkParams& p, const int* ins, int ii, int step, int pos, float* sm, int* sflag,
                   const AttnStep& as, ClusterRecv& cr) {
#else
MK_DEV int op_attn(const MkParams& p, const int* ins, int ii, int step, int pos, float* sm, int* sflag,
                   const AttnStep& as) {
#endif
    const int layer = ins[MK_F_LAYER], head = ins[MK_F_A0], split = ins[MK_F_A1];
    const int g = p.group, S = p.n_splits;
    const int S_eff = as.s_eff;
    int p0, p1;
    attn_span(as, split, p0, p1);
    const int cap = p.kv_stage_pos;               // staged positions per chunk (>= 1)
    mk_bf16* stk = (mk_bf16*)(sm + p.sm_kv);                 // [cap][HD + MK_KPAD] bf16
    mk_bf16* stv = stk + (size_t)cap * (HD + MK_KPAD);       // [cap][HD] bf16
    float* sc = sm + p.sm_kv + (size_t)cap * (HD + MK_KPAD / 2);   // [MAX_GROUP][cap] scores, then weights
    const size_t row0 = ((size_t)layer * p.n_kv + head) * (size_t)p.max_len;
    mk_bf16* kc = p.k_cache + row0 * HD;
    mk_bf16* vc = p.v_cache + row0 * HD;
    mk_bf16* qh = (mk_bf16*)sm;                   // rotated, scaled q as hi / lo rows (attn_q_store)
    if (split < S_eff) {   // CTA-uniform: the barriers inside are safe
        attn_q_and_append<HD>(p, as, head, pos, p0, cap, qh, kc, vc, stk, stv, split == S_eff - 1);
#if MK_CLUSTER   // the partial stays in this CTA's partial-sum region, which it pushes to its cluster peers
        float* part = sm + p.sm_red;
#else
        float* part = p.part + (size_t)(head * S + split) * g * (HD + 2);
#endif
        attn_chunks<HD>(p, step, ii, g, p0, p1, cap, qh, stk, stv, sc, kc, vc, part);
    }   // split < S_eff
#if MK_CLUSTER   // the head's splits are ranks 0 .. S - 1 of one cluster (schedule.build(cluster=S))
    return attn_cluster_combine<HD>(p, ins, ii, step, g, p.attn + (size_t)head * g * HD, split, S_eff, sm, cr,
                                    sflag);
#endif
    // Every split (idle ones too: S per step) publishes its partial on the head's counter. Once all have, each
    // split with positions merges its own 1 / S_eff of the head's g x HD outputs from the S_eff partials and
    // bumps ATTN_DONE; idle splits bump it at once (OPROJ waits for all n_kv x S).
    signal_ctr(p, p.ctr + ins[MK_F_SIG_CTR]);
    trace(p, step, ii, 3);   // partial published; the merge of this split's slice follows
    if (split < S_eff) {
        if (!wait_ctr(p, p.ctr + ins[MK_F_SIG_CTR], (unsigned)((step + 1) * S), step, sflag)) return -1;
        attn_merge_slice<HD>(p, head, split, as);
    }
    signal_ctr(p, p.ctr + ins[MK_F_AUX]);
    return 0;
}

#if MK_CLUSTER
// ATTNQ's q heads and this step's K / V row, from the part's rows in shared memory (qkv: gq q heads, then k, then v):
// the rotated, scaled q tile as attn_q_and_append's; with `row` (the split holding pos) the rotated K and the V row
// into the cache and into staged chunk 0. Every part's split holding pos writes the row to the cache (the same bits):
// where pos lies past chunk 0, attn_chunks stages it from the cache, and only a CTA's own write is ordered before
// that read (part 0's alone was not: bench/NOTES.md, session 32). kg: with kv_apart the step's k row in the global
// qkv[] (its v row kv_dim after it), written by other CTAs (read past L1), else null. Caller syncs.
template <int HD>
MK_DEV void attnq_q_and_row(const MkParams& p, const AttnStep& as, const float* qkv, const float* kg, int gq, int pos,
                            int p0, int cap, mk_bf16* qh, mk_bf16* kc, mk_bf16* vc, mk_bf16* stk, mk_bf16* stv,
                            bool row) {
    constexpr int HALF = HD / 2;
    const int nq = gq * HD, nt = nq + (row ? HD : 0);
    for (int t = threadIdx.x; t < nt; t += NT) {
        const bool isq = t < nq;
        const int i = isq ? t % HD : t - nq, ib = i < HALF ? i + HALF : i - HALF;
        float a, b, v = 0.f;
        if (isq || !kg) {
            const float* src = qkv + (isq ? t - i : nq);
            a = src[i];
            b = src[ib];
            if (!isq) v = qkv[nq + HD + i];
        } else {
            a = mk_ld_cg(kg + i);
            b = mk_ld_cg(kg + ib);
            v = mk_ld_cg(kg + p.kv_dim + i);
        }
        const float r = rope_rotate<HD>(as, a, b, i);
        if (isq) {
            attn_q_store<HD>(qh, t / HD, i, r * p.attn_scale);
            continue;
        }
        const mk_bf16 kb = mk_f2bf(r), vb = mk_f2bf(v);
        if (row) {
            kc[(size_t)pos * HD + i] = kb;
            vc[(size_t)pos * HD + i] = vb;
        }
        if (pos - p0 < cap) {
            stk[(size_t)(pos - p0) * (HD + MK_KPAD) + i] = kb;
            stv[(size_t)(pos - p0) * HD + i] = vb;
        }
    }
}

// ATTNQ (isa.OPS, schedule qkv_parts), after the shared matvec: out[0 .. R) are this rank's rows of the part (RMS
// factor rs still to apply; bias rows through m), rank = split. Pushes them (with bias) to every rank's qkv region,
// waits for every rank's, then runs the part's gq q heads as ATTN runs its group: q and the step's K / V row from
// shared memory (the split holding pos appends it), the position loop, the cluster combine into attn[] (which
// bumps ATTN_DONE). With kv_apart (schedule.build; aux's upper bits) the part's rows are its q heads' only and the
// split holding pos first waits for the layer's QKV counter, then takes the K / V row from qkv[] (adding that row
// after the split's cached positions instead, a pass of its own, was slower: bench/NOTES.md, session 29).
// Returns op_attn's.
template <int HD>
MK_DEV int op_attnq(const MkParams& p, const int* ins, int ii, int step, int pos, float* sm, int* sflag,
                    const AttnStep& as, ClusterRecv& cr, const float* out, float rs, const RowMap& m, int R,
                    const float* bias) {
    const int layer = ins[MK_F_LAYER], sig = ins[MK_F_SIG_CTR];
    const int j0 = sig & 255, gq = (sig >> 8) & 255, head = (sig >> 16) & 255, split = sig >> 24;
    const int lnr = __ffs(p.attn_cluster) - 1, NR = 1 << lnr;
    for (int t = threadIdx.x; t < (R << lnr); t += NT) {   // row r of this rank to rank q
        const int q = t & (NR - 1), r = t >> lnr;
        const float v = out[r] * rs + (bias ? bias[m.row0 + r] : 0.f);
        mk_st_async1(mk_cluster_addr(cr.qkv + split * R + r, q), v, mk_cluster_addr(cr.qbar, q));
    }
    if (threadIdx.x == 0) mk_mbar_expect(cr.qbar, (unsigned)(R << lnr) * 4u);
    if (!wait_pushes(p, cr.qbar, cr.qphase & 1u, step, sflag)) return -1;
    ++cr.qphase;
    const int S_eff = as.s_eff;
    int p0, p1;
    attn_span(as, split, p0, p1);
    const int cap = p.kv_stage_pos;
    mk_bf16* stk = (mk_bf16*)(sm + p.sm_kv);
    mk_bf16* stv = stk + (size_t)cap * (HD + MK_KPAD);
    float* sc = sm + p.sm_kv + (size_t)cap * (HD + MK_KPAD / 2);
    const size_t row0 = ((size_t)layer * p.n_kv + head) * (size_t)p.max_len;
    mk_bf16* kc = p.k_cache + row0 * HD;
    mk_bf16* vc = p.v_cache + row0 * HD;
    mk_bf16* qh = (mk_bf16*)sm;
    const int kvn = ins[MK_F_AUX] >> MK_AUX_KV_SHIFT;   // kv_apart: the k / v rows' producers per step, else 0
    if (split < S_eff) {   // CTA-uniform
        const bool row = split == S_eff - 1;
        if (kvn > 0 && row &&   // the step's K / V row from the QKV instructions outside the part
            !wait_ctr(p, p.ctr + layer * MK_CTR_PER_LAYER + MK_CTR_QKV, (unsigned)((step + 1) * kvn), step, sflag))
            return -1;
        const float* kg = kvn > 0 ? p.qkv + p.q_dim + head * HD : nullptr;
        attnq_q_and_row<HD>(p, as, cr.qkv, kg, gq, pos, p0, cap, qh, kc, vc, stk, stv, row);
        attn_chunks<HD>(p, step, ii, gq, p0, p1, cap, qh, stk, stv, sc, kc, vc, sm + p.sm_red);
    }
    return attn_cluster_combine<HD>(p, ins, ii, step, gq, p.attn + (size_t)(head * p.group + j0) * HD, split, S_eff,
                                    sm, cr, sflag);
}
#endif
