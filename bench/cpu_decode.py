"""CPU decode throughput of a model directory (default: engine/models/default) or of a random model of a given
small shape. Prints a table, then one JSON line last.

    python bench/cpu_decode.py                                  # the shipped default model (if present)
    python bench/cpu_decode.py --model /path/to/hf_dir
    python bench/cpu_decode.py --random        # random weights, the default model's shape (below)
    python bench/cpu_decode.py --random --layers 8 --hidden 384 --heads 6 --kv-heads 2 --ffn 1024 --vocab 16384
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import os

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model dir (default: engine/models/default if present)")
    ap.add_argument("--random", action="store_true", help="use a random model of the shape below")
    ap.add_argument("--arch", default="qwen2", choices=["qwen2", "llama"])
    # Defaults: the shipped default model's shape (tools/train_model.py "full": ~23M params).
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=1408)
    ap.add_argument("--vocab", type=int, default=12288)
    ap.add_argument("--context", type=int, default=256, help="prompt tokens before decoding")
    ap.add_argument("--tokens", type=int, default=128, help="generated tokens per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--omp-wait-policy", choices=["ACTIVE", "PASSIVE"], default=None,
                    help="set OMP_WAIT_POLICY before torch loads (PASSIVE helps a lot on a busy machine: "
                         "spinning OpenMP workers fight other processes for the 2 cores)")
    a = ap.parse_args(argv)
    if a.omp_wait_policy:
        if "torch" in sys.modules:
            raise SystemExit("--omp-wait-policy must be set before torch is imported")
        os.environ["OMP_WAIT_POLICY"] = a.omp_wait_policy
    import torch

    from engine import Engine, SamplingParams
    from engine.engine import DEFAULT_MODEL_DIR
    from engine.testing import make_tiny_checkpoint
    torch.set_num_threads(a.threads)

    tmp = None
    if a.model is None and not a.random and (DEFAULT_MODEL_DIR / "config.json").exists():
        model_dir, source = DEFAULT_MODEL_DIR, "default"
    elif a.model is not None:
        model_dir, source = Path(a.model), str(a.model)
    else:
        tmp = tempfile.TemporaryDirectory()
        model_dir = make_tiny_checkpoint(tmp.name, arch=a.arch, hidden_size=a.hidden, n_layers=a.layers,
                                         n_heads=a.heads, n_kv_heads=a.kv_heads, intermediate_size=a.ffn,
                                         vocab_size=a.vocab, init_std=0.02)
        source = f"random {a.arch} L{a.layers} d{a.hidden} h{a.heads}/{a.kv_heads} ffn{a.ffn} V{a.vocab}"
    eng = Engine.load(str(model_dir), device="cpu", backend="reference", kv_slots=2,
                      max_seq_len=a.context + a.tokens + 8)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, eng.tokenizer.vocab_size, (a.context,), generator=g).tolist()
    greedy = SamplingParams()

    def once():
        eng.cache.reset()    # cold every repeat: same prefill work, same context length
        r = eng.complete(prompt, max_new_tokens=a.tokens, sampling=greedy, stop_ids=())
        return r
    once()  # warm-up (allocator, oneDNN kernels)
    runs = [once() for _ in range(a.repeats)]
    tok_s = statistics.median(r.decode_tok_s for r in runs)
    prefill_ms = statistics.median(r.prefill_ms for r in runs)
    probe = _matvec_gb_s(torch, bytes_=eng.model.n_params() * 4)
    params = eng.model.n_params()
    bytes_per_token = params * eng.model.embed.element_size()
    gbs = bytes_per_token * tok_s / 1e9
    load = os.getloadavg()[0]
    rows = [("model", source), ("params", f"{params / 1e6:.1f} M"), ("threads", a.threads),
            ("OMP_WAIT_POLICY", os.environ.get("OMP_WAIT_POLICY", "(default)")),
            ("load average", f"{load:.2f} (other processes share the cores)"),
            ("context", a.context), ("generated", a.tokens), ("prefill", f"{prefill_ms:.1f} ms"),
            ("decode", f"{tok_s:.1f} tok/s ({1e3 / tok_s:.2f} ms/token)"),
            ("weight stream", f"{gbs:.2f} GB/s (fp32 weights once per token)"),
            ("matvec probe", f"{probe:.2f} GB/s (one fp32 matvec of the same bytes, same threads, same moment)"),
            ("efficiency", f"{100 * gbs / probe:.0f}% of the probe")]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    out = {"bench": "cpu_decode", "model": source, "params": params, "threads": a.threads,
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "load_avg_1m": round(load, 2), "context": a.context,
           "tokens": a.tokens, "prefill_ms": round(prefill_ms, 2), "decode_tok_s": round(tok_s, 2),
           "ms_per_token": round(1e3 / tok_s, 3), "weight_gb_s": round(gbs, 3),
           "matvec_probe_gb_s": round(probe, 3),
           "all_tok_s": [round(r.decode_tok_s, 2) for r in runs]}
    print(json.dumps(out))
    if tmp is not None:
        tmp.cleanup()
    return out


def _matvec_gb_s(torch, bytes_: int, repeats: int = 7) -> float:
    """Bandwidth of a plain fp32 matvec over as many bytes as the model's weights: the ceiling for decode."""
    cols = 1024
    rows = max(1, bytes_ // (4 * cols))
    w = torch.randn(rows, cols)
    x = torch.randn(1, cols)
    torch.nn.functional.linear(x, w)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        torch.nn.functional.linear(x, w)
        times.append(time.perf_counter() - t)
    return rows * cols * 4 / statistics.median(times) / 1e9


if __name__ == "__main__":
    main()
