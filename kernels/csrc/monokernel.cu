// The monokernel: one persistent CTA per SM runs the whole decode loop (all layers, LM head, sampling, N tokens).
//
// Each CTA executes its host-built instruction list (kernels/schedule.py) once per token step. Stages hand
// data to each other through small fp32 buffers in global memory and monotonic counters: a producer bumps its
// counter with release semantics after writing, a consumer's thread 0 spins with acquire loads until the
// counter reaches (step + 1) * producers, so no grid-wide barrier and no reset between steps. Data written by
// other CTAs is read with L2-coherent loads (ld.global.cg); weights with streaming 16-byte loads.
// Vendor-specific primitives live in mk_vendor.h; the instruction format and the parameter struct are
// generated from kernels/isa.py into mk_isa.h.
#include "mk_vendor.h"
#include "mk_isa.h"
#include <math.h>

#define NT MK_NTHREADS
#define NW MK_NWARPS
#ifndef MK_CLUSTER
#define MK_CLUSTER 0   // 1: the attention combined inside thread-block clusters (kernels/build.py cluster=True)
#endif
#if MK_CLUSTER && MK_TP
#error "the tensor-parallel build has no cluster attention"
#endif
// MK_HEAD_DIM: the one attention head size this build runs (kernels/build.py; isa.HEAD_DIMS).
#if MK_HEAD_DIM != 64 && MK_HEAD_DIM != 96 && MK_HEAD_DIM != 128
#error "MK_HEAD_DIM must be 64, 96 or 128"
#endif
#define U MK_MV_UNROLL

// Thread 0 stamps instruction ii of the traced step (Monokernel.enable_trace; word k: isa.TRACE_WORDS). A side
// launch's trace pointer starts at its first CTA's row (kernels/runtime.py).
MK_DEV void trace(const MkParams& p, int step, int ii, int k) {
    if (p.trace && step == p.trace_step && threadIdx.x == 0)
        p.trace[((size_t)blockIdx.x * p.trace_stride + ii) * MK_TRACE_WORDS + k] = mk_globaltimer();
}

#include "mk_block.cuh"
#include "mk_exchange.cuh"
#include "mk_matvec.cuh"
#include "mk_sample.cuh"
#include "mk_attention.cuh"
#if !MK_TP   // kFusedMlp
#include "mk_mlp.cuh"
#include "mk_lmscreen.cuh"
#endif

// ---------------------------------------------------------------- weight prefetch
// Weights do not depend on data: before spinning on an instruction's inputs, ask L2 for the first
// prefetch_bytes of its weight rows (they are contiguous), so the matvec starts on L2 hits. Measured slower or equal
// whenever tried (bench/NOTES.md sessions 2, 18, 24): the run-time default is off, and its ~1,500 SASS instructions
// sit in the instruction loop all the same. KOG_NVCC_FLAGS="-DMK_L2_PREFETCH=0" builds the kernel without them.
#ifndef MK_L2_PREFETCH
#define MK_L2_PREFETCH 1
#endif
MK_DEV void prefetch_rows(const mk_bf16* base, size_t row0, int rows, int K, int budget) {
    const size_t bytes = (size_t)rows * K * 2;
    const unsigned n = (unsigned)(bytes < (size_t)budget ? bytes : (size_t)budget) & ~15u;
    const char* p = (const char*)(base + row0 * K);
    const unsigned chunk = 4096;
    for (unsigned off = threadIdx.x * chunk; off < n; off += NT * chunk)
        mk_prefetch_l2(p + off, n - off < chunk ? n - off : chunk);
}

MK_DEV void prefetch_instr(const MkParams& p, const MkLayer* layers, const int* ins) {
    const int op = ins[MK_F_OP], a0 = ins[MK_F_A0], a1 = ins[MK_F_A1];
    const MkLayer& Lw = layers[ins[MK_F_LAYER]];
    const int b = p.prefetch_bytes;
    switch (op) {
    case MK_OP_QKV: prefetch_rows(Lw.wqkv, a0, a1, p.d, b); break;
    case MK_OP_OPROJ: prefetch_rows(Lw.wo, a0, a1, p.q_dim, b); break;
    case MK_OP_GATEUP:
        prefetch_rows(Lw.wgu, a0, a1, p.d, b / 2);
        prefetch_rows(Lw.wgu, (size_t)p.ffn + a0, a1, p.d, b / 2);
        break;
    case MK_OP_DOWN: prefetch_rows(Lw.wd, a0, a1, p.ffn, b); break;
    case MK_OP_MLP:
        prefetch_rows(Lw.wgu, a0, a1, p.d, b / 2);
        prefetch_rows(Lw.wgu, (size_t)p.ffn + a0, a1, p.d, b / 2);
        break;
    case MK_OP_LMHEAD: prefetch_rows(p.lm_head, a0, a1, p.d, b); break;
    default: break;
    }
}

// ---------------------------------------------------------------- the kernel
extern __shared__ float4 mk_smem4[];

__global__ void __launch_bounds__(NT, 1) mk_decode(const MkParams p) {
    float* sm = (float*)mk_smem4;
    __shared__ float scr[2 * NW + 8];
    __shared__ int sflag[4];
    __shared__ AttnStep attn_st;   // this step's attention split bounds (mk_attention.cuh)
    // This CTA's index in the schedule: a side launch's CTAs follow the main launch's (p.cta0).
    const int g = blockIdx.x + p.cta0;
    const int* sm_off = p.sm_off;
    const int* instr = p.instr;
    if (p.n_resident > 0 && side_verdict(p, sflag) != MK_SIDE_BOTH) {
        if (p.cta0 > 0) return;   // the main launch runs alone, on its own lists
        sm_off = p.sm_off_alone;
        instr = p.instr_alone;
    }
    const int n_my = sm_off[g + 1] - sm_off[g];
    // The layer table and this CTA's instruction list live in shared memory (copied in once, below): every
    // instruction starts by reading both, right after a wait whose acquire polls left the L1 empty, and from global
    // memory that was two dependent L2 round trips before its first weight loads could be issued.
    const MkLayer* layers = (const MkLayer*)(sm + p.sm_tab);
    const int* my = (const int*)(sm + p.sm_tab) + p.n_layers * MK_LAYER_WORDS;
    {
        int* tab = (int*)(sm + p.sm_tab);
        const int* gi = instr + (size_t)sm_off[g] * MK_INSTR_WORDS;
        for (int i = threadIdx.x; i < p.n_layers * MK_LAYER_WORDS; i += NT) tab[i] = ((const int*)p.layers)[i];
        for (int i = threadIdx.x; i < n_my * MK_INSTR_WORDS; i += NT) tab[p.n_layers * MK_LAYER_WORDS + i] = gi[i];
        __syncthreads();
    }
    float* sv = sm + p.sm_vec;
    float* red = sm + p.sm_red;
    float* out = sm + p.sm_out;
    unsigned* tok_ctr = p.ctr + p.token_ctr;
#if MK_CLUSTER
    // The cluster combine's receive region and mbarrier (mk_attention.cuh), initialised before any peer can push.
    __shared__ __align__(16) float cl_recv[MK_RECV_FLOATS];
    __shared__ __align__(16) float cl_qkv[MK_QKV_RECV_FLOATS];
    __shared__ __align__(16) float cl_h[MK_MLP_PAIR_ROWS];
    __shared__ __align__(8) unsigned long long cl_bar, cl_qbar, cl_hbar;
    ClusterRecv cr{cl_recv, &cl_bar, 0u, cl_qkv, &cl_qbar, 0u, cl_h, &cl_hbar, 0u};
    if (threadIdx.x == 0) {
        mk_mbar_init(&cl_bar);
        mk_mbar_init(&cl_qbar);
        mk_mbar_init(&cl_hbar);
    }
    mk_cluster_sync();
#endif

    if (g == 0) {   // prologue: the first token's embedding
        const mk_bf16* e = p.embed + (size_t)p.first_token * p.d;
        for (int i = threadIdx.x; i < p.d; i += NT) p.x[i] = mk_bf2f(e[i]);
        signal_ctr(p, tok_ctr);
    }
    for (int step = 0; step < p.n_steps; ++step) {
        attn_step_fill(p, p.pos0 + step + 1, attn_st);   // published by the barriers below (step 0: its own)
        if (step == 0) __syncthreads();
        if (step > 0) {
            if (!wait_ctr(p, tok_ctr, (unsigned)(step + 1), step, sflag, false, true)) return;
            if ((unsigned)sflag[1] & kTokStop) break;   // the last step's SAMPLE stopped (it added kTokStop)
        }
        const int pos = p.pos0 + step;
        for (int ii = 0; ii < n_my; ++ii) {
            const int* ins = my + ii * MK_INSTR_WORDS;
            const int op = ins[MK_F_OP], layer = ins[MK_F_LAYER], a0 = ins[MK_F_A0], a1 = ins[MK_F_A1];
            const MkLayer& Lw = layers[layer];
            // The matvec this instruction runs (weights only: known before its inputs are ready).
            RowMap m{nullptr, a0, a1, 0};
            int R = 0, K = 0;
            switch (op) {
            case MK_OP_QKV:
#if MK_CLUSTER
            case MK_OP_ATTNQ:   // its rank's rows of W_qkv in the ATTNQ order (schedule.attnq_order), as QKV's
#endif
                m.base = Lw.wqkv; R = a1; K = p.d; break;
            case MK_OP_OPROJ: m.base = Lw.wo; R = a1; K = p.q_dim; break;
            case MK_OP_GATEUP:
#if !MK_TP   // the fused MLP exists in the one-GPU builds only
            case MK_OP_MLP:
#endif
                m.base = Lw.wgu; m.off2 = p.ffn; R = 2 * a1; K = p.d; break;
            case MK_OP_DOWN: m.base = Lw.wd; R = a1; K = p.ffn; break;
            case MK_OP_LMHEAD: m.base = p.lm_head; R = a1; K = p.d; break;
            default: break;
            }
            uint4 w[2][U];
            MvBatch cb;
#if MK_TP
            const bool screened = false;
#else
            const bool screened = op == MK_OP_LMHEAD && p.lm8 != nullptr;   // lm_screen loads its own rows
#endif
            const bool pre = R > 0 && p.early_loads && !screened;
            if (pre) mv_load(m, R, K, threadIdx.x >> 5, w, cb);   // in flight while we wait
#if !MK_TP
            // the screen's first batch, likewise, but not on warp 0 (whose thread 0 polls the wait): warp 0 loads
            // its share after the wait with the rest. Measured (bench/NOTES.md, session 38): 1.5B -9 us/token, from the
            // LM head's spread (5.8 -> 4.1 us) and the layers' path, not from the hop it was meant for (unchanged)
            const bool lm_pre = screened && p.early_loads && threadIdx.x >= 32;
            if (lm_pre) lm8_load(p.lm8, a0, R, K, threadIdx.x >> 5, w);
#endif
            if (MK_L2_PREFETCH && p.prefetch_bytes > 0) prefetch_instr(p, layers, ins);
            if (op == MK_OP_ATTN) {   // cached K/V rows in flight while we wait, like a matvec's weights
                attn_prefetch<MK_HEAD_DIM>(p, ins, pos, sm, attn_st);
            }
#if MK_CLUSTER
            if (op == MK_OP_ATTNQ) attnq_prefetch<MK_HEAD_DIM>(p, ins, pos, sm, attn_st);
#endif
            // the host's cancel flag (mapped memory: a PCIe round trip) in flight through SAMPLE's wait
            const int cancel = !kTP && op == MK_OP_SAMPLE && threadIdx.x == 0 ? *(volatile const int*)p.cancel : 0;
            trace(p, step, ii, 0);
            if (!xr_wait(p, ins, step, sflag)) return;
            trace(p, step, ii, 1);
            if (op == MK_OP_ATTN) {
#if MK_CLUSTER
                const int r = op_attn<MK_HEAD_DIM>(p, ins, ii, step, pos, sm, sflag, attn_st, cr);
#else
                const int r = op_attn<MK_HEAD_DIM>(p, ins, ii, step, pos, sm, sflag, attn_st);
#endif
                if (r < 0) return;   // aborted (watchdog) while waiting for the head's partials
                trace(p, step, ii, 2);
                continue;   // ATTN signals after its slice of the merge
            }
            if (op == MK_OP_SAMPLE) {
                int tok;
                const int stop = op_sample(p, step, sm, scr, sflag, cancel, tok);
                signal_ctr(p, p.ctr + ins[MK_F_SIG_CTR], stop ? 1u + kTokStop : 1u);   // the token counter
                sample_notify(p, step, tok, stop);
                trace(p, step, ii, 2);
                continue;
            }
            if (R > 0) {
                // One copy of each part for every matvec op (the code is inlined once: a smaller kernel): the input
                // vector (a norm of x, or attn / h as they are), the matvec, then the op's epilogue.
                float rs = 1.f;   // the RMS factor norm_vec_scale leaves to the outputs
                if (op == MK_OP_OPROJ || op == MK_OP_DOWN) {
                    load_vec(sv, op == MK_OP_OPROJ ? p.attn : p.h, op == MK_OP_OPROJ ? p.q_dim : p.ffn);
                    __syncthreads();
                } else {
                    const int nop = MK_CLUSTER && op == MK_OP_ATTNQ ? MK_OP_QKV : op;   // ATTNQ: QKV's norm of x (+ acc)
                    rs = xr_norm(p, sv, nop == MK_OP_QKV ? Lw.ln1 : op == MK_OP_LMHEAD ? p.final_norm : Lw.ln2, nop,
                                 layer, scr);
                }
                trace(p, step, ii, 3);
#if !MK_TP
                if (screened)
                    lm_screen(p.lm8, p.lm8_scale, p.lm8_c, p.lm8_d, p.lm_head, a0, R, K, p.temperature, p.seed, step,
                              sv, red, out, sm + p.sm_kv, scr, p.host_stat + MK_HOST_LM_OVER, w, lm_pre);
                else
#endif
                    matvec(m, R, K, sv, red, out, w, cb, pre);
                switch (op) {
                case MK_OP_QKV:
                    for (int r = threadIdx.x; r < a1; r += NT)
                        p.qkv[a0 + r] = out[r] * rs + (Lw.bqkv ? Lw.bqkv[a0 + r] : 0.f);
                    break;
                case MK_OP_GATEUP:
                    for (int r = threadIdx.x; r < a1; r += NT) {
                        const float gt = out[r] * rs;
                        p.h[a0 + r] = gt / (1.f + expf(-gt)) * (out[a1 + r] * rs);
                    }
                    break;
#if !MK_TP
                case MK_OP_MLP:
                    trace(p, step, ii, 4);
#if MK_CLUSTER
                    if (ins[MK_F_AUX] & MK_AUX_PAIR) {   // schedule.build mlp_pairs
                        if (mlp_down_pair(p, Lw.wdt, a0, a1, ins[MK_F_AUX], rs, out, red, cr, step, ii) < 0) return;
                        break;
                    }
#endif
                    mlp_down(p, Lw.wdt, a0, a1, rs, out, red, step, ii);
                    break;
#endif
                case MK_OP_OPROJ:
                case MK_OP_DOWN:
                    xr_residual(p, op, layer, a0, a1, out);
                    break;
#if MK_CLUSTER
                case MK_OP_ATTNQ:
                    if (op_attnq<MK_HEAD_DIM>(p, ins, ii, step, pos, sm, sflag, attn_st, cr, out, rs, m, R, Lw.bqkv) < 0)
                        return;
                    trace(p, step, ii, 2);
                    continue;   // ATTN_DONE bumped by the combine
#endif
                case MK_OP_LMHEAD:
                    if (p.logits_out)
                        for (int r = threadIdx.x; r < a1; r += NT)
                            p.logits_out[(size_t)step * p.vocab + p.vocab_off + a0 + r] = out[r];
                    lm_record(p, out, a1, p.vocab_off + a0, step,
                              p.lmrec + (size_t)(p.rec_off + ins[MK_F_AUX]) * MK_REC_WORDS, scr);
                    xr_push_record(p, ins[MK_F_AUX]);
                    break;
                default:
                    break;
                }
            }
            xr_signal(p, op, layer, ins[MK_F_SIG_CTR]);
            trace(p, step, ii, 2);
        }
    }
#if MK_CLUSTER
    // no CTA leaves while a peer's pushes to it, or its own to a peer, may be in flight
    mk_cluster_sync();
#endif
}

// ---------------------------------------------------------------- C ABI (ctypes)
extern "C" {

int mk_params_size() { return (int)sizeof(MkParams); }
int mk_layer_size() { return (int)sizeof(MkLayer); }

int mk_device_info(int dev, int* n_sm, int* smem_optin, int* major, int* minor) {
    cudaDeviceProp pr;
    cudaError_t e = cudaGetDeviceProperties(&pr, dev);
    if (e != cudaSuccess) return (int)e;
    *n_sm = pr.multiProcessorCount;
    *smem_optin = (int)pr.sharedMemPerBlockOptin;
    *major = pr.major;
    *minor = pr.minor;
    return 0;
}

const char* mk_error_string(int e) { return cudaGetErrorString((cudaError_t)e); }

// This library links its own CUDA runtime: make it use the torch tensors' device (primary context shared).
int mk_set_device(int dev) { return (int)cudaSetDevice(dev); }

// Counters and status are zeroed on the stream first, so every launch starts at step 0 with no reset inside.
// mk_start launches without zeroing: tensor parallelism zeroes every rank's counters (which peers bump) before
// any rank starts (kernels/tp_runtime.py).
int mk_start(const MkParams* p, int grid, int smem, void* stream);

// A launch's counters and status words at zero, on its stream.
static cudaError_t zero_state(const MkParams* p, cudaStream_t s, int n_ctr) {
    cudaError_t e = cudaMemsetAsync(p->ctr, 0, sizeof(unsigned) * (size_t)n_ctr, s);
    if (e == cudaSuccess) e = cudaMemsetAsync(p->status, 0, sizeof(int) * MK_STATUS_WORDS, s);
    return e;
}

int mk_launch(const MkParams* p, int grid, int smem, void* stream, int n_ctr) {
    const cudaError_t e = zero_state(p, (cudaStream_t)stream, n_ctr);
    if (e != cudaSuccess) return (int)e;
    return mk_start(p, grid, smem, stream);
}

// The kernel's shared memory, and for clusters of more than the portable 8 CTAs (16 on an H200) the opt-in to them.
static cudaError_t kernel_attributes(int smem, int cluster) {
    cudaError_t e = cudaFuncSetAttribute(mk_decode, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess && cluster > 8) e = cudaFuncSetAttribute(mk_decode, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    return e;
}

// A launch of `grid` CTAs in clusters of `cluster` (mk_start, mk_max_clusters); `at` holds the attribute cfg points to.
static cudaLaunchConfig_t cluster_config(int grid, int smem, cudaStream_t s, int cluster, cudaLaunchAttribute& at) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(NT);
    cfg.dynamicSmemBytes = (size_t)smem;
    cfg.stream = s;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = (unsigned)cluster;
    at.val.clusterDim.y = 1;
    at.val.clusterDim.z = 1;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    return cfg;
}

int mk_start(const MkParams* p, int grid, int smem, void* stream) {
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e = kernel_attributes(smem, p->attn_cluster);
    if (e != cudaSuccess) return (int)e;
    MkParams local = *p;
    if ((p->attn_cluster > 0) != (MK_CLUSTER != 0)) return (int)cudaErrorInvalidValue;   // library / launch mismatch
    if (p->head_dim != MK_HEAD_DIM) return (int)cudaErrorInvalidValue;   // another head size
    if (p->attn_cluster > 0) {
        // Clusters of attn_cluster CTAs. Not a cooperative launch: the host checked with mk_max_clusters that the
        // whole grid is resident at once, which the spin waits need.
        cudaLaunchAttribute at;
        const cudaLaunchConfig_t cfg = cluster_config(grid, smem, s, p->attn_cluster, at);
        e = cudaLaunchKernelEx(&cfg, mk_decode, local);
        if (e != cudaSuccess) return (int)e;
        return (int)cudaGetLastError();
    }
    void* args[] = {&local};
    // Cooperative launch: refuses to start unless every CTA is resident at once, which the spin waits need.
    e = cudaLaunchCooperativeKernel((const void*)mk_decode, dim3(grid), dim3(NT), args, (size_t)smem, s);
    if (e != cudaSuccess) return (int)e;
    return (int)cudaGetLastError();
}

// The main launch with a side launch (kernels/runtime.py Monokernel(side=True)): counters and status are zeroed on the
// main stream; the side launch (plain, side_grid CTAs, its own stream) starts after the zeroing, and the main
// stream's later work waits for it. A side launch that fails to start is reported; the main launch then runs alone
// after side_wait_ns (mk_block.cuh side_verdict).
int mk_launch_pair(const MkParams* p, const MkParams* side, int grid, int side_grid, int smem, void* stream,
                   void* side_stream, int n_ctr) {
    cudaStream_t s = (cudaStream_t)stream, s2 = (cudaStream_t)side_stream;
    cudaError_t e = zero_state(p, s, n_ctr);
    if (e != cudaSuccess) return (int)e;
    cudaEvent_t zeroed, ended;
    e = cudaEventCreateWithFlags(&zeroed, cudaEventDisableTiming);
    if (e != cudaSuccess) return (int)e;
    e = cudaEventCreateWithFlags(&ended, cudaEventDisableTiming);
    if (e != cudaSuccess) { cudaEventDestroy(zeroed); return (int)e; }
    e = cudaEventRecord(zeroed, s);
    if (e == cudaSuccess) e = (cudaError_t)mk_start(p, grid, smem, stream);
    cudaError_t es = e == cudaSuccess ? cudaStreamWaitEvent(s2, zeroed, 0) : e;
    if (es == cudaSuccess) {
        MkParams local = *side;
        void* args[] = {&local};
        es = cudaLaunchKernel((const void*)mk_decode, dim3(side_grid), dim3(NT), args, (size_t)smem, s2);
    }
    if (es == cudaSuccess) es = cudaEventRecord(ended, s2);
    if (es == cudaSuccess) es = cudaStreamWaitEvent(s, ended, 0);
    cudaEventDestroy(zeroed);
    cudaEventDestroy(ended);
    if (e != cudaSuccess) return (int)e;
    // the main launch runs (alone, if the side's failed): a side failure is reported as its own code
    return es == cudaSuccess ? 0 : -(int)es;
}

// How many clusters of `cluster` CTAs with `smem` bytes of dynamic shared memory can be resident at once.
int mk_max_clusters(int smem, int cluster, int* n) {
    cudaError_t e = kernel_attributes(smem, cluster);
    if (e != cudaSuccess) return (int)e;
    cudaLaunchAttribute at;
    const cudaLaunchConfig_t cfg = cluster_config(cluster, smem, nullptr, cluster, at);
    return (int)cudaOccupancyMaxActiveClusters(n, (void*)mk_decode, &cfg);
}

int mk_host_alloc(size_t bytes, void** host, void** dev) {
    cudaError_t e = cudaHostAlloc(host, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) return (int)e;
    memset(*host, 0, bytes);
    return (int)cudaHostGetDevicePointer(dev, *host, 0);
}

int mk_host_free(void* host) { return (int)cudaFreeHost(host); }

int mk_occupancy(int smem, int* blocks_per_sm) {
    cudaError_t e = kernel_attributes(smem, 0);
    if (e != cudaSuccess) return (int)e;
    return (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, mk_decode, NT, (size_t)smem);
}

}  // extern "C"
