"""Rebuild engine/models/default/ end to end: corpus -> tokenizer -> FIM data -> training -> eval -> save.

Full build (one call on the lent H200, < 10 minutes; fixed seeds):
    PYTHONUNBUFFERED=1 python3 tools/build_default_model.py --scale full --device cuda --out $OUT/model --pack $OUT
CPU dry run of the same code at tiny scale (a minute):
    python3 tools/build_default_model.py --scale tiny --device cpu --out /tmp/kog-tiny/model

--pack DIR copies the safetensors shards and the build log into DIR and tars the small files (configs,
tokenizer, index, metrics, manifest) into DIR/meta.tar, so at most 8 files come back from the device.
Unpack with:  tools/unpack_default_model.sh DIR   (or tar -xf meta.tar -C engine/models/default).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import build_corpus  # noqa: E402
from fim_data import FimIds, build_specs, pack_aligned, pretoken_snapper, tokenize_specs  # noqa: E402
from train_tokenizer import save_tokenizer, train_tokenizer  # noqa: E402

SCALES = {
    "full": dict(max_bytes=300_000_000, max_bytes_per_package=25_000_000, corpus_seconds=75, tok_bytes=40_000_000,
                 vocab=12288, window_chars=6000, seq_len=2048, batch=64, max_steps=20000, warmup=200,
                 peak_lr=1.5e-3, eval_lines=400, ppl_tokens=1_000_000, shard="14MB",
                 fim_window=(400, 4000), fim_lr=6e-4, fim_warmup=30),
    "tiny": dict(max_bytes=3_000_000, max_bytes_per_package=400_000, corpus_seconds=30, tok_bytes=2_000_000,
                 vocab=1024, window_chars=600, seq_len=128, batch=8, max_steps=30, warmup=5,
                 peak_lr=3e-3, eval_lines=24, ppl_tokens=8192, shard="200KB",
                 fim_window=(100, 600), fim_lr=1e-3, fim_warmup=3),
}
# Phase "pretrain": half FIM over long windows. Phase "fim": short random windows, 90% FIM, mostly
# single-line middles -- many more "find the cursor" events per token, which is what a small model
# lacks after pretraining (measured: 0.25% masked-line EM after pretraining alone).
PHASES = {
    "pretrain": dict(fim_rate=0.5, span_mix=(0.45, 0.25), seed_offset=0, max_suffix_chars=None, aligned=False),
    "fim": dict(fim_rate=0.9, span_mix=(0.60, 0.25), seed_offset=1, max_suffix_chars=None, aligned=False),
    # Run once for 100 s (README): FIM samples never straddle a training window (pack_aligned) and suffixes are
    # cut to about the server's window; slightly worse than the shipped model.
    "fim-short": dict(fim_rate=0.8, span_mix=(0.60, 0.25), seed_offset=2, max_suffix_chars=900, aligned=True),
    # The shipped model's last phase (session 3, 300 s; engine/models/default/README.md): half the FIM samples in
    # SPM order, where the prefix end
    # sits right before the middle (the shipped model predicts a masked line *worse* with a suffix than without
    # one: it does not find the prefix end across the suffix in PSM); every middle starts on a pre-token
    # boundary (what the engine's token healing serves); aligned packing; suffix cut to the server's window.
    "fim-spm": dict(fim_rate=0.9, span_mix=(0.60, 0.25), seed_offset=3, max_suffix_chars=900, aligned=True,
                    snap=True, spm_rate=0.5),
}
SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "model.safetensors.index.json", "metrics.json", "corpus_manifest.json")


class Log:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "w")
        self.t0 = time.time()

    def __call__(self, msg: str):
        line = f"[{time.time() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", choices=sorted(SCALES), default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--compile", action="store_true",
                    help="train through torch.compile (inductor); falls back to eager with the reason logged")
    ap.add_argument("--out", type=Path, required=True, help="model directory to write")
    ap.add_argument("--pack", type=Path, help="also pack the results into this folder (<= 8 files)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline-s", type=float, default=560.0, help="whole-run budget; training stops early to fit")
    ap.add_argument("--train-seconds", type=float, default=280.0, help="pretrain phase budget")
    ap.add_argument("--fim-seconds", type=float, default=170.0, help="fim / fim-spm phase budget")
    ap.add_argument("--phase", choices=("all", "pretrain", "fim", "fim-short", "fim-spm"), default="all",
                    help="all = pretrain then fim-spm in one run (the shipped model's recipe in one device call)")
    ap.add_argument("--init-from", type=Path, help="start from this model dir (its tokenizer is kept)")
    ap.add_argument("--fim-max-steps", type=int, help="override the fim phase step count (reproduce a run)")
    ap.add_argument("--max-steps", type=int, help="override the scale's step count (reproduce a run)")
    ap.add_argument("--max-bytes", type=int, help="override the corpus byte cap")
    ap.add_argument("--holdout", nargs="*", help="held-out distributions (default: tools/corpus.py choice)")
    a = ap.parse_args(argv)
    if a.phase.startswith("fim") and not a.init_from:
        ap.error(f"--phase {a.phase} needs --init-from")
    S = dict(SCALES[a.scale])
    if a.max_steps:
        S["max_steps"] = a.max_steps
    if a.max_bytes:
        S["max_bytes"] = a.max_bytes
    t0 = time.time()
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    log = Log((a.pack or out.parent) / "build_log.txt")   # everything under --pack comes back from the device
    log(f"build_default_model {a.scale} on {a.device}; seed {a.seed}; argv {sys.argv[1:]}")

    import torch
    import transformers
    log(f"python {sys.version.split()[0]} torch {torch.__version__} transformers {transformers.__version__} "
        f"cuda {torch.cuda.get_device_name(0) if a.device.startswith('cuda') else '-'} cpus {os.cpu_count()}")

    # 1. corpus
    train_docs, eval_docs, manifest = build_corpus(
        max_bytes=S["max_bytes"], max_bytes_per_package=S["max_bytes_per_package"],
        time_budget_s=S["corpus_seconds"], holdout=a.holdout, log=log)
    (out / "corpus_manifest.json").write_text(json.dumps(manifest, indent=1))

    # 2. tokenizer on a deterministic, evenly spread sample of the training files (or the init model's)
    t = time.time()
    if a.init_from:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(a.init_from / "tokenizer.json"))
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if (a.init_from / name).resolve() != (out / name).resolve():
                shutil.copy2(a.init_from / name, out / name)
        log(f"tokenizer: vocab {tok.get_vocab_size()} from {a.init_from}")
    else:
        step = max(1, int(manifest["train_bytes"] / S["tok_bytes"]))
        sample = [d.text for d in train_docs[::step]]
        tok = train_tokenizer(sample, vocab_size=S["vocab"])
        # SPM: the PSM-trained model finds the prefix end far better when the prefix comes last (README.md).
        save_tokenizer(tok, out, fim_order="spm")
        log(f"tokenizer: vocab {tok.get_vocab_size()} from {sum(map(len, sample))/1e6:.1f} MB in {time.time()-t:.1f}s")
    ids = FimIds.from_tokenizer(tok)

    # 3. model
    from train_model import build_model, make_config, train
    from transformers import Qwen2ForCausalLM
    prior_phases = []
    if a.init_from:
        model = Qwen2ForCausalLM.from_pretrained(a.init_from, dtype=torch.float32)
        config = model.config
        if (a.init_from / "metrics.json").exists():
            prior = json.loads((a.init_from / "metrics.json").read_text()).get("train", {})
            prior_phases = prior.get("phases") or [{**prior, "phase": "pretrain"}]
    else:
        config = make_config(a.scale, tok.get_vocab_size(), ids.eos)
        model = build_model(config, a.seed)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: Qwen2 {config.num_hidden_layers}L d{config.hidden_size} ffn{config.intermediate_size} "
        f"{config.num_attention_heads}q/{config.num_key_value_heads}kv vocab {config.vocab_size}: {n_params/1e6:.2f}M params")

    # 4. training phases: FIM / plain samples packed into one token stream each
    reserve = 120.0 if a.scale == "full" else 5.0         # save + eval (ppl + up to 10 line-task runs) kept back
    phases = ["pretrain", "fim-spm"] if a.phase == "all" else [a.phase]
    stats_list = []
    for ph in phases:
        P = PHASES[ph]
        t = time.time()
        if ph == "pretrain":
            specs = build_specs(train_docs, ids, a.seed + P["seed_offset"], S["window_chars"], P["fim_rate"],
                                span_mix=P["span_mix"])
        else:
            lo, hi = S["fim_window"]
            specs = build_specs(train_docs, ids, a.seed + P["seed_offset"], hi, P["fim_rate"],
                                min_window_chars=lo, span_mix=P["span_mix"], max_suffix_chars=P["max_suffix_chars"],
                                snap=pretoken_snapper(tok) if P.get("snap") else None,
                                spm_rate=P.get("spm_rate", 0.0))
        loss_mask, note = None, ""
        if P["aligned"]:
            stream, loss_mask, dropped = pack_aligned(specs, tok, S["seq_len"], ids.middle, ids.eos)
            note = f", aligned: {dropped} long FIM samples dropped, {1 - loss_mask.mean():.1%} padding"
        else:
            stream = tokenize_specs(specs, tok)
        n_fim = sum(1 for sp in specs if ids.middle in sp.parts)
        log(f"data[{ph}]: {len(specs)} samples ({n_fim/len(specs):.0%} FIM), {len(stream)/1e6:.2f}M tokens, "
            f"{manifest['train_bytes']/max(1, len(stream)):.2f} bytes/token in {time.time()-t:.1f}s{note}")
        del specs
        left = a.deadline_s - (time.time() - t0) - reserve
        if ph == "pretrain":
            budget = min(a.train_seconds, left - (a.fim_seconds if len(phases) > 1 else 0.0))
            steps, lr, warm = S["max_steps"], S["peak_lr"], S["warmup"]
        else:
            budget = min(a.fim_seconds, left)
            steps, lr, warm = a.fim_max_steps or S["max_steps"], S["fim_lr"], S["fim_warmup"]
        log(f"train[{ph}]: budget {budget:.0f}s")
        st = train(model, stream, seq_len=S["seq_len"], batch=S["batch"], device=a.device,
                   seed=a.seed + P["seed_offset"], train_seconds=budget, max_steps=steps, peak_lr=lr,
                   warmup=warm, loss_mask=loss_mask, compile_backend="inductor" if a.compile else None, log=log)
        st.update(phase=ph, fim_rate=P["fim_rate"], span_mix=P["span_mix"], max_suffix_chars=P["max_suffix_chars"],
                  aligned=P["aligned"], snap=bool(P.get("snap")), spm_rate=P.get("spm_rate", 0.0))
        stats_list.append(st)
        log(f"train[{ph}]: done {st['steps']} steps, {st['tokens_trained']/1e6:.1f}M tokens, "
            f"{st['epochs']} epochs, {st['train_wall_s']}s, final loss {st['final_loss']}")
        del stream
    all_phases = prior_phases + stats_list
    stats = {"phases": all_phases, "tokens_trained": sum(p["tokens_trained"] for p in all_phases),
             "train_wall_s": round(sum(p["train_wall_s"] for p in all_phases), 1),
             "steps": sum(p["steps"] for p in all_phases),
             "epochs": round(sum(p["epochs"] for p in all_phases), 2),
             "final_loss": stats_list[-1]["final_loss"]}

    # 5. save in bf16 (what ships), reload in fp32 exactly as the CPU will run it
    model = model.to(torch.bfloat16).cpu()
    model.save_pretrained(out, max_shard_size=S["shard"])
    add_legacy_rope_theta(out / "config.json")
    del model
    model = Qwen2ForCausalLM.from_pretrained(out, dtype=torch.float32).to(a.device).eval()

    if a.pack:
        pack(out, a.pack, log)                              # the model comes back even if eval fails

    # 6. evaluation on the held-out packages
    from eval_model import line_tasks, perplexity
    t = time.time()
    try:
        ppl = perplexity(model, tok, eval_docs, seq_len=S["seq_len"], max_tokens=S["ppl_tokens"],
                         device=a.device, eos_id=ids.eos)
        lines = line_tasks(model, tok, eval_docs, n=S["eval_lines"], seed=a.seed, device=a.device, fim_ids=ids)
        # The same lines with the cursor after the indentation (an editor after Enter) and mid-line, each with
        # and without token healing (what the server does with generate(heal=True)).
        # SPM prompts too once any phase of this model trained them.
        lines["variants"] = []
        orders = ["psm"] + (["spm"] if any(p.get("spm_rate") for p in prior_phases + stats_list) else [])
        todo = [(o, v, h) for o in orders for v, h in (("line", False), ("indent", False), ("indent", True),
                                                       ("mid", False), ("mid", True))]
        for order, variant, heal in todo[1:]:
            r = line_tasks(model, tok, eval_docs, n=S["eval_lines"], seed=a.seed, device=a.device, fim_ids=ids,
                           variant=variant, heal=heal, order=order)
            lines["variants"].append({k: r[k] for k in ("order", "variant", "heal", "fim_line_exact_match",
                                                        "next_line_exact_match", "healed_fim_prompts")})
            log(f"eval[{order}, {variant}, heal={heal}]: fim_em {r['fim_line_exact_match']} "
                f"next_line_em {r['next_line_exact_match']}")
    except Exception as exc:                                 # keep the trained model; eval can be rerun
        import traceback
        log("eval FAILED:\n" + traceback.format_exc())
        ppl = {"error": repr(exc), "perplexity": float("nan"), "bits_per_byte": float("nan")}
        lines = {"samples": 0, "fim_line_exact_match": float("nan"), "next_line_exact_match": float("nan"),
                 "error": repr(exc)}
    log(f"eval: {time.time()-t:.1f}s ppl {ppl} fim_em {lines['fim_line_exact_match']} "
        f"next_line_em {lines['next_line_exact_match']}")
    files = sorted(p.name for p in out.iterdir())
    metrics = {
        "model": {"architecture": "Qwen2ForCausalLM", "params": n_params, "layers": config.num_hidden_layers,
                  "hidden": config.hidden_size, "ffn": config.intermediate_size,
                  "heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads,
                  "vocab": config.vocab_size, "tokenizer_vocab": tok.get_vocab_size(), "stored_dtype": "bfloat16",
                  "bytes_on_disk": sum((out / f).stat().st_size for f in files if f.endswith(".safetensors"))},
        "corpus": {k: manifest[k] for k in ("train_files", "train_bytes", "eval_files", "eval_bytes",
                                            "duplicates_dropped", "holdout", "python")},
        "train": {**stats, "seed": a.seed, "device": torch.cuda.get_device_name(0) if a.device.startswith("cuda")
                  else "cpu", "torch": torch.__version__, "transformers": transformers.__version__},
        "eval_heldout": {"perplexity": ppl, **lines, "prefix_tokens": 1024, "suffix_tokens": 256,
                         "note": "greedy, fp32 on bf16-stored weights; exact match compares stripped lines"},
        "build_wall_s": round(time.time() - t0, 1),
        "command": "python3 tools/build_default_model.py " + " ".join(sys.argv[1:]),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    if a.pack:
        pack(out, a.pack, log)
    log("\n" + summary_table(metrics))
    return metrics


def add_legacy_rope_theta(path: Path) -> None:
    """transformers 5 writes rope_parameters only; readers of Qwen2.5-style configs look for rope_theta."""
    cfg = json.loads(path.read_text())
    rp = cfg.get("rope_parameters") or {}
    if "rope_theta" not in cfg and "rope_theta" in rp:
        cfg["rope_theta"] = rp["rope_theta"]
        path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def pack(model_dir: Path, dest: Path, log) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest / "meta.tar", "w") as tf:
        for name in SMALL_FILES:
            if (model_dir / name).exists():
                tf.add(model_dir / name, arcname=name)
    for p in sorted(model_dir.glob("*.safetensors")):
        shutil.copy2(p, dest / p.name)
    log(f"pack: {sorted(x.name for x in dest.iterdir())}")


def summary_table(m: dict) -> str:
    e = m["eval_heldout"]
    rows = [("params", f"{m['model']['params']/1e6:.2f}M"), ("bytes on disk", f"{m['model']['bytes_on_disk']/1e6:.1f} MB"),
            ("corpus train", f"{m['corpus']['train_files']} files, {m['corpus']['train_bytes']/1e6:.1f} MB"),
            ("held out", f"{m['corpus']['holdout']} {m['corpus']['eval_bytes']/1e6:.1f} MB"),
            ("tokens trained", f"{m['train']['tokens_trained']/1e6:.1f}M ({m['train']['epochs']} epochs)"),
            ("train wall", f"{m['train']['train_wall_s']} s, {m['train']['steps']} steps"),
            ("final loss", m["train"]["final_loss"]), ("held-out ppl", e["perplexity"]["perplexity"]),
            ("bits/byte", e["perplexity"]["bits_per_byte"]),
            ("FIM line EM", f"{e['fim_line_exact_match']:.1%} of {e['samples']}"),
            ("next-line EM", f"{e['next_line_exact_match']:.1%}"), ("build wall", f"{m['build_wall_s']} s")]
    return "\n".join(f"{k:>16} | {v}" for k, v in rows)


if __name__ == "__main__":
    main()
