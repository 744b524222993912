"""Tensor-parallel decode benchmark (issue #6): the same model on 1 and N GPUs.

Rows per model shape (random bf16 weights, context 512, 256 tokens timed after warm-up, median of repeats):
- peer, 1 GPU and N GPUs: the model sharded with engine/tp/shard.py (exact mode), one process per GPU
  (torch.multiprocessing), torch.distributed + NCCL, each rank's whole decode step (all layers, vocab-parallel LM
  head, greedy (max, index) exchange, token fed back on the GPU) captured in one CUDA graph, gpt-fast style: one
  all-reduce after the O-projection and one after the down-projection of every layer. Also timed: the same graph
  with the collectives left out (compute only; its difference to the full step is what communication costs) and
  a graph of the collectives alone. The 1-GPU peer is the same step code unsharded (rank 0 alone); the sharded
  logits are checked against it (relative L2, printed). Default ops are plain torch ops (~25 kernels per layer);
  --compile hands the three blocks between exchanges to torch.compile (fused elementwise ops, as gpt-fast does),
  falling back to plain ops on every rank, with the reason printed, if compilation fails anywhere.
- monokernel 1 GPU / N GPUs exact / N GPUs delayed: HOOKS (backend_row below) for the lead's persistent kernel.
  A backend that does not exist or cannot run prints "not run: <reason>"; no number is ever made up.
  "monokernel-exact" is kernels/tp_runtime.py's TPMonokernel (in-kernel peer exchange), timed with launches of
  --tokens steps next to a single-GPU Monokernel on the same weights timed the same way in the same run (its
  speedup is against that); it also reports the exchange wait (per CTA and token, kernel-measured) and checks
  that both ranks' logits are bit-identical and close to the single GPU's.

    NCCL_NVLS_ENABLE=0 python3 bench/tp.py --gpus 2 [--shape qwen-1.5b,llama-1b|all] [--ctx 512] [--tokens 256]
                                           [--compile] [--eager] [--no-monokernel]
    python3 bench/tp.py --plan-only --gpus 2     # the shard plans and byte counts, no GPU needed

Runs with engine/ + torch (+ kernels/ for the monokernel rows); no server packages. Prints a table, then one
JSON line last. Exit status 2 when CUDA or enough GPUs are missing.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from engine.config import ModelConfig, preset  # noqa: E402
from engine.model import Model, apply_rope, rms_norm, rope_tables  # noqa: E402
from engine.tp.shard import make_plan, rank_layers, shard_weights  # noqa: E402

HBM_BYTES_PER_S = 4.29e12     # read-only bandwidth measured on the H200 (shared/GPU.md), for --plan-only


def _dense_2b() -> ModelConfig:
    # ~2.3B dense Llama with the dimensions inferred for Kog's laneformer-2b (DTP-laneformer.md §1): Kog's
    # published 476 us/token on 8 H200s is for a model of this size.
    return ModelConfig(arch="llama", vocab_size=32000, hidden_size=3072, n_layers=15, n_heads=32, n_kv_heads=16,
                       intermediate_size=12288, head_dim=96, rms_norm_eps=1e-5, rope_theta=10000.0,
                       max_position_embeddings=4096, tie_word_embeddings=False, name="dense-2b")


SHAPES = {
    "qwen-1.5b": lambda: preset("qwen2.5-coder-1.5b"),
    "qwen-0.5b": lambda: preset("qwen2.5-coder-0.5b"),
    "llama-1b": lambda: preset("llama-3.2-1b"),
    "dense-2b": _dense_2b,
}
MONOKERNEL_ROWS = ("monokernel-1gpu", "monokernel-exact", "monokernel-delayed")


def log(*a):
    print(*a, flush=True)


# ---- the peer: one rank's decode step ----------------------------------------------------------------------
# The compute between two exchanges is one function each (attention block, MLP block, head), so `--compile` can
# hand exactly these to torch.compile (fused elementwise ops, gpt-fast style) while the NCCL collectives stay
# outside; either way the whole step is then captured in one CUDA graph.
def attn_block(x, p_prev, ln1, wqkv, bqkv, wo, bo, kc, vc, pos, cos_t, sin_t, arange, sel, *, nq: int, nkv: int,
               hd: int, group, eps: float):
    """x: fp32 residual [1, d]; p_prev: the previous (already reduced) partial [1, d], added here (the merge at the
    point of consumption). Writes K/V at pos into kc/vc [nkv, max_len, hd]. Returns (x, attention partial [1, d])."""
    x = x + p_prev.float()
    h = rms_norm(x, ln1, eps)
    qkv = F.linear(h, wqkv, bqkv)                                                         # [1, (nq+2nkv) hd]
    cos, sin = cos_t.index_select(0, pos), sin_t.index_select(0, pos)                     # [1, hd]
    qk = apply_rope(qkv[:, :(nq + nkv) * hd].view(1, nq + nkv, hd).transpose(0, 1), cos, sin)
    kc.index_copy_(1, pos, qk[nq:])
    vc.index_copy_(1, pos, qkv[:, (nq + nkv) * hd:].view(1, nkv, hd).transpose(0, 1))
    if group is not None:             # local q head j reads local kv head j // group
        q, kk, vv = qk[:nq].reshape(nkv, group, hd), kc, vc
    else:                             # a straddling ("balanced") split: gather the kv head of each q head
        q, kk, vv = qk[:nq].reshape(nq, 1, hd), kc.index_select(0, sel), vc.index_select(0, sel)
    # All max_len keys are read (static shapes for the graph); those beyond pos are masked.
    mask = torch.where(arange <= pos, 0.0, float("-inf"))                                # [max_len]
    att = torch.bmm(q, kk.transpose(1, 2)).float() * hd ** -0.5 + mask
    o = torch.bmm(att.softmax(-1).to(vv.dtype), vv).reshape(1, nq * hd)
    return x, F.linear(o, wo, bo)


def mlp_block(x, p_prev, ln2, wgu, bgu, wd, bd, *, eps: float):
    """x fp32 [1, d] + the reduced attention partial -> (x, MLP partial [1, d])."""
    x = x + p_prev.float()
    g, u = F.linear(rms_norm(x, ln2, eps), wgu, bgu).chunk(2, dim=-1)
    return x, F.linear(F.silu(g) * u, wd, bd)


def head_block(x, p_prev, norm, lm_head, *, eps: float, v0: int):
    """-> (logits slice fp32 [1, V_r], (max logit, global index) pair fp32 [2]). Vocab ids < 2^24: exact in fp32."""
    x = x + p_prev.float()
    logits = F.linear(rms_norm(x, norm, eps), lm_head).float()
    val, idx = logits[0].max(dim=-1)
    return logits, torch.stack([val, (idx + v0).float()])


class PeerStep:
    """One rank's decode step on static buffers (CUDA-graph capturable: no host sync, position and token live on
    the device). `world` ranks share the work as engine/tp/shard.py plans it; world == 1 is the unsharded model.
    layers: engine.model.LayerWeights with this rank's local sizes; k/v: [n_layers, local kv, max_len, hd].
    compile: run the three blocks through torch.compile (call warm() before any capture)."""

    def __init__(self, cfg: ModelConfig, layers, embed, norm, lm_head, shard, k, v, world: int,
                 compile: bool = False):
        self.cfg, self.layers, self.embed, self.norm, self.lm_head = cfg, layers, embed, norm, lm_head
        self.shard, self.k, self.v, self.world = shard, k, v, world
        dev, dt = embed.device, embed.dtype
        self.max_len = k.shape[2]
        self.cos, self.sin = rope_tables(cfg, self.max_len, dt, dev)
        self.token = torch.zeros(1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.arange = torch.arange(self.max_len, device=dev)
        self.logits = torch.zeros(1, shard.n_vocab, dtype=torch.float32, device=dev)
        self.pairs = torch.zeros(world * 2, dtype=torch.float32, device=dev)
        self.zero = torch.zeros(1, cfg.hidden_size, dtype=dt, device=dev)
        self.sel = torch.tensor(shard.kv_of_q, device=dev)
        eps = cfg.rms_norm_eps
        self.attn = functools.partial(attn_block, nq=shard.n_q, nkv=shard.n_kv, hd=cfg.head_dim, group=shard.group,
                                      eps=eps)
        self.mlp = functools.partial(mlp_block, eps=eps)
        self.head = functools.partial(head_block, eps=eps, v0=shard.vocab[0])
        self._eager = (self.attn, self.mlp, self.head)
        self.compiled = False
        if compile:
            # One compile per block and shape: the 1-GPU and sharded steps of every shape are separate entries,
            # more than dynamo's default limit of 8 per code object.
            import torch._dynamo as dynamo    # "as": a plain `import torch._dynamo` would make torch local here
            for knob in ("recompile_limit", "cache_size_limit"):
                if hasattr(dynamo.config, knob):
                    setattr(dynamo.config, knob, max(64, getattr(dynamo.config, knob)))
            c = functools.partial(torch.compile, fullgraph=True, dynamic=False)
            self.attn, self.mlp, self.head = c(self.attn), c(self.mlp), c(self.head)
            self.compiled = True

    def warm_compile(self) -> str | None:
        """Compile the three blocks now (one call each on the real buffers, no collectives); on failure go back to
        eager ops and return why. Call on every rank, then agree (peer_shape does)."""
        if not self.compiled:
            return None
        w = self.layers[0]
        try:
            x = F.embedding(self.token, self.embed).float()
            x, p = self.attn(x, self.zero, w.ln1, w.wqkv, w.bqkv, w.wo, w.bo, self.k[0], self.v[0], self.pos,
                             self.cos, self.sin, self.arange, self.sel)
            x, p = self.mlp(x, p, w.ln2, w.wgu, w.bgu, w.wd, w.bd)
            self.head(x, p, self.norm, self.lm_head)
            return None
        except Exception as e:                # noqa: BLE001 - any compiler failure means: measure eager ops
            self.uncompile()
            return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"

    def uncompile(self) -> None:
        self.attn, self.mlp, self.head = self._eager
        self.compiled = False

    def reset(self, pos: int, token: int) -> None:
        self.pos.fill_(pos)
        self.token.fill_(token)

    def step(self, comm: bool = True) -> None:
        """Feed self.token at self.pos, write KV, leave this rank's logits slice in self.logits, the greedy next
        token (after the (max, index) exchange) in self.token, and advance self.pos."""
        import torch.distributed as dist
        reduce = comm and self.world > 1
        x = F.embedding(self.token, self.embed).float()                                        # [1, d] fp32
        p = self.zero
        for li, w in enumerate(self.layers):
            x, p = self.attn(x, p, w.ln1, w.wqkv, w.bqkv, w.wo, w.bo, self.k[li], self.v[li], self.pos, self.cos,
                             self.sin, self.arange, self.sel)
            if reduce:
                dist.all_reduce(p)                                   # bf16 partial [1, d], summed in place
            x, p = self.mlp(x, p, w.ln2, w.wgu, w.bgu, w.wd, w.bd)
            if reduce:
                dist.all_reduce(p)
        logits, pair = self.head(x, p, self.norm, self.lm_head)
        self.logits.copy_(logits)
        if reduce:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                dist.all_gather_into_tensor(self.pairs, pair)
            pairs = self.pairs.view(self.world, 2)
        else:
            pairs = pair.view(1, 2)
        best = pairs[:, 0].argmax().view(1)                            # first max: ties go to the lowest rank
        self.token.copy_(pairs.index_select(0, best)[:, 1].long())      # index ops only: no host sync in a graph
        self.pos.add_(1)

    def collectives_only(self) -> None:
        """The step's exchanges alone (2 all-reduces of [1, d] per layer + the pair gather), for their cost."""
        import torch.distributed as dist
        for _ in range(2 * len(self.layers)):
            dist.all_reduce(self.zero)                               # zeros stay zeros
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            dist.all_gather_into_tensor(self.pairs, self.pairs[:2].clone())


def capture(fn):
    """fn captured in a CUDA graph (after warm-up runs on a side stream, as capture requires). thread_local capture
    mode: NCCL's watchdog thread keeps querying its events while this thread captures; in the default global
    mode such a call from another thread invalidates the capture."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode="thread_local"):
        fn()
    return g


def time_loop(run_one, reset, n: int, reps: int, world: int) -> float:
    """Median seconds per call of run_one over n calls, reps times (reset before each), ranks started together."""
    import torch.distributed as dist
    ts = []
    for _ in range(reps):
        reset()
        if world > 1:
            dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            run_one()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) / n)
    return statistics.median(ts)


def _max_over_ranks(t: float, world: int) -> float:
    import torch.distributed as dist
    if world == 1:
        return t
    x = torch.tensor([t], dtype=torch.float64, device="cuda")
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return float(x)


def random_fill(model: Model, seed: int) -> Model:
    """Same values on every rank (same seed, same device type); norms near 1, never zeros."""
    g = torch.Generator(device=model.device).manual_seed(seed)
    for name, t in model.params.items():
        if name.endswith("norm.weight"):
            t.uniform_(0.8, 1.2, generator=g)
        else:
            t.normal_(0.0, 0.02, generator=g)
    return model


def _gather_logits(step: PeerStep, plan, world: int, rank: int) -> torch.Tensor | None:
    """Full logits [V] on rank 0 from the ranks' slices (for the correctness check only; outside the graph)."""
    import torch.distributed as dist
    width = max(r.n_vocab for r in plan.ranks)
    mine = torch.zeros(width, dtype=torch.float32, device=step.logits.device)
    mine[:step.shard.n_vocab] = step.logits[0]
    outs = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(outs, mine)
    if rank != 0:
        return None
    return torch.cat([o[:r.n_vocab] for o, r in zip(outs, plan.ranks)])


def peer_shape(rank: int, world: int, name: str, spec: dict) -> dict:
    """One shape on every rank: the 1-GPU step (rank 0 alone), then the world-GPU sharded step. Returns rank 0's
    row (other ranks return {})."""
    import torch.distributed as dist
    extra = spec.get("configs") or {}          # tests: tiny ModelConfig fields by name
    cfg = ModelConfig(**extra[name]) if name in extra else SHAPES[name]()
    cuda = spec["device"] == "cuda"
    dev = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    dt = torch.bfloat16 if spec["dtype"] == "bf16" else torch.float32
    ctx, n_tok, reps = spec["ctx"], spec["tokens"], spec["reps"]
    graphs = spec.get("graphs", True)
    compile_ = spec.get("compile", False)
    max_len = ctx + max(n_tok, spec["warmup"]) + 8
    tok0 = 1234 % cfg.vocab_size
    model = random_fill(Model(cfg, device=dev, dtype=dt, max_len=max_len), seed=0)
    g = torch.Generator(device=dev).manual_seed(1)
    kv_shape = (cfg.n_layers, cfg.n_kv_heads, max_len, cfg.head_dim)
    kfull = torch.randn(kv_shape, generator=g, device=dev).to(dt)    # "context": random keys/values, same on all
    vfull = torch.randn(kv_shape, generator=g, device=dev).to(dt)
    row: dict = {"shape": name, "gpus": world,
                 "timing": ("CUDA graph replay" if graphs else "eager (--eager)") if cuda else "none (CPU check)"}
    ref = None
    if rank == 0:
        one = make_plan(cfg, 1)
        s1 = PeerStep(cfg, model.layers, model.embed, model.norm, model.lm_head, one.ranks[0], kfull.clone(),
                      vfull.clone(), world=1, compile=compile_)
        s1.reset(ctx, tok0)
        why = s1.warm_compile()
        row["ops_1gpu"] = "torch.compile" if s1.compiled else \
            f"eager ops{'' if why is None else ' (compile failed: ' + why + ')'}"
        s1.reset(ctx, tok0)
        s1.step()
        ref = s1.logits[0].clone()
        row["weights_GB_1gpu"] = one.rank_weight_bytes(0, dt.itemsize) / 1e9
        if cuda:
            g1 = capture(s1.step) if graphs else None
            row["peer_1gpu_us"] = time_loop(g1.replay if graphs else s1.step, lambda: s1.reset(ctx, tok0), n_tok,
                                            reps, 1) * 1e6
            del g1
        del s1
    if world > 1:
        dist.barrier()
        plan = make_plan(cfg, world)
        sh = shard_weights(model.params, plan, rank)
        del model
        if cuda:
            torch.cuda.empty_cache()
        r = plan.ranks[rank]
        kv = slice(*r.kv_heads)
        step = PeerStep(cfg, rank_layers(sh, cfg.n_layers), sh["model.embed_tokens.weight"], sh["model.norm.weight"],
                        sh["lm_head.weight"], r, kfull[:, kv].contiguous(), vfull[:, kv].contiguous(), world,
                        compile=compile_)
        del kfull, vfull
        step.reset(ctx, tok0)
        why = step.warm_compile()
        ok = torch.tensor([float(step.compiled)], device=dev)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)                # every rank runs the same kind of step
        if step.compiled and not bool(ok):
            step.uncompile()
            why = why or "another rank failed to compile"
        if rank == 0:
            row["ops"] = "torch.compile" if step.compiled else \
                f"eager ops{'' if why is None else ' (compile failed: ' + why + ')'}"
        step.reset(ctx, tok0)
        step.step()
        full = _gather_logits(step, plan, world, rank)
        if rank == 0:
            err = float((full - ref).norm() / ref.norm())
            row["check_rel_l2_vs_1gpu"] = err
            row["check_token_equal"] = bool(int(step.token) == int(ref.argmax()))
            row["plan"] = plan.describe()
            row["weights_GB_per_gpu"] = max(plan.rank_weight_bytes(i, dt.itemsize) for i in range(world)) / 1e9
            if spec.get("return_logits"):
                row["logits"] = full.tolist()
                row["ref_logits"] = ref.tolist()
        if cuda:
            reset = lambda: step.reset(ctx, tok0)  # noqa: E731
            fns = [lambda: step.step(comm=True), lambda: step.step(comm=False), step.collectives_only]
            g_full, g_nc, g_cc = (capture(fn) for fn in fns) if graphs else (None, None, None)
            run = [g.replay for g in (g_full, g_nc, g_cc)] if graphs else fns
            t = time_loop(run[0], reset, n_tok, reps, world)
            t_nc = time_loop(run[1], reset, n_tok, reps, world)
            t_cc = time_loop(run[2], lambda: None, n_tok, reps, world)
            t, t_nc, t_cc = (_max_over_ranks(v, world) for v in (t, t_nc, t_cc))
            row.update({f"peer_{world}gpu_us": t * 1e6, f"peer_{world}gpu_compute_only_us": t_nc * 1e6,
                        f"peer_{world}gpu_collectives_only_us": t_cc * 1e6,
                        f"peer_{world}gpu_comm_cost_us": (t - t_nc) * 1e6})
            del g_full, g_nc, g_cc
        del step, sh
    if cuda:
        torch.cuda.empty_cache()
    return row if rank == 0 else {}


def peer_worker(rank: int, world: int, spec: dict, out_path: str) -> None:
    """Spawned once per GPU; rank 0 writes the rows (JSON) to out_path."""
    import torch.distributed as dist
    os.environ["NCCL_NVLS_ENABLE"] = "0"      # NVLink multicast off (KINDS.md); set before NCCL initialises
    cuda = spec["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    if world > 1:
        kw = {"device_id": torch.device(f"cuda:{rank}")} if cuda else {}
        # A finite timeout turns a rank stuck in a collective into an error instead of a silent hang; long enough
        # for rank 1 to wait out rank 0's 1-GPU run (with --compile: compilation included) at the barrier.
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=spec.get("timeout_s", 420)), **kw)
        warm = torch.ones(8, device=f"cuda:{rank}" if cuda else "cpu")
        dist.all_reduce(warm)                 # communicator up before any graph capture
    rows = []
    try:
        for name in spec["shapes"]:
            try:
                rows.append(peer_shape(rank, world, name, spec))
            except Exception as e:            # noqa: BLE001 - one failing shape must not hide the others
                traceback.print_exc()
                rows.append({"shape": name, "gpus": world, "error": f"{type(e).__name__}: {e}"})
                if world > 1:
                    raise                     # ranks may be out of step: stop instead of hanging in a collective
        if rank == 0:
            Path(out_path).write_text(json.dumps(rows))
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_peer(shapes: list[str], world: int, spec: dict) -> list[dict]:
    import torch.multiprocessing as mp
    os.environ["NCCL_NVLS_ENABLE"] = "0"      # inherited by the spawned processes
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(_free_port())
    spec = {**spec, "shapes": shapes}
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.json")
        try:
            mp.spawn(peer_worker, args=(world, spec, out), nprocs=world, join=True)
        except Exception as e:                # noqa: BLE001
            done = json.loads(Path(out).read_text()) if os.path.exists(out) else []
            names = {r["shape"] for r in done}
            return done + [{"shape": s, "gpus": world, "error": f"peer processes failed: {type(e).__name__}: "
                            f"{str(e).strip().splitlines()[-1] if str(e).strip() else e}"}
                           for s in shapes if s not in names]
        return json.loads(Path(out).read_text())


# ---- HOOKS for the lead's persistent-kernel rows -----------------------------------------------------------
def backend_row(backend: str, cfg: ModelConfig, args) -> dict:
    """HOOK: one benchmark row for `backend` in MONOKERNEL_ROWS:
      "monokernel-1gpu"    the single-GPU persistent kernel (runs now, through the Backend contract);
      "monokernel-exact"   args.gpus GPUs, tp_mode='exact'  (needs MonokernelBackend.supports_tp);
      "monokernel-delayed" args.gpus GPUs, TPMonokernel(mode='delayed') on random lane weights of the same size
                           (args.gpus lanes, broadcast delay --lane-delay), timed like monokernel-exact.
    Returns {"backend", "gpus", "us"} or {"backend", "gpus", "not_run": reason}. Never invents a number.
    Lead: when the TP kernel lands, fill the two TP branches (same timing as _time_backend) and report its
    per-token exchange wait from the backend's stats() under "wait_us"."""
    gpus = 1 if backend == "monokernel-1gpu" else args.gpus
    row = {"backend": backend, "gpus": gpus}
    try:
        from engine.backends.monokernel import MonokernelBackend
    except Exception as e:                    # noqa: BLE001
        return {**row, "not_run": f"engine.backends.monokernel does not import: {type(e).__name__}: {e}"}
    ok, why = MonokernelBackend.supported(cfg, "cuda")
    if not ok:
        return {**row, "not_run": f"monokernel does not support {cfg.name}: {why}"}
    if backend == "monokernel-1gpu":
        return {**row, **_time_backend(MonokernelBackend, cfg, args, tp=1, tp_mode="exact")}
    if backend == "monokernel-exact":
        if args.gpus < 2:
            return {**row, "not_run": "--gpus 1: no exchange to time"}
        return {**row, **_time_tp_monokernel(cfg, args)}
    if backend == "monokernel-delayed":
        if args.gpus < 2:
            return {**row, "not_run": "--gpus 1: delayed mode runs one lane per GPU"}
        return {**row, **_time_tp_delayed(cfg, args)}
    raise ValueError(f"unknown backend row {backend!r} (known: {', '.join(MONOKERNEL_ROWS)})")


def _time_backend(cls, cfg: ModelConfig, args, tp: int, tp_mode: str) -> dict:
    """us/token of backend `cls` through the Backend contract: decode_loop from position ctx (random KV context),
    greedy, no stop ids; median of args.reps runs of args.tokens tokens after a warm-up run."""
    from engine.kv_cache import KVCache
    from engine.sampling import SamplingParams
    max_len = args.ctx + max(args.tokens, args.warmup) + 64
    try:
        model = random_fill(Model(cfg, device="cuda", dtype=torch.bfloat16, max_len=max_len), seed=0)
        cache = KVCache(1, cfg.n_layers, cfg.n_kv_heads, max_len, cfg.head_dim, dtype=torch.bfloat16,
                        device="cuda")
        cache.k.normal_()
        cache.v.normal_()
        be = cls(model, cache, tp=tp, tp_mode=tp_mode)
        if hasattr(be, "warmup"):
            be.warmup()
        greedy, tok0 = SamplingParams(), 1234 % cfg.vocab_size

        def run(n):
            list(be.decode_loop(0, tok0, args.ctx, n, greedy, frozenset(), None))
        run(args.warmup)
        ts = []
        for _ in range(args.reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run(args.tokens)
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) / args.tokens)
        out = {"us": statistics.median(ts) * 1e6, "how": "Backend.decode_loop (tokens streamed to the host)"}
        st = be.stats() if callable(getattr(be, "stats", None)) else getattr(be, "stats", {})
        if isinstance(st, dict) and "wait_us" in st:
            out["wait_us"] = st["wait_us"]
        del be, model, cache
        torch.cuda.empty_cache()
        return out
    except Exception as e:                    # noqa: BLE001
        traceback.print_exc()
        return {"not_run": f"failed: {type(e).__name__}: {e}"}


def time_kernel_run(eng, restore, args, tok0: int) -> float:
    """Median us/token of eng.run (Monokernel or TPMonokernel) over args.reps runs of args.tokens from position
    args.ctx, each after restore() (the KV cache as before the run) and one untimed warm-up run."""
    restore()
    if args.warmup:
        eng.run(0, tok0, args.ctx, args.warmup)
    ts = []
    for _ in range(args.reps):
        restore()
        t0 = time.perf_counter()
        toks, _ = eng.run(0, tok0, args.ctx, args.tokens)
        ts.append((time.perf_counter() - t0) / len(toks))
    return statistics.median(ts) * 1e6


def _time_tp_monokernel(cfg: ModelConfig, args) -> dict:
    """us/token of TPMonokernel on args.gpus GPUs and of Monokernel on GPU 0 (same weights, same random KV
    context, same timing: one launch of args.tokens greedy steps from position ctx, median of args.reps, after a
    warm-up launch), the exchange wait, and a 16-step teacher-forced check (ranks bit-identical, rel L2 to 1 GPU)."""
    from kernels.runtime import Monokernel
    from kernels.tp_runtime import TPMonokernel
    max_len = args.ctx + max(args.tokens, args.warmup, 16) + 64
    n = args.gpus
    try:
        model = random_fill(Model(cfg, device="cuda:0", dtype=torch.bfloat16, max_len=max_len), seed=0)
        shape = (1, cfg.n_layers, cfg.n_kv_heads, max_len, cfg.head_dim)
        g = torch.Generator(device="cuda:0").manual_seed(1)
        k = torch.randn(shape, generator=g, device="cuda:0").bfloat16()
        v = torch.randn(shape, generator=g, device="cuda:0").bfloat16()
        tok0 = 1234 % cfg.vocab_size

        def timed(eng, restore) -> float:
            return time_kernel_run(eng, restore, args, tok0)

        k1, v1 = k.clone(), v.clone()
        mk = Monokernel(model, k1, v1, max_steps=max(args.tokens, args.warmup, 16) + 1)
        us1 = timed(mk, lambda: (k1.copy_(k), v1.copy_(v)))
        forced = torch.randint(0, cfg.vocab_size, (16,), generator=torch.Generator().manual_seed(2)).tolist()
        k1.copy_(k), v1.copy_(v)
        ref = torch.empty(16, cfg.vocab_size, device="cuda:0")
        mk.run(0, forced[0], args.ctx, 16, forced=forced, logits_out=ref)
        del mk, k1, v1
        torch.cuda.empty_cache()
        devs = [f"cuda:{i}" for i in range(n)]
        steps = max(args.tokens, args.warmup, 16) + 1
        # replicated LM head first: its per-rank logits show the residual streams are bit-identical
        tp = TPMonokernel(model, devs, max_len=max_len, slots=1, max_steps=steps, vocab_parallel=False)
        us_rep = timed(tp, lambda: tp.load_cache(k, v))
        tp.load_cache(k, v)
        outs = [torch.empty(16, cfg.vocab_size, device=d) for d in devs]
        tp.run(0, forced[0], args.ctx, 16, forced=forced, rank_logits=outs)
        same = all(torch.equal(outs[0], o.to("cuda:0")) for o in outs[1:])
        del tp
        torch.cuda.empty_cache()
        tp = TPMonokernel(model, devs, max_len=max_len, slots=1, max_steps=steps)
        us = timed(tp, lambda: tp.load_cache(k, v))
        wait = tp.exchange_wait_us()      # of the last timed launch
        tp.load_cache(k, v)
        vp = torch.empty(16, cfg.vocab_size, device="cuda:0")
        tp.run(0, forced[0], args.ctx, 16, forced=forced, logits_out=vp)
        err = max(((vp[j].double() - ref[j].double()).norm() / ref[j].double().norm()).item() for j in range(16))
        head = "vocabulary-parallel" if tp.vocab_parallel else "replicated (candidates do not fit)"
        del tp, model
        torch.cuda.empty_cache()
        return {"us": us, "us_1gpu_same_run": us1, "speedup_vs_1gpu": us1 / us, "wait_us": wait["mean_us"],
                "wait_max_us": wait["max_us"], "check_rel_l2_vs_1gpu": err, "ranks_bit_identical": same,
                "vp_equals_replicated": bool(torch.equal(vp, outs[0])), "us_replicated_head": us_rep,
                "lm_head": head,
                "how": "one launch of --tokens greedy steps (tokens streamed to the host); 1-GPU Monokernel "
                       "timed the same way in this run"}
    except Exception as e:                    # noqa: BLE001
        traceback.print_exc()
        return {"not_run": f"failed: {type(e).__name__}: {e}"}


def _time_tp_delayed(cfg: ModelConfig, args) -> dict:
    """us/token of TPMonokernel(mode='delayed') on args.gpus GPUs running a random Laneformer lane model with cfg's
    sizes (args.gpus lanes, replicate LM head, broadcast delay args.lane_delay, early layers PRESENT), next to the
    single-GPU Monokernel on a dense model of cfg timed the same way in this run (one launch of args.tokens greedy
    steps from position ctx over a random KV context, median of args.reps after a warm-up launch); the exchange
    wait is the kernel-measured time CTAs spent waiting for peers' partials (per token)."""
    from engine.lanes import LaneModel
    from kernels.runtime import Monokernel
    from kernels.testing import lane_config_like, random_lane_weights_on
    from kernels.tp_runtime import TPMonokernel
    n = args.gpus
    steps = max(args.tokens, args.warmup, 16) + 1
    max_len = args.ctx + steps + 64
    tok0 = 1234 % cfg.vocab_size

    def timed(eng, restore) -> float:
        return time_kernel_run(eng, restore, args, tok0)

    try:
        lcfg = lane_config_like(cfg, n, broadcast_delay=args.lane_delay)
        g = torch.Generator(device="cuda:0").manual_seed(1)
        model = random_fill(Model(cfg, device="cuda:0", dtype=torch.bfloat16, max_len=max_len), seed=0)
        shape = (1, cfg.n_layers, cfg.n_kv_heads, max_len, cfg.head_dim)
        k = torch.randn(shape, generator=g, device="cuda:0").bfloat16()
        v = torch.randn(shape, generator=g, device="cuda:0").bfloat16()
        k1, v1 = k.clone(), v.clone()
        mk = Monokernel(model, k1, v1, max_steps=steps)
        us1 = timed(mk, lambda: (k1.copy_(k), v1.copy_(v)))
        del mk, k1, v1, model, k, v
        torch.cuda.empty_cache()
        lanes = LaneModel(lcfg, random_lane_weights_on(lcfg, device="cuda:0", seed=0))
        lshape = (1, lcfg.num_layers, lcfg.num_kv_heads, max_len, lcfg.head_dim)
        k = torch.randn(lshape, generator=g, device="cuda:0").bfloat16()
        v = torch.randn(lshape, generator=g, device="cuda:0").bfloat16()
        tp = TPMonokernel(lanes, [f"cuda:{i}" for i in range(n)], max_len=max_len, slots=1, max_steps=steps,
                          mode="delayed")
        us = timed(tp, lambda: tp.load_cache(k, v))
        wait = tp.exchange_wait_us()      # of the last timed launch
        tp.load_cache(k, v)
        a = tp.run(0, tok0, args.ctx, 16)[0]
        tp.load_cache(k, v)
        rerun_same = tp.run(0, tok0, args.ctx, 16)[0] == a
        desc = tp.lanes.describe()
        del tp, lanes
        torch.cuda.empty_cache()
        return {"us": us, "us_1gpu_same_run": us1, "speedup_vs_1gpu": us1 / us, "wait_us": wait["mean_us"],
                "wait_max_us": wait["max_us"], "rerun_tokens_identical": rerun_same, "lanes": desc,
                "how": "one launch of --tokens greedy steps (tokens streamed to the host); random lane weights of "
                       "the dense shape's size; 1-GPU Monokernel on the dense shape timed the same way in this run"}
    except Exception as e:                    # noqa: BLE001
        traceback.print_exc()
        return {"not_run": f"failed: {type(e).__name__}: {e}"}


# ---- output ------------------------------------------------------------------------------------------------
def kv_bytes_per_token(cfg: ModelConfig, plan, rank: int, ctx: int, tokens: int) -> float:
    """K+V bytes (bf16) rank `rank` reads per token, averaged over the timed positions ctx..ctx+tokens-1."""
    live = ctx + (tokens + 1) / 2
    return 2 * 2 * cfg.n_layers * plan.ranks[rank].n_kv * cfg.head_dim * live


def table_rows(name: str, cfg: ModelConfig, peer: dict, mk: list[dict], gpus: int, bw: float, args) -> list[dict]:
    """Flat rows for one shape: backend, gpus, us/token, tok/s, speedup vs the same backend on 1 GPU, % of the
    per-GPU weight+KV streaming roofline, communication cost. bw: the measured copy rate (read + write), which on
    the H200 equals the read-only rate (shared/GPU.md: 4.25 vs 4.29 TB/s), so it is the streaming rate here."""
    out = []
    plans = {n: make_plan(cfg, n) for n in {1, gpus}}

    def roof(n):
        p = plans[n]
        return max(p.rank_weight_bytes(r) + kv_bytes_per_token(cfg, p, r, args.ctx, args.tokens)
                   for r in range(n)) / bw * 1e6

    base_peer = peer.get("peer_1gpu_us")
    for n in sorted({1, gpus}):
        r = {"shape": name, "backend": "peer (NCCL + CUDA graph)", "gpus": n, "roofline_us": roof(n),
             "ops": peer.get("ops_1gpu" if n == 1 else "ops"), "timing": peer.get("timing")}
        us = peer.get(f"peer_{n}gpu_us")
        if us is None:
            r["not_run"] = peer.get("error", "no timing (see log)")
        else:
            r["us"] = us
            if n > 1:
                r["speedup_vs_1gpu"] = base_peer / us if base_peer else None
                r["comm_cost_us"] = peer.get(f"peer_{n}gpu_comm_cost_us")
                r["compute_only_us"] = peer.get(f"peer_{n}gpu_compute_only_us")
                r["collectives_only_us"] = peer.get(f"peer_{n}gpu_collectives_only_us")
                r["check_rel_l2_vs_1gpu"] = peer.get("check_rel_l2_vs_1gpu")
        out.append(r)
    mk1 = next((m.get("us") for m in mk if m["backend"] == "monokernel-1gpu"), None)
    for m in mk:
        r = {"shape": name, **m, "roofline_us": roof(m["gpus"]) if m["gpus"] in plans else None}
        if "us" in r and m["gpus"] > 1 and mk1:   # a row timed against its own 1-GPU run keeps that ratio
            r.setdefault("speedup_vs_1gpu", mk1 / r["us"])
        out.append(r)
    for r in out:
        if "us" in r:
            r["tok_s"] = 1e6 / r["us"]
            if r.get("roofline_us"):
                r["pct_roofline"] = 100 * r["roofline_us"] / r["us"]
    return out


def print_table(rows: list[dict]) -> None:
    log("")
    log(f"{'shape':<10} {'backend':<26} {'gpus':>4} {'us/token':>9} {'tok/s':>7} {'x 1gpu':>7} {'%roof':>6} "
        f"{'comm us':>8} {'coll us':>8}  note")
    for r in rows:
        def f(k, fmt, width):
            return (fmt.format(r[k]) if r.get(k) is not None else "-").rjust(width)
        notes = [f"not run: {r['not_run']}"] if "not_run" in r else []
        if r.get("ops"):
            notes.append(r["ops"])
        if r.get("check_rel_l2_vs_1gpu") is not None:
            notes.append(f"logits rel L2 vs 1 GPU {r['check_rel_l2_vs_1gpu']:.1e}")
        if r.get("us_1gpu_same_run") is not None:
            notes.append(f"1-GPU monokernel same run {r['us_1gpu_same_run']:.1f} us")
        if r.get("wait_us") is not None:
            notes.append(f"exchange wait {r['wait_us']:.1f} us/token per CTA (max {r.get('wait_max_us', 0):.1f})")
        if r.get("rerun_tokens_identical") is not None:
            notes.append("reruns identical" if r["rerun_tokens_identical"] else "RERUNS DIFFER")
        if r.get("ranks_bit_identical") is not None:
            notes.append("ranks bit-identical" if r["ranks_bit_identical"] else "RANKS DIFFER")
        if r.get("lm_head"):
            notes.append(f"LM head {r['lm_head']}")
        if r.get("us_replicated_head") is not None:
            notes.append(f"replicated head {r['us_replicated_head']:.1f} us")
        if r.get("vp_equals_replicated") is not None:
            notes.append("vocab-parallel logits = replicated" if r["vp_equals_replicated"]
                         else "VOCAB-PARALLEL LOGITS DIFFER")
        log(f"{r['shape']:<10} {r['backend']:<26} {r['gpus']:>4} {f('us', '{:.1f}', 9)} {f('tok_s', '{:.0f}', 7)} "
            f"{f('speedup_vs_1gpu', '{:.2f}x', 7)} {f('pct_roofline', '{:.0f}%', 6)} {f('comm_cost_us', '{:.1f}', 8)} "
            f"{f('collectives_only_us', '{:.1f}', 8)}  {'; '.join(notes)}")


def plan_only(args, shapes: list[str]) -> int:
    """Shard plans, bytes per GPU and the streaming roofline at HBM_BYTES_PER_S; no GPU needed."""
    rows = []
    log(f"{'shape':<10} {'gpus':>4} {'split':<9} {'GB/GPU':>7} {'KV MB/tok':>9} {'roof us':>8}  plan")
    for name in shapes:
        cfg = SHAPES[name]()
        for n in sorted({1, args.gpus}):
            p = make_plan(cfg, n)
            wb = max(p.rank_weight_bytes(r) for r in range(n))
            kvb = max(kv_bytes_per_token(cfg, p, r, args.ctx, args.tokens) for r in range(n))
            row = {"shape": name, "gpus": n, "head_split": p.head_split, "weights_GB_per_gpu": wb / 1e9,
                   "kv_MB_per_token": kvb / 1e6, "roofline_us": (wb + kvb) / HBM_BYTES_PER_S * 1e6,
                   "plan": p.describe()}
            rows.append(row)
            log(f"{name:<10} {n:>4} {p.head_split:<9} {wb / 1e9:7.3f} {kvb / 1e6:9.2f} {row['roofline_us']:8.1f}  "
                f"{p.describe()}")
    log(json.dumps({"bench": "tp", "mode": "plan-only", "gpus": args.gpus, "ctx": args.ctx, "tokens": args.tokens,
                    "hbm_TBps_assumed": HBM_BYTES_PER_S / 1e12, "rows": rows}))
    return 0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="Tensor-parallel decode benchmark: 1 GPU vs N GPUs (issue #6).")
    ap.add_argument("--gpus", type=int, default=2, help="GPUs for the tensor-parallel rows (default 2)")
    ap.add_argument("--shape", default="qwen-1.5b",
                    help=f"comma list of model shapes, or 'all' (known: {', '.join(SHAPES)})")
    ap.add_argument("--ctx", type=int, default=512, help="context length before the timed tokens")
    ap.add_argument("--tokens", type=int, default=256, help="timed tokens per repeat")
    ap.add_argument("--warmup", type=int, default=32, help="untimed tokens before timing")
    ap.add_argument("--reps", type=int, default=5, help="repeats (the median is reported)")
    ap.add_argument("--no-monokernel", action="store_true", help="skip the monokernel hook rows")
    ap.add_argument("--lane-delay", type=int, default=2,
                    help="monokernel-delayed: broadcast delay in layers of the random lane model (default 2, as "
                         "reported for laneformer-2b)")
    ap.add_argument("--eager", action="store_true", help="time the peer without CUDA graphs (if capture fails)")
    ap.add_argument("--compile", action="store_true",
                    help="peer: torch.compile the blocks between exchanges (fused elementwise ops, gpt-fast style)")
    ap.add_argument("--plan-only", action="store_true", help="print shard plans and byte counts; no GPU needed")
    args = ap.parse_args(argv)
    shapes = list(SHAPES) if args.shape == "all" else [s for s in args.shape.split(",") if s]
    bad = [s for s in shapes if s not in SHAPES]
    if bad or not shapes:
        ap.error(f"unknown shape(s) {bad or args.shape!r}; known: {', '.join(SHAPES)}, all")
    if args.gpus < 1:
        ap.error("--gpus must be >= 1")
    if args.lane_delay < 1:
        ap.error("--lane-delay must be >= 1")
    if min(args.ctx, args.tokens, args.reps) < 1 or args.warmup < 0:
        ap.error("--ctx, --tokens and --reps must be >= 1, --warmup >= 0")
    return args, shapes


def main(argv=None) -> int:
    args, shapes = parse_args(argv)
    if args.plan_only:
        return plan_only(args, shapes)
    if not torch.cuda.is_available():
        print("bench/tp.py needs CUDA GPUs: torch.cuda.is_available() is False here "
              "(use --plan-only to print the shard plans without a GPU)", file=sys.stderr)
        return 2
    have = torch.cuda.device_count()
    if have < args.gpus:
        print(f"bench/tp.py --gpus {args.gpus} needs {args.gpus} GPUs; this machine has {have}", file=sys.stderr)
        return 2
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    dev = torch.cuda.get_device_name(0)
    from bench.decode import copy_bandwidth   # the same probe as the single-GPU bench
    bw = copy_bandwidth()
    log(f"device {dev} x{have}; copy bandwidth {bw / 1e12:.2f} TB/s (read + write); NCCL_NVLS_ENABLE=0; "
        f"shapes {','.join(shapes)}; ctx {args.ctx}, {args.tokens} tokens x {args.reps} repeats")
    torch.cuda.empty_cache()
    spec = {"device": "cuda", "dtype": "bf16", "ctx": args.ctx, "tokens": args.tokens, "warmup": args.warmup,
            "reps": args.reps, "graphs": not args.eager, "compile": args.compile}
    t0 = time.monotonic()
    peer_rows = {r["shape"]: r for r in run_peer(shapes, args.gpus, spec)}
    log(f"peer done in {time.monotonic() - t0:.0f} s")
    for r in peer_rows.values():
        log(json.dumps({k: v for k, v in r.items() if k not in ("logits", "ref_logits")}))
    rows = []
    for name in shapes:
        cfg = SHAPES[name]()
        mk = [] if args.no_monokernel else [backend_row(b, cfg, args) for b in MONOKERNEL_ROWS]
        rows += table_rows(name, cfg, peer_rows.get(name, {"error": "no result"}), mk, args.gpus, bw, args)
    print_table(rows)
    log(json.dumps({"bench": "tp", "device": dev, "gpus": args.gpus, "copy_bw_TBps": bw / 1e12, "ctx": args.ctx,
                    "tokens": args.tokens, "reps": args.reps, "rows": rows,
                    "peer": [{k: v for k, v in r.items() if k not in ("logits", "ref_logits")}
                             for r in peer_rows.values()]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
