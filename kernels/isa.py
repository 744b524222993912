"""The monokernel instruction format: the single source of truth for Python and CUDA.

`render_header()` produces kernels/csrc/mk_isa.h; the build regenerates it and a test checks that the file on
disk equals the rendered text, so the two sides cannot drift.

An instruction is 8 int32 words:
    op, layer, a0, a1, wait_ctr, wait_n, sig_ctr, aux
- op: one of OPS below.
- a0/a1: for matvec ops the first output row and the row count; for ATTN the kv head and the split index.
- wait_ctr/wait_n: before running at token step s the executing CTA spins until
  counter[wait_ctr] >= (s + 1) * wait_n (counters start at 0 each launch and only grow, so no reset per step).
- sig_ctr: counter incremented (release) once the instruction's outputs are written.
- aux: ATTN: the per-(layer, kv head) "combined" counter bumped by the last split to finish;
  LMHEAD: index of this block's candidate record.
"""
from __future__ import annotations

OPS = {
    "QKV": 1,      # RMSNorm(x) -> rows of [q;k;v] (+bias), raw (RoPE is applied by ATTN)
    "ATTN": 2,     # one (kv head, position split) partial; last split also appends K/V at pos; last finisher combines
    "OPROJ": 3,    # x[rows] += Wo[rows] . attn
    "GATEUP": 4,   # RMSNorm(x) -> h[rows] = silu(gate[rows] . xn) * (up[rows] . xn)
    "DOWN": 5,     # x[rows] += Wd[rows] . h
    "LMHEAD": 6,   # RMSNorm(x) -> logits[rows] + this block's sampling record
    "SAMPLE": 7,   # reduce the records, pick the token, stream it, embed it into x, bump TOKEN
    # One GPU, fused MLP schedule (schedule.build(fused_mlp=True)) instead of GATEUP + DOWN: RMSNorm(x) -> h rows
    # as GATEUP, then this slice's DOWN partial of all d rows (Wd^T rows a0 .. a0 + a1) added to acc[] in fixed
    # point (ACC_FRAC_BITS): integer adds, so the sum does not depend on the order the SMs add in. aux: 0, or with
    # schedule.build(mlp_pairs=True) a paired instruction (AUX_PAIR | the partner's first row | its row count <<
    # AUX_PAIR_ROWS_SHIFT): cluster ranks 2k and 2k + 1 exchange their h rows over DSMEM and each adds half of the d
    # outputs (rank parity 0 the first half) over both slices, half the atomics per element.
    "MLP": 8,
    # Cluster launch with schedule.build(qkv_parts=P): QKV inside the attention clusters. One (kv head, part, split)
    # on rank `split` of a cluster: RMSNorm(x) -> its rank's share of the part's q / k / v rows (the part's q heads,
    # then the kv head's k and v rows), pushed to every rank of the cluster over DSMEM; then the part's q heads'
    # attention partial over the split's positions (each part's split holding pos appends K/V) and the cluster combine
    # into attn[] as ATTN's. a0 / a1: the rank's first row and row count in W_qkv's ATTNQ order
    # (schedule.attnq_order; the runtime keeps W_qkv so), as a QKV instruction's; sig_ctr: the part's first q head
    # (of the group) | its q head count << 8 | kv head << 16 | split << 24; aux: ATTN_DONE | kv << AUX_KV_SHIFT, kv
    # > 0 with schedule.build(kv_apart=True): the part's rows are its q heads' only and its split holding pos waits
    # for kv producers per step on the layer's QKV counter (QKV instructions computing the k / v rows elsewhere),
    # then reads its K / V row from qkv[].
    "ATTNQ": 9,
}
AUX_KV_SHIFT = 16
AUX_PAIR = 1 << 30          # MLP aux: a paired instruction (schedule.build mlp_pairs)
AUX_PAIR_ROWS_SHIFT = 16    # MLP aux: the partner's row count above its first row
MLP_PAIR_ROWS = 256         # a paired MLP instruction's partner rows at most (the kernel's receive buffer)
FIELDS = ("op", "layer", "a0", "a1", "wait_ctr", "wait_n", "sig_ctr", "aux")
INSTR_WORDS = len(FIELDS)

# Counter layout: per layer one counter per stage, then LM and TOKEN, then one ATTN counter per (layer, kv head)
# (attn_ticket: every split bumps it once its partial is written, and the head's splits with positions wait for all
# of them before merging their slices of the head). ATTN_DONE counts splits done (their slice merged, if any).
CTR_PER_LAYER = 5
CTR_QKV, CTR_ATTN_DONE, CTR_OPROJ, CTR_GATEUP, CTR_DOWN = 0, 1, 2, 3, 4

# Per-block sampling record written by each LMHEAD instruction: 32-bit words, floats and ints by position.
TOPK = 8
REC_WORDS = 8 + 2 * TOPK   # max, argmax, sumexp, gumbel_best, gumbel_id, pad x3, topv[TOPK], topi[TOPK]

# Kernel geometry the schedule builder and the CUDA code agree on.
NTHREADS = 512
NWARPS = NTHREADS // 32
MV_UNROLL = 4              # 16-byte chunks per lane per matvec item (loads in flight per lane)
MAX_GROUP = 8              # q heads per kv head an ATTN instruction handles
KPAD = 8                   # bf16 padding per staged K row (conflict-free 16-byte reads, mk_attn_loop.cuh)
HEAD_DIMS = (64, 96, 128)  # attention head sizes the kernel has (one per library build, kernels/build.py)
MAX_SPLITS = 64
SMEM_RED_FLOATS = 8192     # matvec partial sums per instruction: rows x items_per_row must fit


def counter_index(layer: int, which: int) -> int:
    return layer * CTR_PER_LAYER + which


def n_counters(n_layers: int, n_kv_heads: int) -> int:
    # per-layer block + LM + TOKEN + per-(layer, head) ATTN tickets
    return n_layers * CTR_PER_LAYER + 2 + n_layers * n_kv_heads


def lm_counter(n_layers: int) -> int:
    return n_layers * CTR_PER_LAYER


def token_counter(n_layers: int) -> int:
    return n_layers * CTR_PER_LAYER + 1


def attn_ticket(n_layers: int, n_kv_heads: int, layer: int, head: int) -> int:
    return n_layers * CTR_PER_LAYER + 2 + layer * n_kv_heads + head


# Kernel parameters, passed by value (one struct) and mirrored by a ctypes Structure (kernels/runtime.py).
# kinds: "p:<C type>" pointer, "u64", "f32", "i32". Pointers first so C and ctypes pad the same way.
LAYER_FIELDS = [("ln1", "p:const float"), ("wqkv", "p:const mk_bf16"), ("bqkv", "p:const float"),
                ("wo", "p:const mk_bf16"), ("ln2", "p:const float"), ("wgu", "p:const mk_bf16"),
                ("wd", "p:const mk_bf16"),
                ("wdt", "p:const mk_bf16")]   # Wd transposed [ffn, d] (fused MLP schedule only, else NULL)
# 4-byte words of one MkLayer (all its fields are 8-byte pointers): the kernel copies the layer table into shared
# memory as that many words per layer and schedule.tables_floats sizes the region with it; the header checks
# sizeof(MkLayer) against it.
assert all(kind.startswith("p:") for _, kind in LAYER_FIELDS)
LAYER_WORDS = 2 * len(LAYER_FIELDS)
PARAM_FIELDS = [
    ("layers", "p:const MkLayer"), ("embed", "p:const mk_bf16"), ("lm_head", "p:const mk_bf16"),
    ("final_norm", "p:const float"), ("inv_freq", "p:const float"),
    ("k_cache", "p:mk_bf16"), ("v_cache", "p:mk_bf16"),            # this slot's [L, kvh, max_len, hd]
    ("x", "p:float"), ("qkv", "p:float"), ("attn", "p:float"), ("h", "p:float"), ("part", "p:float"),
    ("lmrec", "p:float"), ("ctr", "p:unsigned"), ("status", "p:int"),
    # Fused MLP schedule (one GPU): the MLP output accumulator, int64 [d] fixed point (ACC_FRAC_BITS); NULL with
    # the GATEUP / DOWN schedule. The residual after layer l is x + acc: QKV and LMHEAD read both, OPROJ adds
    # acc[rows] into x[rows] and zeroes them, SAMPLE zeroes it before the next step's embedding.
    ("acc", "p:unsigned long long"),
    ("instr", "p:const int"), ("sm_off", "p:const int"),
    # With a side launch (n_resident > 0): the main launch's own lists, run when the side launch is not resident
    # (mk_block.cuh side_verdict); NULL otherwise.
    ("instr_alone", "p:const int"), ("sm_off_alone", "p:const int"),
    ("forced", "p:const int"), ("logits_out", "p:float"), ("out_tokens", "p:int"),
    ("host_tokens", "p:int"), ("host_stat", "p:int"), ("cancel", "p:const int"), ("stop_ids", "p:const int"),
    ("trace", "p:unsigned long long"),   # optional [n_sm, trace_stride, TRACE_WORDS] globaltimer ns, else NULL
    # Tensor parallelism (tp_size > 1, mk_exchange.cuh): this rank's receive buffer [L][2][tp_size][d] fp32
    # (OPROJ / DOWN partials by source rank), optional per-CTA exchange-wait ns (u64 [n_sm]), and every rank's
    # receive buffer, counters and status words (peer-mapped; index = rank, this rank's own included).
    ("recv", "p:float"), ("xwait", "p:unsigned long long"),
    ("peer_recv", "a8:float"), ("peer_ctr", "a8:unsigned"), ("peer_status", "a8:int"),
    ("peer_lmrec", "a8:float"),          # vocabulary-parallel LM head: every rank's record array
    # Delayed mode (Laneformer lanes, mk_exchange.cuh): NULL in exact mode and on one GPU; else the reduce mode
    # (LANE_* below) of every (layer, stage 0 = attention | 1 = MLP), int32 [n_layers * 2].
    ("lane_mode", "p:const int"),
    ("seed", "u64"), ("watchdog_cycles", "u64"),
    ("eps", "f32"), ("attn_scale", "f32"), ("temperature", "f32"), ("top_p", "f32"),
    ("d", "i32"), ("q_dim", "i32"), ("kv_dim", "i32"), ("ffn", "i32"), ("vocab", "i32"), ("n_layers", "i32"),
    ("n_kv", "i32"), ("head_dim", "i32"), ("group", "i32"), ("n_splits", "i32"), ("max_len", "i32"),
    ("n_lm", "i32"), ("pos0", "i32"), ("n_steps", "i32"), ("first_token", "i32"), ("n_stop", "i32"),
    ("prefetch_bytes", "i32"),   # per instruction, weights pulled into L2 before its wait (0 = off)
    ("early_loads", "i32"),      # 1: a matvec's first batch of weight loads is issued before its wait
    ("attn_min_pos", "i32"),     # positions per attention split at least (fewer splits at short contexts)
    ("trace_step", "i32"),       # with trace != NULL: the step whose per-instruction timestamps are recorded
    ("trace_stride", "i32"),     # instructions per SM in the trace buffer (the longest list)
    ("kv_stage_pos", "i32"),     # K/V rows per attention split staged in shared memory before the wait
    ("stage_floats", "i32"),     # size of the staging region (floats from sm_kv); the combine reuses it
    ("sm_vec", "i32"), ("sm_red", "i32"), ("sm_out", "i32"), ("sm_scr", "i32"), ("sm_kv", "i32"),
    ("sm_tab", "i32"),           # the layer table, then this CTA's instruction list (copied in at the start)
    ("token_ctr", "i32"),
    ("tp_rank", "i32"), ("tp_size", "i32"),   # 0, 1 on a single GPU: no exchange code runs
    # Vocabulary-parallel LM head (lm_parallel 1): this rank's rows are global ids vocab_off + local row (vocab is
    # the full size, the logits_out stride); its records go to slots rec_off + aux on every rank, and n_lm counts
    # all ranks' records. 0, 0, 0 on a single GPU.
    ("vocab_off", "i32"), ("rec_off", "i32"), ("lm_parallel", "i32"),
    # Delayed mode only (lane_mode != NULL): broadcast delay in layers; first "peer" counter (peer counter of
    # (layer, stage) = lane_x_ctr + 2 layer + stage, the final-state counter lane_x_ctr + 2 n_layers), bumped by
    # every rank's producers; OPROJ / DOWN producers over all ranks per step; lane_agg 1: the LM head normalises
    # the mean of every lane's normed final state (replicate head; the last DOWN pushes the final state), 0: each
    # lane normalises its own stream; lane_scale: sqrt(lanes), the NO_REDUCE factor.
    ("lane_delay", "i32"), ("lane_x_ctr", "i32"), ("lane_xn_oproj", "i32"), ("lane_xn_down", "i32"),
    ("lane_agg", "i32"), ("lane_scale", "f32"),
    # Launched in thread-block clusters of this many CTAs, each kv head's attention splits on one cluster (the
    # MK_CLUSTER library); 0: no clusters. Last, so the other fields keep their offsets in every build.
    ("attn_cluster", "i32"),
    # At context n the attention uses at most max(attn_min_splits, ceil(n / kv_stage_pos)) splits: enough for each
    # split's positions to fit one staged chunk (copied in before the wait), no more (each costs the combine);
    # 0: no such bound.
    ("attn_min_splits", "i32"),
    # The warp whose lane 0 bumps a stage's counter (mk_block.cuh signal_ctr): NWARPS - 1 by default, 0 = thread 0.
    ("signal_warp", "i32"),
    # The side launch (kernels/runtime.py Monokernel(side=True)): a plain launch of the same kernel on the SMs a
    # cluster launch leaves idle, running instructions of the same schedule on the same counters. cta0: the index of
    # this launch's first CTA in the schedule (0: the main launch); n_resident: CTAs of both launches (0: no side
    # launch); side_wait_ns: how long the main launch waits for every side CTA to be resident before it runs alone.
    ("cta0", "i32"), ("n_resident", "i32"), ("side_wait_ns", "i32"),
    # The screened LM head (kernels/lm_screen.py, mk_lmscreen.cuh; one GPU): the LM head's int8 copy, its per-row
    # scales and the two per-row bound factors (c: x's norm, d: x's quantization error); NULL: the exact head
    # (top-p, logits output, the tensor-parallel build).
    ("lm8", "p:const signed char"), ("lm8_scale", "p:const float"), ("lm8_c", "p:const float"),
    ("lm8_d", "p:const float"),
]
# status[] words (device) and host_stat[] words (mapped host memory)
STATUS_STOP, STATUS_REASON, STATUS_ABORT = 0, 1, 2   # stop: 0 running, else (last step + 1); abort: watchdog
# tp_size > 1: rank 0 saw the host's cancel flag; every rank cancels from step (word - 1) on (0 = no cancel).
STATUS_TP_CANCEL = 3
# Side launch start (mk_block.cuh side_verdict): CTAs of both launches arrived, and the main launch's verdict
# (0 undecided, SIDE_BOTH, SIDE_ALONE).
STATUS_ARRIVED, STATUS_VERDICT = 4, 5
SIDE_BOTH, SIDE_ALONE = 1, 2
STATUS_WORDS = 8
MAX_TP = 8                 # ranks the peer-pointer arrays of MkParams hold
# Delayed-mode reduce modes (engine/lanes ReduceMode; PAST_OWN: PAST whose source layer was not queued, A1).
LANE_PRESENT, LANE_NO_REDUCE, LANE_PAST, LANE_PAST_OWN = 0, 1, 2, 3
HOST_COUNT, HOST_DONE, HOST_REASON = 0, 1, 2
# A wait that spins longer than watchdog_cycles aborts the whole launch and reports where it was stuck.
HOST_WD_BLOCK, HOST_WD_CTR, HOST_WD_TARGET, HOST_WD_VALUE, HOST_WD_STEP = 3, 4, 5, 6, 7
# With a side launch: 1 when the main launch ran alone (the side launch was not resident within side_wait_ns).
HOST_ALONE = 8
# The screened LM head found more than LM_CAND_MAX candidates in some block and computed that block exactly (1).
HOST_LM_OVER = 9
HOST_WORDS = 10
LM_CAND_MAX = 128          # candidate rows per LMHEAD instruction the screened head recomputes exactly
# Trace record per instruction (globaltimer ns): wait start, inputs ready, outputs signalled, and the matvec's
# start (after its norm / vector load) or, for ATTN, its partial published; ATTN splits with positions also stamp
# q ready (word 4) and their position loop done (word 5). bench/mk_trace.py reads them.
TRACE_WORDS = 6
# Fused MLP: acc[] holds the MLP's output as int64 with this many fractional bits (|value| < 2^(63 - bits)).
ACC_FRAC_BITS = 28
# no_token: the sampler found no finite logit (NaN or -inf everywhere): the launch stops instead of reading the
# embedding row of a token that does not exist.
REASONS = {1: "length", 2: "stop", 3: "cancelled", 4: "watchdog", 5: "no_token"}


def _c_fields(fields) -> list[str]:
    out = []
    for name, kind in fields:
        if kind.startswith("p:"):
            out.append(f"    {kind[2:]}* {name};")
        elif kind.startswith("a8:"):   # MAX_TP pointers
            out.append(f"    {kind[3:]}* {name}[{MAX_TP}];")
        else:
            out.append(f"    {dict(u64='unsigned long long', f32='float', i32='int')[kind]} {name};")
    return out


def render_header() -> str:
    lines = [
        "// GENERATED by kernels/isa.py (render_header); do not edit. tests/kernels checks it is current.",
        "#pragma once",
        "",
    ]
    for name, code in OPS.items():
        lines.append(f"#define MK_OP_{name} {code}")
    lines.append("")
    for i, f in enumerate(FIELDS):
        lines.append(f"#define MK_F_{f.upper()} {i}")
    lines += [
        f"#define MK_INSTR_WORDS {INSTR_WORDS}",
        f"#define MK_LAYER_WORDS {LAYER_WORDS}",
        f"#define MK_CTR_PER_LAYER {CTR_PER_LAYER}",
        f"#define MK_CTR_QKV {CTR_QKV}",
        f"#define MK_AUX_KV_SHIFT {AUX_KV_SHIFT}",
        f"#define MK_AUX_PAIR {AUX_PAIR}",
        f"#define MK_AUX_PAIR_ROWS_SHIFT {AUX_PAIR_ROWS_SHIFT}",
        f"#define MK_MLP_PAIR_ROWS {MLP_PAIR_ROWS}",
        f"#define MK_TOPK {TOPK}",
        f"#define MK_REC_WORDS {REC_WORDS}",
        f"#define MK_NTHREADS {NTHREADS}",
        f"#define MK_NWARPS {NWARPS}",
        f"#define MK_MV_UNROLL {MV_UNROLL}",
        f"#define MK_TRACE_WORDS {TRACE_WORDS}",
        f"#define MK_ACC_FRAC_BITS {ACC_FRAC_BITS}",
        f"#define MK_MAX_GROUP {MAX_GROUP}",
        f"#define MK_KPAD {KPAD}",
        f"#define MK_MAX_SPLITS {MAX_SPLITS}",
        f"#define MK_SMEM_RED_FLOATS {SMEM_RED_FLOATS}",
        f"#define MK_STATUS_STOP {STATUS_STOP}",
        f"#define MK_STATUS_REASON {STATUS_REASON}",
        f"#define MK_HOST_COUNT {HOST_COUNT}",
        f"#define MK_HOST_DONE {HOST_DONE}",
        f"#define MK_HOST_REASON {HOST_REASON}",
        f"#define MK_STATUS_ABORT {STATUS_ABORT}",
        f"#define MK_STATUS_TP_CANCEL {STATUS_TP_CANCEL}",
        f"#define MK_STATUS_ARRIVED {STATUS_ARRIVED}",
        f"#define MK_STATUS_VERDICT {STATUS_VERDICT}",
        f"#define MK_STATUS_WORDS {STATUS_WORDS}",
        f"#define MK_SIDE_BOTH {SIDE_BOTH}",
        f"#define MK_SIDE_ALONE {SIDE_ALONE}",
        f"#define MK_HOST_ALONE {HOST_ALONE}",
        f"#define MK_HOST_LM_OVER {HOST_LM_OVER}",
        f"#define MK_LM_CAND_MAX {LM_CAND_MAX}",
        f"#define MK_MAX_TP {MAX_TP}",
        f"#define MK_LANE_PRESENT {LANE_PRESENT}",
        f"#define MK_LANE_NO_REDUCE {LANE_NO_REDUCE}",
        f"#define MK_LANE_PAST {LANE_PAST}",
        f"#define MK_LANE_PAST_OWN {LANE_PAST_OWN}",
        f"#define MK_HOST_WD_BLOCK {HOST_WD_BLOCK}",
        f"#define MK_HOST_WD_CTR {HOST_WD_CTR}",
        f"#define MK_HOST_WD_TARGET {HOST_WD_TARGET}",
        f"#define MK_HOST_WD_VALUE {HOST_WD_VALUE}",
        f"#define MK_HOST_WD_STEP {HOST_WD_STEP}",
    ]
    lines += [f"#define MK_REASON_{v.upper()} {k}" for k, v in REASONS.items()]
    lines += ["", "struct MkLayer {"] + _c_fields(LAYER_FIELDS) + ["};",
              'static_assert(sizeof(MkLayer) == 4 * MK_LAYER_WORDS, "MK_LAYER_WORDS (isa.LAYER_WORDS)");', "",
              "struct MkParams {"]
    lines += _c_fields(PARAM_FIELDS) + ["};", ""]
    return "\n".join(lines)
