"""Prefill latency with a prefix already cached: the eager reference forward (Model.forward) against the
graph-replayed padded prefill (engine.backends.graph.PrefillGraphs), per chunk length. Random weights (latency
does not depend on their values); needs only engine/ and torch.

For each chunk length: ms until the chunk's last-position logits are on the device (`*_ms`, synchronised), ms
until the first token is on the host (`*_first_ms`: + argmax and its copy, the engine's greedy first-token
path), and the host-side ms of the call alone (`*_host_ms`: launch overhead; the GPU may still be running).
Medians over --iters after --warmup calls (the first graph call per shape captures it). `--engine-root DIR`
imports engine/ from another tree (e.g. `git archive HEAD engine | tar -x -C DIR` for a before/after); a tree
without PrefillGraphs is measured eager only.

    python3 bench/prefill.py                                   # CUDA, Qwen2.5-Coder-1.5B shape, bf16
    python3 bench/prefill.py --device cpu --preset tiny        # the same protocol on CPU (static step, no graph)

Prints a table, then one JSON line last.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when available)")
    ap.add_argument("--preset", default="qwen2.5-coder-1.5b", help="an engine.config preset, or 'tiny'")
    ap.add_argument("--lengths", default="1,8,32,128,512", help="chunk lengths, comma-separated")
    ap.add_argument("--prefix", type=int, default=1024, help="tokens already cached before each chunk")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"], help="auto: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="CPU intra-op threads (0: torch's default)")
    ap.add_argument("--engine-root", default=str(Path(__file__).resolve().parents[1]),
                    help="directory holding the engine/ package to measure")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


def tiny_config(ModelConfig):
    """A small Qwen2-like shape for CPU runs of this script (GQA, biases, tied embeddings like the real one)."""
    return ModelConfig(arch="qwen2", vocab_size=4096, hidden_size=256, n_layers=4, n_heads=4, n_kv_heads=2,
                       intermediate_size=704, head_dim=64, rms_norm_eps=1e-6, rope_theta=1e6,
                       tie_word_embeddings=True, qkv_bias=True, name="tiny")


def main() -> None:
    args = parse_args()
    sys.path.insert(0, args.engine_root)
    import torch

    from engine.config import ModelConfig, preset
    from engine.kv_cache import KVCache
    from engine.model import Model
    try:
        from engine.backends.graph import PrefillGraphs, prefill_bucket
    except ImportError:   # a tree from before the graph prefill: eager only
        PrefillGraphs = prefill_bucket = None

    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                       "cpu" if args.device == "auto" else args.device)
    cuda = dev.type == "cuda"
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}.get(args.dtype, torch.bfloat16 if cuda else torch.float32)
    cfg = tiny_config(ModelConfig) if args.preset == "tiny" else preset(args.preset)
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.prefix + max(lengths) > args.max_len:
        raise SystemExit(f"--prefix {args.prefix} + chunk {max(lengths)} exceeds --max-len {args.max_len}")

    t0 = time.perf_counter()
    model = Model(cfg, device=dev, dtype=dtype, max_len=args.max_len)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    with torch.no_grad():
        for name, t in model.params.items():   # drawn on the device: seconds for 1.5B parameters
            if name.endswith("norm.weight"):
                t.fill_(1.0)
            else:
                t.normal_(0.0, 0.02, generator=gen)
    cache = KVCache(1, cfg.n_layers, cfg.n_kv_heads, args.max_len, cfg.head_dim, dtype=dtype, device=dev)
    ids = torch.randint(0, cfg.vocab_size, (args.prefix + max(lengths),), device=dev, generator=gen)
    pg, capture_s = None, None
    if PrefillGraphs is not None:
        pg = PrefillGraphs(model, cache)
        pg.warmup()   # every (bucket, window) graph of the one slot; x n_slots at engine start
        capture_s = pg.capture_s if pg.use_graphs else None
    for c in range(0, args.prefix, 512):   # the cached prefix
        model.forward(cache.k, cache.v, 0, ids[c:min(c + 512, args.prefix)], c)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    setup_s = time.perf_counter() - t0

    def measure(fn, chunk):
        host, done, first = [], [], []
        for i in range(args.warmup + args.iters):
            sync()
            a = time.perf_counter()
            out = fn(chunk)
            b = time.perf_counter()
            sync()
            c = time.perf_counter()
            int(out.argmax())
            d = time.perf_counter()
            if i >= args.warmup:
                host.append(b - a)
                done.append(c - a)
                first.append(d - a)
        return {k: round(statistics.median(v) * 1e3, 3) for k, v in
                (("host_ms", host), ("ms", done), ("first_ms", first))}

    start = args.prefix
    eager = lambda chunk: model.forward(cache.k, cache.v, 0, chunk, start)   # noqa: E731
    rows = []
    for n in lengths:
        chunk = ids[start:start + n]
        row = {"len": n, **{f"eager_{k}": v for k, v in measure(eager, chunk).items()}}
        if pg is not None:
            row["bucket"] = prefill_bucket(n)
            row.update({f"graph_{k}": v for k, v in measure(lambda x: pg.prefill(0, x, start), chunk).items()})
            row["speedup"] = round(row["eager_first_ms"] / row["graph_first_ms"], 2)
            # The graph and the eager forward write the same K/V: the last check that the two paths agree.
            want = eager(chunk).float()
            got = pg.prefill(0, chunk, start).float()
            row["rel_l2_vs_eager"] = float(f"{((got - want).norm() / want.norm()).item():.3g}")
        rows.append(row)

    graph_label = "graph" if pg is not None and pg.use_graphs else "static (eager, no graph)"
    print(f"prefill on {dev} ({torch.cuda.get_device_name(dev) if cuda else 'cpu'}), {cfg.name or args.preset}, "
          f"{str(dtype).replace('torch.', '')}, prefix {args.prefix} cached, median of {args.iters}; "
          f"torch {torch.__version__}, engine from {args.engine_root}")
    hdr = f"{'len':>5} {'eager ms':>9} {'eager 1st':>9} {'eager host':>10}"
    if pg is not None:
        hdr += f" | {'bucket':>6} {graph_label + ' ms':>10} {'1st':>7} {'host':>7} {'speedup':>7} {'relL2':>8}"
    print(hdr)
    for r in rows:
        line = f"{r['len']:>5} {r['eager_ms']:>9.2f} {r['eager_first_ms']:>9.2f} {r['eager_host_ms']:>10.2f}"
        if pg is not None:
            line += (f" | {r['bucket'] or '-':>6} {r['graph_ms']:>10.2f} {r['graph_first_ms']:>7.2f} "
                     f"{r['graph_host_ms']:>7.2f} {r['speedup']:>7.2f} {r['rel_l2_vs_eager']:>8.2g}")
        print(line)
    if pg is not None:
        print(f"graphs captured: {len(pg.graphs)} for 1 slot in {capture_s if capture_s is not None else 0:.1f} s; "
              f"path counts {pg.counts}")
    print(json.dumps({"bench": "prefill", "device": str(dev), "gpu": torch.cuda.get_device_name(dev) if cuda else None,
                      "preset": args.preset, "dtype": str(dtype).replace("torch.", ""), "prefix": args.prefix,
                      "iters": args.iters, "torch": torch.__version__, "engine_root": args.engine_root,
                      "graph_mode": graph_label if pg is not None else None,
                      "graphs_per_slot": len(pg.graphs) if pg is not None else None,
                      "capture_s_per_slot": round(capture_s, 2) if capture_s is not None else None,
                      "setup_s": round(setup_s, 1), "rows": rows}))


if __name__ == "__main__":
    main()
