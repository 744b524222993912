"""Monokernel backend: the whole decode loop (all layers, LM head, sampling, stop checks) runs inside one
persistent CUDA kernel (kernels/). Tokens stream back through mapped host memory while it runs; cancellation
is a host-written flag the kernel polls once per token.

Prefill runs the reference model (same weights, same KV layout) from CUDA graphs, except chunks short enough to
run faster as teacher-forced kernel steps (kernel_prefill.py, timed at warm-up); decode and decode_loop run the
kernel.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from typing import Iterator

import torch

from ..sampling import SamplingParams
from . import kernel_prefill
from .base import Backend, BackendUnavailable
from .graph import PrefillGraphs

log = logging.getLogger("engine")


def launch_seed(sampling: SamplingParams, generator: torch.Generator | None) -> int:
    """The kernel's sampling seed: the request's, else drawn from its generator, else random."""
    if sampling.seed is not None:
        return sampling.seed
    if generator is not None:
        return int(torch.randint(0, 2 ** 62, (1,), generator=generator))
    return random.getrandbits(62)


def backend_class(tp: int, tp_mode: str):
    """The monokernel class that serves this request: the single-GPU kernel for tp=1 exact, else the
    tensor-parallel one (tp_monokernel.py; imported here so a machine that never asks for tp > 1 never loads it)."""
    if tp == 1 and tp_mode == "exact":
        return MonokernelBackend
    from .tp_monokernel import TPMonokernelBackend
    return TPMonokernelBackend


class _LaunchClock:
    """Host-side timing of one token-loop launch, averaged into the backend's stats over all launches: what the
    host spends starting it (`launch_host_us`: parameters, K/V hooks, the launch call), launch to first token
    seen (`first_token_us`: kernel start + its first step + polling), the mean gap between later tokens
    (`token_interval_us`: the kernel's step time as the host sees it) and last token to the launch's end
    (`finish_us`: cancel, wait, K/V hooks). The editor-loop bench reads them to split decode time."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.t_launched = self.t_first = self.t_last = None
        self.n = 0

    def launched(self) -> None:
        self.t_launched = time.perf_counter()

    def token(self) -> None:
        t = time.perf_counter()
        if self.t_first is None:
            self.t_first = t
        self.t_last, self.n = t, self.n + 1

    def finished(self, sums: dict, stats: dict) -> None:
        """sums: {key: [total us, count]} kept by the backend across launches; stats gets the means."""
        if self.t_launched is None:
            return
        end = time.perf_counter()

        def add(key, us, n=1):
            sums.setdefault(key, [0.0, 0])
            sums[key][0] += us
            sums[key][1] += n
            stats[key] = round(sums[key][0] / sums[key][1], 1)
        add("launch_host_us", (self.t_launched - self.t0) * 1e6)
        if self.t_first is not None:
            add("first_token_us", (self.t_first - self.t_launched) * 1e6)
            if self.n > 1:
                add("token_interval_us", (self.t_last - self.t_first) * 1e6, self.n - 1)
            add("finish_us", (end - self.t_last) * 1e6)


class MonokernelBackend(Backend):
    name = "monokernel"
    supports_tp = False
    mk_long = None   # the plain launch for long contexts next to a cluster launch (_long_kernel); None: self.mk only
    kernel_prefill_max = 0   # prefill chunks up to this many tokens run as kernel steps (set by warmup's timing)
    KERNEL_PREFILL = True    # whether warmup times the kernel prefill (the tensor-parallel backend does not)

    @staticmethod
    def supported(config, device) -> tuple[bool, str]:
        """Whether this model shape can run on `device` (checked before any build or allocation)."""
        dev = torch.device(device)
        if dev.type != "cuda" or not torch.cuda.is_available():
            return False, "needs a CUDA device"
        major, minor = torch.cuda.get_device_capability(dev)
        if (major, minor) != (9, 0):
            return False, f"built for sm_90a (Hopper); this GPU is {major}.{minor}"
        from kernels import isa
        from kernels.build import cache_root, find_nvcc, source_hash
        from kernels.schedule import Dims, attn_cluster_model
        if config.arch not in ("llama", "qwen2"):
            return False, f"architecture {config.arch} not supported"
        if config.head_dim not in isa.HEAD_DIMS:
            return False, f"head_dim {config.head_dim} (supported: {', '.join(map(str, isa.HEAD_DIMS))})"
        if config.n_heads % config.n_kv_heads or config.n_heads // config.n_kv_heads > isa.MAX_GROUP:
            return False, f"GQA group {config.n_heads}/{config.n_kv_heads} (at most {isa.MAX_GROUP})"
        if config.o_bias or config.mlp_bias:
            return False, "o_proj / MLP biases are not implemented in the kernel"
        if config.hidden_size % 8 or config.intermediate_size % 8:
            return False, "hidden and intermediate sizes must be multiples of 8"
        dims = Dims.of(config)
        lib = source_hash(cluster=attn_cluster_model(dims) > 0, head_dim=config.head_dim)
        if find_nvcc() is None and not (cache_root() / lib / "libmonokernel.so").exists():
            return False, "nvcc not found and no cached kernel build"
        return True, "ok"

    def __init__(self, model, cache, tp: int = 1, tp_mode: str = "exact", max_steps: int = 4096):
        super().__init__(model, cache)
        if tp != 1:
            raise BackendUnavailable("monokernel runs on one GPU (tp=1)")
        ok, why = self.supported(model.cfg, model.device)
        if not ok:
            raise BackendUnavailable(why)
        if cache.k.dtype != torch.bfloat16:
            raise BackendUnavailable(f"monokernel needs a bf16 KV cache (got {cache.k.dtype})")
        self.stats = {"launches": 0, "tokens": 0, "cancelled": 0}
        self.mk = self._kernel(model, cache, max_steps)
        self.stats["attn_cluster"] = self.mk.attn_cluster
        self.stats["side_ctas"] = self.mk.n_side   # the side launch next to the clusters (kernels/runtime.py)
        self.stats["qkv_parts"] = self.mk.sched.qkv_parts   # QKV inside the clusters (0: its own stage)
        self.stats["kv_apart"] = self.mk.sched.kv_apart     # their k / v rows on the CTAs without attention
        self.stats["mlp_pairs"] = self.mk.sched.mlp_pairs   # cluster ranks 2k / 2k + 1 share the MLP's adds
        self.stats["mlp_weights"] = list(self.mk.sched.mlp_weights)   # MLP rows of free / side CTAs (1: the parts')
        # K / V positions staged per chunk, and whether that staging left the L1 its share (kernels/runtime.py
        # L1_KEEP_CARVEOUT; False: fewer than 128 positions fit within it, the log line says so too)
        self.stats["stage_positions"] = self.mk.stage_capacity
        self.stats["l1_kept"] = self.mk.l1_kept
        self.mk_long = self._long_kernel(model, cache, max_steps)
        self._logits = torch.empty(1, model.cfg.vocab_size, dtype=torch.float32, device=model.device)
        self._chunk_logits = torch.empty(kernel_prefill.CAP, model.cfg.vocab_size, dtype=torch.float32,
                                         device=model.device)   # every step's logits of a kernel prefill
        self.stats["kernel_prefill_max"] = 0
        self.stats["kernel_prefills"] = 0
        self._clock_sums: dict[str, list] = {}     # _LaunchClock totals over all launches
        # Completion prefill replays CUDA graphs (eager launch overhead was ~20 ms on the 1.5B model).
        self.prefill_graphs = PrefillGraphs(model, cache)
        log.info("monokernel backend ready: %s", self.describe())

    def _kernel(self, model, cache, max_steps):
        """The kernel this model runs: in thread-block clusters where schedule.attn_cluster_model picks them (small
        layers), else the plain launch. A cluster launch that cannot start here (library build, too few resident
        clusters) falls back to the plain one, with the reason in the log and in stats["attn_cluster_fallback"]."""
        from kernels.runtime import Monokernel
        from kernels.schedule import Dims, attn_cluster_model
        cluster = attn_cluster_model(Dims.of(model.cfg))
        if cluster:
            try:   # no long-context library yet: _long_kernel decides what runs the launches that restage
                return Monokernel(model, cache.k, cache.v, max_steps=max_steps, attn_cluster=cluster, long_lib=False)
            except Exception as e:   # noqa: BLE001 - any failure of the fast path: say why, run the plain launch
                why = f"{type(e).__name__}: {e}"
                self.stats["attn_cluster_fallback"] = why
                log.warning("monokernel: clusters of %d not used (%s); launching without clusters", cluster, why)
        return Monokernel(model, cache.k, cache.v, max_steps=max_steps)

    def _long_kernel(self, model, cache, max_steps):
        """Next to a cluster launch, the plain launch for the launches where the clusters would restage K / V
        (Monokernel.restages: a kv head's positions over 16 ranks per part there, over up to 64 CTAs in the plain
        launch, each with all of the head's q heads). stats["long_launch"] says whether it runs and why not; none is
        made where the clusters stage every split in one chunk up to the cache's last position. Where the plain
        launch cannot be made, the clusters take those launches with their long-context library (Monokernel
        long_lib, where it loads), which nothing else needs: it is not built otherwise."""
        # stats["long_lib"]: whether the cluster launch restages K / V with its long-context library, or why not
        def lib_state() -> str:
            return "on" if self.mk.lib_long is not None else f"off ({self.mk.long_lib_off})"
        if not self.mk.attn_cluster:
            self.stats["long_lib"] = lib_state()
            return None
        max_len = cache.k.shape[3]
        if not self.mk.restages(max_len - 1, 1):
            self.stats["long_launch"] = f"not needed (the clusters stage all {max_len} cache positions without restaging)"
            self.stats["long_lib"] = "off (no launch restages within the cache)"
            return None
        from kernels.runtime import Monokernel
        try:
            mk = Monokernel(model, cache.k, cache.v, max_steps=max_steps)
        except Exception as e:   # noqa: BLE001 - any failure of the long-context launch: say why, keep the clusters
            why = f"{type(e).__name__}: {e}"
            self.stats["long_launch"] = f"off ({why})"
            self.mk.set_long_lib(None)
            self.stats["long_lib"] = lib_state()
            log.warning("monokernel: no plain launch for long contexts (%s); the clusters run every launch (long-context "
                        "library %s)", why, self.stats["long_lib"])
            return None
        self.stats["long_launch"] = "plain where the clusters restage"
        self.stats["long_lib"] = "off (the plain launch takes the launches that restage)"
        self.stats["plain_long_launches"] = 0
        return mk

    def _pick(self, pos: int, n: int):
        """The kernel a launch of n steps from pos runs: the plain one where the cluster launch would restage."""
        if self.mk_long is not None and self.mk.restages(pos, n):
            self.stats["plain_long_launches"] += 1
            return self.mk_long
        return self.mk

    def warmup(self) -> None:
        """One real step on slot 0 (empty at start, its KV position 0 is rewritten by any later prefill), on each
        launch."""
        self.decode(0, 0, 0)
        if self.mk_long is not None:
            self.mk_long.run(0, 0, 0, 1)
        self.prefill_graphs.warmup()   # every (slot, bucket, window) graph now: no request pays a capture
        torch.cuda.synchronize(self.model.device)
        if self.KERNEL_PREFILL:
            self._time_kernel_prefill()

    def _time_kernel_prefill(self, timer=kernel_prefill.median_ms) -> None:
        """Time a one-token graph prefill against kernel launches of one and two steps, all on slot 0 from position 0
        (still empty: the next prefill rewrites what these write), and set kernel_prefill_max from them."""
        dev = self.model.device
        sync = lambda: torch.cuda.synchronize(dev)   # noqa: E731
        tok = torch.zeros(1, dtype=torch.long, device=dev)
        launches = self.stats["launches"]
        graph = timer(lambda: self.prefill_graphs.prefill(0, tok, 0), sync)
        one = timer(lambda: self._steps(0, [0], 0, self._chunk_logits), sync)
        two = timer(lambda: self._steps(0, [0, 0], 0, self._chunk_logits), sync)
        self.stats["launches"] = launches   # the timing's launches serve no request
        self.kernel_prefill_max = kernel_prefill.limit(graph, one, two)
        self.stats["kernel_prefill_max"] = self.kernel_prefill_max
        self.stats["kernel_prefill_ms"] = {"graph_1_token": round(graph, 3), "kernel_1_step": round(one, 3),
                                           "kernel_2_steps": round(two, 3)}
        log.info("monokernel: prefill chunks of up to %d tokens run as kernel steps (one-token graph prefill %.2f ms, "
                 "kernel launch of 1 / 2 steps %.2f / %.2f ms)", self.kernel_prefill_max, graph, one, two)

    def describe(self) -> str:
        s = self.mk.sched
        free, side = s.mlp_weights
        weights = f", MLP rows {free:g} / {side:g} on the free / side CTAs" if (free, side) != (1.0, 1.0) else ""
        return (f"monokernel ({self.mk.n_sm} CTAs, {sum(map(len, s.per_sm))} instructions/step, "
                f"{'fused MLP' if self.mk.fused_mlp else 'GATEUP + DOWN'}, "
                f"{f'attention in clusters of {self.mk.attn_cluster}' if self.mk.attn_cluster else 'no clusters'}"
                f"{f', QKV inside them in {s.qkv_parts} parts per kv head' if s.qkv_parts else ''}"
                f"{' (k / v on the other CTAs)' if s.kv_apart else ''}"
                f"{', MLP adds by cluster-rank pairs' if s.mlp_pairs else ''}{weights})"
                f"{'; the plain launch where the clusters would restage K / V' if self.mk_long else ''}")

    def prefill(self, slot, ids, start_pos, all_logits=False):
        n = ids.shape[0]
        if not all_logits and 0 < n <= self.kernel_prefill_max:
            self.stats["kernel_prefills"] += 1
            return self._steps(slot, ids.tolist(), start_pos, self._chunk_logits)
        out = self.prefill_graphs.prefill(slot, ids, start_pos, all_logits)
        self.stats.update(self.prefill_graphs.stats())
        return out

    # Hooks around every kernel launch. The single-GPU kernel reads and writes the engine's cache in place: nothing
    # to do. The tensor-parallel backend (tp_monokernel.py) copies K/V between the engine's cache and its ranks'.
    def _before_launch(self, slot: int, pos: int) -> None:
        """The kernel is about to read positions [0, pos) of `slot` and write from pos on."""

    def _after_run(self, slot: int, pos: int, ok: bool) -> None:
        """The launch from `pos` ended (ok: without error; mk.count() steps ran)."""

    def decode(self, slot, token, pos):
        return self._steps(slot, [token], pos, self._logits)

    def _steps(self, slot: int, toks: list[int], pos: int, out: torch.Tensor) -> torch.Tensor:
        """One launch of len(toks) teacher-forced steps from pos (their K / V written); every step's logits go to
        out's rows, the last one's is returned."""
        n = len(toks)
        self._before_launch(slot, pos)
        mk = self._pick(pos, n)
        mk.launch(slot, toks[0], pos, n, forced=toks if n > 1 else None, logits_out=out)
        ok = False
        try:
            mk.wait()
            ok = True
        finally:
            self._after_run(slot, pos, ok)
            self._side_stats(mk)
        self.stats["launches"] += 1
        return out[n - 1].clone()

    def _side_stats(self, mk) -> None:
        """The side launch's fallbacks so far (kernels/runtime.py: each one is also logged): launches that ran on the
        clusters alone, and why the side launch stopped being started, if it did. The tensor-parallel kernels have
        no side launch (no n_side). Also which LM head the last launch ran (screened, or exact and why) and the
        launches whose screened head computed a block exactly (too many candidates), and the launches that ran the
        long-context library. mk: the kernel the launch ran (self.mk, or the plain launch for long contexts)."""
        if hasattr(mk, "lm_mode"):
            self.stats["lm_head"] = mk.lm_mode
            self.stats["lm_screen_over"] = self.mk.lm_over + (self.mk_long.lm_over if self.mk_long else 0)
            self.stats["long_launches"] = self.mk.long_launches
        if getattr(self.mk, "n_side", 0):
            self.stats["side_alone"] = self.mk.side_alone
            if self.mk.side_error:
                self.stats["side_error"] = self.mk.side_error

    def decode_loop(self, slot: int, token: int, pos: int, max_new: int, sampling: SamplingParams,
                    stop_ids: frozenset[int], cancel: threading.Event | None,
                    generator: torch.Generator | None = None) -> Iterator[int]:
        n = min(max_new, self.cache.max_len - pos, self.mk.max_steps)
        if n <= 0 or (cancel is not None and cancel.is_set()):
            return
        seed = launch_seed(sampling, generator)
        mk = self._pick(pos, n)
        clock = _LaunchClock()
        self._before_launch(slot, pos)
        mk.launch(slot, token, pos, n, temperature=sampling.temperature, top_p=sampling.top_p, seed=seed,
                  stop_ids=sorted(stop_ids))
        clock.launched()
        self.stats["launches"] += 1
        got = 0
        spins = 0
        try:
            while True:
                cnt = mk.count()
                while got < cnt:
                    if cancel is not None and cancel.is_set():
                        self.stats["cancelled"] += 1
                        return
                    tok = mk.token(got)
                    clock.token()
                    got += 1
                    self.stats["tokens"] += 1
                    yield tok
                if mk.done() and got >= mk.count():
                    return
                if cancel is not None and cancel.is_set():
                    self.stats["cancelled"] += 1
                    return
                spins += 1
                if spins % 64 == 0:
                    if mk.kernel_finished() and not mk.done():
                        raise RuntimeError("monokernel exited without finishing its token loop")
                    time.sleep(20e-6)
        finally:
            ok = False
            try:
                if not mk.done():
                    mk.cancel()
                mk.wait()
                ok = True
            finally:
                self._after_run(slot, pos, ok)
                clock.finished(self._clock_sums, self.stats)
                self._side_stats(mk)
