"""Tensor-parallel monokernel (exact or delayed mode) over N GPUs driven by one process and one host thread.

`TPMonokernel(model, devices)` shards the model with engine/tp/shard.py's plan (kernels/tp_local.py: local heads
and FFN channels, full hidden size, replicated LM head), builds one `Monokernel` per GPU on its local model with
the exchange-aware schedule (schedule.with_exchange), enables peer access between every pair of GPUs, allocates
each rank's receive buffer, and launches the N cooperative kernels back to back on the N devices' current streams.
The kernels spin on each other's counters (kernels/csrc/mk_exchange.cuh), so all of them must be launched before
any can finish: launches are asynchronous and nothing here waits between them.

LM head: vocabulary-parallel by default (each rank streams its vocabulary slice; every LM-head block's sampling
record is pushed to every rank and each rank's sampler reduces all of them, so all ranks pick the same token), or
replicated (vocab_parallel=False: every rank computes all logits from its bit-identical residual; simpler, and
the check that residuals really are bit-identical). The vocabulary-parallel sampler needs all ranks' top-k
candidates in shared memory; when they do not fit, the replicated head is used and the log says why.

Rank 0 is the front: its tokens stream to the host, its cancel flag is the one the host sets (rank 0 relays it to
the others inside the kernels, one step later), `logits_out` lives on rank 0 (vocabulary-parallel: every rank
writes its slice there through peer stores). Every rank samples the same tokens; `run` checks that.

mode='delayed' (Kog's delayed tensor parallelism, /work/shared/DTP.md): `model` is an engine.lanes.LaneModel and GPU
l runs lane l (kernels/tp_local.py lane_plan / lane_rank_model, schedule.with_lanes): each lane keeps its own
residual stream, adds its own partials at once and the peers' `broadcast_delay` layers later (mk_exchange.cuh,
delayed mode); the LM head is always vocabulary-parallel over the GPUs (records exchanged), with the replicate
lane head taking the mean of the lanes' normed final states. An ordinary model in delayed mode, or a lane model
in exact mode, is refused (engine.lanes.TPModeError) before any GPU is touched.
"""
from __future__ import annotations

import ctypes
import logging
import os
import random
import time

import torch

from . import isa, schedule
from .runtime import (Monokernel, _check, _keeps_device, l1_keep_bytes, load_library, no_token_message,
                      smem_optin)
from .tp_local import kernel_plan, lane_kv_bounds, lane_plan, lane_rank_model, rank_model

log = logging.getLogger("kernels")


def _check_mode(model, mode: str) -> str:
    """Refuse an ordinary model in delayed mode and a lane model in exact mode (engine/lanes check_tp_mode words)."""
    from engine.lanes import LaneModel, check_tp_mode
    check_tp_mode("lane" if isinstance(model, LaneModel) else "dense", mode)
    return mode


class TPUnavailableError(RuntimeError):
    """This set of GPUs cannot run the tensor-parallel monokernel (the message says why)."""


def counter_name(idx: int, n_layers: int, lane_base: int | None = None) -> str:
    """Human name of counter `idx` (watchdog reports); lane_base: delayed mode's first peer counter."""
    if lane_base is not None and idx >= lane_base:
        k = idx - lane_base
        return "final lane states (peers)" if k == 2 * n_layers else \
            f"layer {k // 2} {'OPROJ' if k % 2 == 0 else 'DOWN'} (peers)"
    base = n_layers * isa.CTR_PER_LAYER
    if idx < base:
        names = {isa.CTR_QKV: "QKV", isa.CTR_ATTN_DONE: "ATTN_DONE", isa.CTR_OPROJ: "OPROJ (exchanged)",
                 isa.CTR_GATEUP: "GATEUP", isa.CTR_DOWN: "DOWN (exchanged)"}
        return f"layer {idx // isa.CTR_PER_LAYER} {names[idx % isa.CTR_PER_LAYER]}"
    if idx == base:
        return "LMHEAD"
    if idx == base + 1:
        return "TOKEN"
    return f"ATTN ticket {idx - base - 2}"



class TPMonokernel:
    """model: engine.model.Model (any device; bf16 weights are streamed as is, others are cast to bf16);
    devices: one CUDA device per rank (distinct). k_caches/v_caches: optional per-rank bf16 caches
    [S, L, kv heads of the rank, max_len, hd]; by default S = slots caches of max_len positions are allocated."""

    def __init__(self, model, devices, max_len: int = 4096, slots: int = 1, max_steps: int = 4096,
                 n_sm: int | None = None, k_caches=None, v_caches=None, vocab_parallel: bool = True,
                 mode: str = "exact"):
        """mode 'exact' (model: engine.model.Model) or 'delayed' (model: engine.lanes.LaneModel, one GPU per lane;
        its LM head is always vocabulary-parallel over the GPUs and vocab_parallel is ignored)."""
        self.mode = _check_mode(model, mode)
        self.devices = [torch.device(d) for d in devices]
        N = self.n = len(self.devices)
        if N < 1:
            raise ValueError("TPMonokernel needs at least one device")
        if any(d.type != "cuda" for d in self.devices):
            raise TPUnavailableError(f"tensor-parallel monokernel needs CUDA devices, got {devices}")
        idx = [d.index if d.index is not None else torch.cuda.current_device() for d in self.devices]
        if len(set(idx)) != N:
            raise TPUnavailableError(f"devices {devices} repeat a GPU: each rank's persistent kernel needs its own GPU")
        if N > 1 and "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").lower().replace(" ", ""):
            raise TPUnavailableError("PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True: such memory is not "
                                     "peer-mapped by cudaDeviceEnablePeerAccess; unset it for tensor parallelism")
        self.dev_idx = idx
        self.devices = [torch.device("cuda", i) for i in idx]
        self.lib = lib = load_library(tp=True, head_dim=model.cfg.head_dim)
        for a in idx:
            for b in idx:
                if a != b and not torch.cuda.can_device_access_peer(a, b):
                    raise TPUnavailableError(f"cuda:{a} cannot access cuda:{b}'s memory (no peer-to-peer path); "
                                             "the in-kernel exchange needs NVLink or PCIe P2P between every pair")
        with _keeps_device():
            self._enable_peers(lib, idx)
        if n_sm is None:
            n_sm = min(torch.cuda.get_device_properties(i).multi_processor_count for i in idx)
        self.n_sm = n_sm
        self.max_steps = max_steps
        self.running = False
        self.n_steps = 0
        self.lanes = None
        if self.mode == "delayed":
            self._init_lanes(model, max_len, slots, k_caches, v_caches)
            return
        cfg = self.cfg = model.cfg
        self.plan = kernel_plan(cfg, N)   # ShardError (a ValueError) when the shapes do not shard
        self.kv_bounds = [s.kv_heads for s in self.plan.ranks]
        vp = vocab_parallel and N > 1
        if vp:
            sch = [schedule.build(schedule.Dims.of(self._local_cfg(r)), n_sm) for r in range(N)]
            n_rec = sum(sc.n_lm for sc in sch)
            props = [torch.cuda.get_device_properties(dv) for dv in self.devices]
            room = min(schedule.smem_layout(sc, max_len, smem_optin(pr), l1_keep=l1_keep_bytes(pr)).sampler_floats
                       for sc, pr in zip(sch, props))   # the layout each rank's Monokernel takes
            if not schedule.sampler_fits(n_rec, room):
                log.warning("tp monokernel: replicated LM head: %d LM-head records over %d ranks do not fit the "
                            "sampler's shared memory (%d floats)", n_rec, N, room)
                vp = False
        self.vocab_parallel = vp
        self.vocab_off = [s.vocab[0] for s in self.plan.ranks]
        self.models = [rank_model(model, self.plan, r, device=self.devices[r], vocab_parallel=vp) for r in range(N)]
        scheds = schedule.with_exchange([schedule.build(schedule.Dims.of(m.cfg), n_sm) for m in self.models],
                                        lm_parallel=vp)
        self._build_ranks(scheds, cfg.n_layers, cfg.hidden_size, cfg.head_dim, max_len, slots, k_caches, v_caches, 0)
        log.info("tp monokernel: %s; %d CTAs per GPU; receive buffer %d KB per GPU; LM head %s", self.plan.describe(),
                 n_sm, self.recv[0].numel() * 4 // 1024, "vocabulary-parallel" if vp else "replicated")

    def _build_ranks(self, scheds, L: int, d: int, hd: int, max_len: int, slots: int, k_caches, v_caches,
                     fin: int) -> None:
        """Per-rank Monokernels on self.models with `scheds`, caches, receive buffers ([L][2][N][d] fp32, then
        `fin` x d for the delayed mode's final states), exchange-wait counters and sampling records."""
        N, n_sm, vp = self.n, self.n_sm, self.vocab_parallel
        for s in scheds:
            schedule.check(s)
        n_lm = [s.n_lm for s in scheds]
        self.rec_off = [sum(n_lm[:r]) for r in range(N)] if vp else [0] * N
        self.n_records = sum(n_lm) if vp else n_lm[0]
        if k_caches is None:
            k_caches, v_caches = [], []
            for r, m in enumerate(self.models):
                shape = (slots, L, m.cfg.n_kv_heads, max_len, hd)
                k_caches.append(torch.zeros(shape, dtype=torch.bfloat16, device=self.devices[r]))
                v_caches.append(torch.zeros(shape, dtype=torch.bfloat16, device=self.devices[r]))
        self.k_caches, self.v_caches = list(k_caches), list(v_caches)
        self.ranks: list[Monokernel] = []
        for r in range(N):
            with torch.cuda.device(self.devices[r]):
                self.ranks.append(Monokernel(self.models[r], self.k_caches[r], self.v_caches[r],
                                             max_steps=self.max_steps, n_sm=n_sm, sched=scheds[r], tp_build=True))
        room = min(mk.smem_layout.sampler_floats for mk in self.ranks)
        if vp and not schedule.sampler_fits(self.n_records, room):
            raise TPUnavailableError(f"{self.n_records} LM-head records over {N} ranks do not fit the sampler's "
                                     f"shared memory ({room} floats)")
        self.recv = [torch.zeros(L * 2 * N * d + fin * d, dtype=torch.float32, device=dv) for dv in self.devices]
        self.xwait = [torch.zeros(n_sm, dtype=torch.int64, device=dv) for dv in self.devices]
        # every rank's sampling records (vocabulary-parallel), else each Monokernel's own
        self.lmrec = [torch.zeros(self.n_records * isa.REC_WORDS, dtype=torch.float32, device=dv) if vp else mk.lmrec
                      for dv, mk in zip(self.devices, self.ranks)]

    def _init_lanes(self, model, max_len: int, slots: int, k_caches, v_caches) -> None:
        """Delayed mode: rank r runs lane r of the LaneModel `model` (tp_local.py lane_plan / lane_rank_model)."""
        N = self.n
        cfg = self.cfg = model.cfg
        self.lanes = lane_plan(cfg, N, max_len=max_len)   # ShardError when the kernel cannot run this lane model
        self.plan = None
        self.vocab_parallel = True
        self.vocab_off = [v0 for v0, _ in self.lanes.vocab]
        self.kv_bounds = lane_kv_bounds(cfg, N)
        self.models = [lane_rank_model(cfg, model.w, self.lanes, r, device=self.devices[r]) for r in range(N)]
        scheds = schedule.with_lanes([schedule.build(schedule.Dims.of(m.cfg), self.n_sm) for m in self.models])
        self._lane_ctr = schedule.lane_counters(scheds)
        self._build_ranks(scheds, cfg.num_layers, cfg.hidden_size, cfg.head_dim, max_len, slots, k_caches, v_caches,
                          N if self.lanes.agg else 0)
        self.lane_mode = [torch.tensor(self.lanes.modes, dtype=torch.int32, device=dv) for dv in self.devices]
        log.info("tp monokernel: %s; %d CTAs per GPU; receive buffer %d KB per GPU", self.lanes.describe(), self.n_sm,
                 self.recv[0].numel() * 4 // 1024)

    def describe(self) -> str:
        """The split: exact mode's shard plan or delayed mode's lane plan."""
        return self.lanes.describe() if self.lanes is not None else self.plan.describe()

    def _local_cfg(self, r: int):
        from .tp_local import local_cfg
        return local_cfg(self.cfg, self.plan, r, vocab_parallel=True)

    # ---- caches ----
    def load_cache(self, k_full: torch.Tensor, v_full: torch.Tensor) -> None:
        """Copy a full cache [S, L, n_kv, max_len, hd] (any device / dtype) into the ranks' caches (their heads).
        Delayed mode: n_kv = all lanes' KV heads, lane-major, keys in the kernel's half-rotation layout
        (kernels/tp_local.py lane_cache builds one rank's part from a reference LaneKVCache)."""
        for r in range(self.n):
            k0, k1 = self.kv_bounds[r]
            self.k_caches[r].copy_(k_full[:, :, k0:k1])
            self.v_caches[r].copy_(v_full[:, :, k0:k1])

    # ---- launch ----
    def launch(self, slot: int, token: int, pos0: int, n_steps: int, temperature: float = 0.0, top_p: float = 1.0,
               seed: int | None = None, stop_ids=(), forced: list[int] | None = None,
               logits_out: torch.Tensor | None = None, rank_logits: list | None = None) -> None:
        """As Monokernel.launch. logits_out: fp32 [n_steps, V] on rank 0's device, all logits. rank_logits
        (replicated LM head only): one such tensor (or None) per rank on that rank's device, each rank's own logits
        (they must be bit-identical: the residual-stream check)."""
        if self.running:
            raise RuntimeError("tp monokernel: a launch is still running")
        V = self.cfg.vocab_size
        if logits_out is not None:
            if logits_out.device != self.devices[0] or logits_out.dtype != torch.float32 or \
                    not logits_out.is_contiguous() or logits_out.numel() < n_steps * V:
                raise ValueError(f"logits_out must be contiguous fp32 on {self.devices[0]} with >= {n_steps} x {V}")
        if rank_logits is not None and self.vocab_parallel:
            raise ValueError("rank_logits needs the replicated LM head (vocab_parallel=False); with the "
                             "vocabulary-parallel head every rank writes its slice into logits_out")
        if seed is None:
            seed = random.getrandbits(63)   # one seed for all ranks: they must draw the same samples
        outs = list(rank_logits) if rank_logits is not None else [None] * self.n
        if logits_out is not None:
            outs[0] = logits_out
        params = []
        for r, mk in enumerate(self.ranks):
            with torch.cuda.device(self.devices[r]):
                p = mk.params(slot, token, pos0, n_steps, temperature, top_p, seed, stop_ids, forced, outs[r])
            p.recv, p.xwait = self.recv[r].data_ptr(), self.xwait[r].data_ptr()
            for k, other in enumerate(self.ranks):
                p.peer_recv[k] = self.recv[k].data_ptr()
                p.peer_ctr[k] = other.ctr.data_ptr()
                p.peer_status[k] = other.status.data_ptr()
                p.peer_lmrec[k] = self.lmrec[k].data_ptr()
            p.tp_rank, p.tp_size = r, self.n
            if self.lanes is not None:
                lp = self.lanes
                p.lane_mode = self.lane_mode[r].data_ptr()
                p.lane_delay, p.lane_agg, p.lane_scale = lp.delay, lp.agg, lp.scale
                p.lane_x_ctr, p.lane_xn_oproj, p.lane_xn_down = self._lane_ctr
            if self.vocab_parallel:
                p.vocab, p.vocab_off = V, self.vocab_off[r]
                p.rec_off, p.n_lm, p.lm_parallel = self.rec_off[r], self.n_records, 1
                p.lmrec = self.lmrec[r].data_ptr()
                p.logits_out = logits_out.data_ptr() if logits_out is not None else None
            params.append(p)
        # Peers bump each other's counters: every rank's counters must be zero before any kernel starts.
        streams = []
        for r, mk in enumerate(self.ranks):
            with torch.cuda.device(self.devices[r]):
                mk.ctr.zero_()
                mk.status.zero_()
                self.xwait[r].zero_()
                streams.append(torch.cuda.current_stream(self.devices[r]))
        for s in streams:
            s.synchronize()
        with _keeps_device():
            self._start_ranks(params, streams, n_steps)
        self.running = True
        self.n_steps = n_steps

    @staticmethod
    def _enable_peers(lib, idx: list[int]) -> None:
        for a in idx:
            for b in idx:
                if a == b:
                    continue
                err = lib.mk_enable_peer(a, b)
                if err == -1:
                    raise TPUnavailableError(f"cuda:{a} -> cuda:{b}: the peer link has no native atomics (PCIe "
                                             "without P2P atomics?); the exchange bumps peer counters atomically")
                if err != 0:
                    raise TPUnavailableError(f"cudaDeviceEnablePeerAccess(cuda:{a} -> cuda:{b}) failed: CUDA error "
                                             f"{err} ({lib.mk_error_string(err).decode()})")

    def _start_ranks(self, params, streams, n_steps: int) -> None:
        for r, mk in enumerate(self.ranks):
            _check(self.lib, self.lib.mk_set_device(self.dev_idx[r]), "cudaSetDevice")
            err = self.lib.mk_start(ctypes.byref(params[r]), mk.n_sm, mk.smem, ctypes.c_void_p(streams[r].cuda_stream))
            if err != 0:
                # the ranks already started spin on this one until their watchdogs fire (wait() then reports them)
                self.running = r > 0
                raise RuntimeError(f"tp monokernel launch on rank {r} (cuda:{self.dev_idx[r]}) failed: CUDA error "
                                   f"{err} ({self.lib.mk_error_string(err).decode()}); ranks 0..{r - 1} are running "
                                   "and will stop on their watchdog")
            mk.stream, mk.running, mk.n_steps = streams[r], True, n_steps

    # ---- streaming side: rank 0 ----
    def count(self) -> int:
        return self.ranks[0].count()

    def done(self) -> bool:
        return self.ranks[0].done()

    def token(self, i: int) -> int:
        return self.ranks[0].token(i)

    def reason(self) -> str:
        return self.ranks[0].reason()

    def cancel(self) -> None:
        self.ranks[0].cancel()

    def kernel_finished(self) -> bool:
        return all(mk.kernel_finished() for mk in self.ranks)

    def debug_state(self) -> list[dict]:
        out = []
        L = self.cfg.num_layers if self.lanes is not None else self.cfg.n_layers
        for r, mk in enumerate(self.ranks):
            st = mk.debug_state()
            st["rank"] = r
            if st["reason"] == "watchdog" and not self.running:   # counters readable once all kernels ended
                st["wd_ctr_name"] = counter_name(st["wd_ctr"], L, self._lane_ctr[0] if self.lanes else None)
                st["ctr_on_ranks"] = [int(o.ctr[st["wd_ctr"]]) for o in self.ranks]
            out.append(st)
        return out

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until every rank's launch ends; TimeoutError after timeout_s (kernels keep running), RuntimeError
        when a watchdog fired (per-rank state: stuck counter by name and its value on every rank) or the sampler
        found no finite logit (every rank stops at the same step: they reduce the same records)."""
        if not self.running:
            return
        if timeout_s is not None:
            t_end = time.monotonic() + timeout_s
            while not self.kernel_finished():
                if time.monotonic() > t_end:
                    raise TimeoutError(f"tp monokernel still running after {timeout_s} s: {self.debug_state()}")
                time.sleep(1e-3)
        for mk in self.ranks:
            if mk.running:
                mk.stream.synchronize()
            mk.running = False
        self.running = False
        if any(mk.reason() == "watchdog" for mk in self.ranks):
            raise RuntimeError(f"tp monokernel watchdog fired: {self.debug_state()}")
        if any(mk.reason() == "no_token" for mk in self.ranks):
            raise RuntimeError(no_token_message(self.ranks[0].count()))

    def rank_tokens(self, r: int) -> list[int]:
        mk = self.ranks[r]
        return [mk.token(i) for i in range(mk.count())]

    def run(self, *args, timeout_s: float = 120.0, **kw) -> tuple[list[int], str]:
        """launch + wait -> (tokens, finish reason) of rank 0; raises if the ranks disagree."""
        self.launch(*args, **kw)
        self.wait(timeout_s)
        toks = self.rank_tokens(0)
        for r in range(1, self.n):
            other = self.rank_tokens(r)
            if other != toks or self.ranks[r].reason() != self.reason():
                raise RuntimeError(f"tp ranks disagree: rank 0 {len(toks)} tokens ({self.reason()}), rank {r} "
                                   f"{len(other)} ({self.ranks[r].reason()}); first difference at "
                                   f"{next((i for i, (a, b) in enumerate(zip(toks, other)) if a != b), None)}")
        return toks, self.reason()

    def exchange_wait_us(self) -> dict:
        """Of the last launch: time each CTA spent in its exchanged waits (QKV of layer > 0, GATEUP, LMHEAD) per
        token from step 1 on, mean and max over CTAs and ranks, in us (mk_exchange.cuh xr_wait). Exact mode: the
        whole wait (local producers included, an upper bound); delayed mode: only the wait for peers' partials
        after the local producers were done (xr_lane_wait_all), i.e. exchange latency that was not hidden."""
        steps = max(1, self.n_steps - 1)
        per = torch.stack([x.cpu() for x in self.xwait]).double() / steps / 1e3   # [N, n_sm] us per token
        return {"mean_us": float(per.mean()), "max_us": float(per.max()),
                "per_rank_mean_us": [float(v) for v in per.mean(dim=1)]}
