"""ctypes binding of the monokernel library and the GPU state one model needs to run it.

`Monokernel(model, k_cache, v_cache)` packs the per-layer weight pointers, allocates the small fp32 scratch
buffers, the counters and the mapped (pinned, device-visible) host buffers through which tokens stream out and
the cancel flag goes in, builds the schedule, and launches the persistent kernel on the current torch stream.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import random
import time

import torch

from . import isa
from .build import build
from .schedule import (L1_KEEP_MIN_POS, Dims, Schedule, attn_split_defaults, attnq_order, build as build_schedule,
                       longest_split_chunks, mlp_pairs_default, mlp_weights_default, qkv_parts_default, sampler_fits,
                       smem_layout)

log = logging.getLogger("kernels")


def _ctype(kind: str):
    if kind.startswith("a8:"):
        return ctypes.c_void_p * isa.MAX_TP
    return {"u64": ctypes.c_uint64, "f32": ctypes.c_float, "i32": ctypes.c_int32}.get(kind, ctypes.c_void_p)


class MkLayer(ctypes.Structure):
    _fields_ = [(n, _ctype(k)) for n, k in isa.LAYER_FIELDS]


class MkParams(ctypes.Structure):
    _fields_ = [(n, _ctype(k)) for n, k in isa.PARAM_FIELDS]


def smem_optin(props) -> int:
    """Dynamic shared memory a CTA may use on a GPU (torch device properties), less 1 KB of static headroom."""
    return getattr(props, "shared_memory_per_block_optin", 227 * 1024) - 1024


# The shared-memory carveout (per SM, of the 256 KiB it shares with the L1; Hopper's steps: ..., 132, 164, 196, 228
# KiB) the staging stays within where it can (schedule.smem_layout l1_keep): above it the L1 drops to 60 KiB or
# less and every layer's q stage and merge slow down. Measured (bench/NOTES.md, session 31, us/token at ctx 512):
# 0.5B launched with 185 KB of shared memory instead of 106 KB +21; 1.5B staging 148 positions (169 KiB with the
# static part) 1,108 against 128 positions (158 KiB) 1,093, with a 4,020-position cache (252 positions, 226 KiB)
# 1,140 against 1,094 at ctx 512 and 1,289 against 1,279 at ctx 3,700 (two staged chunks per split). 0.5B at 138
# KB (a 164 KiB carveout) runs as fast as at 106 KB.
L1_KEEP_CARVEOUT = 164 * 1024


def l1_keep_bytes(props) -> int:
    """Bytes of smem_optin that a layout leaves unused to stay within L1_KEEP_CARVEOUT (1 KiB of it is the
    driver's per CTA)."""
    return max(0, getattr(props, "shared_memory_per_block_optin", 227 * 1024) - (L1_KEEP_CARVEOUT - 1024))


def no_token_message(step: int) -> str:
    return (f"monokernel: no finite logit at step {step} (every logit NaN or -inf; broken weights or an overflow): "
            "the launch stopped there")


_LIBS: dict[tuple[bool, bool, int, bool], ctypes.CDLL] = {}   # (tp, cluster, head_dim, kv_overlap)


def load_library(tp: bool = False, cluster: bool = False, *, head_dim: int, kv_overlap: bool = False) -> ctypes.CDLL:
    """The one-GPU build (cluster: with the attention combined inside thread-block clusters; kv_overlap: and the
    K / V restaging overlapped with the attention loop), or with tp the tensor-parallel one, for one attention head
    size (kernels/build.py)."""
    key = (tp, cluster, head_dim, kv_overlap)
    if key not in _LIBS:
        lib = ctypes.CDLL(str(build(tp=tp, cluster=cluster, head_dim=head_dim, kv_overlap=kv_overlap)))
        lib.mk_launch.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        lib.mk_start.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        lib.mk_launch_pair.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        lib.mk_host_alloc.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
        lib.mk_host_free.argtypes = [ctypes.c_void_p]
        lib.mk_error_string.restype = ctypes.c_char_p
        lib.mk_occupancy.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        lib.mk_max_clusters.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        if lib.mk_params_size() != ctypes.sizeof(MkParams) or lib.mk_layer_size() != ctypes.sizeof(MkLayer):
            raise RuntimeError("MkParams layout differs between CUDA and ctypes (stale build?)")
        _LIBS[key] = lib
    return _LIBS[key]


def _check(lib, err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"{what}: CUDA error {err} ({lib.mk_error_string(err).decode()})")


class HostBuffer:
    """int32 array in pinned host memory mapped into the device (kernel writes, host polls, and vice versa)."""

    def __init__(self, lib, n: int):
        self.lib, self.n = lib, n
        h, d = ctypes.c_void_p(), ctypes.c_void_p()
        _check(lib, lib.mk_host_alloc(4 * n, ctypes.byref(h), ctypes.byref(d)), "cudaHostAlloc(mapped)")
        self.host, self.dev = h.value, d.value
        self.arr = (ctypes.c_int32 * n).from_address(self.host)

    def __del__(self):
        if getattr(self, "host", None):
            self.lib.mk_host_free(ctypes.c_void_p(self.host))
            self.host = None


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


@contextlib.contextmanager
def _keeps_device():
    """The library's cudaSetDevice (mk_set_device, mk_enable_peer) switches the thread's current context, which
    torch shares: give the caller its current device back, even when the body raises."""
    caller = torch.cuda.current_device()
    try:
        yield
    finally:
        torch.cuda.set_device(caller)


class Monokernel:
    """model: engine.model.Model on a CUDA device; k_cache/v_cache: [S, L, kvh, max_len, hd] bf16."""

    def __init__(self, model, k_cache: torch.Tensor, v_cache: torch.Tensor, max_steps: int = 4096,
                 n_sm: int | None = None, sched: Schedule | None = None, tp_build: bool = False,
                 fused_mlp: bool | None = None, attn_cluster: int = 0,
                 n_splits: int | None = None, kv_stage_cap: int | None = None, side: bool | None = None,
                 qkv_parts: int | None = None, kv_apart: bool | None = None,
                 lm_screen: bool | None = None, mlp_pairs: bool | None = None, long_lib: bool | None = None,
                 mlp_weights: tuple[float, float] | None = None):
        """sched: a prebuilt schedule for this model's shape and n_sm (tensor parallelism passes one whose
        exchanged waits count every rank's producers, and tp_build: the library variant with the exchange:
        kernels/tp_runtime.py). fused_mlp: the MLP schedule (schedule.build(fused_mlp=True); default: on for the
        one-GPU build without a prebuilt schedule; the tensor-parallel build has GATEUP + DOWN only).
        attn_cluster: 2, 4, 8 or 16 (16: not portable, an H200 holds 7): launch
        in thread-block clusters of that many CTAs (the library built with cluster=True) with each kv head's
        attention splits on one cluster, combined over distributed shared memory (schedule.build(cluster=...));
        n_sm defaults to every resident cluster. n_splits: attention position splits per kv head in the schedule it
        builds (default: as many as the SMs allow, schedule.build). kv_stage_cap: at most this many attention
        positions staged per chunk (schedule.smem_layout; default: as many as shared memory holds, within
        L1_KEEP_CARVEOUT where 128 positions fit there).
        side (default: on with attn_cluster when n_sm is not given): the SMs the clusters leave idle (20 of an H200's
        132 with clusters of 16) run a second, plain launch of the same kernel at the same time, which takes a share
        of every instruction but the attention on the same counters (schedule.build(cluster_ctas=...)). Nothing
        guarantees that two launches are resident together: the main launch waits side_wait_ns for the side's CTAs
        and else runs alone on its own schedule (mk_block.cuh side_verdict; logged, counted in side_alone).
        Measured on 0.5B (bench/NOTES.md, session 23): -6 us/token at ctx 512 against the same build without it.
        qkv_parts (with attn_cluster): the ATTNQ layout (schedule.build(qkv_parts=...)): QKV computed inside the
        attention clusters, each kv head's q heads in that many parts, one cluster each (0: QKV + ATTN; default:
        schedule.qkv_parts_default with clusters, else 0). kv_apart (with qkv_parts): the parts compute their q rows
        only and the k / v rows are QKV instructions on the CTAs without a part (schedule.build(kv_apart=True));
        default: on where that layout fits the clusters (measured faster on 0.5B and 1.5B, bench/NOTES.md session 29).
        mlp_pairs (with attn_cluster and the fused MLP): paired MLP instructions (schedule.build(mlp_pairs=True)):
        cluster ranks 2k and 2k + 1 exchange their h rows and each adds half of the outputs (76 adds per output
        instead of 132 on an H200); default: schedule.mlp_pairs_default. mlp_weights (with qkv_parts): the MLP rows of
        the CTAs without a part and of the side launch's, against 1 for the parts' (schedule.build mlp_weights);
        default: schedule.mlp_weights_default (the side launch's schedule and the main launch's own each get theirs).
        lm_screen (default: on where it can run): the screened LM head (kernels/lm_screen.py) for launches that
        need no logits output and no top-p; it keeps an int8 copy of the LM head (vocab x d bytes). lm_mode says
        which head the last launch ran and why.
        long_lib (with attn_cluster; default: on where it loads): launches whose longest attention split needs more
        than one staged chunk of K / V (schedule.longest_split_chunks at the launch's last step) run the cluster build
        with the later chunks restaged during the loop (kernels/build.py kv_overlap; the same arithmetic, the same
        bits). Built into the default library it cost 1.5B +0.9 % at ctx 512 (session 32's 107), hence a second
        library. Measured so (session 33, bench/NOTES.md): 1.5B 1,547 -> 1,455 us/token at ctx 8,000, 0.5B 726 -> 712,
        ctx 512 unchanged.
        long_lib_off says why it is off; long_launches counts the launches that ran it.
        The library calls below bind to the thread's current device, which is the model's device inside this
        block; the caller's comes back after."""
        with torch.cuda.device(model.device):
            self._init(model, k_cache, v_cache, max_steps, n_sm, sched, tp_build, fused_mlp, attn_cluster,
                       n_splits, kv_stage_cap, side, qkv_parts, kv_apart, mlp_pairs, mlp_weights)
            self._init_lm_screen(lm_screen, tp_build)
            self.set_long_lib(long_lib)

    def _init_lm_screen(self, want: bool | None, tp_build: bool) -> None:
        """The screened LM head's tables, or why it is off (self.lm_screen_off: None when it can run)."""
        from .lm_screen import quantize, staging_floats
        self.lm8 = self.lm8_scale = self.lm8_c = self.lm8_d = None
        self.lm_over = 0   # launches in which some LMHEAD block had more candidates than LM_CAND_MAX
        rows = max(s.rows["LMHEAD"] for s in (self.sched, self.sched_alone) if s is not None)
        need = staging_floats(rows, self.dims.d)
        if tp_build:
            why = "the tensor-parallel build has no screened LM head"
        elif self.dims.d % 128:   # x's int8 chunks: whole warps of 4-element threads (mk_lmscreen.cuh)
            why = f"hidden size {self.dims.d} is not a multiple of 128"
        elif need > self.stage_floats:
            why = f"{rows} LM-head rows per block need {need} floats of staging, {self.stage_floats} there"
        elif want is False:
            why = "off (lm_screen=False)"
        else:
            why = None
        if why is not None and want:
            raise ValueError(f"lm_screen: {why}")
        self.lm_screen_off = why
        if why is None:
            self.lm8, self.lm8_scale, self.lm8_c, self.lm8_d = quantize(self.lm_head)
            log.info("monokernel: screened LM head (int8 copy, %.0f MB) for launches without top-p or logits output",
                     self.lm8.numel() / 2**20)
        else:
            log.info("monokernel: exact LM head only: %s", why)
        self.lm_mode = "exact" if why is None else f"exact ({why})"
        self._lm_logged: set[str] = set()

    def set_long_lib(self, want: bool | None) -> None:
        """The long-context library (see __init__ long_lib), or why it is off (self.long_lib_off: None when on);
        also after construction (the engine's backend turns it on only where its plain launch cannot take the
        launches that restage)."""
        self.lib_long: ctypes.CDLL | None = None
        self.long_launches = 0
        lib, failed = None, False
        if not self.attn_cluster:
            why = "no cluster launch"
        elif want is False:
            why = "long_lib=False"
        else:
            try:
                lib = load_library(False, True, head_dim=self.cfg.head_dim, kv_overlap=True)
                fit = ctypes.c_int(0)
                _check(lib, lib.mk_max_clusters(self.smem, self.attn_cluster, ctypes.byref(fit)), "cluster occupancy")
                why = None if fit.value * self.attn_cluster >= self.n_main else \
                    f"only {fit.value} clusters of its build resident"
            except Exception as e:   # noqa: BLE001 - no nvcc, a failed build: the default library runs every launch
                why, failed = f"{type(e).__name__}: {e}", True
        if why is not None and want:
            raise ValueError(f"long_lib: {why}")
        self.long_lib_off = why
        if why is None:
            self.lib_long = lib
            log.info("monokernel: launches with more than one staged K / V chunk per split run the build that "
                     "restages them during the loop")
        elif self.attn_cluster:
            (log.warning if failed else log.info)("monokernel: one library for every context: %s", why)

    def restages(self, pos0: int, n_steps: int) -> bool:
        """Whether a launch of n_steps from position pos0 stages some attention split's K / V in more than one chunk
        (at its last step, the longest split)."""
        return longest_split_chunks(pos0 + n_steps, self.sched.n_splits, self.attn_min_pos, self.attn_min_splits,
                                    self.kv_stage_pos) > 1

    def lib_for(self, pos0: int, n_steps: int) -> ctypes.CDLL:
        """The library a launch of n_steps from position pos0 runs: the long-context one where it restages."""
        if self.lib_long is not None and self.restages(pos0, n_steps):
            return self.lib_long
        return self.lib

    def _init(self, model, k_cache, v_cache, max_steps, n_sm, sched, tp_build, fused_mlp,
              attn_cluster, n_splits, kv_stage_cap=None, side=None, qkv_parts=None, kv_apart=None,
              mlp_pairs=None, mlp_weights=None) -> None:
        self.lib = lib = load_library(tp_build, attn_cluster > 0, head_dim=model.cfg.head_dim)
        self.model, self.cfg = model, model.cfg
        dev = model.device
        self.device = dev
        self.dev_index = dev.index if dev.index is not None else torch.cuda.current_device()
        _check(lib, lib.mk_set_device(self.dev_index), "cudaSetDevice")
        if k_cache.dtype != torch.bfloat16 or v_cache.dtype != torch.bfloat16:
            raise ValueError("monokernel needs a bf16 KV cache")
        self.k_cache, self.v_cache = k_cache, v_cache
        cfg = self.cfg
        self.dims = Dims.of(cfg)
        props = torch.cuda.get_device_properties(dev)
        self.attn_cluster = attn_cluster
        self.n_side = 0   # CTAs of the side launch (they follow the main launch's in the schedule)
        if side and not attn_cluster:
            raise ValueError("side: a side launch runs next to a cluster launch only (attn_cluster)")
        if attn_cluster:
            if tp_build or sched is not None:
                raise ValueError("attn_cluster: one-GPU builds with their own schedule only")
            fit = ctypes.c_int(0)
            _check(lib, lib.mk_max_clusters(96 * 1024, attn_cluster, ctypes.byref(fit)), "cluster occupancy")
            if (side is None or side) and n_sm is None:
                self.n_side = props.multi_processor_count - min(props.multi_processor_count // attn_cluster,
                                                                fit.value) * attn_cluster
            n_sm = n_sm or min(props.multi_processor_count // attn_cluster, fit.value) * attn_cluster
        self.n_main = n_sm or props.multi_processor_count   # the main launch's CTAs
        self.n_sm = self.n_main + self.n_side
        if fused_mlp and (tp_build or (sched is not None and not sched.fused_mlp)):
            raise ValueError("the fused MLP runs on the one-GPU build with its own schedule only")
        self.sched_alone: Schedule | None = None   # with a side launch: the main launch's own schedule
        if sched is None:
            fused_mlp = not tp_build if fused_mlp is None else fused_mlp
            n_cl = self.n_main // attn_cluster if attn_cluster else 0
            if kv_apart is None:
                kv_apart = bool(attn_cluster) and qkv_parts != 0 and qkv_parts_default(self.dims, attn_cluster, n_cl,
                                                                                         True) > 0
            if qkv_parts is None:
                qkv_parts = qkv_parts_default(self.dims, attn_cluster, n_cl, kv_apart) if attn_cluster else 0
            if mlp_pairs is None:
                mlp_pairs = mlp_pairs_default(self.dims, attn_cluster, fused_mlp)

            def weights(n: int) -> tuple[float, float]:
                if mlp_weights is not None:
                    return mlp_weights
                return mlp_weights_default(self.dims, n, self.n_main, attn_cluster, qkv_parts, kv_apart, fused_mlp)
            sched = build_schedule(self.dims, self.n_sm, n_splits, fused_mlp=fused_mlp, cluster=attn_cluster,
                                   cluster_ctas=self.n_main if attn_cluster else None, qkv_parts=qkv_parts,
                                   kv_apart=kv_apart, mlp_pairs=mlp_pairs, mlp_weights=weights(self.n_sm))
            if self.n_side:
                self.sched_alone = build_schedule(self.dims, self.n_main, n_splits, fused_mlp=fused_mlp,
                                                  cluster=attn_cluster, qkv_parts=qkv_parts, kv_apart=kv_apart,
                                                  mlp_pairs=mlp_pairs, mlp_weights=weights(self.n_main))
        self.sched: Schedule = sched
        self.fused_mlp = sched.fused_mlp
        # Attention staging after the working buffers (mk_attention.cuh): per position its K row (bf16, padded by
        # KPAD) and V row (bf16) and MAX_GROUP scores. A split's first chunk of positions is copied
        # in before its wait (attn_prefetch); longer splits go through it in chunks of kv_stage_pos positions.
        # Capacity: max(128, max_len / n_splits) positions, bounded by the SM's shared memory, and by
        # L1_KEEP_CARVEOUT where 128 positions fit within it.
        max_len = k_cache.shape[3]
        # the cluster build's receive region for the combine is static shared memory (monokernel.cu cl_recv,
        # MK_RECV_FLOATS: MAX_GROUP x head_dim o values + (max, denominator) pairs of MAX_GROUP heads for up to 16
        # splits), ATTNQ's q / k / v rows (cl_qkv, MK_QKV_RECV_FLOATS: (MAX_GROUP + 2) x head_dim) and a paired
        # MLP's partner rows (cl_h, MK_MLP_PAIR_ROWS)
        recv_floats = isa.MAX_GROUP * cfg.head_dim + 16 * 2 * isa.MAX_GROUP + (isa.MAX_GROUP + 2) * cfg.head_dim + \
            isa.MLP_PAIR_ROWS
        optin = smem_optin(props) - (4 * recv_floats if attn_cluster else 0)
        keep = l1_keep_bytes(props)
        try:
            self.smem_layout = lay = smem_layout(self.sched, max_len, optin, kv_stage_cap, alone=self.sched_alone,
                                                 l1_keep=keep)
        except ValueError as e:
            raise RuntimeError(str(e)) from None
        self.sm_kv, self.stage_capacity, self.stage_floats, self.smem = lay.sm_kv, lay.stage_pos, lay.stage_floats, \
            lay.smem
        self.kv_stage_pos = self.stage_capacity
        # whether the staging stayed within L1_KEEP_CARVEOUT (schedule.smem_layout l1_keep; logged below)
        self.l1_kept = lay.smem <= optin - keep
        occ = ctypes.c_int(0)
        _check(lib, lib.mk_occupancy(self.smem, ctypes.byref(occ)), "occupancy")
        if occ.value < 1:
            raise RuntimeError(f"monokernel CTA does not fit on an SM ({self.smem} B shared memory)")
        if attn_cluster:
            fit = ctypes.c_int(0)
            _check(lib, lib.mk_max_clusters(self.smem, attn_cluster, ctypes.byref(fit)), "cluster occupancy")
            if fit.value * attn_cluster < self.n_main:
                raise ValueError(f"attn_cluster {attn_cluster}: {self.n_main} CTAs, only {fit.value} clusters resident")
        bf = torch.bfloat16
        keep = self._keep = []

        def w(t, dtype=bf):   # weights in the dtype the kernel reads, contiguous (copies only when needed)
            if t is None:
                return None
            t2 = t.to(dtype=dtype).contiguous()
            keep.append(t2)
            return t2

        self.layer_tab = (MkLayer * cfg.n_layers)()
        # ATTNQ (qkv_parts): W_qkv and its bias in the parts' order, each part one run of rows (schedule.attnq_order;
        # with kv_apart that is W_qkv's own order)
        order = torch.tensor(attnq_order(self.dims, self.sched.qkv_parts), device=dev) \
            if self.sched.qkv_parts and not self.sched.kv_apart else None
        for i, lw in enumerate(model.layers):
            # the fused MLP reads Wd^T (its DOWN share is a slice of Wd's columns): one transposed copy per layer
            wdt = w(lw.wd.t()) if self.fused_mlp else None
            wqkv, bqkv = lw.wqkv, lw.bqkv
            if order is not None:
                wqkv, bqkv = wqkv[order], (bqkv[order] if bqkv is not None else None)
            self.layer_tab[i] = MkLayer(_ptr(w(lw.ln1, torch.float32)), _ptr(w(wqkv)),
                                        _ptr(w(bqkv, torch.float32)), _ptr(w(lw.wo)),
                                        _ptr(w(lw.ln2, torch.float32)), _ptr(w(lw.wgu)), _ptr(w(lw.wd)), _ptr(wdt))
        self.layers_dev = torch.frombuffer(bytearray(bytes(self.layer_tab)), dtype=torch.uint8).to(dev)
        self.embed = w(model.embed)
        self.lm_head = self.embed if model.lm_head is model.embed else w(model.lm_head)
        self.final_norm = w(model.norm, torch.float32)
        from engine.model import rope_inv_freq
        self.inv_freq = rope_inv_freq(cfg).float().to(dev)
        dm, sc = self.dims, self.sched
        f32 = dict(dtype=torch.float32, device=dev)
        i32 = dict(dtype=torch.int32, device=dev)
        self.x = torch.zeros(dm.d, **f32)
        self.qkv = torch.zeros(dm.q_dim + 2 * dm.kv_dim, **f32)
        self.attn = torch.zeros(dm.q_dim, **f32)
        self.h = torch.zeros(dm.ffn, **f32)
        self.acc = torch.zeros(dm.d, dtype=torch.int64, device=dev) if self.fused_mlp else None
        self.part = torch.zeros(dm.n_kv * sc.n_splits * dm.group * (dm.head_dim + 2), **f32)
        self.lmrec = torch.zeros(sc.n_lm * isa.REC_WORDS, **f32)
        self.ctr = torch.zeros(sc.n_counters, **i32)
        self.status = torch.zeros(isa.STATUS_WORDS, **i32)
        self.max_steps = max_steps
        self.out_tokens = torch.zeros(max_steps, **i32)
        self.forced = torch.zeros(max_steps + 1, **i32)
        self.stop_ids = torch.zeros(64, **i32)
        self._stop_written: list[int] = []   # what self.stop_ids holds (params copies only a changed list)
        self._fixed: MkParams | None = None   # the launch parameters no launch changes (params)
        off, ins = sc.flat()
        self.sm_off = torch.from_numpy(off).to(dev)
        self.instr = torch.from_numpy(ins).contiguous().to(dev)
        self.max_instr = int((off[1:] - off[:-1]).max())
        self.sm_off_alone = self.instr_alone = None
        if self.sched_alone is not None:
            off_a, ins_a = self.sched_alone.flat()
            self.sm_off_alone = torch.from_numpy(off_a).to(dev)
            self.instr_alone = torch.from_numpy(ins_a).contiguous().to(dev)
            self.max_instr = max(self.max_instr, int((off_a[1:] - off_a[:-1]).max()))
        for s_ in (sc, self.sched_alone):
            if s_ is not None and not sampler_fits(s_.n_lm, self.smem_layout.sampler_floats):
                raise ValueError(f"{s_.n_lm} LM-head blocks: their candidates do not fit the sampler's shared memory "
                                 f"({self.smem_layout.sampler_floats} floats)")
        self.host_tokens = HostBuffer(lib, max_steps)
        self.host_stat = HostBuffer(lib, isa.HOST_WORDS)
        self.cancel_flag = HostBuffer(lib, 1)
        vec = max(dm.d, dm.q_dim, dm.ffn)
        self.layout = dict(sm_vec=0, sm_red=vec, sm_out=vec + isa.SMEM_RED_FLOATS, sm_scr=0, sm_kv=self.sm_kv,
                           sm_tab=self.smem_layout.sm_tab)
        self.running = False
        self.stream = None
        # The side launch: its stream, how long the main launch waits for it at each start (the two-launch probe:
        # resident 4-8 us after the main launch's first CTA), and the launches the main one ran alone.
        self.side_stream = torch.cuda.Stream(dev) if self.n_side else None
        self.side_wait_ns = 200_000
        self.side_alone = 0
        self.side_error: str | None = None   # the side launch failed to start: later launches run without it
        # Attention splits hold at least attn_min_pos positions (fewer, longer splits at short contexts: a cheaper
        # merge; bench/decode.py sweeps it), and at context n at most max(attn_min_splits, ceil(n / kv_stage_pos))
        # of them: one staged chunk per split (0: no such bound). Per model: schedule.attn_split_defaults.
        self.attn_min_pos, self.attn_min_splits = attn_split_defaults(self.dims, attn_cluster)
        log.info("monokernel: %d CTAs x %d threads, %d instructions/step, %d attention splits per kv head (in use: "
                 ">= %d positions each, at most max(%d, one staged chunk each)), %d B shared memory (%d positions "
                 "staged per chunk, %s), %s MLP, %s",
                 self.n_sm, isa.NTHREADS, len(ins), sc.n_splits, self.attn_min_pos, self.attn_min_splits, self.smem,
                 self.stage_capacity, f"within the {L1_KEEP_CARVEOUT >> 10} KiB carveout that leaves the L1 its share"
                 if self.l1_kept else f"beyond the {L1_KEEP_CARVEOUT >> 10} KiB carveout: fewer than "
                 f"{L1_KEEP_MIN_POS} positions fit within it, the L1 shrinks",
                 "fused" if self.fused_mlp else "GATEUP + DOWN",
                 (f"attention combined in clusters of {self.attn_cluster}"
                  + (f", QKV inside them ({sc.qkv_parts} parts per kv head"
                     f"{', k / v apart' if sc.kv_apart else ''})" if sc.qkv_parts else ""))
                 if self.attn_cluster else "no clusters")
        if self.n_side:
            log.info("monokernel: side launch of %d CTAs on the SMs the clusters leave idle (%d instructions/step "
                     "with it, %d alone)", self.n_side, len(ins), int(self.instr_alone.shape[0]))
        # A wait longer than this (~1 s at H200 clocks) aborts the launch and reports the stuck counter.
        self.watchdog_cycles = 2_000_000_000
        # L2 prefetch of each instruction's first weight bytes before its wait (0 = off); see bench/NOTES.md.
        self.prefetch_bytes = 0
        # Issue each matvec's first batch of weight loads before spinning on its inputs.
        self.early_loads = 1
        # The warp whose lane 0 releases each stage's counter (mk_block.cuh signal_ctr; 0: thread 0).
        self.signal_warp = isa.NWARPS - 1
        # enable_trace(step) sets this: [n_sm, max_instr, TRACE_WORDS] int64 globaltimer stamps of one step.
        self.trace_buf: torch.Tensor | None = None
        self.trace_step = 0

    # ---- launch ----
    def launch(self, slot: int, token: int, pos0: int, n_steps: int, temperature: float = 0.0, top_p: float = 1.0,
               seed: int | None = None, stop_ids=(), forced: list[int] | None = None,
               logits_out: torch.Tensor | None = None) -> None:
        """Start the token loop (asynchronous). forced: tokens fed at steps 0.. (teacher forcing, len >= n_steps);
        logits_out: fp32 [n_steps, V] receives every step's logits."""
        p = self.params(slot, token, pos0, n_steps, temperature, top_p, seed, stop_ids, forced, logits_out)
        self.stream = torch.cuda.current_stream(self.device)
        lib = self.lib_for(pos0, n_steps)
        self.long_launches += lib is not self.lib
        with _keeps_device():
            lib.mk_set_device(self.dev_index)   # per host thread and library: the engine worker may not be the creator
            if self.side_active:
                ps = MkParams.from_buffer_copy(p)
                ps.cta0 = self.n_main
                if self.trace_buf is not None:   # the side's CTAs stamp rows n_main.. (monokernel.cu trace)
                    ps.trace = _ptr(self.trace_buf[self.n_main:])
                err = lib.mk_launch_pair(ctypes.byref(p), ctypes.byref(ps), self.n_main, self.n_side, self.smem,
                                         ctypes.c_void_p(self.stream.cuda_stream),
                                         ctypes.c_void_p(self.side_stream.cuda_stream), self.sched.n_counters)
                if err < 0:   # the main launch runs (alone, after side_wait_ns); later ones without the side
                    self.side_error = f"CUDA error {-err} ({lib.mk_error_string(-err).decode()})"
                    log.warning("monokernel: the side launch failed to start (%s): launching without it from now on",
                                self.side_error)
                    err = 0
            else:
                err = lib.mk_launch(ctypes.byref(p), self.n_main, self.smem,
                                    ctypes.c_void_p(self.stream.cuda_stream), self.sched.n_counters)
        _check(lib, err, "monokernel launch")
        self.running = True
        self.n_steps = n_steps

    def params(self, slot: int, token: int, pos0: int, n_steps: int, temperature: float = 0.0, top_p: float = 1.0,
               seed: int | None = None, stop_ids=(), forced: list[int] | None = None,
               logits_out: torch.Tensor | None = None) -> MkParams:
        """The launch parameters (kept in self._params) and the host-side resets of a launch; tp_size 1."""
        if self.running:
            raise RuntimeError("monokernel: a launch is still running")
        dm = self.dims
        if not 1 <= n_steps <= self.max_steps:
            raise ValueError(f"n_steps {n_steps} outside 1..{self.max_steps}")
        if pos0 + n_steps > self.k_cache.shape[3]:
            raise ValueError("KV cache too short for this many steps")
        stop_ids = list(stop_ids)[:64]
        if stop_ids and stop_ids != self._stop_written:   # a copy from pageable memory waits for the stream
            self.stop_ids[:len(stop_ids)].copy_(torch.tensor(stop_ids, dtype=torch.int32))
            self._stop_written = stop_ids
        if forced is not None:
            self.forced[:n_steps].copy_(torch.tensor(list(forced[:n_steps]), dtype=torch.int32))
        if logits_out is not None:
            assert logits_out.dtype == torch.float32 and logits_out.is_contiguous()
            assert logits_out.numel() >= n_steps * dm.vocab
        for i in range(isa.HOST_WORDS):
            self.host_stat.arr[i] = 0
        self.cancel_flag.arr[0] = 0
        if seed is None:
            seed = random.getrandbits(63)
        p = MkParams.from_buffer_copy(self._fixed_params())
        item = self.k_cache.element_size()
        p.k_cache = self.k_cache.data_ptr() + slot * self.k_cache.stride(0) * item
        p.v_cache = self.v_cache.data_ptr() + slot * self.v_cache.stride(0) * item
        if self.n_side and not self.side_active:   # the side launch failed once: its schedule's lists are not run
            p.instr, p.sm_off = p.instr_alone, p.sm_off_alone
        p.n_resident = self.n_sm if self.side_active else 0
        p.side_wait_ns = int(self.side_wait_ns)
        p.forced = _ptr(self.forced) if forced is not None else None
        p.logits_out = _ptr(logits_out)
        p.seed = seed & ((1 << 64) - 1)
        p.watchdog_cycles = int(self.watchdog_cycles)
        p.prefetch_bytes = int(self.prefetch_bytes)
        if self.acc is not None:   # the MLP output accumulator starts at zero (same stream as the launch)
            self.acc.zero_()
        p.early_loads = int(self.early_loads)
        if not 0 <= self.signal_warp < isa.NWARPS:
            raise ValueError(f"signal_warp {self.signal_warp} outside 0..{isa.NWARPS - 1}")
        p.signal_warp = int(self.signal_warp)
        p.attn_min_pos = int(self.attn_min_pos)
        p.attn_min_splits = int(self.attn_min_splits)
        if not 1 <= self.kv_stage_pos <= self.stage_capacity:
            raise ValueError(f"kv_stage_pos {self.kv_stage_pos} outside 1..{self.stage_capacity}")
        p.kv_stage_pos = int(self.kv_stage_pos)
        p.attn_cluster = int(self.attn_cluster)
        p.trace = _ptr(self.trace_buf)
        p.trace_step = int(self.trace_step)
        p.temperature, p.top_p = float(temperature), float(top_p)
        p.pos0, p.n_steps, p.first_token, p.n_stop = pos0, n_steps, int(token), len(stop_ids)
        self._set_lm_screen(p, top_p, logits_out)
        self._params = p
        return p

    def _fixed_params(self) -> MkParams:
        """The launch parameters that no launch changes (buffers allocated at construction, the model's dimensions,
        the shared-memory layout), built at the first launch, not at construction, so a tool that swaps one of those
        buffers before launching is seen (bench/experiments/weight-arena-time.py's layers_dev); params copies them and
        sets the rest (setting every field per launch was the largest Python part of a launch under cProfile; the
        host-time gain measured alone was within noise: bench/NOTES.md, session 35)."""
        if self._fixed is None:
            dm, sc = self.dims, self.sched
            p = MkParams()
            p.layers, p.embed, p.lm_head = self.layers_dev.data_ptr(), _ptr(self.embed), _ptr(self.lm_head)
            p.final_norm, p.inv_freq = _ptr(self.final_norm), _ptr(self.inv_freq)
            p.x, p.qkv, p.attn, p.h, p.part = (_ptr(t) for t in (self.x, self.qkv, self.attn, self.h, self.part))
            p.lmrec, p.ctr, p.status = _ptr(self.lmrec), _ptr(self.ctr), _ptr(self.status)
            p.instr, p.sm_off = _ptr(self.instr), _ptr(self.sm_off)
            if self.n_side:
                p.instr_alone, p.sm_off_alone = _ptr(self.instr_alone), _ptr(self.sm_off_alone)
            p.cta0 = 0
            p.out_tokens = _ptr(self.out_tokens)
            p.host_tokens, p.host_stat, p.cancel = self.host_tokens.dev, self.host_stat.dev, self.cancel_flag.dev
            p.stop_ids = _ptr(self.stop_ids)
            p.acc = _ptr(self.acc)
            p.stage_floats = self.stage_floats
            p.trace_stride = self.max_instr
            p.eps, p.attn_scale = dm.eps, dm.head_dim ** -0.5
            p.d, p.q_dim, p.kv_dim, p.ffn, p.vocab = dm.d, dm.q_dim, dm.kv_dim, dm.ffn, dm.vocab
            p.n_layers, p.n_kv, p.head_dim, p.group = dm.n_layers, dm.n_kv, dm.head_dim, dm.group
            p.n_splits, p.max_len, p.n_lm = sc.n_splits, self.k_cache.shape[3], sc.n_lm
            for k, v in self.layout.items():
                setattr(p, k, v)
            p.token_ctr = isa.token_counter(dm.n_layers)
            p.tp_rank, p.tp_size = 0, 1
            self._fixed = p
        return self._fixed

    def _set_lm_screen(self, p: MkParams, top_p: float, logits_out) -> None:
        """The screened LM head for this launch where it gives the exact head's tokens; lm_mode says which ran."""
        why = self.lm_screen_off
        if why is None and logits_out is not None:
            why = "logits output"
        elif why is None and top_p < 1.0:
            why = "top-p"
        if why is None:
            p.lm8, p.lm8_scale = _ptr(self.lm8), _ptr(self.lm8_scale)
            p.lm8_c, p.lm8_d = _ptr(self.lm8_c), _ptr(self.lm8_d)
            self.lm_mode = "screened"
        else:
            self.lm_mode = f"exact ({why})"
            if self.lm_screen_off is None and why not in self._lm_logged:   # once per reason
                self._lm_logged.add(why)
                log.info("monokernel: exact LM head for launches with %s (the screened head cannot give those)", why)

    @property
    def side_active(self) -> bool:
        """Launches start the side launch (n_side > 0 and it has not failed to start)."""
        return self.n_side > 0 and self.side_error is None

    def ran_alone(self) -> bool:
        """The last launch had a side launch planned and ran without it (main launch's own schedule)."""
        return self.n_side > 0 and (self.side_error is not None or self.host_stat.arr[isa.HOST_ALONE] != 0)

    def enable_trace(self, step: int | None) -> None:
        """Record per-instruction timestamps of token step `step` in every later launch (None: off); read them
        with trace_records() after the launch. Tracing only adds a few stores by thread 0: results do not change."""
        if step is None:
            self.trace_buf = None
            return
        self.trace_step = int(step)
        self.trace_buf = torch.zeros(self.n_sm, self.max_instr, isa.TRACE_WORDS, dtype=torch.int64,
                                     device=self.device)

    def trace_records(self) -> list[dict]:
        """One dict per executed instruction of the traced step: sm, index, op, layer, t_wait, t_ready, t_done,
        t_mv (matvec start, or an ATTN split's ticket), t_q and t_loop (ATTN splits with positions: q ready, position
        loop done); ns from the earliest stamp, None where not stamped."""
        if self.trace_buf is None:
            raise RuntimeError("tracing is off (enable_trace)")
        tr = self.trace_buf.cpu()
        off, ins = (self.sched_alone if self.ran_alone() else self.sched).flat()
        t0 = int(tr[tr > 0].min()) if (tr > 0).any() else 0
        recs = []
        for sm in range(len(off) - 1):
            for i in range(int(off[sm + 1] - off[sm])):
                a, b, c, mv, q, lp = (int(v) for v in tr[sm, i])
                if a == 0:
                    continue
                op, layer = int(ins[off[sm] + i][0]), int(ins[off[sm] + i][1])
                rel = lambda t: t - t0 if t else None  # noqa: E731
                recs.append(dict(sm=sm, index=i, op=op, layer=layer, t_wait=a - t0, t_ready=b - t0, t_done=c - t0,
                                 t_mv=rel(mv), t_q=rel(q), t_loop=rel(lp)))
        return recs

    # ---- streaming side (host polls mapped memory) ----
    def count(self) -> int:
        return self.host_stat.arr[isa.HOST_COUNT]

    def done(self) -> bool:
        return self.host_stat.arr[isa.HOST_DONE] != 0

    def token(self, i: int) -> int:
        return self.host_tokens.arr[i]

    def reason(self) -> str:
        return isa.REASONS.get(self.host_stat.arr[isa.HOST_REASON], "unknown")

    def cancel(self) -> None:
        self.cancel_flag.arr[0] = 1

    def kernel_finished(self) -> bool:
        return self.stream is None or self.stream.query()

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the launch ends; raises TimeoutError after timeout_s (the kernel keeps running) and
        RuntimeError if the in-kernel watchdog aborted it or the sampler found no finite logit (no_token)."""
        if not self.running:
            return
        if timeout_s is not None:
            t_end = time.monotonic() + timeout_s
            while not self.stream.query():
                if time.monotonic() > t_end:
                    raise TimeoutError(f"monokernel still running after {timeout_s} s: {self.debug_state()}")
                time.sleep(1e-3)
        self.stream.synchronize()   # the main stream waits for the side launch too (mk_launch_pair)
        self.running = False
        if self.side_active and self.ran_alone():
            self.side_alone += 1
            log.warning("monokernel: the side launch's %d CTAs were not resident within %d us of the main launch "
                        "(another kernel on the GPU?): this launch ran on the main launch's %d CTAs alone "
                        "(%d such launches)", self.n_side, self.side_wait_ns // 1000, self.n_main, self.side_alone)
        if self.host_stat.arr[isa.HOST_LM_OVER]:
            self.lm_over += 1
            log.info("monokernel: screened LM head: more than %d candidate rows in a block, which ran its rows "
                     "exactly (%d such launches)", isa.LM_CAND_MAX, self.lm_over)
        if self.host_stat.arr[isa.HOST_REASON] == 4:
            raise RuntimeError(f"monokernel watchdog fired: {self.debug_state()}")
        if self.reason() == "no_token":
            raise RuntimeError(no_token_message(self.count()))

    def debug_state(self) -> dict:
        a = self.host_stat.arr
        return {"tokens": a[isa.HOST_COUNT], "done": a[isa.HOST_DONE], "reason": self.reason(),
                "wd_block": a[isa.HOST_WD_BLOCK], "wd_ctr": a[isa.HOST_WD_CTR], "wd_target": a[isa.HOST_WD_TARGET],
                "wd_value": a[isa.HOST_WD_VALUE], "wd_step": a[isa.HOST_WD_STEP]}

    def run(self, *args, timeout_s: float = 120.0, **kw) -> tuple[list[int], str]:
        """launch + wait -> (tokens, finish reason)."""
        self.launch(*args, **kw)
        self.wait(timeout_s)
        n = self.count()
        return [self.token(i) for i in range(n)], self.reason()
