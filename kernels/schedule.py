"""Build the per-SM instruction lists for one decode step (the same lists run for every token step).

Global order of stages for one step: for each layer QKV -> ATTN -> OPROJ -> GATEUP -> DOWN, then LMHEAD, SAMPLE.
With fused_mlp (one GPU) each layer is QKV -> ATTN -> OPROJ -> MLP: an MLP instruction runs GATEUP's rows and then
their DOWN partial of all d rows, added into the fixed-point accumulator (isa.OPS["MLP"]), so one counter handoff
and DOWN's read of h per layer go away. Cluster launches with qkv_parts (the default where it fits,
qkv_parts_default) run ATTNQ -> OPROJ -> MLP: QKV is computed inside the attention clusters (build's docstring).
Each stage's instructions are spread round-robin over the SMs with a cursor that continues across stages, so
no SM is always the one left with an extra instruction; OPROJ's go to the SMs of the highest ATTN splits instead
(`oproj_rows`).  Every SM's list is in global stage order and every
wait names an earlier stage, so with all CTAs resident (cooperative launch) the schedule cannot deadlock.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import isa


@dataclass
class Dims:
    """The model shape the kernel needs (read from engine.config.ModelConfig by `Dims.of`)."""
    d: int
    n_layers: int
    n_heads: int
    n_kv: int
    head_dim: int
    ffn: int
    vocab: int
    eps: float

    @classmethod
    def of(cls, cfg) -> "Dims":
        return cls(d=cfg.hidden_size, n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv=cfg.n_kv_heads,
                   head_dim=cfg.head_dim, ffn=cfg.intermediate_size, vocab=cfg.vocab_size, eps=cfg.rms_norm_eps)

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv * self.head_dim

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv


@dataclass
class Schedule:
    dims: Dims
    n_sm: int
    n_splits: int                     # ATTN position splits per kv head
    rows: dict[str, int]              # rows per instruction, per matvec stage
    counts: dict[str, int]            # instructions per stage (per layer for layer stages)
    per_sm: list[list[tuple[int, ...]]] = field(default_factory=list)
    n_counters: int = 0
    # Tensor parallelism (with_exchange): counter index -> producers per step over all ranks, for the stage
    # counters every rank's OPROJ / DOWN instructions bump. Empty on a single GPU.
    exchanged: dict[int, int] = field(default_factory=dict)
    fused_mlp: bool = False           # MLP instructions instead of GATEUP + DOWN (one GPU only)
    cluster: int = 0                  # CTAs per thread-block cluster (0: none); see build
    cluster_ctas: int = 0             # with cluster: the clustered CTAs, the first ones (the rest: a side launch)
    qkv_parts: int = 0                # with cluster: parts per kv head of the ATTNQ layout (0: QKV + ATTN); see build
    kv_apart: bool = False            # with qkv_parts: k / v rows by QKV instructions outside the parts; see build
    mlp_pairs: bool = False           # with cluster and fused_mlp: paired MLP instructions (isa.AUX_PAIR); see build
    mlp_weights: tuple[float, float] = (1.0, 1.0)   # with qkv_parts: MLP rows of free / side CTAs; see build

    @property
    def n_lm(self) -> int:
        return self.counts["LMHEAD"]

    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        """-> offsets int32 [n_sm + 1], instrs int32 [n_instr, INSTR_WORDS] (SM i runs instrs[off[i]:off[i+1]])."""
        off = np.zeros(self.n_sm + 1, dtype=np.int32)
        for i, lst in enumerate(self.per_sm):
            off[i + 1] = off[i] + len(lst)
        rows = [ins for lst in self.per_sm for ins in lst]
        return off, np.asarray(rows, dtype=np.int32).reshape(-1, isa.INSTR_WORDS)

    def smem_bytes(self) -> int:
        """Dynamic shared memory of the working region: [input vector | partial sums | row outputs], or the ATTN
        rotated q tile which reuses the same bytes. The attention staging region follows it (runtime.Monokernel)."""
        dm = self.dims
        vec = max(dm.d, dm.q_dim, dm.ffn)
        out = max(r * (2 if op in ("GATEUP", "MLP") else 1) for op, r in self.rows.items())
        attn = isa.MAX_GROUP * (dm.head_dim + isa.KPAD)   # the q tile: 2 x MAX_GROUP rows of head_dim + KPAD bf16
        return 4 * max(vec + isa.SMEM_RED_FLOATS + out, attn)


@dataclass(frozen=True)
class SmemLayout:
    """A CTA's dynamic shared memory (floats unless named bytes): the working region (schedule.smem_bytes), then the
    attention staging of stage_pos positions (per position its K row padded by KPAD and its V row, bf16, and
    MAX_GROUP scores), then the tables (tables_floats: the layer table and this CTA's instruction list, copied in at
    the kernel's start). The sampler's top-p candidates (2 floats each: probability and token id) start at the
    partial-sum region (after the input vector) and may run up to the tables: nothing else is live in the sampling
    CTA then (mk_sample.cuh nucleus_pick)."""
    sm_kv: int            # float offset of the staging, 16-byte aligned
    stage_pos: int        # positions staged at once
    stage_floats: int
    smem: int             # bytes
    sampler_floats: int   # room for the sampler's candidates
    sm_tab: int           # float offset of the tables, 16-byte aligned


def tables_floats(sched: Schedule) -> int:
    """Shared-memory floats of the kernel's tables: the layer table (isa.LAYER_WORDS per layer) and the longest
    instruction list of an SM."""
    longest = max(len(lst) for lst in sched.per_sm)
    return sched.dims.n_layers * isa.LAYER_WORDS + longest * isa.INSTR_WORDS


# With l1_keep (smem_layout), the staging gives up the last l1_keep bytes of shared memory if at least this many
# positions still fit in the rest.
L1_KEEP_MIN_POS = 128


def smem_layout(sched: Schedule, max_len: int, optin: int, cap: int | None = None,
                alone: Schedule | None = None, l1_keep: int = 0) -> SmemLayout:
    """Staging capacity max(128, max_len / n_splits) positions, bounded by `optin` bytes per CTA and by `cap`
    positions when given; ValueError when fewer than 16 positions fit. alone: the main launch's own schedule of a
    side launch (runtime.Monokernel(side=True)), which the same layout must hold (more rows per instruction; either
    schedule may have the longest list). l1_keep: bytes of `optin` the layout leaves unused when the staging still
    holds min(its need, L1_KEEP_MIN_POS) positions without them: shared memory and L1 share an SM's 256 KiB, and the
    L1 keeps the kernel's stack frames and small vectors (runtime.L1_KEEP_CARVEOUT says what that is worth)."""
    dm = sched.dims
    both = [sched] if alone is None else [sched, alone]
    sm_kv = -(-max(s.smem_bytes() for s in both) // 16) * 4
    row = 4 * dm.head_dim + 2 * isa.KPAD + 4 * isa.MAX_GROUP
    tab = max(tables_floats(s) for s in both)
    fit = (optin - 4 * (sm_kv + tab + 3)) // row   # + 3: the tables start 16-byte aligned after the staging
    if fit < 16:
        raise ValueError(f"monokernel: no shared memory left for attention staging ({fit} positions)")
    need = max(128, -(-max_len // sched.n_splits))
    kept = (optin - l1_keep - 4 * (sm_kv + tab + 3)) // row
    if l1_keep > 0 and kept >= min(need, L1_KEEP_MIN_POS):
        fit = kept
    pos = min(need, fit, cap if cap else fit)
    stage = pos * row // 4
    sm_tab = -(-(sm_kv + stage) // 4) * 4
    vec = max(dm.d, dm.q_dim, dm.ffn)
    return SmemLayout(sm_kv, pos, stage, 4 * (sm_tab + tab), sm_tab - vec, sm_tab)


def sampler_fits(n_records: int, sampler_floats: int) -> bool:
    """Whether n_records LM-head records' top-k candidates fit sampler_floats (SmemLayout) of shared memory."""
    return n_records * isa.TOPK * 2 <= sampler_floats


# Layers whose weights stream in less than this many bytes run the attention in clusters (attn_cluster_model).
CLUSTER_LAYER_BYTES = 48 << 20
CLUSTER_SIZE = 16
H200_CLUSTERS = 7   # clusters of CLUSTER_SIZE an H200 keeps resident with the kernel's shared memory (of 132 SMs)


def layer_weight_bytes(dm: Dims) -> int:
    """bf16 bytes of one decoder layer's matrices (QKV, O, gate + up, down)."""
    return 2 * (dm.d * (dm.q_dim + 2 * dm.kv_dim) + dm.q_dim * dm.d + 3 * dm.d * dm.ffn)


def attn_cluster_model(dm: Dims) -> int:
    """The cluster size the one-GPU engine launches this model with (0: no clusters; Monokernel(attn_cluster=)).
    Clusters combine each kv head's attention over distributed shared memory (~1 us per layer cheaper) but leave
    an H200's SMs idle (12 of 132 in clusters of 8, 20 in clusters of 16), which costs the weight streaming of big
    layers more than it saves. Measured (bench/NOTES.md, session 13, ctx 512, clusters of 8): 0.5B (30 MB per layer)
    658 vs 684 us/token; Llama-1B (122 MB) 879 vs 862; 1.5B (94 MB) 1355 vs 1311. Clusters of 16 (twice the splits
    per kv head, half the positions each) against 8 on 0.5B with the engine's 4,096-position cache (session 20):
    616 vs 623 at ctx 512, 635 vs 644 at 1,024, 675 vs 683 at 2,048, 704 vs 776 at 4,096. Bigger layers launch in
    clusters when an H200's clusters hold their ATTNQ layout with k / v apart (qkv_parts_default(kv_apart=True)):
    1.5B 1,109 / 1,187 us/token at ctx 512 / 2,048 against the plain launch's 1,133 / 1,191 (session 29). The
    schedule also needs q heads x head_dim per kv head a multiple of 32."""
    if (dm.group * dm.head_dim) % 32:
        return 0
    if layer_weight_bytes(dm) > CLUSTER_LAYER_BYTES and not qkv_parts_default(dm, CLUSTER_SIZE, H200_CLUSTERS, True):
        return 0
    return CLUSTER_SIZE


def attn_splits_in_use(n: int, n_splits: int, min_pos: int, min_splits: int, stage_pos: int) -> int:
    """Attention splits with positions at context length n (mk_attention.cuh attn_splits): ceil(n / min_pos) of the
    n_splits, and with min_splits > 0 at most max(min_splits, ceil(n / stage_pos)): one staged chunk of stage_pos
    positions per split."""
    s = min(n_splits, -(-n // min_pos))
    if min_splits > 0:
        s = min(s, max(min_splits, -(-n // stage_pos)))
    return max(1, s)


def longest_split_chunks(n: int, n_splits: int, min_pos: int, min_splits: int, stage_pos: int) -> int:
    """Staged chunks the longest attention split goes through at context length n: mk_attention.cuh attn_step_fill
    gives split s positions [s n / S, (s + 1) n / S) of the S = attn_splits_in_use splits, so at most ceil(n / S)."""
    s = attn_splits_in_use(n, n_splits, min_pos, min_splits, stage_pos)
    return -(-(-(-n // s)) // stage_pos)


# The attention's split rule (attn_split_defaults): about this many CTAs hold a step's positions; a cluster
# launch's splits hold at least CLUSTER_MIN_POS positions each.
ATTN_CTAS = 64
CLUSTER_MIN_POS = 40


def attn_split_defaults(dm: Dims, cluster: int = 0) -> tuple[int, int]:
    """(attn_min_pos, attn_min_splits) the runtime starts with (attn_splits_in_use). Each kv head's positions go to
    up to max(8, ATTN_CTAS / n_kv) splits (at most 32), at least 16 positions each when that is more than 8 splits,
    else 64. Measured with the slice merge (bench/NOTES.md, session 14, same process): 1.5B (2 kv heads) 1,274 ->
    1,257 us/token at ctx 512 and 1,368 -> 1,323 at 2048 with 32 splits of >= 16 positions against 8 of >= 64;
    Llama-1B (8 kv heads, 16 splits) 849 -> 865 at 512 with 16, so it keeps 8. A cluster launch has exactly
    `cluster` splits per kv head and fills all of them, at least 40 positions each (session 26, clusters of 16, 0.5B:
    546.6 / 548.4 / 551.6 / 560.5 / 584.1 us/token at ctx 128 / 256 / 512 / 1,024 / 2,048 against 550.3 / 551.2 /
    557.4 / 575.5 / 585.5 with session 20's 8 splits of >= 64; 48 positions no better)."""
    share = min(32, max(8, ATTN_CTAS // dm.n_kv))
    if cluster:
        return CLUSTER_MIN_POS, cluster
    if share <= 8:
        return 64, 8
    return 16, share


def items_per_row(k: int) -> int:
    """Matvec work items per output row: one item = 32 lanes x MV_UNROLL 16-byte chunks (8 bf16 each)."""
    return math.ceil(k / 8 / (32 * isa.MV_UNROLL))


def _red_fits(rows: int, k: int, mult: int) -> bool:
    """An instruction's matvec partial sums (rows x mult outputs of rows of length k) fit the reduction buffer."""
    return rows * mult * items_per_row(k) <= isa.SMEM_RED_FLOATS


def _rows_per_instr(m: int, k: int, n_sm: int, mult: int) -> int:
    r = math.ceil(m / n_sm)
    while r > 1 and not _red_fits(r, k, mult):
        r = math.ceil(r / 2)
    return r


# ATTN splits per kv head whose SMs OPROJ leaves free when it can (oproj_rows): at contexts up to
# KEEP_SPLITS x attn_min_pos (512 positions with 64, the rule of models with many kv heads) these splits hold every
# position. Models with few kv heads use more splits (attn_split_defaults); their later splits share SMs with OPROJ.
KEEP_SPLITS = 8


def oproj_rows(dims: Dims, n_sm: int, n_splits: int, rows: int) -> int:
    """Rows per OPROJ instruction. The low ATTN splits hold the positions at short contexts (mk_attention.cuh:
    attn_splits) and each of them merges a slice of its head after the others, so an OPROJ on their SMs starts late
    with its weights still on the way while the idle splits' SMs wait with theirs loaded. When the other SMs can take
    every OPROJ row with at most a quarter more rows each, the rows are spread over them only. Models with more busy
    splits (1.5B: 32 per kv head) keep OPROJ on some busy SMs: 23 rows on the 67 free ones was slower (bench/NOTES.md,
    session 16, 65)."""
    free = n_sm - dims.n_kv * min(n_splits, KEEP_SPLITS)
    if free <= 0:
        return rows
    r = math.ceil(dims.d / free)
    if r * 4 > rows * 5 or not _red_fits(r, dims.q_dim, 1):
        return rows
    return r


def mlp_partial_floats(d: int) -> int:
    """Shared-memory floats an MLP instruction's DOWN partial needs for its row groups (mk_mlp.cuh: NT // (d / 8)
    groups of d partial sums, one group when d / 8 >= NT)."""
    nch = d // 8
    return (isa.NTHREADS // nch if nch < isa.NTHREADS else 1) * d


def qkv_part_heads(group: int, parts: int) -> list[tuple[int, int]]:
    """(first q head, q heads) of each part of a kv head's group in the ATTNQ layout: as even as possible, the larger
    parts first (7 q heads in 3 parts: 3, 2, 2)."""
    if not 1 <= parts <= group:
        raise ValueError(f"{parts} parts of {group} q heads")
    out, j0 = [], 0
    for k in range(parts):
        gq = group // parts + (1 if k < group % parts else 0)
        out.append((j0, gq))
        j0 += gq
    return out


def attnq_rows(dims: Dims, gq: int, kv_apart: bool = False) -> int:
    """q / k / v rows of an ATTNQ part with gq q heads: its q heads' rows, then the kv head's k and v rows (with
    kv_apart the q heads' rows only: build's docstring)."""
    return (gq + (0 if kv_apart else 2)) * dims.head_dim


def attnq_row(dims: Dims, head: int, j0: int, gq: int, r: int) -> int:
    """The [q; k; v] weight row of row r of the part (kv head, first q head j0, gq q heads)."""
    hd = dims.head_dim
    if r < gq * hd:
        return (head * dims.group + j0) * hd + r
    if r < (gq + 1) * hd:
        return dims.q_dim + head * hd + r - gq * hd
    return dims.q_dim + dims.kv_dim + head * hd + r - (gq + 1) * hd


def attnq_part_start(dims: Dims, n_parts: int, head: int, j0: int, k: int, kv_apart: bool = False) -> int:
    """The first row of part k (first q head j0) of kv head `head` in attnq_order: every part before it holds its q
    heads' rows and its own copy of the kv head's k and v rows (with kv_apart its q heads' rows only: W_qkv's own
    order)."""
    if kv_apart:
        return (head * dims.group + j0) * dims.head_dim
    return (head * (dims.group + 2 * n_parts) + j0 + 2 * k) * dims.head_dim


def _attnq_part_splits(dims: Dims, gq: int, cluster: int, kv_apart: bool = False) -> bool:
    """A part of gq q heads splits over `cluster` ranks: its rows evenly, its q heads warp-uniformly."""
    return attnq_rows(dims, gq, kv_apart) % cluster == 0 and (gq * dims.head_dim) % 32 == 0


def mlp_pairs_default(dims: Dims, cluster: int, fused_mlp: bool) -> bool:
    """Whether a launch starts with paired MLP instructions (runtime.Monokernel mlp_pairs=None): wherever build
    accepts them (a cluster launch, the fused MLP, a hidden size in 16-byte halves). Measured at ctx 512 against
    the same build unpaired: 0.5B 526 against 542 us/token, 1.5B 1,077 against 1,098 (bench/NOTES.md, session 33)."""
    return bool(cluster) and fused_mlp and dims.d % 16 == 0


# MLP rows of the CTAs without a part and of the side launch's against 1 on the parts' (build's mlp_weights), where
# mlp_weights_default takes them. Swept with bench/experiments/kw-sweep.sh (bench/NOTES.md, session 34): 1.5B 1,077 ->
# 1,066 us/token at ctx 512 (-6.7 at 2,048), 0.5B within noise; (1.0, 0.86) -7, (1.0, 0.6) -4.
MLP_WEIGHTS = (0.9, 0.8)


def mlp_weights_default(dims: Dims, n_sm: int, cluster_ctas: int, cluster: int, qkv_parts: int, kv_apart: bool,
                        fused_mlp: bool) -> tuple[float, float]:
    """The mlp_weights a launch starts with (runtime.Monokernel mlp_weights=None): MLP_WEIGHTS in the ATTNQ layout
    with its k / v rows apart and the fused MLP (the free and side CTAs run those rows and start them sooner with
    fewer MLP rows), where build takes them: two rows or more per CTA and the longest share (at most one row pair
    past its exact proportion) in the partial-sum buffer; else (1.0, 1.0)."""
    if not (qkv_parts and kv_apart and fused_mlp) or dims.ffn < 2 * n_sm:
        return (1.0, 1.0)
    n_parts = dims.n_kv * qkv_parts * cluster
    total = n_parts + MLP_WEIGHTS[0] * (cluster_ctas - n_parts) + MLP_WEIGHTS[1] * (n_sm - cluster_ctas)
    longest = math.floor(dims.ffn / total) + 2
    return MLP_WEIGHTS if _red_fits(longest, dims.d, 2) else (1.0, 1.0)


def qkv_parts_default(dims: Dims, cluster: int, n_clusters: int, kv_apart: bool = False) -> int:
    """The ATTNQ layout's parts per kv head a cluster launch starts with (runtime.Monokernel qkv_parts=None): the
    most that the clusters hold (a cluster per part) whose rows per rank all fit one early-load batch of the matvec
    (2 rows per warp with rows of up to 32 x MV_UNROLL chunks, 1 with longer ones: items_per_row); 0 (QKV + ATTN)
    when none does. The most, not the fewest: on the 0.5B shape 3 parts ran 542 us/token at context 512 against 560
    for 2 and 552 for QKV + ATTN (bench/NOTES.md, session 28: with 2 parts the 64 CTAs that ran a layer's attention
    finished its MLP last; with 3 the attention is spread over 96). kv_apart: the parts hold q rows only (build),
    and at least one cluster is left for the k / v rows."""
    batch = 2 * isa.NWARPS // items_per_row(dims.d)
    for parts in range(min(dims.group, (n_clusters - (1 if kv_apart else 0)) // dims.n_kv), 0, -1):
        if all(_attnq_part_splits(dims, gq, cluster, kv_apart) and attnq_rows(dims, gq, kv_apart) // cluster <= batch
               for _, gq in qkv_part_heads(dims.group, parts)):
            return parts
    return 0


def attnq_aux(done_ctr: int, kv_producers: int) -> int:
    """An ATTNQ instruction's aux (isa.OPS): the ATTN_DONE counter it bumps, and with kv_apart the k / v rows'
    producers per step its split holding pos waits for (0: none)."""
    return done_ctr | kv_producers << isa.AUX_KV_SHIFT


def attnq_aux_parts(aux: int) -> tuple[int, int]:
    """attnq_aux's (ATTN_DONE counter, k / v producers per step)."""
    return aux & ((1 << isa.AUX_KV_SHIFT) - 1), aux >> isa.AUX_KV_SHIFT


def attnq_order(dims: Dims, parts: int) -> list[int]:
    """The [q; k; v] weight rows in the ATTNQ layout's order (runtime.Monokernel keeps W_qkv and its bias this way):
    for each kv head, each part's rows (attnq_row) one after the other, so a part is one run of rows starting at
    attnq_part_start; each part has its own copy of the kv head's k and v rows. An ATTNQ instruction's a0 / a1 are
    its rank's rows there, as a QKV instruction's in W_qkv."""
    return [attnq_row(dims, h, j0, gq, r) for h in range(dims.n_kv) for j0, gq in qkv_part_heads(dims.group, parts)
            for r in range(attnq_rows(dims, gq))]


def build(dims: Dims, n_sm: int, n_splits: int | None = None, fused_mlp: bool = False, cluster: int = 0,
          cluster_ctas: int | None = None, qkv_parts: int = 0, kv_apart: bool = False,
          mlp_pairs: bool = False, mlp_weights: tuple[float, float] = (1.0, 1.0)) -> Schedule:
    """cluster > 0: the kernel runs in thread-block clusters of that many CTAs and each kv head's attention has
    exactly `cluster` splits, split s on rank s of one cluster (the head's cluster rotates with the layer); every split
    merges its share of the head's outputs over distributed shared memory and signals ATTN_DONE
    (mk_attention.cuh attn_cluster_combine). The clusters are the first cluster_ctas CTAs (default n_sm; a multiple
    of `cluster`); the CTAs after them are a side launch without clusters (runtime.Monokernel(side=True)), which
    takes every kind of instruction but ATTN.
    qkv_parts = P > 0 (with cluster): no QKV stage; each kv head's q heads are cut into P parts (qkv_part_heads) and
    each part runs as ATTNQ instructions on one cluster (split s on rank s), which compute the part's q / k / v rows
    themselves (rank r its r-th 1 / cluster of them) and share them over distributed shared memory: the QKV -> ATTN
    handoff through L2 and the counters is gone; k and v are computed by each of a kv head's P clusters. The
    n_kv x P parts of a layer take distinct clusters, rotating with the layer.
    kv_apart (with qkv_parts): the parts compute their q heads' rows only, in W_qkv's own order; the k and v rows are
    QKV instructions on the CTAs that run no part in the layer (the other clusters' and the side launch's), which
    write them to qkv and bump the layer's QKV counter as the QKV stage does. Only each part's split holding pos
    needs them (its step's K / V row): it waits for that counter (for the producers per step its aux names,
    isa.OPS) after the part's q exchange, so the k / v matvec runs beside the parts' instead of adding its rows to
    theirs.
    mlp_pairs (with cluster and fused_mlp): in every layer where cluster CTAs 2k and 2k + 1 (ranks of one cluster)
    each have exactly one MLP instruction of at most isa.MLP_PAIR_ROWS rows, the two are paired (mlp_pair_aux):
    each sends its h rows to the other and adds half of the d outputs over both slices.
    mlp_weights = (free, side) (with qkv_parts and the fused MLP, one MLP instruction per CTA): a layer's MLP rows in
    proportion to 1 on the CTAs of its ATTNQ parts, `free` on its cluster CTAs without a part and `side` on the side
    launch's (mlp_row_split), instead of equal shares: the CTAs that run no attention reach the MLP with their early
    loads landed, and the unpaired side CTAs add every output where a pair's add half (bench/NOTES.md, session 33)."""
    if cluster:
        if cluster not in (2, 4, 8, 16):
            raise ValueError(f"cluster {cluster}: 2, 4, 8 or 16 CTAs")
        cluster_ctas = n_sm if cluster_ctas is None else cluster_ctas
        if cluster_ctas % cluster or not cluster <= cluster_ctas <= n_sm:
            raise ValueError(f"cluster {cluster}: {cluster_ctas} cluster CTAs of {n_sm} is not a multiple of it "
                             "between it and n_sm")
        if (dims.group * dims.head_dim) % 32:
            raise ValueError("cluster attention needs q heads x head_dim per kv head a multiple of 32")
        n_splits = cluster
    if qkv_parts:
        if not cluster:
            raise ValueError("qkv_parts needs a cluster launch")
        if dims.n_kv * qkv_parts > cluster_ctas // cluster:
            raise ValueError(f"qkv_parts {qkv_parts}: {dims.n_kv} x {qkv_parts} parts need as many clusters "
                             f"({cluster_ctas // cluster})")
        for j0, gq in qkv_part_heads(dims.group, qkv_parts):
            if not _attnq_part_splits(dims, gq, cluster, kv_apart):
                raise ValueError(f"qkv_parts {qkv_parts}: a part of {gq} q heads does not split over {cluster} ranks")
    if mlp_pairs and not (cluster and fused_mlp):
        raise ValueError("mlp_pairs needs a cluster launch and the fused MLP")
    if mlp_pairs and dims.d % 16:
        raise ValueError("mlp_pairs: hidden size must be a multiple of 16 (two halves of 16-byte Wd^T chunks)")
    mlp_weights = tuple(mlp_weights)
    weighted = mlp_weights != (1.0, 1.0)
    if weighted and not (qkv_parts and fused_mlp):
        raise ValueError("mlp_weights need the ATTNQ layout (qkv_parts) and the fused MLP")
    if min(mlp_weights) <= 0:
        raise ValueError(f"mlp_weights {mlp_weights}: positive")
    if dims.d % 8 or dims.ffn % 8 or dims.q_dim % 8:
        raise ValueError("hidden, ffn and q dims must be multiples of 8 (16-byte weight loads)")
    if dims.n_heads % dims.n_kv:
        raise ValueError("n_heads must be a multiple of n_kv_heads")
    if dims.group > isa.MAX_GROUP:
        raise ValueError(f"GQA group {dims.group} > {isa.MAX_GROUP}")
    if n_splits is None:
        n_splits = max(1, min(isa.MAX_SPLITS, n_sm // dims.n_kv))
    n_splits = min(n_splits, isa.MAX_SPLITS)
    if not cluster and n_splits > 1 and dims.n_kv * n_splits > n_sm:
        # A split with positions waits (inside its ATTN) for every split of its head: with two ATTN of one layer
        # on an SM, the one behind could be a split another SM's waiting ATTN needs, while that SM's next ATTN is
        # one this SM's first waits for.
        raise ValueError(f"{dims.n_kv} kv heads x {n_splits} attention splits need at most one ATTN per SM "
                         f"per layer ({n_sm} SMs)")
    if fused_mlp and mlp_partial_floats(dims.d) > isa.SMEM_RED_FLOATS:
        raise ValueError(f"fused MLP: hidden size {dims.d} too large for the partial-sum buffer")
    qkv_m = dims.q_dim + 2 * dims.kv_dim
    shapes = {"QKV": (qkv_m, dims.d, 1), "OPROJ": (dims.d, dims.q_dim, 1), "GATEUP": (dims.ffn, dims.d, 2),
              "DOWN": (dims.d, dims.ffn, 1), "LMHEAD": (dims.vocab, dims.d, 1)}
    rows = {k: _rows_per_instr(m, kk, n_sm, mult) for k, (m, kk, mult) in shapes.items()}
    rows["OPROJ"] = oproj_rows(dims, n_sm, n_splits, rows["OPROJ"])
    counts = {k: math.ceil(shapes[k][0] / rows[k]) for k in shapes}
    counts["ATTN"] = dims.n_kv * n_splits
    if fused_mlp:   # an MLP instruction takes a GATEUP instruction's rows; no DOWN instructions
        rows["MLP"], counts["MLP"] = rows.pop("GATEUP"), counts.pop("GATEUP")
        del rows["DOWN"], counts["DOWN"]
    if kv_apart and not qkv_parts:
        raise ValueError("kv_apart needs qkv_parts")
    parts = qkv_part_heads(dims.group, qkv_parts) if qkv_parts else []
    n_free = n_sm - dims.n_kv * qkv_parts * cluster   # CTAs without a part in a layer (kv_apart's QKV rows)
    if parts:   # ATTNQ instead of QKV and ATTN: a rank's share of its part's rows
        del rows["QKV"], counts["QKV"]
        if kv_apart:
            if n_free <= 0:
                raise ValueError("kv_apart: no CTA is left without a part for the k / v rows")
            rows["QKV"] = _rows_per_instr(2 * dims.kv_dim, dims.d, n_free, 1)
            counts["QKV"] = math.ceil(2 * dims.kv_dim / rows["QKV"])
        rows["ATTNQ"] = max(attnq_rows(dims, gq, kv_apart) for _, gq in parts) // cluster
        counts["ATTN"] = dims.n_kv * qkv_parts * cluster
        if not _red_fits(rows["ATTNQ"], dims.d, 1):
            raise ValueError(f"qkv_parts {qkv_parts}: {rows['ATTNQ']} rows per rank do not fit the partial sums")
    if weighted:   # one MLP instruction per CTA, its share of the rows (mlp_row_split)
        if dims.ffn < 2 * n_sm:
            raise ValueError(f"mlp_weights: {dims.ffn} MLP rows for {n_sm} CTAs")
        counts["MLP"] = n_sm
    L = dims.n_layers
    sched = Schedule(dims=dims, n_sm=n_sm, n_splits=n_splits, rows=rows, counts=counts,
                     per_sm=[[] for _ in range(n_sm)], n_counters=isa.n_counters(L, dims.n_kv), fused_mlp=fused_mlp,
                     cluster=cluster, cluster_ctas=cluster_ctas if cluster else 0, qkv_parts=qkv_parts,
                     kv_apart=kv_apart, mlp_pairs=mlp_pairs, mlp_weights=mlp_weights)
    # the stage whose counter the residual's consumers (next QKV, LMHEAD) wait for, and its producers per step
    last, last_ctr = ("MLP", isa.CTR_GATEUP) if fused_mlp else ("DOWN", isa.CTR_DOWN)
    cursor = 0

    def emit(instrs):
        nonlocal cursor
        for ins in instrs:
            sched.per_sm[cursor % n_sm].append(tuple(int(v) for v in ins))
            cursor += 1

    def emit_after_attn(instrs, c0, n_attn):
        """Instruction i on the SM of ATTN instruction n_attn - 1 - i (ATTN began at cursor c0; split-major, so
        the highest splits first); the cursor moves on as if emitted round-robin."""
        nonlocal cursor
        assert len(instrs) <= n_sm
        for i, ins in enumerate(instrs):
            sched.per_sm[(c0 + n_attn - 1 - i) % n_sm].append(tuple(int(v) for v in ins))
        cursor += len(instrs)

    shapes["MLP"] = shapes["GATEUP"]

    def matvec(op, layer, wait_ctr, wait_n, sig_ctr):
        m, r = shapes[op][0], rows[op]
        out = []
        for i, r0 in enumerate(range(0, m, r)):
            aux = i if op == "LMHEAD" else 0
            out.append((isa.OPS[op], layer, r0, min(r, m - r0), wait_ctr, wait_n, sig_ctr, aux))
        return out

    ci = isa.counter_index
    tok = isa.token_counter(L)
    for layer in range(L):
        if layer == 0:
            w_ctr, w_n = tok, 1
        else:
            w_ctr, w_n = ci(layer - 1, last_ctr), counts[last]
        if parts:   # part u = h P + k of this layer on cluster (layer n_kv P + u) mod n_clusters, split s on rank s
            n_cl, P = cluster_ctas // cluster, len(parts)
            used = set()
            for h in range(dims.n_kv):
                for k, (j0, gq) in enumerate(parts):
                    c = (layer * dims.n_kv * P + h * P + k) % n_cl
                    used.add(c)
                    row0 = attnq_part_start(dims, P, h, j0, k, kv_apart)
                    rr = attnq_rows(dims, gq, kv_apart) // cluster
                    for sp in range(cluster):
                        sched.per_sm[c * cluster + sp].append(
                            (isa.OPS["ATTNQ"], layer, row0 + sp * rr, rr, w_ctr, w_n, j0 | gq << 8 | h << 16 | sp << 24,
                             attnq_aux(ci(layer, isa.CTR_ATTN_DONE), counts.get("QKV", 0))))
            if kv_apart:   # the k / v rows on the CTAs of the unused clusters, then the side launch's
                free = [c * cluster + r for c in range(n_cl) if c not in used for r in range(cluster)]
                free += list(range(cluster_ctas, n_sm))
                r_kv = rows["QKV"]
                for i, r0 in enumerate(range(dims.q_dim, qkv_m, r_kv)):
                    sched.per_sm[free[i]].append((isa.OPS["QKV"], layer, r0, min(r_kv, qkv_m - r0), w_ctr, w_n,
                                                  ci(layer, isa.CTR_QKV), 0))
            cursor += counts["ATTN"]
            emit(matvec("OPROJ", layer, ci(layer, isa.CTR_ATTN_DONE), counts["ATTN"], ci(layer, isa.CTR_OPROJ)))
            if weighted:   # CTA (cursor + i) % n_sm gets instruction i
                cls = [mlp_weights[1] if c >= cluster_ctas else 1.0 if c // cluster in used else mlp_weights[0]
                       for c in ((cursor + i) % n_sm for i in range(n_sm))]
                b = mlp_row_split(dims.ffn, cls)
                mlp = [(isa.OPS["MLP"], layer, b[i], b[i + 1] - b[i], ci(layer, isa.CTR_OPROJ), counts["OPROJ"],
                        ci(layer, isa.CTR_GATEUP), 0) for i in range(n_sm)]
            else:
                mlp = matvec("MLP" if fused_mlp else "GATEUP", layer, ci(layer, isa.CTR_OPROJ), counts["OPROJ"],
                             ci(layer, isa.CTR_GATEUP))
            emit(mlp)
            if not fused_mlp:
                emit(matvec("DOWN", layer, ci(layer, isa.CTR_GATEUP), counts["GATEUP"], ci(layer, isa.CTR_DOWN)))
            continue
        emit(matvec("QKV", layer, w_ctr, w_n, ci(layer, isa.CTR_QKV)))
        c0 = cursor
        attn = [(isa.OPS["ATTN"], layer, h, s, ci(layer, isa.CTR_QKV), counts["QKV"],
                 isa.attn_ticket(L, dims.n_kv, layer, h), ci(layer, isa.CTR_ATTN_DONE))
                for s in range(n_splits) for h in range(dims.n_kv)]
        # ATTN_DONE producers: every split (once its slice of the head's merge is written)
        oproj = matvec("OPROJ", layer, ci(layer, isa.CTR_ATTN_DONE), dims.n_kv * n_splits, ci(layer, isa.CTR_OPROJ))
        if cluster:   # head h of this layer on cluster (layer n_kv + h) mod n_clusters, split s on its rank s
            for ins in attn:
                sched.per_sm[(layer * dims.n_kv + ins[2]) % (cluster_ctas // cluster) * cluster + ins[3]].append(ins)
            cursor += len(attn)
            # round-robin, the attention SMs included: OPROJ only on the other SMs was slower (bench/NOTES.md,
            # session 16, 65: the OPROJ CTAs that trail behind a merge give the MLP's early loads time to land)
            emit(oproj)
        else:
            emit(attn)
            emit_after_attn(oproj, c0, counts["ATTN"])
        if fused_mlp:
            emit(matvec("MLP", layer, ci(layer, isa.CTR_OPROJ), counts["OPROJ"], ci(layer, isa.CTR_GATEUP)))
            continue
        emit(matvec("GATEUP", layer, ci(layer, isa.CTR_OPROJ), counts["OPROJ"], ci(layer, isa.CTR_GATEUP)))
        emit(matvec("DOWN", layer, ci(layer, isa.CTR_GATEUP), counts["GATEUP"], ci(layer, isa.CTR_DOWN)))
    if mlp_pairs:
        _pair_mlp(sched)
    if weighted:   # the longest share sizes the working region (smem_bytes)
        sched.rows = dict(rows, MLP=max([rows["MLP"]] + [ins[3] for lst in sched.per_sm for ins in lst
                                                        if ins[0] == isa.OPS["MLP"]]))
        if not _red_fits(sched.rows["MLP"], dims.d, 2):
            raise ValueError(f"mlp_weights: {sched.rows['MLP']} MLP rows in one instruction: too many for the partial "
                             f"sums")
    emit(matvec("LMHEAD", 0, ci(L - 1, last_ctr), counts[last], isa.lm_counter(L)))
    # The sampler bumps TOKEN once the next token's embedding is in x.
    sched.per_sm[0].append((isa.OPS["SAMPLE"], 0, 0, 0, isa.lm_counter(L), counts["LMHEAD"], tok, 0))
    return sched


def mlp_row_split(m: int, weights: list[float]) -> list[int]:
    """Bounds of m rows split in proportion to weights, one share per weight in order: b[0] = 0, b[-1] = m, each bound
    rounded to an even row (a share of two rows per warp batch); every share gets at least two rows."""
    total, acc, out = sum(weights), 0.0, [0]
    for i, w in enumerate(weights[:-1]):
        acc += w
        b = 2 * round(m * acc / total / 2)
        out.append(min(max(b, out[-1] + 2), (m - 2 * (len(weights) - 1 - i)) & ~1))
    return out + [m]


def mlp_pair_aux(r0: int, n: int) -> int:
    """The aux of an MLP instruction paired with the one holding rows [r0, r0 + n) (isa.AUX_PAIR)."""
    return isa.AUX_PAIR | r0 | n << isa.AUX_PAIR_ROWS_SHIFT


def mlp_partner(aux: int) -> tuple[int, int] | None:
    """(first row, row count) of a paired MLP instruction's partner, or None when unpaired."""
    if not aux & isa.AUX_PAIR:
        return None
    return aux & ((1 << isa.AUX_PAIR_ROWS_SHIFT) - 1), (aux & (isa.AUX_PAIR - 1)) >> isa.AUX_PAIR_ROWS_SHIFT


def _pair_mlp(sched: Schedule) -> None:
    """Pair the MLP instructions of cluster CTAs 2k and 2k + 1 layer by layer (build's mlp_pairs), in place."""
    mlp = isa.OPS["MLP"]
    for layer in range(sched.dims.n_layers):
        for a in range(0, sched.cluster_ctas, 2):
            idx = [[j for j, ins in enumerate(sched.per_sm[c]) if ins[0] == mlp and ins[1] == layer]
                   for c in (a, a + 1)]
            if any(len(i) != 1 for i in idx):
                continue
            (ja,), (jb,) = idx
            ia, ib = sched.per_sm[a][ja], sched.per_sm[a + 1][jb]
            if max(ia[3], ib[3]) > isa.MLP_PAIR_ROWS:
                continue
            sched.per_sm[a][ja] = ia[:7] + (mlp_pair_aux(ib[2], ib[3]),)
            sched.per_sm[a + 1][jb] = ib[:7] + (mlp_pair_aux(ia[2], ia[3]),)


def with_exchange(scheds: list[Schedule], lm_parallel: bool = False) -> list[Schedule]:
    """Rank schedules of one tensor-parallel model (scheds[r]: rank r's local shape, same n_layers and n_sm).
    Every rank's OPROJ / DOWN instruction bumps that stage's counter on every rank (mk_exchange.cuh), so the
    waits on those counters (QKV of layer > 0, GATEUP, LMHEAD) must count all ranks' producers; with a
    vocabulary-parallel LM head (lm_parallel) every rank's LMHEAD blocks also bump every rank's LM counter, which
    the sampler waits on. Returns new schedules with those wait counts; the instruction lists are otherwise
    unchanged."""
    L = scheds[0].dims.n_layers
    if any(s.dims.n_layers != L or s.n_sm != scheds[0].n_sm for s in scheds):
        raise ValueError("rank schedules differ in layer count or SM count")
    tot = {op: sum(s.counts[op] for s in scheds) for op in ("OPROJ", "DOWN")}
    exchanged = {}
    for layer in range(L):
        exchanged[isa.counter_index(layer, isa.CTR_OPROJ)] = tot["OPROJ"]
        exchanged[isa.counter_index(layer, isa.CTR_DOWN)] = tot["DOWN"]
    if lm_parallel:
        exchanged[isa.lm_counter(L)] = sum(s.n_lm for s in scheds)
    out = []
    for s in scheds:
        per_sm = [[ins[:5] + (exchanged[ins[4]],) + ins[6:] if ins[4] in exchanged else ins for ins in lst]
                  for lst in s.per_sm]
        out.append(Schedule(dims=s.dims, n_sm=s.n_sm, n_splits=s.n_splits, rows=dict(s.rows),
                            counts=dict(s.counts), per_sm=per_sm, n_counters=s.n_counters, exchanged=exchanged))
    return out


def with_lanes(scheds: list[Schedule]) -> list[Schedule]:
    """Rank schedules of a delayed-mode (lane) model (mk_exchange.cuh, delayed mode). The instruction lists and their
    waits stay the single-GPU ones (a consumer waits for its own rank's producers); the LM head is exchanged like the
    vocabulary-parallel exact mode (every rank's LMHEAD blocks bump every rank's LM counter, the sampler waits for
    all of them). 2 n_layers + 1 peer counters are appended after the ordinary ones: (layer, stage) at
    n_counters + 2 layer + stage and the final-state counter at n_counters + 2 n_layers, bumped by every rank's
    OPROJ / DOWN (last DOWN) instructions; the kernel's extra waits on them are not in the lists (see lane_counters)."""
    L = scheds[0].dims.n_layers
    if any(s.dims.n_layers != L or s.n_sm != scheds[0].n_sm or s.n_counters != scheds[0].n_counters for s in scheds):
        raise ValueError("rank schedules differ in layer count, SM count or counter layout")
    lm = isa.lm_counter(L)
    exchanged = {lm: sum(s.n_lm for s in scheds)}
    out = []
    for s in scheds:
        per_sm = [[ins[:5] + (exchanged[lm],) + ins[6:] if ins[4] == lm else ins for ins in lst] for lst in s.per_sm]
        out.append(Schedule(dims=s.dims, n_sm=s.n_sm, n_splits=s.n_splits, rows=dict(s.rows), counts=dict(s.counts),
                            per_sm=per_sm, n_counters=s.n_counters + 2 * L + 1, exchanged=exchanged))
    return out


def lane_counters(scheds: list[Schedule]) -> tuple[int, int, int]:
    """(first peer counter, OPROJ producers over all ranks, DOWN producers over all ranks) of with_lanes schedules."""
    L = scheds[0].dims.n_layers
    return (scheds[0].n_counters - 2 * L - 1, sum(s.counts["OPROJ"] for s in scheds),
            sum(s.counts["DOWN"] for s in scheds))


def check(sched: Schedule) -> None:
    """Static checks: rows covered exactly once per stage, waits match the number of signallers per step,
    every SM's list is in global stage order (no deadlock with all CTAs resident)."""
    dm = sched.dims
    L = dm.n_layers
    op_name = {v: k for k, v in isa.OPS.items()}
    order = {}  # (layer, op) -> global rank
    rank = 0
    stages = ("QKV", "ATTN", "OPROJ", "MLP") if sched.fused_mlp else ("QKV", "ATTN", "OPROJ", "GATEUP", "DOWN")
    parts = qkv_part_heads(dm.group, sched.qkv_parts) if sched.qkv_parts else []
    if parts:   # kv_apart: the k / v rows' QKV instructions come first (the parts' pos splits wait for them)
        stages = (("QKV",) if sched.kv_apart else ()) + ("ATTNQ",) + stages[2:]
    for layer in range(L):
        for op in stages:
            order[(layer, isa.OPS[op])] = rank
            rank += 1
    order[(0, isa.OPS["LMHEAD"])] = rank
    order[(0, isa.OPS["SAMPLE"])] = rank + 1
    signallers: dict[int, int] = {}
    covered: dict[tuple[int, int], np.ndarray] = {}
    q_off = dm.q_dim if sched.kv_apart else 0   # kv_apart: QKV instructions cover the k / v rows only
    sizes = {"QKV": dm.q_dim + 2 * dm.kv_dim - q_off, "OPROJ": dm.d, "GATEUP": dm.ffn, "DOWN": dm.d, "LMHEAD": dm.vocab,
             "ATTN": dm.n_kv * sched.n_splits, "MLP": dm.ffn, "ATTNQ": dm.n_kv * len(parts) * sched.n_splits}
    for sm, lst in enumerate(sched.per_sm):
        last = -1
        for ins in lst:
            op, layer, a0, a1, wc, wn, sc, aux = ins
            assert not (sched.cluster_ctas and op in (isa.OPS["ATTN"], isa.OPS["ATTNQ"]) and
                        sm >= sched.cluster_ctas), f"ATTN on side-launch CTA {sm}"
            r = order[(layer, op)]
            assert r >= last, f"SM list out of global order at {ins}"
            last = r
            name = op_name[op]
            cov = covered.setdefault((layer, op), np.zeros(sizes.get(name, 1), dtype=np.int64))
            if name == "ATTN":
                cov[a0 * sched.n_splits + a1] += 1
                signallers[aux] = signallers.get(aux, 0) + 1   # every split, after its slice of the merge
            elif name == "ATTNQ":   # split sc >> 24 of part (kv head (sc >> 16) & 255, q heads sc & 255 ..)
                j0, gq, h, sp = sc & 255, (sc >> 8) & 255, (sc >> 16) & 255, sc >> 24
                k = parts.index((j0, gq))
                assert sm % sched.cluster == sp, f"{ins}: split {sp} on rank {sm % sched.cluster}"
                rr = attnq_rows(dm, gq, sched.kv_apart) // sched.cluster
                assert (a0, a1) == (attnq_part_start(dm, len(parts), h, j0, k, sched.kv_apart) + sp * rr, rr), \
                    f"{ins}: not its rank's rows of the part"
                cov[(h * len(parts) + k) * sched.n_splits + sp] += 1
                done, kvn = attnq_aux_parts(aux)
                assert kvn == (sched.counts["QKV"] if sched.kv_apart else 0), f"{ins}: not the layer's k / v producers"
                signallers[done] = signallers.get(done, 0) + 1
            elif name == "SAMPLE":
                cov[0] += 1
                signallers[sc] = signallers.get(sc, 0) + 1
            elif name == "MLP" and aux:   # paired: with the partner rank's MLP of the layer, inside one cluster
                pr = mlp_partner(aux)
                assert pr is not None and sched.mlp_pairs and sm < sched.cluster_ctas, f"{ins}: bad MLP aux"
                peer = [i for i in sched.per_sm[sm ^ 1] if i[0] == op and i[1] == layer]
                assert len(peer) == 1 and (peer[0][2], peer[0][3]) == pr and \
                    mlp_partner(peer[0][7]) == (a0, a1), f"{ins}: not paired with CTA {sm ^ 1}'s MLP"
                cov[a0:a0 + a1] += 1
                signallers[sc] = signallers.get(sc, 0) + 1
            else:
                o = q_off if name == "QKV" else 0
                assert a0 >= o, f"{ins}: a q row outside the parts"
                cov[a0 - o:a0 - o + a1] += 1
                signallers[sc] = signallers.get(sc, 0) + 1
    for key, cov in covered.items():
        assert (cov == 1).all(), f"stage {key} rows not covered exactly once"
    assert len(covered) == len(stages) * L + 2, "missing stages"
    for lst in sched.per_sm:
        for ins in lst:
            op, layer, a0, a1, wc, wn, sc, aux = ins
            if wc == isa.token_counter(L):
                assert wn == 1
            elif wc in sched.exchanged:   # this rank's producers are part of the count; the rest are peers
                assert wn == sched.exchanged[wc] and 0 < signallers.get(wc, 0) <= wn, \
                    f"{ins}: exchanged wait for {wn}, {signallers.get(wc)} local signallers"
            else:
                assert signallers.get(wc) == wn, f"{ins}: waits for {wn} signals, {signallers.get(wc)} exist"
    if sched.kv_apart:   # the parts' pos splits wait for counts["QKV"] k / v producers (their aux)
        for layer in range(L):
            n = signallers.get(isa.counter_index(layer, isa.CTR_QKV))
            assert n == sched.counts["QKV"], f"layer {layer}: {n} k / v producers, {sched.counts['QKV']} counted"
