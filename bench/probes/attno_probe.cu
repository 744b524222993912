// Fused attention + output projection probe: one CTA per q head over the whole context, then its slice of Wo.
// Today a layer's attention runs as position splits per kv head, a last-finisher combine, then OPROJ on other SMs:
// on the 0.5B shape ATTN + OPROJ take ~10.4 us per layer (trace, hops included; bench/NOTES.md session 9), while the
// work itself is small (512 positions x 64 dims per head; Wo is 1.6 MB). This probe times the alternative for
// small heads before any kernel change: CTA h stages its kv head's K / V rows (cp.async) and issues the loads of its
// Wo slice (d rows x HD columns h HD .. h HD + HD - 1, all into registers) before a simulated wait for QKV, then
// q, scores (one thread per position), softmax (block max / sum), V sums (warp = position slice, lane = dims),
// the slice's matvec (CPR lanes per row) and the stores of its partial output rows. With n_heads CTAs at once.
//
// Thread 0 stamps %globaltimer: T0 issue, T1 after the wait, T2 q and K / V ready, T3 softmax weights, T4 o ready,
// T5 y stored. Each launch follows an L2 flush (K / V and Wo come from HBM, as in the kernel after a token's weight
// stream). Per launch the slowest CTA counts (the next stage waits for all); the median over launches is printed.
// o and y of one launch are checked against a double-precision host reference (same bf16 inputs).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I kernels/csrc bench/probes/attno_probe.cu \
//        -o /tmp/attno_probe && /tmp/attno_probe
#include "mk_vendor.h"
#include "probe_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#define NT 512
#define NW 16
#define KPAD 8              // bf16 padding per staged K row: 16-byte reads of rows p .. p + 7 hit distinct banks
#define LAUNCHES 21

// Shape of the 0.5B model: hidden 896, 14 q heads, 2 kv heads, head_dim 64.
#define HD 64
#define CPR (HD / 8)        // 16-byte chunks per K / V row and per Wo row segment
#define RPW (32 / CPR)      // Wo rows per warp per round
#define D 896
#define NH 14
#define NKV 2
#define QDIM (NH * HD)
#define ROUNDS ((D + NW * RPW - 1) / (NW * RPW))

template <bool EARLY>   // EARLY: the Wo slice's loads issued before the wait; else after o is ready
__global__ void __launch_bounds__(NT, 1) attno(const float* q, const mk_bf16* kc, const mk_bf16* vc,
                                               const mk_bf16* wo, float* y, float* o_out, int n, int max_len,
                                               unsigned long long delay_ns, unsigned long long* stamps) {
    extern __shared__ float4 smem4[];
    const int h = blockIdx.x, kvh = h / (NH / NKV), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    mk_bf16* sk = (mk_bf16*)smem4;                      // [n][HD + KPAD]
    mk_bf16* svv = sk + (size_t)n * (HD + KPAD);         // [n][HD]
    float* qs = (float*)(svv + (size_t)n * HD);          // [HD]
    float* e = qs + HD;                                  // [n]
    float* red = e + n;                                  // [NW][HD]
    float* scr = red + NW * HD;                          // [NW]
    float* os = scr + NW;                                // [HD]
    unsigned long long t[6];
    t[0] = mk_globaltimer();
    const mk_bf16* kh = kc + (size_t)kvh * max_len * HD;
    const mk_bf16* vh = vc + (size_t)kvh * max_len * HD;
    for (int c = tid; c < n * CPR; c += NT) {
        const int p = c / CPR, k = c - p * CPR;
        mk_cp_async16(sk + (size_t)p * (HD + KPAD) + k * 8, kh + (size_t)c * 8);
        mk_cp_async16(svv + (size_t)c * 8, vh + (size_t)c * 8);
    }
    uint4 w[ROUNDS];
    const int ck = lane % CPR;
    auto load_wo = [&]() {
#pragma unroll
        for (int k = 0; k < ROUNDS; ++k) {
            const int r = k * NW * RPW + warp * RPW + lane / CPR;
            w[k] = r < D ? mk_ld_stream16(wo + (size_t)r * QDIM + h * HD + ck * 8) : make_uint4(0, 0, 0, 0);
        }
    };
    if (EARLY) load_wo();
    if (tid == 0)
        while (mk_globaltimer() - t[0] < delay_ns) {}
    __syncthreads();
    t[1] = mk_globaltimer();
    if (tid < HD) qs[tid] = mk_ld_cg(q + h * HD + tid) * 0.125f;   // 1 / sqrt(64)
    mk_cp_async_wait_all();
    __syncthreads();
    t[2] = mk_globaltimer();
    float mx = -INFINITY;
    for (int p = tid; p < n; p += NT) {
        const uint4* kr = (const uint4*)(sk + (size_t)p * (HD + KPAD));
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < CPR; ++k) {
            float f[8];
            mk_unpack8(kr[k], f);
#pragma unroll
            for (int j = 0; j < 8; ++j) s += f[j] * qs[k * 8 + j];
        }
        e[p] = s;
        mx = fmaxf(mx, s);
    }
    mx = warp_max(mx);
    if (lane == 0) scr[warp] = mx;
    __syncthreads();
    mx = scr[0];
#pragma unroll
    for (int i = 1; i < NW; ++i) mx = fmaxf(mx, scr[i]);
    float ls = 0.f;
    for (int p = tid; p < n; p += NT) {
        const float v = expf(e[p] - mx);
        e[p] = v;
        ls += v;
    }
    ls = warp_sum(ls);
    __syncthreads();   // everyone has read scr (max)
    if (lane == 0) scr[warp] = ls;
    __syncthreads();
    float L = 0.f;
#pragma unroll
    for (int i = 0; i < NW; ++i) L += scr[i];
    t[3] = mk_globaltimer();
    // V sums: warp = position slice, lane = dims 2 lane, 2 lane + 1
    float a0 = 0.f, a1 = 0.f;
    for (int p = warp; p < n; p += NW) {
        const __nv_bfloat162 v2 = ((const __nv_bfloat162*)(svv + (size_t)p * HD))[lane];
        const float ep = e[p];
        a0 += ep * __low2float(v2);
        a1 += ep * __high2float(v2);
    }
    red[warp * HD + 2 * lane] = a0;
    red[warp * HD + 2 * lane + 1] = a1;
    __syncthreads();
    if (tid < HD) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < NW; ++i) s += red[i * HD + tid];
        os[tid] = s / L;
        if (o_out) o_out[h * HD + tid] = s / L;
    }
    __syncthreads();
    t[4] = mk_globaltimer();
    if (!EARLY) load_wo();
    float o8[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) o8[j] = os[ck * 8 + j];
#pragma unroll
    for (int k = 0; k < ROUNDS; ++k) {
        const int r = k * NW * RPW + warp * RPW + lane / CPR;
        float f[8];
        mk_unpack8(w[k], f);
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) s += f[j] * o8[j];
#pragma unroll
        for (int m = CPR / 2; m; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
        if (ck == 0 && r < D) y[(size_t)h * D + r] = s;
    }
    __syncthreads();
    t[5] = mk_globaltimer();
    if (tid == 0)
        for (int i = 0; i < 6; ++i) stamps[h * 6 + i] = t[i];
}

// GATEUP's side of the fused layout: every CTA reads the residual plus the NP partial rows of the heads (NP = 0:
// today's single vector) from L2 and sums them per element in a fixed order; thread 0 stamps the read.
__global__ void __launch_bounds__(NT, 1) sum_partials(const float* x, const float* part, int np, float* out,
                                                      unsigned long long* ns) {
    __shared__ float xs[D];
    const unsigned long long t0 = mk_globaltimer();
    for (int i = threadIdx.x; i < D; i += NT) {
        float v = mk_ld_cg(x + i);
        for (int h = 0; h < np; ++h) v += mk_ld_cg(part + (size_t)h * D + i);
        xs[i] = v;
    }
    __syncthreads();
    if (threadIdx.x == 0) ns[blockIdx.x] = mk_globaltimer() - t0;
    if (threadIdx.x < 4 && blockIdx.x == 0) out[threadIdx.x] = xs[threadIdx.x * 200];
}

static float bf2f(unsigned short b) {
    unsigned u = (unsigned)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static unsigned short f2bf(float x) {
    const float r = bf16_round(x);
    unsigned u;
    memcpy(&u, &r, 4);
    return (unsigned short)(u >> 16);
}

int main() {
    const int max_len = 1024;
    std::vector<unsigned short> hk((size_t)NKV * max_len * HD), hv(hk.size()), hw((size_t)D * QDIM);
    std::vector<float> hq(QDIM);
    unsigned s = 12345u;
    auto rnd = [&]() { s = s * 1664525u + 1013904223u; return ((s >> 8) & 0xffff) / 32768.f - 1.f; };
    for (auto& x : hk) x = f2bf(rnd());
    for (auto& x : hv) x = f2bf(rnd());
    for (auto& x : hw) x = f2bf(rnd() * 0.05f);
    for (auto& x : hq) x = rnd();
    mk_bf16 *dk, *dv, *dw;
    float *dq, *dy, *dout;
    unsigned long long* dst;
    char* flush;
    const size_t flush_bytes = (size_t)256 << 20;
    cudaMalloc(&dk, hk.size() * 2);
    cudaMalloc(&dv, hv.size() * 2);
    cudaMalloc(&dw, hw.size() * 2);
    cudaMalloc(&dq, hq.size() * 4);
    cudaMalloc(&dy, (size_t)NH * D * 4);
    cudaMalloc(&dout, (size_t)NH * HD * 4);
    cudaMalloc(&dst, NH * 6 * 8);
    cudaMalloc(&flush, flush_bytes);
    cudaMemcpy(dk, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dv, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dq, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice);
    printf("0.5B shape: %d q heads (one CTA each), hd %d, Wo slice %d x %d bf16 = %d KB per CTA\n", NH, HD, D, HD,
           D * HD * 2 / 1024);
    printf("%5s %5s %7s %8s %8s %8s %8s %8s %8s %9s %9s\n", "n", "early", "wait", "qkv", "softmax", "values", "wo", "ready->y",
           "T0->y", "err o", "err y");
    std::string json = "{\"probe\": \"attno\", \"rows\": [";
    bool first = true, ok = true;
    for (int early : {1, 0})
    for (int delay : {0, 3000}) {
        for (int n : {64, 128, 256, 512, 768}) {
            const size_t smem = (size_t)n * (HD + KPAD) * 2 + (size_t)n * HD * 2 + 4 * (HD + n + NW * HD + NW + HD);
            auto kern = early ? attno<true> : attno<false>;
            cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            std::vector<double> parts[7];
            for (int l = 0; l < LAUNCHES; ++l) {
                cudaMemset(flush, l & 0xff, flush_bytes);   // K / V and Wo out of L2
                kern<<<NH, NT, smem>>>(dq, dk, dv, dw, dy, dout, n, max_len, (unsigned long long)delay, dst);
                std::vector<unsigned long long> st(NH * 6);
                cudaMemcpy(st.data(), dst, st.size() * 8, cudaMemcpyDeviceToHost);
                double worst[7] = {0, 0, 0, 0, 0, 0, 0};
                unsigned long long t0 = ~0ull, t1 = ~0ull, t5 = 0;
                for (int b = 0; b < NH; ++b) {
                    const unsigned long long* x = &st[b * 6];
                    for (int i = 1; i < 5; ++i) worst[i] = std::max(worst[i], (x[i + 1] - x[i]) / 1e3);
                    t0 = std::min(t0, x[0]);
                    t1 = std::min(t1, x[1]);
                    t5 = std::max(t5, x[5]);
                }
                worst[0] = 0;
                worst[5] = (t5 - t1) / 1e3;   // first CTA past the wait -> last y stored
                worst[6] = (t5 - t0) / 1e3;
                if (l > 0)
                    for (int i = 0; i < 7; ++i) parts[i].push_back(worst[i]);
            }
            double med[7];
            for (int i = 0; i < 7; ++i) {
                std::sort(parts[i].begin(), parts[i].end());
                med[i] = parts[i][parts[i].size() / 2];
            }
            // check the last launch against the host reference
            std::vector<float> o(NH * HD), yv((size_t)NH * D);
            cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost);
            cudaMemcpy(yv.data(), dy, yv.size() * 4, cudaMemcpyDeviceToHost);
            double eo = 0, no = 0, ey = 0, ny = 0;
            for (int h = 0; h < NH; ++h) {
                const int kvh = h / (NH / NKV);
                std::vector<double> sc(n), ov(HD, 0.0);
                double m = -1e300, l = 0;
                for (int p = 0; p < n; ++p) {
                    double a = 0;
                    for (int i = 0; i < HD; ++i)
                        a += (double)hq[h * HD + i] * 0.125 * bf2f(hk[((size_t)kvh * max_len + p) * HD + i]);
                    sc[p] = a;
                    m = std::max(m, a);
                }
                for (int p = 0; p < n; ++p) {
                    sc[p] = std::exp(sc[p] - m);
                    l += sc[p];
                }
                for (int p = 0; p < n; ++p)
                    for (int i = 0; i < HD; ++i) ov[i] += sc[p] * bf2f(hv[((size_t)kvh * max_len + p) * HD + i]);
                for (int i = 0; i < HD; ++i) {
                    ov[i] /= l;
                    eo += (o[h * HD + i] - ov[i]) * (o[h * HD + i] - ov[i]);
                    no += ov[i] * ov[i];
                }
                for (int r = 0; r < D; ++r) {
                    double a = 0;
                    for (int i = 0; i < HD; ++i) a += bf2f(hw[(size_t)r * QDIM + h * HD + i]) * (double)o[h * HD + i];
                    ey += (yv[(size_t)h * D + r] - a) * (yv[(size_t)h * D + r] - a);
                    ny += a * a;
                }
            }
            const double ro = std::sqrt(eo / no), ry = std::sqrt(ey / ny);
            const cudaError_t err = cudaGetLastError();
            ok = ok && err == cudaSuccess && ro < 1e-4 && ry < 1e-4;
            printf("%5d %5d %7d %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %9.2e %9.2e %s\n", n, early, delay, med[1], med[2], med[3],
                   med[4], med[5], med[6], ro, ry, err == cudaSuccess ? "" : cudaGetErrorString(err));
            char b[300];
            snprintf(b, sizeof b,
                     "%s{\"n\": %d, \"early\": %d, \"wait_ns\": %d, \"qkv\": %.4f, \"softmax\": %.4f, \"values\": %.4f, \"wo\": %.4f, "
                     "\"ready_to_y\": %.4f, \"t0_to_y\": %.4f, \"err_o\": %.3g, \"err_y\": %.3g}",
                     first ? "" : ", ", n, early, delay, med[1], med[2], med[3], med[4], med[5], med[6], ro, ry);
            first = false;
            json += b;
        }
    }
    // the residual read of every GATEUP CTA: x alone, or x + the NH partial rows (all in L2, written just before)
    int nsm = 0;
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
    float *dx, *dsum;
    unsigned long long* dns;
    cudaMalloc(&dx, D * 4);
    cudaMalloc(&dsum, 16);
    cudaMalloc(&dns, nsm * 8);
    cudaMemset(dx, 0, D * 4);
    json += "], \"residual_read_us\": {";
    for (int np : {0, NH}) {
        std::vector<double> meds;
        for (int l = 0; l < LAUNCHES; ++l) {
            sum_partials<<<nsm, NT>>>(dx, dy, np, dsum, dns);
            std::vector<unsigned long long> h(nsm);
            cudaMemcpy(h.data(), dns, nsm * 8, cudaMemcpyDeviceToHost);
            std::sort(h.begin(), h.end());
            if (l > 0) meds.push_back(h[nsm - 1] / 1e3);   // the slowest CTA
        }
        std::sort(meds.begin(), meds.end());
        printf("residual read by %d CTAs, x + %2d partial rows of %d floats: %.3f us (slowest CTA, median)\n", nsm, np,
               D, meds[meds.size() / 2]);
        char b[80];
        snprintf(b, sizeof b, "%s\"%d\": %.4f", np ? ", " : "", np, meds[meds.size() / 2]);
        json += b;
    }
    printf("%s}, \"ok\": %s}\n", json.c_str(), ok ? "true" : "false");
    return ok ? 0 : 1;
}
