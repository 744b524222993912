"""Tensor-parallel monokernel backend (tp > 1): one persistent decode kernel per GPU (kernels/tp_runtime.py
TPMonokernel), partial sums exchanged inside the kernels, vocabulary-parallel LM head, tokens streamed from rank 0.

The engine's KVCache (full heads, on the first GPU) stays the one source of truth that the prefix cache, prefill
and scoring read and write, as with every other backend. Each rank decodes from its own cache holding its KV heads
(kernels/tp_local.py shard_cache: heads plan.ranks[r].kv_heads, replicated heads on every holder), so:
- before a launch, the positions of the slot that the ranks' caches do not hold yet (a fresh prefill, a slot the
  prefix cache rebuilt) are copied into them (KVMirror.sync);
- after it, the decoded positions' K/V are copied back from the ranks into the full cache (KVMirror.gather), so
  the next prefill, the prefix cache and a single-GPU reader see exactly what the kernels computed.
Prefill runs on the first GPU as in MonokernelBackend (PrefillGraphs); decode, decode_loop, cancellation and
streaming are MonokernelBackend's, around the launch hooks.

tp_mode "delayed" (Laneformer lane checkpoints only, engine/lanes/serving.py LaneServingModel): GPU l runs lane l
(TPMonokernel(mode="delayed") on the LaneModel). The engine's KVCache holds all lanes' KV heads lane-major with keys
in the kernel's layout (what load_cache reads), so the same KVMirror copies rank r's heads (tp_local.lane_kv_bounds)
in and the decoded positions back; prefill is the lane reference forward on the first GPU (LanePrefill, eager).
A mode / checkpoint mismatch, a lane count other than tp, or a kernel without a `mode` keyword is refused, saying why.
"""
from __future__ import annotations

import inspect
import logging
import time

import torch

from .base import Backend, BackendUnavailable
from .graph import PrefillGraphs
from .monokernel import MonokernelBackend

log = logging.getLogger("engine")


class KVMirror:
    """Keeps the ranks' KV caches equal to the engine's full cache on the positions a launch reads.

    valid[s]: positions [0, valid[s]) of slot s are equal in the full cache and in every rank's shard of it. The
    full cache changes behind the ranks' backs in two ways only: a prefill writes from its start position on
    (the backend calls `invalidate`), and KVCache.acquire copies a prefix from another slot, which it does by
    giving the slot a new `ids` list (an object identity change this class watches; in-place edits of the list,
    record / truncate / reset, do not touch the tensors)."""

    def __init__(self, kv_bounds, k_full: torch.Tensor, v_full: torch.Tensor, k_ranks, v_ranks, slots):
        self.kv_bounds = [tuple(b) for b in kv_bounds]    # rank r holds full-cache KV heads [k0, k1)
        self.k_full, self.v_full = k_full, v_full
        self.k_ranks, self.v_ranks = list(k_ranks), list(v_ranks)
        self.slots = slots                      # KVCache.slots (watched for a replaced ids list)
        n = k_full.shape[0]
        self.valid = [0] * n
        self._ids = [s.ids for s in slots]
        # Each KV head is given back by the lowest rank holding it (replicated heads are equal on all holders).
        self.primary: list[tuple[int, int]] = []
        done = 0
        for k0, k1 in self.kv_bounds:
            a = max(k0, done)
            self.primary.append((a, max(a, k1)))
            done = max(done, k1)
        self.to_ranks = 0                       # positions copied into the ranks (over all syncs)
        self.from_ranks = 0                     # positions copied back

    def reset(self) -> None:
        """Trust nothing: every slot is copied again at its next launch."""
        self.valid = [0] * len(self.valid)

    def invalidate(self, slot: int, start: int) -> None:
        """The full cache of `slot` was written from position `start` on."""
        self.valid[slot] = min(self.valid[slot], start)

    def sync(self, slot: int, pos: int) -> int:
        """Make the ranks hold positions [0, pos) of `slot`; returns how many positions were copied."""
        ids = self.slots[slot].ids
        if ids is not self._ids[slot]:          # KVCache.acquire rebuilt this slot from another one
            self._ids[slot] = ids
            self.valid[slot] = 0
        p0 = self.valid[slot]
        if p0 >= pos:
            return 0
        for r, (k0, k1) in enumerate(self.kv_bounds):
            self.k_ranks[r][slot, :, :, p0:pos].copy_(self.k_full[slot, :, k0:k1, p0:pos])
            self.v_ranks[r][slot, :, :, p0:pos].copy_(self.v_full[slot, :, k0:k1, p0:pos])
        self.valid[slot] = pos
        self.to_ranks += pos - p0
        return pos - p0

    def gather(self, slot: int, p0: int, p1: int) -> None:
        """The ranks wrote positions [p0, p1) of `slot`: copy them into the full cache."""
        if p1 <= p0:
            return
        for r, (k0, _) in enumerate(self.kv_bounds):
            a, b = self.primary[r]
            if a == b:
                continue
            self.k_full[slot, :, a:b, p0:p1].copy_(self.k_ranks[r][slot, :, a - k0:b - k0, p0:p1])
            self.v_full[slot, :, a:b, p0:p1].copy_(self.v_ranks[r][slot, :, a - k0:b - k0, p0:p1])
        self.from_ranks += p1 - p0
        if self.valid[slot] >= p0:
            # Exactly p1, not more: a cancelled launch may have written a position or two past p1 on some ranks.
            self.valid[slot] = p1


def rank_devices(device, tp: int, n_gpus: int) -> list[torch.device]:
    """tp consecutive GPUs starting at the model's (rank 0 = the model's GPU: prefill, logits and streaming stay
    there), wrapping around."""
    dev = torch.device(device)
    first = dev.index if dev.index is not None else torch.cuda.current_device()
    if tp > n_gpus:
        raise BackendUnavailable(f"tp={tp} needs {tp} GPUs; this machine has {n_gpus}")
    return [torch.device("cuda", (first + r) % n_gpus) for r in range(tp)]


def lane_rank_config(cfg):
    """The Llama-shaped config each GPU runs for a lane model (engine/lanes/serving.py LaneServingConfig), for the
    single-GPU shape checks (MonokernelBackend.supported); None for an ordinary config."""
    lanes = getattr(cfg, "lanes", None)
    if lanes is None:
        return None
    from engine.config import ModelConfig
    return ModelConfig(arch="llama", vocab_size=cfg.vocab_size, hidden_size=lanes.hidden_size,
                       n_layers=lanes.num_layers, n_heads=lanes.heads_per_lane, n_kv_heads=lanes.kv_heads_per_lane,
                       intermediate_size=lanes.ffn_per_lane, head_dim=lanes.head_dim, name=cfg.name)


def kernel_mode_kwargs(model, tp: int, tp_mode: str, tp_kernel_cls) -> dict:
    """TPMonokernel keywords for tp_mode. exact: none (the kernel's default). delayed: mode="delayed", only for a
    lane model (an engine.lanes.LaneModel, or a model marked `checkpoint_kind == "lane"` with its `lane_config`)
    and only when the kernel has a delayed mode. A mode / checkpoint mismatch raises engine.lanes.TPModeError (its
    message says which)."""
    from ..lanes import LaneModel, check_tp_mode
    if isinstance(model, LaneModel):
        kind, lanes = "lane", model.cfg
    else:
        kind, lanes = getattr(model, "checkpoint_kind", "dense"), getattr(model, "lane_config", None)
    check_tp_mode(kind, tp_mode, tp, getattr(lanes, "num_lanes", None))
    if tp_mode == "exact":
        return {}
    if tp < 2:
        raise BackendUnavailable("tp_mode='delayed' with tp=1 simulates every lane on one device: that is the "
                                 "reference lane model (engine.lanes.LaneModel), not a kernel backend")
    if "mode" not in inspect.signature(tp_kernel_cls).parameters:
        raise BackendUnavailable("tp_mode='delayed' needs the delayed-exchange tensor-parallel kernel "
                                 "(kernels.tp_runtime.TPMonokernel(mode='delayed')); this build has exact mode only")
    return {"mode": "delayed"}


# Why the tensor-parallel backend runs no short prefill chunk as kernel steps (MonokernelBackend.prefill).
KERNEL_PREFILL_OFF = "tensor-parallel: a kernel prefill would also copy K / V between the ranks; not measured"


class TPMonokernelBackend(MonokernelBackend):
    name = "monokernel"        # what --backend asks for; describe() and stats() say tp
    supports_tp = True

    KERNEL_PREFILL = False   # prefill chunks stay on the graphs (KERNEL_PREFILL_OFF says why; stats and log too)

    @staticmethod
    def supported(config, device) -> tuple[bool, str]:
        """MonokernelBackend's checks; for a lane model on the shape every GPU runs (one lane)."""
        lane = lane_rank_config(config)
        return MonokernelBackend.supported(lane if lane is not None else config, device)

    def __init__(self, model, cache, tp: int = 2, tp_mode: str = "exact", max_steps: int = 4096):
        Backend.__init__(self, model, cache, tp, tp_mode)
        if tp < 2 and tp_mode == "exact":
            raise BackendUnavailable("the tensor-parallel monokernel needs tp >= 2 (tp=1 is MonokernelBackend)")
        from kernels.tp_runtime import TPMonokernel, TPUnavailableError
        mode_kw = kernel_mode_kwargs(model, tp, tp_mode, TPMonokernel)
        delayed = mode_kw.get("mode") == "delayed"
        ok, why = self.supported(model.cfg, model.device)
        if not ok:
            raise BackendUnavailable(why)
        if cache.k.dtype != torch.bfloat16:
            raise BackendUnavailable(f"monokernel needs a bf16 KV cache (got {cache.k.dtype})")
        from engine.tp.shard import ShardError
        from kernels.tp_local import kernel_plan, lane_plan
        try:   # cheap shape checks before any GPU memory is touched
            if delayed:
                lane_plan(model.lane_config, tp, max_len=cache.max_len)
            else:
                kernel_plan(model.cfg, tp)
        except ShardError as e:
            raise BackendUnavailable(f"tp={tp}: {e}") from e
        devices = rank_devices(model.device, tp, torch.cuda.device_count())
        try:
            # delayed: the kernel takes the LaneModel itself (its weights in the published lane layout)
            kernel = TPMonokernel(model.lane if delayed else model, devices, max_len=cache.max_len,
                                  slots=cache.n_slots, max_steps=max_steps, vocab_parallel=True, **mode_kw)
        except TPUnavailableError as e:
            raise BackendUnavailable(str(e)) from e
        self._attach(kernel)
        log.info("monokernel backend ready: %s", self.describe())

    def _attach(self, kernel) -> None:
        """Everything around a built kernel (TPMonokernel's interface: plan, devices, k_caches / v_caches, launch,
        count, token, done, cancel, wait, kernel_finished, exchange_wait_us, n_steps, max_steps; delayed mode:
        lanes instead of plan)."""
        model, cache = self.model, self.cache
        self.mk = kernel
        # kv_bounds: rank r's heads of the full cache (exact: plan.ranks[r].kv_heads, the rule of
        # tp_local.shard_cache; delayed: tp_local.lane_kv_bounds)
        bounds = getattr(kernel, "kv_bounds", None) or [s.kv_heads for s in kernel.plan.ranks]
        self.mirror = KVMirror(bounds, cache.k, cache.v, kernel.k_caches, kernel.v_caches, cache.slots)
        self._logits = torch.empty(1, model.cfg.vocab_size, dtype=torch.float32, device=kernel.devices[0])
        self._clock_sums: dict[str, list] = {}     # _LaunchClock totals (monokernel.py)
        self.stats = {"launches": 0, "tokens": 0, "cancelled": 0, "tp": self.tp, "tp_mode": self.tp_mode,
                      "tp_devices": [str(d) for d in kernel.devices], "vocab_parallel": kernel.vocab_parallel,
                      "exchange_wait_us": None, "exchange_wait_max_us": None, "exchange_wait_mean_us": None,
                      "kv_to_ranks_positions": 0, "kv_from_ranks_positions": 0,
                      "kv_copy_host_ms": 0.0,   # host time issuing the K/V copies (they run async)
                      "kernel_prefill_max": 0, "kernel_prefill": f"off ({KERNEL_PREFILL_OFF})"}
        self._xw_sum, self._xw_steps = 0.0, 0     # per-token exchange wait summed over launches, for the mean
        log.info("tp monokernel: no kernel prefill of short chunks (%s)", KERNEL_PREFILL_OFF)
        lanes = getattr(kernel, "lanes", None)
        if lanes is not None:
            # A lane model: its reference forward prefills into the lane-major cache (no CUDA graphs for it).
            from engine.lanes.serving import LanePrefill
            self.stats["lanes"] = lanes.describe()
            self.prefill_graphs = LanePrefill(model, cache)
            log.info("tp monokernel delayed: prefill runs the lane reference model eagerly on %s", model.device)
        else:
            self.prefill_graphs = PrefillGraphs(model, cache)

    def warmup(self) -> None:
        super().warmup()
        # The graph captures wrote K/V at the head of every slot without going through prefill().
        self.mirror.reset()

    def describe(self) -> str:
        m = self.mk
        s = m.ranks[0].sched
        return (f"monokernel tp={self.tp} {self.tp_mode} on {', '.join(str(d) for d in m.devices)} "
                f"({m.n_sm} CTAs per GPU, rank 0 {sum(map(len, s.per_sm))} instructions/step, "
                f"{'vocabulary-parallel' if m.vocab_parallel else 'replicated'} LM head; {m.describe()})")

    def prefill(self, slot, ids, start_pos, all_logits=False):
        self.mirror.invalidate(slot, start_pos)   # the graphs write K/V from start_pos on (a padded tail included)
        return super().prefill(slot, ids, start_pos, all_logits)

    def _before_launch(self, slot: int, pos: int) -> None:
        t0 = time.perf_counter()
        if self.mirror.sync(slot, pos):
            self.stats["kv_copy_host_ms"] += (time.perf_counter() - t0) * 1e3
        self.stats["kv_to_ranks_positions"] = self.mirror.to_ranks

    def _after_run(self, slot: int, pos: int, ok: bool) -> None:
        if not ok:
            # A failed launch (watchdog): the ranks' K/V past pos are not trusted and were not copied back, so the
            # slot must not claim those tokens (the engine recorded the ones it had streamed).
            self.mirror.invalidate(slot, pos)
            self.cache.truncate(slot, min(pos, len(self.cache.slots[slot].ids)))
            return
        m = self.mk
        n = m.count()
        t0 = time.perf_counter()
        self.mirror.gather(slot, pos, pos + n)
        self.stats["kv_copy_host_ms"] += (time.perf_counter() - t0) * 1e3
        self.stats["kv_from_ranks_positions"] = self.mirror.from_ranks
        if n >= 2:
            self._record_exchange_wait(n)

    def _record_exchange_wait(self, ran: int) -> None:
        """exchange_wait_us() divides by the launch's n_steps - 1; a stopped or cancelled launch ran fewer."""
        w = self.mk.exchange_wait_us()
        scale = max(1, self.mk.n_steps - 1) / max(1, ran - 1)
        mean, mx = w["mean_us"] * scale, w["max_us"] * scale
        self.stats["exchange_wait_us"] = round(mean, 3)        # per token, last multi-token launch
        self.stats["exchange_wait_max_us"] = round(mx, 3)
        self._xw_sum += mean * (ran - 1)
        self._xw_steps += ran - 1
        self.stats["exchange_wait_mean_us"] = round(self._xw_sum / self._xw_steps, 3)   # over all launches
