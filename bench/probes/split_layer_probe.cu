// Split-layer probe: one decode layer of the 0.5B shape in the layout that bench/NOTES.md (session 36, "What #5's bars
// need") names as the only one the measurements leave for 3,000 tok/s: the latency chain (norm, QKV, attention, O) on
// two clusters of 16 CTAs, the MLP on the other CTAs, and each side landing its next layer's weights in shared memory
// by bulk copies while the other side runs, so that DRAM works during the chain. The estimate there is ~12.5-13.5 us
// per layer (today's kernel: 20.0); this probe times the parts the estimate could not measure: the chain under the
// other side's copy traffic, and an MLP that reads most of its rows from shared memory.
//
// Launch: 7 clusters of 16 CTAs (all an H200 holds at once), NT threads each, one CTA per SM. Clusters 0-1 are the
// chain (one kv head each), clusters 2-6 the MLP (80 CTAs; the layout has ~100, the other 20 SMs run a side launch in
// the kernel: here they idle, so the MLP's copy traffic is ~80 % of the layout's). Per layer, as the 0.5B shape
// needs (d 896, ffn 4,864, 14 q / 2 kv heads of 64, context 512):
//   chain CTA (rank r of its kv head's cluster): wait for the MLP counter; RMS norm of x + acc (L2); 36 rows x 896 of
//     W_qkv (its share of the head's 7 q + k + v heads); all-gather of the 36 values over the cluster (DSMEM); 8 KB of
//     K / V rows (its 32 positions) from DRAM; the position loop as a spin of LOOP_NS (the loop runs on staged data);
//     a second all-gather (the merge, 28 values per rank); 56 rows x 448 of W_o (its output rows, its head's
//     columns); 56 fixed-point adds into oacc; signal the chain counter.
//   MLP CTA: wait for the chain counter; norm of x + acc + oacc; 98 gate / up rows x 896 (49 of the 4,864 h rows, the
//     share of one of ~100 CTAs); h; the DOWN share (896 outputs x 49); 896 fixed-point adds into acc; signal.
// Modes:
//   stash     both sides read their weights from shared memory, landed by bulk copies right after their own signal
//             (the chain: its 112 KB; the MLP: the DOWN share and 62 of the 98 gate / up rows, 194 KB; the other 36
//             rows, 63 KB, stream from DRAM after the wait)
//   nostash   every weight read from DRAM / L2 after the wait (the same layout without the copies)
//   alone     the chain with its stash, the MLP CTAs only wait, norm, add and signal (no weights, no copies): the
//             chain's cost without traffic
// Weights and K / V are distinct per layer over NLW layers (~25 MB each), so nothing is served by L2 across layers.
// The matvecs are FMA loops (warp per row, 16-byte loads): shared memory at this loop's ~57 GB/s per SM (sessions
// 6-18), where the layout would need a tensor-core consumer (session 19's probe: 90-128 GB/s): read the MLP span
// with that in mind.
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I kernels/csrc bench/probes/split_layer_probe.cu \
//        -o /tmp/split_layer_probe && /tmp/split_layer_probe
// Prints one line per mode (us per layer: period, chain span, MLP span), then a JSON line.
// Recorded (bench/NOTES.md session 36, one H200, us per layer / chain / MLP): stash 27.30 / 11.25 / 16.05, nostash
// 40.76 / 15.91 / 24.84, alone 14.64 / 10.96 / 3.68: the chain barely notices the copies, but even alone it is longer
// than today's whole chain, so the layout's floor is above the 12.2 us per layer that 3,000 tok/s needs.
#include "mk_vendor.h"
#include "mk_isa.h"
#include "probe_bulk.h"
#include "probe_launch.h"

#include <cstdio>
#include <string>
#include <vector>

#define NT 512
#define NW (NT / 32)
#include "mk_block.cuh"   // block_sum, warp_sum, kAccScale

constexpr int D = 896, CS = 16, NCL = 7, CHAIN = 2 * CS, GRID = NCL * CS, MLP = GRID - CHAIN;
constexpr int RQ = 36, RO = 56, KO = 448;                     // chain rows per rank
constexpr int HR = 49, RGU = 2 * HR, RS = 62, RG = RGU - RS;  // MLP: h rows, gate / up rows, stashed, streamed
constexpr int KV_BYTES = 8192, EX1 = RQ, EX2 = 28;
constexpr int ROWB = D * 2;                                   // bytes of a 896-column bf16 row
constexpr size_t CHAIN_W = (size_t)RQ * ROWB + (size_t)RO * KO * 2;           // 114,688
constexpr size_t MLP_W = (size_t)RGU * ROWB + (size_t)HR * ROWB;              // 263,424 (gate / up, then Wd^T)
constexpr size_t MLP_STASH = (size_t)RS * ROWB + (size_t)HR * ROWB;           // 198,912
constexpr int NL = 240, NLW = 24;                              // layers timed (10 tokens x 24), distinct weight sets
constexpr int NB = 16;                                         // bulk-copy barriers per CTA
constexpr unsigned CHUNK = 16384;                              // bulk-copy size (the last one of a stash is shorter)
constexpr long long WATCHDOG = 4'000'000'000ll;                // cycles (~2 s) before a wait gives up

enum Mode { STASH = 0, NOSTASH = 1, ALONE = 2 };

struct Args {
    const unsigned char* chain_w;   // [NLW][CHAIN][CHAIN_W]
    const unsigned char* mlp_w;     // [NLW][MLP][MLP_W]
    const unsigned char* kv;        // [NLW][CHAIN][KV_BYTES]
    float* x;                       // [D]
    unsigned long long* acc;        // [D] the MLP's adds
    unsigned long long* oacc;       // [D] the O projection's adds
    unsigned* ctr;                  // [2][NL]: chain done, MLP done
    unsigned long long* out;        // [NL][4]: chain ready, chain CTA 0 signalled, MLP ready, MLP CTA signalled
    unsigned* err;
    int mode;
    int loop_ns;
};

__device__ float g_sink;

MK_DEV bool wait_count(const unsigned* c, unsigned target, unsigned* err) {
    __shared__ int bad;
    if (threadIdx.x == 0) {
        bad = 0;
        const long long t0 = clock64();
        while (mk_ld_acquire(c) < target)
            if (clock64() - t0 > WATCHDOG || *(volatile unsigned*)err) { bad = 1; atomicExch(err, 1u); break; }
    }
    __syncthreads();
    return bad == 0;
}

MK_DEV void signal(unsigned* c) {
    __syncthreads();
    if (threadIdx.x == 0) mk_red_release(c, 1u);
}

// Bulk copies of `bytes` from src into dst on barriers bars[0 ..) (thread 0; each barrier once per layer).
MK_DEV void stash_issue(unsigned char* dst, const unsigned char* src, size_t bytes, unsigned long long* bars) {
    if (threadIdx.x != 0) return;
    int b = 0;
    for (size_t o = 0; o < bytes; o += CHUNK, ++b) {
        const unsigned n = (unsigned)(bytes - o < CHUNK ? bytes - o : CHUNK);
        probe_bulk_copy(dst + o, src + o, n, bars + b);
    }
}

MK_DEV void stash_wait(size_t bytes, unsigned long long* bars, unsigned parity) {
    if (threadIdx.x == 0) {
        const int n = (int)((bytes + CHUNK - 1) / CHUNK);
        for (int b = 0; b < n; ++b) probe_mbar_wait(bars + b, parity);
    }
    __syncthreads();
}

// dst[0 .. D) = (x + acc [+ oacc]) * rsqrt(mean square): the residual's RMS norm (weights 1), read from L2.
MK_DEV void norm(const Args& a, float* dst, bool with_o, float* scr) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < D; i += NT) {
        float v = mk_ld_cg(a.x + i) + acc_value(mk_ld_cg_s64(a.acc + i));
        if (with_o) v += acc_value(mk_ld_cg_s64(a.oacc + i));
        dst[i] = v;
        ss += v * v;
    }
    const float r = rsqrtf(block_sum(ss, scr) / D + 1e-6f);
    for (int i = threadIdx.x; i < D; i += NT) dst[i] *= r;
    __syncthreads();
}

// out[r] = W[r] . v for R rows of K bf16 columns (row stride K * 2 bytes), a warp per row, 16-byte loads.
template <bool SHARED>
MK_DEV void matvec(const unsigned char* W, int R, int K, const float* v, float* out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int r = warp; r < R; r += NW) {
        const unsigned char* row = W + (size_t)r * K * 2;
        float s = 0.f;
        for (int c = lane; c < K / 8; c += 32) {
            const uint4 w = SHARED ? *(const uint4*)(row + c * 16) : mk_ld_stream16(row + c * 16);
            float f[8];
            mk_unpack8(w, f);
#pragma unroll
            for (int j = 0; j < 8; ++j) s += f[j] * v[c * 8 + j];
        }
        s = warp_sum(s);
        if (lane == 0) out[r] = s;
    }
    __syncthreads();
}

// The cluster's all-gather of n values per rank: this rank's vals into its buffer, a cluster barrier, every rank's
// read over DSMEM into dst[rank * n + i]. Buffers alternate, so a rank writes one only after every peer passed the
// barrier that followed their reads of it.
MK_DEV void all_gather(float* buf, const float* vals, int n, float* dst) {
    for (int i = threadIdx.x; i < n; i += NT) buf[i] = vals[i];
    __syncthreads();
    mk_cluster_sync();
    for (int t = threadIdx.x; t < CS * n; t += NT) dst[t] = mk_ld_cluster(mk_cluster_addr(buf + t % n, t / n));
    __syncthreads();
}

MK_DEV void add_fixed(unsigned long long* dst, const float* vals, int n) {
    for (int i = threadIdx.x; i < n; i += NT) mk_red_add_u64(dst + i, (unsigned long long)(long long)(vals[i] * kAccScale));
}

MK_DEV void spin_ns(int ns) {
    if (threadIdx.x == 0) {
        const unsigned long long t0 = mk_globaltimer();
        while (mk_globaltimer() - t0 < (unsigned long long)ns) {}
    }
    __syncthreads();
}

__global__ void __launch_bounds__(NT, 1) probe(Args a) {
    extern __shared__ __align__(128) unsigned char stash[];     // weights (MLP_STASH bytes at most)
    __shared__ __align__(16) float xs[D], gath[CS * EX1], outs[RGU > D ? RGU : D], scr[NW + 1];
    __shared__ __align__(16) float exbuf[2][64];
    __shared__ __align__(16) unsigned char kvs[KV_BYTES];
    __shared__ __align__(8) unsigned long long bars[NB];
    const int b = blockIdx.x;
    const bool chain = b < CHAIN;
    const int me = chain ? b : b - CHAIN, n = chain ? CHAIN : MLP;
    const size_t wbytes = chain ? CHAIN_W : MLP_W, sbytes = chain ? CHAIN_W : MLP_STASH;
    const unsigned char* wbase = chain ? a.chain_w : a.mlp_w;
    auto weights = [&](int l) { return wbase + ((size_t)(l % NLW) * n + me) * wbytes; };
    const bool stashed = a.mode == STASH || (a.mode == ALONE && chain);
    if (threadIdx.x == 0)
        for (int k = 0; k < NB; ++k) probe_mbar_init(bars + k);
    __syncthreads();
    mk_cluster_sync();
    if (stashed) stash_issue(stash, chain ? weights(0) : weights(0) + (size_t)RG * ROWB, sbytes, bars);
    unsigned* chain_ctr = a.ctr;
    unsigned* mlp_ctr = a.ctr + NL;
    for (int l = 0; l < NL; ++l) {
        if (chain) {
            if (l > 0 && !wait_count(mlp_ctr + l - 1, MLP, a.err)) return;
            if (b == 0 && threadIdx.x == 0) a.out[4 * l + 0] = mk_globaltimer();
            if (stashed) stash_wait(sbytes, bars, l & 1);
            const unsigned char* W = stashed ? stash : weights(l);
            norm(a, xs, false, scr);
            if (stashed) matvec<true>(W, RQ, D, xs, outs); else matvec<false>(W, RQ, D, xs, outs);
            all_gather(exbuf[0], outs, EX1, gath);
            const unsigned char* kv = a.kv + ((size_t)(l % NLW) * CHAIN + me) * KV_BYTES;
            for (int i = threadIdx.x; i < KV_BYTES / 16; i += NT) mk_cp_async16(kvs + i * 16, kv + i * 16);
            mk_cp_async_wait_all();
            __syncthreads();
            spin_ns(a.loop_ns);
            all_gather(exbuf[1], gath, EX2, gath + CS * EX1 - CS * EX2);
            const unsigned char* Wo = W + (size_t)RQ * ROWB;
            if (stashed) matvec<true>(Wo, RO, KO, gath, outs); else matvec<false>(Wo, RO, KO, gath, outs);
            add_fixed(a.oacc + (b % CS) * RO, outs, RO);
            signal(chain_ctr + l);
            if (b == 0 && threadIdx.x == 0) a.out[4 * l + 1] = mk_globaltimer();
            if (stashed && l + 1 < NL) stash_issue(stash, weights(l + 1), sbytes, bars);
        } else {
            if (!wait_count(chain_ctr + l, CHAIN, a.err)) return;
            if (b == CHAIN && threadIdx.x == 0) a.out[4 * l + 2] = mk_globaltimer();
            if (stashed) stash_wait(sbytes, bars, l & 1);
            norm(a, xs, true, scr);
            if (a.mode != ALONE) {
                const unsigned char* W = weights(l);
                // gate / up: RG rows streamed, then RS rows from the stash (or from DRAM without it)
                matvec<false>(W, RG, D, xs, outs);
                if (stashed) matvec<true>(stash, RS, D, xs, outs + RG);
                else matvec<false>(W + (size_t)RG * ROWB, RS, D, xs, outs + RG);
                float* h = gath;
                for (int j = threadIdx.x; j < HR; j += NT) {
                    const float g = outs[j], u = outs[HR + j];
                    h[j] = g / (1.f + __expf(-g)) * u;
                }
                __syncthreads();
                // DOWN: output i = sum_j h[j] Wd^T[j][i]; thread t owns outputs 2t, 2t + 1
                const unsigned char* Wd = stashed ? stash + (size_t)RS * ROWB : W + (size_t)RGU * ROWB;
                for (int t = threadIdx.x; t < D / 2; t += NT) {
                    float s0 = 0.f, s1 = 0.f;
                    for (int j = 0; j < HR; ++j) {
                        const unsigned pr = stashed ? *(const unsigned*)(Wd + (size_t)j * ROWB + t * 4)
                                                    : mk_ld_cg_u32(Wd + (size_t)j * ROWB + t * 4);
                        s0 += h[j] * __uint_as_float(pr << 16);
                        s1 += h[j] * __uint_as_float(pr & 0xffff0000u);
                    }
                    outs[2 * t] = s0;
                    outs[2 * t + 1] = s1;
                }
                __syncthreads();
            } else {
                for (int i = threadIdx.x; i < D; i += NT) outs[i] = xs[i] * 1e-3f;
                __syncthreads();
            }
            add_fixed(a.acc, outs, D);
            signal(mlp_ctr + l);
            if (b == CHAIN && threadIdx.x == 0) a.out[4 * l + 3] = mk_globaltimer();
            if (stashed && l + 1 < NL) stash_issue(stash, weights(l + 1) + (size_t)RG * ROWB, sbytes, bars);
        }
    }
    if (stashed) stash_wait(0, bars, 0);   // nothing left in flight: every issued copy was waited for in its layer
    mk_cluster_sync();                     // no rank leaves while a peer may still read its exchange buffers
    if (xs[0] == 1.2345f) g_sink = xs[0];
}

int main() {
    const size_t chain_bytes = (size_t)NLW * CHAIN * CHAIN_W, mlp_bytes = (size_t)NLW * MLP * MLP_W;
    const size_t kv_bytes = (size_t)NLW * CHAIN * KV_BYTES;
    unsigned char *cw, *mw, *kv;
    float* x;
    unsigned long long *acc, *oacc, *out;
    unsigned *ctr, *err;
    cudaMalloc(&cw, chain_bytes);
    cudaMalloc(&mw, mlp_bytes);
    cudaMalloc(&kv, kv_bytes);
    cudaMalloc(&x, sizeof(float) * D);
    cudaMalloc(&acc, 8 * D);
    cudaMalloc(&oacc, 8 * D);
    cudaMalloc(&ctr, sizeof(unsigned) * 2 * NL);
    cudaMalloc(&err, sizeof(unsigned));
    cudaMalloc(&out, 8 * 4 * NL);
    cudaMemset(cw, 0x3c, chain_bytes);   // bf16 ~0.0115 everywhere: finite sums
    cudaMemset(mw, 0x3c, mlp_bytes);
    cudaMemset(kv, 0x3c, kv_bytes);
    const size_t smem = MLP_STASH;
    cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    cudaFuncSetAttribute(probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    cudaLaunchAttribute at;
    const cudaLaunchConfig_t cfg = probe_cluster_config(GRID, NT, smem, CS, at);
    int clusters = 0;
    cudaOccupancyMaxActiveClusters(&clusters, (void*)probe, &cfg);
    printf("co-resident clusters of %d at %zu B dynamic shared memory: %d (need %d)\n", CS, smem, clusters, NCL);
    if (clusters < NCL) return 1;
    const char* names[] = {"stash", "nostash", "alone"};
    const int loop_ns = 1600;
    std::string json = "{\"probe\": \"split_layer\", \"loop_ns\": " + std::to_string(loop_ns) + ", \"modes\": {";
    printf("%-8s %10s %10s %10s %10s %10s\n", "mode", "layer us", "chain us", "mlp us", "chain hop", "mlp hop");
    for (int mode = 0; mode < 3; ++mode) {
        double best[5] = {1e30, 0, 0, 0, 0};
        for (int rep = 0; rep < 3; ++rep) {
            cudaMemset(ctr, 0, sizeof(unsigned) * 2 * NL);
            cudaMemset(err, 0, sizeof(unsigned));
            cudaMemset(out, 0, 8 * 4 * NL);
            cudaMemset(x, 0, sizeof(float) * D);
            cudaMemset(acc, 0, 8 * D);
            cudaMemset(oacc, 0, 8 * D);
            Args a{cw, mw, kv, x, acc, oacc, ctr, out, err, mode, loop_ns};
            cudaError_t e = cudaLaunchKernelEx(&cfg, probe, a);
            if (e == cudaSuccess) e = cudaDeviceSynchronize();
            unsigned herr = 0;
            cudaMemcpy(&herr, err, sizeof(unsigned), cudaMemcpyDeviceToHost);
            if (e != cudaSuccess || herr) {
                printf("%s: %s%s\n", names[mode], cudaGetErrorString(e), herr ? " (watchdog)" : "");
                return 1;
            }
            std::vector<unsigned long long> h(4 * NL);
            cudaMemcpy(h.data(), out, 8 * 4 * NL, cudaMemcpyDeviceToHost);
            // layers 24 .. NL - 2 (after a warm-up token): chain span = chain ready -> MLP ready (includes the hop to
            // the MLP), MLP span = MLP ready -> next chain ready; hops from the signalling CTA's stamp
            double per = 0, ch = 0, ml = 0, hc = 0, hm = 0;
            int cnt = 0;
            for (int l = 24; l < NL - 1; ++l, ++cnt) {
                per += (h[4 * (l + 1)] - h[4 * l]) / 1e3;
                ch += (h[4 * l + 2] - h[4 * l]) / 1e3;
                ml += (h[4 * (l + 1)] - h[4 * l + 2]) / 1e3;
                hc += ((double)h[4 * l + 2] - (double)h[4 * l + 1]) / 1e3;
                hm += ((double)h[4 * (l + 1)] - (double)h[4 * l + 3]) / 1e3;
            }
            if (per / cnt < best[0]) {
                best[0] = per / cnt; best[1] = ch / cnt; best[2] = ml / cnt; best[3] = hc / cnt; best[4] = hm / cnt;
            }
        }
        printf("%-8s %10.2f %10.2f %10.2f %10.2f %10.2f\n", names[mode], best[0], best[1], best[2], best[3], best[4]);
        char buf[256];
        snprintf(buf, sizeof buf, "%s\"%s\": {\"layer_us\": %.3f, \"chain_us\": %.3f, \"mlp_us\": %.3f, "
                 "\"chain_hop_us\": %.3f, \"mlp_hop_us\": %.3f}", mode ? ", " : "", names[mode], best[0], best[1],
                 best[2], best[3], best[4]);
        json += buf;
    }
    printf("%s}}\n", json.c_str());
    return 0;
}
