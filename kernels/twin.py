"""CPU twin of the monokernel: runs the same per-SM instruction lists with torch (fp32) at the kernel's
granularity, including the dependency counters.

The SMs are interleaved in a random (seeded) order: at every tick one SM whose next instruction's wait is
satisfied runs that instruction. Independently of the counters, every buffer element carries a tag naming the
(step, layer, stage) that wrote it, and each instruction asserts that everything it reads carries exactly the
tag it expects. A wait target that is too low (read-after-write) or a stage that overwrites data still being
read (write-after-read) therefore fails loudly here, whatever the counters say.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from . import isa
from .sampling_rng import gumbel
from .schedule import Schedule, attn_splits_in_use, attnq_aux_parts, attnq_row, attnq_rows, mlp_partner

EMBED = 0   # pseudo-stage tag for the embedding written by the prologue / SAMPLE


class ScheduleError(AssertionError):
    pass


def _tag(step: int, layer: int, op: int) -> int:
    return (step * 1024 + layer + 1) * 16 + op


@dataclass
class TwinResult:
    tokens: list[int]           # sampled tokens, one per finished step (stop id included)
    logits: torch.Tensor        # [steps_run, V] fp32
    steps_run: int
    finish: str                 # "length" | "stop" | "cancelled"
    instructions_run: int
    lm_candidates: list[int] = field(default_factory=list)   # screened head: candidates per LMHEAD instruction


class Twin:
    """model: engine.model.Model (fp32 weights, any device; the twin computes on CPU)."""

    def __init__(self, model, sched: Schedule, inv_freq: torch.Tensor, lm_screen: bool = False):
        """lm_screen: LMHEAD records from the screened head (kernels/lm_screen.py: each instruction's rows screened
        against that instruction's own maxima, excluded rows out of its records) in runs without top-p, as the
        kernel's launches without logits output; the logits the twin returns stay every row's exact one."""
        self.m, self.s = model, sched
        self.dm = sched.dims
        self.inv_freq = inv_freq.float().cpu()   # [hd/2]
        self.layers = model.layers
        self.lm8 = None
        if lm_screen:
            from .lm_screen import quantize
            self.lm8 = quantize(model.lm_head.float().cpu())

    # ---- helpers ----
    def _expect(self, tags: np.ndarray, want: int, what: str, ins) -> None:
        if not (tags == want).all():
            bad = np.flatnonzero(tags != want)
            raise ScheduleError(f"{ins}: {what}[{bad[0]}] has tag {tags[bad[0]]}, expected {want}")

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean() + self.dm.eps) * w.float()

    def _rope(self, v: torch.Tensor, pos: int) -> torch.Tensor:
        """v: [..., hd] rotated at `pos` (HF rotate_half pairs i, i + hd/2)."""
        ang = torch.tensor(float(pos), dtype=torch.float32) * self.inv_freq
        c, s = torch.cat([ang.cos()] * 2), torch.cat([ang.sin()] * 2)
        half = v.shape[-1] // 2
        rot = torch.cat([-v[..., half:], v[..., :half]], dim=-1)
        return v * c + rot * s

    def _split_span(self, pos: int, split: int, env) -> tuple[int, int, int]:
        """(splits in use, first position, end) of attention split `split` at position pos (mk_attention.cuh
        attn_step_fill; an idle split has no positions)."""
        n = pos + 1
        s_eff = attn_splits_in_use(n, self.s.n_splits, env["attn_min_pos"], env["attn_min_splits"], env["kv_stage_pos"])
        return (s_eff, split * n // s_eff, (split + 1) * n // s_eff) if split < s_eff else (s_eff, 0, 0)

    def _kv_slices(self, head: int) -> tuple[slice, slice]:
        """Kv head `head`'s k and v rows in qkv[] (after the q rows)."""
        qd, kvd, hd = self.dm.q_dim, self.dm.kv_dim, self.dm.head_dim
        return slice(qd + head * hd, qd + (head + 1) * hd), slice(qd + kvd + head * hd, qd + kvd + (head + 1) * hd)

    def _check_kv(self, ins, layer: int, head: int, positions, env) -> None:
        """Every cached K / V row an attention split reads holds the prompt (tag -2) or the step that appended it."""
        for p in positions:
            t = env["kv_tag"][layer, head, p]
            if not (t == -2 if p < env["valid_len"] else t == _tag(p - env["pos0"], layer, isa.OPS["ATTN"])):
                raise ScheduleError(f"{ins}: KV at pos {p} has tag {t}")

    @staticmethod
    def _partial(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor) -> tuple:
        """One split's online-softmax partial of q heads q [g, hd] over keys / vals [n, hd]: (max, denominator,
        weighted sum) per q head."""
        sc_ = (q @ keys.T) * (q.shape[-1] ** -0.5)
        mx = sc_.max(dim=1).values
        e = torch.exp(sc_ - mx[:, None])
        return mx, e.sum(1), e @ vals

    @staticmethod
    def _merge(mx: torch.Tensor, den: torch.Tensor, num: torch.Tensor) -> torch.Tensor:
        """The splits' partials (max, denominator [s, g], weighted sums [s, g, hd]) merged: the q heads' outputs,
        flat."""
        wgt = torch.exp(mx - mx.max(dim=0).values)
        return ((wgt[:, :, None] * num).sum(0) / (wgt * den).sum(0)[:, None]).reshape(-1)

    # ---- run ----
    def run(self, k_cache: torch.Tensor, v_cache: torch.Tensor, slot: int, token: int, pos0: int, n_steps: int,
            temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, stop_ids=(), forced=None,
            cancel_at_step: int | None = None, order_seed: int = 0, valid_len: int | None = None,
            capture: dict | None = None, attn_min_pos: int = 64, attn_min_splits: int = 0,
            kv_stage_pos: int = 128) -> TwinResult:
        """k_cache/v_cache: [S, L, kvh, max_len, hd] (fp32, updated in place). forced: tokens fed at steps 1..
        (teacher forcing; forced[s] is the input of step s, forced[0] unused). valid_len: positions < valid_len
        hold prefilled KV (default pos0). capture: filled with the final scratch buffers (x, qkv, attn, h).
        attn_min_pos, attn_min_splits, kv_stage_pos: as Monokernel's (schedule.attn_splits_in_use: the splits the
        attention uses)."""
        dm, sc = self.dm, self.s
        L, g, hd, S = dm.n_layers, dm.group, dm.head_dim, sc.n_splits
        qd, kvd = dm.q_dim, dm.kv_dim
        valid_len = pos0 if valid_len is None else valid_len
        m = self.m
        x = torch.zeros(dm.d)
        qkv = torch.zeros(qd + 2 * kvd)
        attn = torch.zeros(qd)
        h = torch.zeros(dm.ffn)
        part = torch.zeros(dm.n_kv, S, g, hd + 2)
        logits = torch.zeros(dm.vocab)
        recs: dict[int, dict] = {}
        tags = {n: np.full(sz, -1, dtype=np.int64) for n, sz in
                (("x", dm.d), ("qkv", qd + 2 * kvd), ("attn", qd), ("h", dm.ffn), ("part", dm.n_kv * S),
                 ("logits", dm.vocab), ("rec", sc.n_lm))}
        # fused MLP schedule: the fixed-point MLP output (isa.ACC_FRAC_BITS), per element the tag of the (step,
        # layer) adding into it (-1: zero), and how many MLP instructions have added per tag
        acc = np.zeros(dm.d, dtype=np.int64)
        acc_tag = np.full(dm.d, -1, dtype=np.int64)
        acc_n: dict[int, int] = {}
        kv_tag = np.full((L, dm.n_kv, k_cache.shape[3]), -1, dtype=np.int64)
        kv_tag[:, :, :valid_len] = -2   # prefilled
        ctr = np.zeros(sc.n_counters, dtype=np.int64)
        tok_ctr = isa.token_counter(L)
        out_tokens: list[int] = []
        out_logits: list[torch.Tensor] = []
        lm_candidates: list[int] = []
        state = {"stop": False, "finish": "length", "token": token}

        def embed(tok, step):
            x.copy_(m.embed[tok].float().cpu())
            tags["x"][:] = _tag(step, -1, EMBED)
            acc[:] = 0          # SAMPLE zeroes the accumulator with the embedding (fused MLP)
            acc_tag[:] = -1

        embed(token, 0)
        ctr[tok_ctr] += 1
        rng = random.Random(order_seed)
        ptr = [0] * sc.n_sm
        step_of = [0] * sc.n_sm
        done = [False] * sc.n_sm
        n_run = 0
        # ATTNQ (schedule qkv_parts): each part's pushed q / k / v shares by rank, the SM's part once it has pushed
        # (it waits for the other ranks' shares), and the part's split partials
        blocks: dict[tuple, dict[int, torch.Tensor]] = {}
        pushed: list[tuple | None] = [None] * sc.n_sm
        qparts: dict[tuple, dict[int, tuple]] = {}
        # paired MLP instructions (schedule.build mlp_pairs): each CTA's h rows once it has sent them, by (step,
        # layer, CTA), and the SMs whose paired MLP has sent its rows and waits for its partner's
        hpub: dict[tuple, tuple] = {}
        hsent: list[tuple | None] = [None] * sc.n_sm

        def runnable(i):
            if done[i]:
                return False
            if hsent[i] is not None:   # a paired MLP waiting for its partner's h rows
                return hsent[i] + (i ^ 1,) in hpub
            if pushed[i] is not None:   # an ATTNQ waiting for its cluster's other ranks' shares
                s = step_of[i]
                return len(blocks[pushed[i]]) == sc.cluster and self._kv_ready(
                    sc.per_sm[i][ptr[i]], s, pos0 + s, ctr, (attn_min_pos, attn_min_splits, kv_stage_pos))
            s = step_of[i]
            if ptr[i] == 0 and ctr[tok_ctr] < s + 1:
                return False
            lst = sc.per_sm[i]
            if not lst:
                return True
            wc, wn = lst[ptr[i]][4], lst[ptr[i]][5]
            return ctr[wc] >= (s + 1) * wn

        while not all(done):
            ready = [i for i in range(sc.n_sm) if runnable(i)]
            if not ready:
                raise ScheduleError(f"deadlock: no SM can run (ptr={ptr}, steps={step_of})")
            i = rng.choice(ready)
            s = step_of[i]
            if ptr[i] == 0 and state["stop"] and state["stop_step"] < s:
                done[i] = True      # the sampler of an earlier step stopped the loop
                continue
            lst = sc.per_sm[i]
            if lst:
                ins = lst[ptr[i]]
                if pushed[i] is None and ins[0] == isa.OPS["ATTNQ"]:
                    pushed[i] = self._push_qkv(ins, i, s, locals())
                    continue
                if hsent[i] is None and ins[0] == isa.OPS["MLP"] and mlp_partner(ins[7]) is not None:
                    hsent[i] = self._send_h(ins, i, s, locals())
                    continue
                self._exec(ins, s, pos0 + s, locals())
                pushed[i] = hsent[i] = None
                n_run += 1
                ptr[i] += 1
            if not lst or ptr[i] == len(lst):
                ptr[i] = 0
                step_of[i] += 1
                done[i] = step_of[i] >= n_steps
        if capture is not None:
            capture.update(x=x, qkv=qkv, attn=attn, h=h)
        return TwinResult(tokens=out_tokens, logits=torch.stack(out_logits) if out_logits else torch.zeros(0, dm.vocab),
                          steps_run=len(out_logits), finish=state["finish"], instructions_run=n_run,
                          lm_candidates=lm_candidates)

    def _exec(self, ins, step, pos, env) -> None:
        op, layer, a0, a1, wc, wn, sig, aux = ins
        dm, sc, m = self.dm, self.s, self.m
        x, qkv, attn, h, part, logits = (env[k] for k in ("x", "qkv", "attn", "h", "part", "logits"))
        tags, ctr, kv_tag = env["tags"], env["ctr"], env["kv_tag"]
        k_cache, v_cache, slot = env["k_cache"], env["v_cache"], env["slot"]
        L, g, hd, S = dm.n_layers, dm.group, dm.head_dim, sc.n_splits
        x_in = _tag(step, layer - 1, isa.OPS["OPROJ" if sc.fused_mlp else "DOWN"]) if layer > 0 \
            else _tag(step, -1, EMBED)
        name = {v: k for k, v in isa.OPS.items()}[op]
        if name == "QKV":
            self._expect(tags["x"], x_in, "x", ins)
            w = self.layers[layer]
            xn = self._norm(self._residual(x, layer - 1, step, ins, env), w.ln1.cpu())
            r = slice(a0, a0 + a1)
            y = w.wqkv[r].float().cpu() @ xn
            if w.bqkv is not None:
                y = y + w.bqkv[r].float().cpu()
            qkv[r] = y
            tags["qkv"][r] = _tag(step, layer, op)
        elif name == "ATTN":
            head, split = a0, a1
            want = _tag(step, layer, isa.OPS["QKV"])
            qs = slice(head * g * hd, (head + 1) * g * hd)
            ks, vs = self._kv_slices(head)
            for sl, nm in ((qs, "q"), (ks, "k"), (vs, "v")):
                self._expect(tags["qkv"][sl], want, nm, ins)
            s_eff, p0, p1 = self._split_span(pos, split, env)
            if split == s_eff - 1:   # the split holding pos appends this step's K/V
                k_cache[slot, layer, head, pos] = self._rope(qkv[ks].clone(), pos)
                v_cache[slot, layer, head, pos] = qkv[vs]
                kv_tag[layer, head, pos] = _tag(step, layer, op)
            self._check_kv(ins, layer, head, range(p0, p1), env)
            q = self._rope(qkv[qs].view(g, hd).clone(), pos)
            pr = part[head, split]
            if p1 > p0:
                pr[:, 0], pr[:, 1], pr[:, 2:] = self._partial(q, k_cache[slot, layer, head, p0:p1].float(),
                                                              v_cache[slot, layer, head, p0:p1].float())
            else:
                pr[:, 0], pr[:, 1], pr[:, 2:] = float("-inf"), 0.0, 0.0
            tags["part"][head * S + split] = _tag(step, layer, op)
            ctr[sig] += 1
            # Every split publishes its partial; once all S have, the splits with positions each merge a slice of
            # the head (mk_attention.cuh attn_merge_slice): modelled as the whole merge at the last publication,
            # with every split's ATTN_DONE bump (OPROJ waits for all n_kv x S of them, so for every slice).
            if ctr[sig] == (step + 1) * S:
                self._expect(tags["part"][head * S:(head + 1) * S], _tag(step, layer, op), "part", ins)
                pp = part[head, :s_eff]
                attn[head * g * hd:(head + 1) * g * hd] = self._merge(pp[:, :, 0], pp[:, :, 1], pp[:, :, 2:])
                tags["attn"][head * g * hd:(head + 1) * g * hd] = _tag(step, layer, op)
            ctr[aux] += 1
            return
        elif name == "ATTNQ":
            self._attnq(ins, step, pos, env)
            ctr[attnq_aux_parts(aux)[0]] += 1
            return
        elif name == "OPROJ":
            self._expect(tags["attn"], _tag(step, layer, isa.OPS["ATTN"]), "attn", ins)
            r = slice(a0, a0 + a1)
            self._expect(tags["x"][r], x_in, "x rows", ins)
            y = self.layers[layer].wo[r].float().cpu() @ attn
            if sc.fused_mlp:   # materialise the last MLP's output into x[rows] and zero it there
                x[r] = self._residual(x, layer - 1, step, ins, env, r) + y
                env["acc"][r], env["acc_tag"][r] = 0, -1
            else:
                x[r] += y
            tags["x"][r] = _tag(step, layer, op)
        elif name == "GATEUP":
            self._expect(tags["x"], _tag(step, layer, isa.OPS["OPROJ"]), "x", ins)
            h[a0:a0 + a1] = self._h_rows(x, layer, a0, a1)
            tags["h"][a0:a0 + a1] = _tag(step, layer, op)
        elif name == "MLP":
            self._expect(tags["x"], _tag(step, layer, isa.OPS["OPROJ"]), "x", ins)
            t = _tag(step, layer, op)
            if not np.isin(env["acc_tag"], (-1, t)).all():
                raise ScheduleError(f"{ins}: acc still holds another layer's output")
            wd = self.layers[layer].wd
            pr = mlp_partner(aux)
            if pr is None:
                rows = slice(None)
                y = wd[:, a0:a0 + a1].float().cpu() @ self._h_rows(x, layer, a0, a1)
            else:   # paired: half of the outputs (by rank parity) over this slice's h and the partner's
                i = env["i"]
                (m0, m1, mine), (b0, b1, theirs) = env["hpub"][(step, layer, i)], env["hpub"][(step, layer, i ^ 1)]
                if (b0, b1) != pr or (m0, m1) != (a0, a1):
                    raise ScheduleError(f"{ins}: partner CTA {i ^ 1} sent rows {b0}..{b0 + b1}, aux names {pr}")
                half = dm.d // 2
                rows = slice(0, half) if i % sc.cluster % 2 == 0 else slice(half, dm.d)
                y = wd[rows, a0:a0 + a1].float().cpu() @ mine + wd[rows, b0:b0 + b1].float().cpu() @ theirs
            env["acc"][rows] += np.rint(y.numpy() * np.float32(2.0 ** isa.ACC_FRAC_BITS)).astype(np.int64)
            env["acc_tag"][rows] = t
            env["acc_n"][t] = env["acc_n"].get(t, 0) + 1
        elif name == "DOWN":
            self._expect(tags["h"], _tag(step, layer, isa.OPS["GATEUP"]), "h", ins)
            r = slice(a0, a0 + a1)
            self._expect(tags["x"][r], _tag(step, layer, isa.OPS["OPROJ"]), "x rows", ins)
            x[r] += self.layers[layer].wd[r].float().cpu() @ h
            tags["x"][r] = _tag(step, layer, op)
        elif name == "LMHEAD":
            self._expect(tags["x"], _tag(step, L - 1, isa.OPS["OPROJ" if sc.fused_mlp else "DOWN"]), "x", ins)
            xn = self._norm(self._residual(x, L - 1, step, ins, env), m.norm.cpu())
            r = slice(a0, a0 + a1)
            lg = m.lm_head[r].float().cpu() @ xn
            logits[r] = lg
            tags["logits"][r] = _tag(step, 0, op)
            env["recs"][aux] = self._record(self._screened(lg, r, xn, step, env), a0, step, env)
            tags["rec"][aux] = _tag(step, 0, op)
        elif name == "SAMPLE":
            self._expect(tags["rec"], _tag(step, 0, isa.OPS["LMHEAD"]), "records", ins)
            self._expect(tags["logits"], _tag(step, 0, isa.OPS["LMHEAD"]), "logits", ins)
            self._sample(step, env)
        ctr[sig] += 1

    def _push_qkv(self, ins, i: int, step: int, env) -> tuple:
        """The first part of an ATTNQ instruction on SM i: its rank's share of the part's q / k / v rows
        (schedule.attnq_row) from RMSNorm(x + the last MLP's output), pushed to its cluster; returns the part's key,
        which the SM then waits on until every rank has pushed."""
        dm, sc = self.dm, self.s
        layer, j0, gq, head, split = ins[1], ins[6] & 255, (ins[6] >> 8) & 255, (ins[6] >> 16) & 255, ins[6] >> 24
        x_in = _tag(step, layer - 1, isa.OPS["OPROJ" if sc.fused_mlp else "DOWN"]) if layer > 0 \
            else _tag(step, -1, EMBED)
        self._expect(env["tags"]["x"], x_in, "x", ins)
        if i >= sc.cluster_ctas or i % sc.cluster != split:
            raise ScheduleError(f"{ins}: ATTNQ split {split} on CTA {i} (clusters of {sc.cluster})")
        w = self.layers[layer]
        xn = self._norm(self._residual(env["x"], layer - 1, step, ins, env), w.ln1.cpu())
        rr = attnq_rows(dm, gq, sc.kv_apart) // sc.cluster
        rows = [attnq_row(dm, head, j0, gq, r) for r in range(split * rr, (split + 1) * rr)]
        y = w.wqkv[rows].float().cpu() @ xn
        if w.bqkv is not None:
            y = y + w.bqkv[rows].float().cpu()
        key = (step, layer, i // sc.cluster, head, j0)
        blk = env["blocks"].setdefault(key, {})
        if split in blk:
            raise ScheduleError(f"{ins}: rank {split} pushed twice into part {key}")
        blk[split] = y
        return key

    def _send_h(self, ins, i: int, step: int, env) -> tuple:
        """The first part of a paired MLP instruction on SM i (schedule.build mlp_pairs): its h rows from RMSNorm(x),
        sent to its partner (CTA i ^ 1, the next or previous rank of its cluster); returns (step, layer), which the SM
        then waits on until the partner has sent its own."""
        layer, a0, a1 = ins[1], ins[2], ins[3]
        sc = self.s
        if i >= sc.cluster_ctas:
            raise ScheduleError(f"{ins}: a paired MLP on side-launch CTA {i}")
        self._expect(env["tags"]["x"], _tag(step, layer, isa.OPS["OPROJ"]), "x", ins)
        env["hpub"][(step, layer, i)] = (a0, a1, self._h_rows(env["x"], layer, a0, a1))
        return step, layer

    def _attnq(self, ins, step: int, pos: int, env) -> None:
        """The second part of an ATTNQ instruction, every rank's share in: the part's q heads' partial over the
        split's positions (the step's own K / V row from the part's shares; every part's split holding pos appends it
        to the cache, the same values), and, once the part's last split has one, the merge into the part's rows of
        attn (mk_attention.cuh attn_cluster_combine)."""
        dm, sc = self.dm, self.s
        layer, j0, gq, head, split = ins[1], ins[6] & 255, (ins[6] >> 8) & 255, (ins[6] >> 16) & 255, ins[6] >> 24
        hd, g, S = dm.head_dim, dm.group, sc.n_splits
        key = env["pushed"][env["i"]]
        v = torch.cat([env["blocks"][key][r] for r in range(sc.cluster)])
        q = self._rope(v[:gq * hd].view(gq, hd).clone(), pos)
        s_eff, p0, p1 = self._split_span(pos, split, env)
        if not sc.kv_apart:
            k_new, v_new = self._rope(v[gq * hd:(gq + 1) * hd].clone(), pos), v[(gq + 1) * hd:]
        elif split == s_eff - 1:   # kv_apart: the row from qkv, once the layer's QKV instructions wrote it (_kv_ready)
            ks, vs = self._kv_slices(head)
            for sl, nm in ((ks, "k"), (vs, "v")):
                self._expect(env["tags"]["qkv"][sl], _tag(step, layer, isa.OPS["QKV"]), nm, ins)
            k_new, v_new = self._rope(env["qkv"][ks].clone(), pos), env["qkv"][vs].clone()
        kt = _tag(step, layer, isa.OPS["ATTN"])
        slot, kc, vc, kv_tag = env["slot"], env["k_cache"], env["v_cache"], env["kv_tag"]
        if split == s_eff - 1:   # each part's split holding pos appends this step's K / V (the same values)
            kc[slot, layer, head, pos], vc[slot, layer, head, pos] = k_new, v_new
            kv_tag[layer, head, pos] = kt
        # this step's row is the part's own (another part's write of it is not ordered before this read); the
        # others come from the cache
        self._check_kv(ins, layer, head, [p for p in range(p0, p1) if p != pos], env)
        keys = [k_new if p == pos else kc[slot, layer, head, p].float() for p in range(p0, p1)]
        vals = [v_new if p == pos else vc[slot, layer, head, p].float() for p in range(p0, p1)]
        if keys:
            pr = self._partial(q, torch.stack(keys), torch.stack(vals))
        else:
            pr = (torch.full((gq,), float("-inf")), torch.zeros(gq), torch.zeros(gq, hd))
        done = env["qparts"].setdefault(key, {})
        done[split] = pr
        if len(done) == S:   # the part's last split: the cluster combine of its q heads
            rows = slice((head * g + j0) * hd, (head * g + j0 + gq) * hd)
            env["attn"][rows] = self._merge(*(torch.stack([done[sp][i] for sp in range(s_eff)]) for i in range(3)))
            env["tags"]["attn"][rows] = kt

    def _kv_ready(self, ins, step: int, pos: int, ctr: np.ndarray, split_rule: tuple[int, int, int]) -> bool:
        """With kv_apart: whether ATTNQ `ins` may go on after its part's exchange at `step` (position pos). Only the
        split holding pos waits (for the k / v producers its aux names, on the layer's QKV counter: mk_attention.cuh
        op_attnq). split_rule: run's (attn_min_pos, attn_min_splits, kv_stage_pos)."""
        kvn = attnq_aux_parts(ins[7])[1]
        if not kvn:
            return True
        if ins[6] >> 24 != attn_splits_in_use(pos + 1, self.s.n_splits, *split_rule) - 1:
            return True
        return ctr[isa.counter_index(ins[1], isa.CTR_QKV)] >= (step + 1) * kvn

    def _h_rows(self, x: torch.Tensor, layer: int, a0: int, a1: int) -> torch.Tensor:
        """h[a0:a0 + a1] = silu(gate rows . xn) * (up rows . xn), xn = RMSNorm(x) with ln2 (GATEUP and MLP)."""
        w, f = self.layers[layer], self.dm.ffn
        xn = self._norm(x, w.ln2.cpu())
        return F.silu(w.wgu[a0:a0 + a1].float().cpu() @ xn) * (w.wgu[f + a0:f + a0 + a1].float().cpu() @ xn)

    def _residual(self, x: torch.Tensor, layer: int, step: int, ins, env, rows=slice(None)) -> torch.Tensor:
        """x[rows] + the fused MLP output of `layer` (complete: every MLP instruction of it added), as the kernel
        reads it (acc_value: int64 -> fp32, then the exact power-of-two scale); x itself without the fused MLP.
        Layer -1 (before layer 0): the accumulator must be zero."""
        if not self.s.fused_mlp:
            return x[rows]
        tags = env["acc_tag"][rows]
        if layer < 0:
            if not (tags == -1).all():
                raise ScheduleError(f"{ins}: acc not zero before layer 0")
            return x[rows]
        t = _tag(step, layer, isa.OPS["MLP"])
        if not (tags == t).all() or env["acc_n"].get(t, 0) != self.s.counts["MLP"]:
            raise ScheduleError(f"{ins}: acc of layer {layer} incomplete ({env['acc_n'].get(t, 0)} of "
                                f"{self.s.counts['MLP']} MLP instructions) or overwritten")
        accf = torch.from_numpy(env["acc"][rows].astype(np.float32)) * (2.0 ** -isa.ACC_FRAC_BITS)
        return x[rows] + accf

    def _screened(self, lg: torch.Tensor, r: slice, xn: torch.Tensor, step: int, env) -> torch.Tensor:
        """The rows an LMHEAD instruction's record sees: all exact logits, or with the screened head (and no top-p)
        the exact logits of its candidates and -inf for the rest (mk_lmscreen.cuh: NaN, which no pick takes)."""
        if self.lm8 is None or env["top_p"] < 1.0:
            return lg
        from .lm_screen import approx_logits, bounds, candidates
        q8, sc, c, d = (t[r] for t in self.lm8)
        a = approx_logits(q8, sc, xn)
        T = env["temperature"]
        g = torch.from_numpy(gumbel(env["seed"], step, np.arange(r.start, r.stop))).float() if T > 0 else None
        keep = candidates(a, bounds(a, c, d, xn), T, g)
        env["lm_candidates"].append(int(keep.sum()))
        return torch.where(keep, lg, torch.full_like(lg, -torch.inf))

    def _record(self, lg: torch.Tensor, row0: int, step: int, env) -> dict:
        T, seed = env["temperature"], env["seed"]
        ids = np.arange(row0, row0 + lg.shape[0])
        rec = {"max": float(lg.max()), "arg": row0 + int(torch.argmax(lg))}
        if T > 0:
            sl = lg / T
            rec["sumexp"] = float(torch.exp(sl - sl.max()).sum())
            gs = sl + torch.from_numpy(gumbel(seed, step, ids))
            rec["gbest"], rec["gid"] = float(gs.max()), row0 + int(torch.argmax(gs))
            k = min(isa.TOPK, lg.shape[0])
            tv, ti = torch.topk(lg, k)
            rec["topv"], rec["topi"] = tv.tolist(), (ti + row0).tolist()
        return rec

    def _sample(self, step: int, env) -> None:
        recs = [env["recs"][i] for i in range(env.get("n_records", self.s.n_lm))]   # TP: every rank's records
        T, top_p, seed = env["temperature"], env["top_p"], env["seed"]
        env["out_logits"].append(env["logits"].clone())
        state = env["state"]
        if env["cancel_at_step"] is not None and step >= env["cancel_at_step"]:
            # The host's cancel flag is read once per token: no token is emitted and the loop ends at the
            # next step start (TOKEN is still bumped by the caller so every CTA wakes up and sees the flag).
            state.update(stop=True, stop_step=step, finish="cancelled")
            return
        if T <= 0:
            best = max(range(len(recs)), key=lambda i: (recs[i]["max"], -i))
            tok = recs[best]["arg"]
        elif top_p >= 1.0:
            best = max(range(len(recs)), key=lambda i: (recs[i]["gbest"], -i))
            tok = recs[best]["gid"]
        else:
            M = max(r["max"] for r in recs)
            Z = sum(r["sumexp"] * np.exp((r["max"] - M) / T) for r in recs)
            cand = [(v, i) for r in recs for v, i in zip(r["topv"], r["topi"])]
            p = np.array([np.exp((v - M) / T) / Z for v, _ in cand], dtype=np.float64)
            ids = np.array([i for _, i in cand])
            before = np.array([p[(p > p[j]) | ((p == p[j]) & (ids < ids[j]))].sum() for j in range(len(cand))])
            keep = before < top_p
            score = np.where(keep, np.log(p) + gumbel(seed, step, ids), -np.inf)
            tok = int(ids[int(np.argmax(score))])
        env["out_tokens"].append(tok)
        if tok in env["stop_ids"]:
            state.update(stop=True, stop_step=step, finish="stop")
        nxt = tok
        forced = env["forced"]
        if forced is not None and step + 1 < len(forced):
            nxt = int(forced[step + 1])
        env["embed"](nxt, step + 1)
