// LM-head sampling records, the counter-based RNG, the sampler instruction.
// Included by monokernel.cu only (one translation unit); relies on its includes and defines.
#pragma once

// ---------------------------------------------------------------- RNG (kernels/sampling_rng.py is the twin)
MK_DEV float mk_gumbel(unsigned long long seed, int step, int id) {
    unsigned long long key = ((unsigned long long)(unsigned)step << 32) | (unsigned long long)(unsigned)id;
    unsigned long long z = seed + key * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z = z ^ (z >> 31);
    const float u = (float)(((double)(z >> 40) + 0.5) * (1.0 / 16777216.0));
    return -logf(-logf(u));
}

// ---------------------------------------------------------------- LM head record
MK_DEV void lm_record(const MkParams& p, const float* out, int R, int row0, int step, float* rec, float* scr) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int r = threadIdx.x; r < R; r += NT)
        if (better(out[r], row0 + r, bv, bi)) { bv = out[r]; bi = row0 + r; }
    block_argmax(bv, bi, scr);
    if (threadIdx.x == 0) { rec[0] = bv; ((int*)rec)[1] = bi; }
    if (p.temperature > 0.f) {
        const float T = p.temperature, mT = bv / T;
        float s = 0.f;
        for (int r = threadIdx.x; r < R; r += NT) s += expf(out[r] / T - mT);
        s = block_sum(s, scr);
        float gv = -INFINITY;
        int gi = 0x7fffffff;
        for (int r = threadIdx.x; r < R; r += NT) {
            const float v = out[r] / T + mk_gumbel(p.seed, step, row0 + r);
            if (better(v, row0 + r, gv, gi)) { gv = v; gi = row0 + r; }
        }
        block_argmax(gv, gi, scr);
        if (threadIdx.x == 0) { rec[2] = s; rec[3] = gv; ((int*)rec)[4] = gi; }
        if (p.top_p < 1.f) {
            float* o = (float*)out;   // consumed: the chosen entries are knocked out one by one
            for (int k = 0; k < MK_TOPK; ++k) {
                float tv = -INFINITY;
                int ti = 0x7fffffff;
                for (int r = threadIdx.x; r < R; r += NT)
                    if (better(o[r], row0 + r, tv, ti)) { tv = o[r]; ti = row0 + r; }
                block_argmax(tv, ti, scr);
                if (threadIdx.x == 0) {
                    const bool ok = ti != 0x7fffffff && tv > -INFINITY;
                    rec[8 + k] = ok ? tv : -INFINITY;
                    ((int*)rec)[8 + MK_TOPK + k] = ok ? ti : -1;
                    if (ok) o[ti - row0] = -INFINITY;
                }
                __syncthreads();
            }
        }
    }
}

// Top-p over the LM-head blocks' candidates (see kernels/sampling_rng.py). Kept out of line with scalar
// arguments: inlined, its live values pushed the whole kernel over 128 registers.
__device__ __noinline__ void nucleus_pick(const float* lmrec, int n, float T, float top_p, unsigned long long seed,
                                          int step, float* cp, float* scr, float& bv, int& bi) {
    const int W = MK_REC_WORDS;
    float M = -INFINITY;
    for (int b = threadIdx.x; b < n; b += NT) M = fmaxf(M, mk_ld_cg(lmrec + (size_t)b * W));
    M = block_max(M, scr);
    float z = 0.f;
    for (int b = threadIdx.x; b < n; b += NT)
        z += mk_ld_cg(lmrec + (size_t)b * W + 2) * expf((mk_ld_cg(lmrec + (size_t)b * W) - M) / T);
    z = block_sum(z, scr);
    const int C = n * MK_TOPK;
    int* ci = (int*)(cp + C);
    for (int c = threadIdx.x; c < C; c += NT) {
        const int b = c / MK_TOPK, k = c - b * MK_TOPK;
        const float v = mk_ld_cg(lmrec + (size_t)b * W + 8 + k);
        const int id = mk_ld_cg_i((const int*)lmrec + (size_t)b * W + 8 + MK_TOPK + k);
        ci[c] = id;
        cp[c] = id >= 0 ? expf((v - M) / T) / z : 0.f;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += NT) {
        const float pc = cp[c];
        const int ic = ci[c];
        if (ic < 0) continue;
        float before = 0.f;
        for (int j = 0; j < C; ++j) {
            const float pj = cp[j];
            if (ci[j] >= 0 && (pj > pc || (pj == pc && ci[j] < ic))) before += pj;
        }
        if (before < top_p) {
            const float v = logf(pc) + mk_gumbel(seed, step, ic);
            if (better(v, ic, bv, bi)) { bv = v; bi = ic; }
        }
    }
}

// ---------------------------------------------------------------- sampler
// A stop (any reason) is added to the token counter with the step's own count (SAMPLE's release, monokernel.cu), so
// every CTA learns it from the value its step-start wait sees, without a second read of the status words.
constexpr unsigned kTokStop = 1u << 30;

// The step's token and whether the launch stops after it (returned: its MK_REASON_*, 0 none), in every thread; the
// device-side records (out_tokens, status) and the next step's embedding. The host hears of it in sample_notify,
// after the token counter's release. cancel: the host's flag as thread 0 read it before this instruction's wait
// (one GPU; the tensor-parallel build reads it here, xr_cancelled).
MK_DEV int op_sample(const MkParams& p, int step, float* sm, float* scr, int* sflag, int cancel, int& tok) {
    const int W = MK_REC_WORDS, n = p.n_lm;
    const float T = p.temperature;
    int cancelled = 0;
    if (threadIdx.x == 0) cancelled = kTP ? xr_cancelled(p, step) : cancel;
    if (threadIdx.x == 0) sflag[0] = cancelled;
    __syncthreads();
    cancelled = sflag[0];
    __syncthreads();
    tok = -1;
    if (!cancelled) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        if (T <= 0.f || p.top_p >= 1.f) {
            const int vo = T <= 0.f ? 0 : 3, io = T <= 0.f ? 1 : 4;
            for (int b = threadIdx.x; b < n; b += NT) {
                const float v = mk_ld_cg(p.lmrec + (size_t)b * W + vo);
                const int i = mk_ld_cg_i((const int*)p.lmrec + (size_t)b * W + io);
                if (better(v, i, bv, bi)) { bv = v; bi = i; }
            }
        } else {
            nucleus_pick(p.lmrec, n, T, p.top_p, p.seed, step, sm + p.sm_red, scr, bv, bi);
        }
        block_argmax(bv, bi, scr);
        tok = bi;
    }
    // No candidate at all (every logit NaN or -inf) leaves tok outside the vocabulary: stop, write no token.
    const bool none = !cancelled && (tok < 0 || tok >= p.vocab);
    int stop = cancelled ? MK_REASON_CANCELLED : none ? MK_REASON_NO_TOKEN : 0;
    if (!cancelled && !none) {
        for (int i = 0; i < p.n_stop; ++i)
            if (p.stop_ids[i] == tok) stop = MK_REASON_STOP;
        if (!stop && step == p.n_steps - 1) stop = MK_REASON_LENGTH;
    }
    if (threadIdx.x == 0) {
        if (!cancelled && !none) p.out_tokens[step] = tok;
        if (stop) {
            p.status[MK_STATUS_STOP] = step + 1;
            p.status[MK_STATUS_REASON] = stop;
        }
    }
    if (!stop) {
        const int nxt = p.forced ? p.forced[step + 1] : tok;
        const mk_bf16* e = p.embed + (size_t)nxt * p.d;
        for (int i = threadIdx.x; i < p.d; i += NT) p.x[i] = mk_bf2f(e[i]);
        if (kFusedMlp && p.acc != nullptr)   // fused MLP: every LMHEAD has read the last layer's output
            for (int i = threadIdx.x; i < p.d; i += NT) p.acc[i] = 0ull;
    }
    return stop;
}

// Thread 0 tells the host (mapped pinned memory) the step's token and, on a stop, its reason: after the token
// counter's release, so the next step does not wait for these system-scope writes and their fences.
MK_DEV void sample_notify(const MkParams& p, int step, int tok, int stop) {
    if (threadIdx.x != 0) return;
    if (stop != MK_REASON_CANCELLED && stop != MK_REASON_NO_TOKEN) {
        ((volatile int*)p.host_tokens)[step] = tok;
        __threadfence_system();
        ((volatile int*)p.host_stat)[MK_HOST_COUNT] = step + 1;
    }
    if (stop) {
        ((volatile int*)p.host_stat)[MK_HOST_REASON] = stop;
        __threadfence_system();
        ((volatile int*)p.host_stat)[MK_HOST_DONE] = 1;
    }
}
