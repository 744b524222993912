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
from .schedule import Schedule, lane_counters
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

    def __init__(self, models, scheds: list[Schedule], inv_freq: torch.Tensor, vocab_offsets=None, lanes=None):
        """lanes: a kernels.tp_local.LanePlan for delayed mode (scheds from schedule.with_lanes; rank r runs lane r,
        vocabulary-parallel LM head over lanes.vocab), else exact mode."""
        if len(models) != len(scheds):
            raise ValueError("one schedule per rank")
        self.lanes = lanes
        if lanes is not None:
            vocab_offsets = [v0 for v0, _ in lanes.vocab]
            self.x_ctr, self.xn_oproj, self.xn_down = lane_counters(scheds)
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
            order_seed: int = 0, valid_len: int | None = None, attn_min_pos: int = 64,
            attn_min_splits: int = 0, kv_stage_pos: int = 128) -> TPTwinResult:
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
                attn_min_pos=attn_min_pos, attn_min_splits=attn_min_splits,
                kv_stage_pos=kv_stage_pos, temperature=temperature, top_p=top_p, seed=seed, stop_ids=stop_ids,
                forced=forced, cancel_at_step=None, out_tokens=[], out_logits=[],
                state={"stop": False, "finish": "length", "token": token}, rank=r)
            env["tags"] = {n: np.full(sz, -1, dtype=np.int64) for n, sz in
                           (("x", d), ("qkv", dm.q_dim + 2 * dm.kv_dim), ("attn", dm.q_dim), ("h", dm.ffn),
                            ("part", dm.n_kv * S), ("logits", self.vocab), ("rec", self.n_records or sc.n_lm))}
            if self.n_records is not None:
                env["n_records"] = self.n_records
            env["rtag"] = np.full((L, 2, N, d), -1, dtype=np.int64)
            env["fin"], env["ftag"] = torch.zeros(N, d), np.full((N, d), -1, dtype=np.int64)   # delayed, lane_agg
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
            if ctr[ins[4]] < (s + 1) * ins[5]:
                return False
            xw = self._lane_wait(ins[0], ins[1]) if self.lanes is not None else None
            return xw is None or ctr[xw[0]] >= (s + 1) * xw[1]

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
        if self.lanes is not None:
            self._exec_lane(r, ins, step, envs)
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

    # ---- delayed mode (mk_exchange.cuh xr_lane_*) ----
    def _lane_wait(self, op, layer):
        """(peer counter, producers per step) the kernel's xr_lane_wait adds to this instruction's wait, or None."""
        lp, L = self.lanes, self.L
        if op == OP["GATEUP"]:
            j, s = layer, 0
        elif op == OP["QKV"] and layer > 0:
            j, s = layer - 1, 1
        elif op == OP["LMHEAD"] and lp.agg:
            return self.x_ctr + 2 * L, self.xn_down
        elif op == OP["LMHEAD"]:
            j, s = L - 1, 1
        elif op == OP["DOWN"] and lp.agg and layer == L - 1:
            j, s = layer, 1
        else:
            return None
        m = lp.modes[2 * j + s]
        n = self.xn_oproj if s == 0 else self.xn_down
        if m == isa.LANE_PRESENT and op != OP["DOWN"]:
            return self.x_ctr + 2 * j + s, n
        if m == isa.LANE_PAST:
            return self.x_ctr + 2 * (j - lp.delay) + s, n
        return None

    def _lane_update(self, r, env, ins, step, j, s, rows, own=None):
        """The update u of stage (j, s) for lane r at `rows` (module docstring of mk_exchange.cuh, delayed mode);
        own: this lane's partial there (default: from its receive buffer), tags checked for everything read."""
        lp, recv, rtag, tw = self.lanes, env["recv"], env["rtag"], self.twins[r]
        m = lp.modes[2 * j + s]
        op_of = lambda ly: _tag(step, ly, OP["OPROJ"] if s == 0 else OP["DOWN"])  # noqa: E731
        if own is None:
            tw._expect(rtag[j, s, r, rows], op_of(j), f"recv[{j}][{s}][own]", ins)
            own = recv[j, s, r, rows]
        if m == isa.LANE_NO_REDUCE:
            return own * lp.scale
        if m == isa.LANE_PAST_OWN:
            return own
        src = j - lp.delay if m == isa.LANE_PAST else j
        tw._expect(rtag[src, s, :, rows].reshape(-1), op_of(src), f"recv[{src}][{s}]", ins)
        tot = recv[src, s, 0, rows].clone()
        for k in range(1, self.N):
            tot = tot + recv[src, s, k, rows]
        return tot if m == isa.LANE_PRESENT else own + (tot - recv[src, s, r, rows])

    def _exec_lane(self, r, ins, step, envs) -> None:
        op, layer, a0, a1, wc, wn, sig, aux = ins
        N, L, lp = self.N, self.L, self.lanes
        env, tw = envs[r], self.twins[r]
        x, tags = env["x"], env["tags"]
        w = tw.layers[layer] if op != OP["LMHEAD"] else None
        emb = _tag(step, -1, EMBED)
        rows = slice(a0, a0 + a1)
        full = slice(None)
        if op == OP["QKV"]:
            tw._expect(tags["x"], emb if layer == 0 else _tag(step, layer - 1, OP["OPROJ"]), "x", ins)
            xc = x if layer == 0 else x + self._lane_update(r, env, ins, step, layer - 1, 1, full)
            env["qkv"][rows] = w.wqkv[rows].float().cpu() @ tw._norm(xc, w.ln1.cpu())
            tags["qkv"][rows] = _tag(step, layer, op)
        elif op == OP["GATEUP"]:
            tw._expect(tags["x"], emb if layer == 0 else _tag(step, layer - 1, OP["DOWN"]), "x", ins)
            xn = tw._norm(x + self._lane_update(r, env, ins, step, layer, 0, full), w.ln2.cpu())
            f = tw.dm.ffn
            env["h"][rows] = F.silu(w.wgu[rows].float().cpu() @ xn) * (w.wgu[f + a0:f + a0 + a1].float().cpu() @ xn)
            tags["h"][rows] = _tag(step, layer, op)
        elif op == OP["LMHEAD"]:
            g = tw.m.norm.cpu()
            if lp.agg:   # mean over lanes of each lane's normed final state
                tw._expect(env["ftag"].reshape(-1), _tag(step, L - 1, OP["DOWN"]), "fin", ins)
                xn = sum(tw._norm(env["fin"][k], g) for k in range(N)) / N
            else:
                tw._expect(tags["x"], _tag(step, L - 1, OP["OPROJ"]), "x", ins)
                xn = tw._norm(x + self._lane_update(r, env, ins, step, L - 1, 1, full), g)
            lg = tw.m.lm_head[rows].float().cpu() @ xn
            v0 = self.vocab_offsets[r]
            rec = tw._record(lg, v0 + a0, step, env)
            slot = self.rec_off[r] + aux
            for dst in envs:
                dst["logits"][v0 + a0:v0 + a0 + a1] = lg
                dst["tags"]["logits"][v0 + a0:v0 + a0 + a1] = _tag(step, 0, op)
                dst["recs"][slot] = rec
                dst["tags"]["rec"][slot] = _tag(step, 0, op)
            for dst in envs:
                dst["ctr"][sig] += 1
            return
        else:
            stage = 0 if op == OP["OPROJ"] else 1
            if op == OP["OPROJ"]:
                tw._expect(tags["attn"], _tag(step, layer, OP["ATTN"]), "attn", ins)
                out = w.wo[rows].float().cpu() @ env["attn"]
                j, s = layer - 1, 1
                x_want = emb if layer == 0 else _tag(step, layer - 1, OP["OPROJ"])
            else:
                tw._expect(tags["h"], _tag(step, layer, OP["GATEUP"]), "h", ins)
                out = w.wd[rows].float().cpu() @ env["h"]
                j, s = layer, 0
                x_want = emb if layer == 0 else _tag(step, layer - 1, OP["DOWN"])
            tw._expect(tags["x"][rows], x_want, "x rows", ins)
            if j >= 0:   # materialise the previous stage's update into x[rows]
                x[rows] = x[rows] + self._lane_update(r, env, ins, step, j, s, rows)
                tags["x"][rows] = _tag(step, j, OP["OPROJ"] if s == 0 else OP["DOWN"])
            fin = op == OP["DOWN"] and lp.agg and layer == L - 1
            if fin:
                f = x[rows] + self._lane_update(r, env, ins, step, layer, 1, rows, own=out)
            t = _tag(step, layer, op)
            for dst in envs:
                dst["recv"][layer, stage, r, rows] = out
                dst["rtag"][layer, stage, r, rows] = t
                if fin:
                    dst["fin"][r, rows] = f
                    dst["ftag"][r, rows] = t
            for dst in envs:
                dst["ctr"][self.x_ctr + 2 * layer + stage] += 1
                if fin:
                    dst["ctr"][self.x_ctr + 2 * L] += 1
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
