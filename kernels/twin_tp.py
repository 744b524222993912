"""CPU twin of the tensor-parallel monokernel: N ranks, each running its own instruction lists on its local model
(kernels/tp_local.py), exchanging OPROJ / DOWN partials exactly as kernels/csrc/mk_exchange.cuh does.

All (rank, SM) pairs are interleaved in one random (seeded) order. Each rank has its own counters; a producer of
an exchanged stage bumps that counter on every rank. Every receive-buffer element carries the tag of the
(step, layer, stage) that wrote it, every x element the tag of the last stage merged into it, and each
instruction checks the tags of everything it reads: a wait too weak for the peer exchange (a consumer before a
peer's partial, a producer overwriting a partial a peer still needs, a materialisation racing a reader) raises
ScheduleError whatever the counters say. ATTN and SAMPLE are the single-GPU twin's own code.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from . import isa
from .schedule import Schedule
from .twin import EMBED, ScheduleError, Twin, TwinResult, _tag

OP = isa.OPS


@dataclass
class TPTwinResult:
    ranks: list[TwinResult]       # per rank; tokens and logits must be equal on every rank
    instructions_run: int


class TwinTP:
    """models[r]: rank r's RankModel (fp32 weights); scheds: schedule.with_exchange of the rank schedules.
    vocab_offsets: None for a replicated LM head, else rank r's first global vocabulary id (vocabulary-parallel:
    every LMHEAD block's record and logits go to every rank, the samplers read all ranks' records)."""

    def __init__(self, models, scheds: list[Schedule], inv_freq: torch.Tensor, vocab_offsets=None):
        if len(models) != len(scheds):
            raise ValueError("one schedule per rank")
        self.N = len(models)
        self.twins = [Twin(m, s, inv_freq) for m, s in zip(models, scheds)]
        self.d = scheds[0].dims.d
        self.L = scheds[0].dims.n_layers
        self.vocab_offsets = list(vocab_offsets) if vocab_offsets is not None else None
        n_lm = [s.n_lm for s in scheds]
        self.rec_off = [sum(n_lm[:r]) for r in range(self.N)] if vocab_offsets is not None else [0] * self.N
        self.n_records = sum(n_lm) if vocab_offsets is not None else None
        self.vocab = sum(s.dims.vocab for s in scheds) if vocab_offsets is not None else scheds[0].dims.vocab

    def run(self, k_caches, v_caches, slot: int, token: int, pos0: int, n_steps: int, temperature: float = 0.0,
            top_p: float = 1.0, seed: int = 0, stop_ids=(), forced=None, cancel_at_step: int | None = None,
            order_seed: int = 0, valid_len: int | None = None, attn_min_pos: int = 64) -> TPTwinResult:
        """k_caches[r]/v_caches[r]: rank r's [S, L, kvh_local, max_len, hd] fp32 caches (updated in place).
        cancel_at_step: the step at which rank 0's sampler first sees the host's cancel flag; like the kernel,
        every rank then cancels from the next step on. Other arguments as Twin.run."""
        N, L, d = self.N, self.L, self.d
        valid_len = pos0 if valid_len is None else valid_len
        shared = {"cancel_from": None, "sampled": [-1] * N}
        envs = []
        for r, tw in enumerate(self.twins):
            dm, sc = tw.dm, tw.s
            g, S = dm.group, sc.n_splits
            env = dict(
                x=torch.zeros(d), qkv=torch.zeros(dm.q_dim + 2 * dm.kv_dim), attn=torch.zeros(dm.q_dim),
                h=torch.zeros(dm.ffn), part=torch.zeros(dm.n_kv, S, g, dm.head_dim + 2), logits=torch.zeros(self.vocab),
                recv=torch.zeros(L, 2, N, d), recs={}, ctr=np.zeros(sc.n_counters, dtype=np.int64),
                k_cache=k_caches[r], v_cache=v_caches[r], slot=slot, pos0=pos0, valid_len=valid_len,
                attn_min_pos=attn_min_pos, temperature=temperature, top_p=top_p, seed=seed, stop_ids=stop_ids,
                forced=forced, cancel_at_step=None, out_tokens=[], out_logits=[],
                state={"stop": False, "finish": "length", "token": token}, rank=r)
            env["tags"] = {n: np.full(sz, -1, dtype=np.int64) for n, sz in
                           (("x", d), ("qkv", dm.q_dim + 2 * dm.kv_dim), ("attn", dm.q_dim), ("h", dm.ffn),
                            ("part", dm.n_kv * S), ("logits", self.vocab), ("rec", self.n_records or sc.n_lm))}
            if self.n_records is not None:
                env["n_records"] = self.n_records
            env["rtag"] = np.full((L, 2, N, d), -1, dtype=np.int64)
            kv_tag = np.full((L, dm.n_kv, k_caches[r].shape[3]), -1, dtype=np.int64)
            kv_tag[:, :, :valid_len] = -2
            env["kv_tag"] = kv_tag

            def embed(tok, step, env=env):
                env["x"].copy_(self.twins[env["rank"]].m.embed[tok].float().cpu())
                env["tags"]["x"][:] = _tag(step, -1, EMBED)

            env["embed"] = embed
            embed(token, 0)
            env["ctr"][isa.token_counter(L)] += 1
            envs.append(env)

        units = [(r, i) for r in range(N) for i in range(self.twins[r].s.n_sm)]
        ptr = {u: 0 for u in units}
        step_of = {u: 0 for u in units}
        done = {u: False for u in units}
        rng = random.Random(order_seed)
        tok_ctr = isa.token_counter(L)
        n_run = 0

        def runnable(u):
            if done[u]:
                return False
            r, i = u
            s, ctr = step_of[u], envs[r]["ctr"]
            if ptr[u] == 0 and ctr[tok_ctr] < s + 1:
                return False
            lst = self.twins[r].s.per_sm[i]
            if not lst:
                return True
            ins = lst[ptr[u]]
            return ctr[ins[4]] >= (s + 1) * ins[5]

        while not all(done.values()):
            ready = [u for u in units if runnable(u)]
            if not ready:
                raise ScheduleError(f"deadlock: no (rank, SM) can run (steps={step_of})")
            u = rng.choice(ready)
            r, i = u
            s, env, tw = step_of[u], envs[r], self.twins[r]
            st = env["state"]
            if ptr[u] == 0 and st["stop"] and st["stop_step"] < s:
                done[u] = True
                continue
            lst = tw.s.per_sm[i]
            if lst:
                self._exec(r, lst[ptr[u]], s, pos0 + s, envs, shared, cancel_at_step)
                n_run += 1
                ptr[u] += 1
            if not lst or ptr[u] == len(lst):
                ptr[u] = 0
                step_of[u] += 1
                done[u] = step_of[u] >= n_steps
        res = []
        for env in envs:
            st, lg = env["state"], env["out_logits"]
            res.append(TwinResult(tokens=env["out_tokens"], logits=torch.stack(lg) if lg else torch.zeros(0, 1),
                                  steps_run=len(lg), finish=st["finish"], instructions_run=0))
        return TPTwinResult(ranks=res, instructions_run=n_run)

    # ---- one instruction of rank r ----
    def _exec(self, r, ins, step, pos, envs, shared, cancel_at_step) -> None:
        op, layer, a0, a1, wc, wn, sig, aux = ins
        N, L = self.N, self.L
        env, tw = envs[r], self.twins[r]
        if op in (OP["ATTN"], OP["SAMPLE"]):
            if op == OP["SAMPLE"]:
                self._cancel_hook(r, step, env, shared, cancel_at_step)
            tw._exec(ins, step, pos, env)
            return
        x, tags, rtag, recv = env["x"], env["tags"], env["rtag"], env["recv"]
        w = tw.layers[layer] if op != OP["LMHEAD"] else None
        emb = _tag(step, -1, EMBED)

        def pending(ly, stage, rows=slice(None)):
            """Sum over source ranks 0..N-1 (that order) of recv[ly][stage] rows, after checking their tags."""
            want = _tag(step, ly, OP["OPROJ"] if stage == 0 else OP["DOWN"])
            tw._expect(rtag[ly, stage, :, rows].reshape(-1), want, f"recv[{ly}][{stage}]", ins)
            acc = recv[ly, stage, 0, rows].clone()
            for k in range(1, N):
                acc = acc + recv[ly, stage, k, rows]
            return acc

        def push(stage, rows, vals):
            t = _tag(step, layer, op)
            for dst in envs:
                dst["recv"][layer, stage, r, rows] = vals
                dst["rtag"][layer, stage, r, rows] = t

        if op in (OP["QKV"], OP["GATEUP"], OP["LMHEAD"]):
            if op == OP["QKV"]:
                src = None if layer == 0 else (layer - 1, 1)
                x_want = emb if layer == 0 else _tag(step, layer - 1, OP["OPROJ"])
            elif op == OP["GATEUP"]:
                src = (layer, 0)
                x_want = emb if layer == 0 else _tag(step, layer - 1, OP["DOWN"])
            else:
                src = (L - 1, 1)
                x_want = _tag(step, L - 1, OP["OPROJ"])
            tw._expect(tags["x"], x_want, "x", ins)
            xc = x if src is None else x + pending(*src)
            if op == OP["QKV"]:
                xn = tw._norm(xc, w.ln1.cpu())
                rows = slice(a0, a0 + a1)
                y = w.wqkv[rows].float().cpu() @ xn
                if w.bqkv is not None:
                    y = y + w.bqkv[rows].float().cpu()
                env["qkv"][rows] = y
                tags["qkv"][rows] = _tag(step, layer, op)
            elif op == OP["GATEUP"]:
                xn = tw._norm(xc, w.ln2.cpu())
                f = tw.dm.ffn
                gt = w.wgu[a0:a0 + a1].float().cpu() @ xn
                up = w.wgu[f + a0:f + a0 + a1].float().cpu() @ xn
                env["h"][a0:a0 + a1] = F.silu(gt) * up
                tags["h"][a0:a0 + a1] = _tag(step, layer, op)
            else:
                xn = tw._norm(xc, tw.m.norm.cpu())
                lg = tw.m.lm_head[a0:a0 + a1].float().cpu() @ xn
                v0 = self.vocab_offsets[r] if self.vocab_offsets is not None else 0
                rec = tw._record(lg, v0 + a0, step, env)
                slot = self.rec_off[r] + aux
                rows = slice(v0 + a0, v0 + a0 + a1)
                # vocabulary-parallel: the block's logits and record reach every rank (records by peer stores)
                for dst in (envs if self.vocab_offsets is not None else [env]):
                    dst["logits"][rows] = lg
                    dst["tags"]["logits"][rows] = _tag(step, 0, op)
                    dst["recs"][slot] = rec
                    dst["tags"]["rec"][slot] = _tag(step, 0, op)
        elif op == OP["OPROJ"]:
            tw._expect(tags["attn"], _tag(step, layer, OP["ATTN"]), "attn", ins)
            rows = slice(a0, a0 + a1)
            if layer > 0:   # materialise DOWN of layer - 1 into x[rows]
                tw._expect(tags["x"][rows], _tag(step, layer - 1, OP["OPROJ"]), "x rows", ins)
                x[rows] = x[rows] + pending(layer - 1, 1, rows)
                tags["x"][rows] = _tag(step, layer - 1, OP["DOWN"])
            else:
                tw._expect(tags["x"][rows], emb, "x rows", ins)
            push(0, rows, w.wo[rows].float().cpu() @ env["attn"])
        elif op == OP["DOWN"]:
            tw._expect(tags["h"], _tag(step, layer, OP["GATEUP"]), "h", ins)
            rows = slice(a0, a0 + a1)
            tw._expect(tags["x"][rows], emb if layer == 0 else _tag(step, layer - 1, OP["DOWN"]), "x rows", ins)
            x[rows] = x[rows] + pending(layer, 0, rows)      # materialise OPROJ of this layer
            tags["x"][rows] = _tag(step, layer, OP["OPROJ"])
            push(1, rows, w.wd[rows].float().cpu() @ env["h"])
        else:
            raise ScheduleError(f"unknown op in {ins}")
        if op in (OP["OPROJ"], OP["DOWN"]) or (op == OP["LMHEAD"] and self.vocab_offsets is not None):
            for dst in envs:
                dst["ctr"][sig] += 1
        else:
            env["ctr"][sig] += 1

    def _cancel_hook(self, r, step, env, shared, cancel_at_step) -> None:
        """mk_exchange.cuh xr_cancelled: rank 0 announces at the step it sees the flag, all ranks stop one later.
        Also checks the causality the kernel relies on: rank 0's sampler of step - 1 ran before this one."""
        if shared["sampled"][0] < step - 1:
            raise ScheduleError(f"rank {r} samples step {step} before rank 0's sampler of step {step - 1}")
        cf = shared["cancel_from"]
        env["cancel_at_step"] = cf if cf is not None and step >= cf else None
        if r == 0 and cf is None and cancel_at_step is not None and step >= cancel_at_step:
            shared["cancel_from"] = step + 1
        shared["sampled"][r] = max(shared["sampled"][r], step)
