"""Held-out evaluation of the default model: perplexity, masked single-line FIM exact match, next-line
exact match. Everything runs on the *saved* checkpoint (bf16 weights upcast to fp32), i.e. what ships.

Masked-line task: pick a non-blank line of a held-out file; prompt
  <|fim_prefix|>{up to 1024 tokens before the cursor}<|fim_suffix|>{up to 256 tokens after it}<|fim_middle|>
greedy-decode up to 48 tokens, cut at the first newline or <|endoftext|>, and compare (the line's text before
the cursor + the output) with the line, both stripped of surrounding whitespace.
Next-line task: the same lines, prompt = the prefix alone (plain left-to-right).

Where the cursor sits (`variant`):
  "line"   -- at the start of the line (the prefix ends with the previous line's "\n"; the middle is the whole
              line, indentation included): the metric recorded since the first build;
  "indent" -- after the line's indentation, the suffix starting with the line's "\n": an editor after Enter
              and auto-indent, about to type the line;
  "mid"    -- at a random point inside the line's content (seeded), as while typing.
heal=True applies token healing (engine/healing.py, as the engine does with generate(heal=True)): up to 2
tokens before the cursor are removed and the first generated token(s) must re-spell them.

Run on CPU:  python3 tools/eval_model.py --lines 400 --variant line indent mid --heal both --threads 2
"""
from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repo root, for `engine`
from engine import healing  # noqa: E402
from engine.tokenizer import Tokenizer as EngineTokenizer  # noqa: E402

PREFIX_TOKENS, SUFFIX_TOKENS, MAX_NEW = 1024, 256, 48


def perplexity(model, tok, docs, *, seq_len: int, max_tokens: int, device: str, eos_id: int,
               batch: int = 16) -> dict:
    """Mean next-token NLL over held-out files (each followed by <|endoftext|>), non-overlapping windows."""
    ids, n_bytes = [], 0
    for d in docs:
        e = tok.encode(d.text, add_special_tokens=False).ids
        ids += e + [eos_id]
        n_bytes += len(d.text.encode("utf-8")) + 1
        if len(ids) >= max_tokens:
            break
    n_win = max(1, min(len(ids), max_tokens) // seq_len)
    used = ids[: n_win * seq_len + 1]
    bytes_per_token = n_bytes / max(1, len(ids))     # average over the encoded files
    x = torch.tensor(used[: n_win * seq_len], dtype=torch.long).view(n_win, seq_len)
    nll, count = 0.0, 0
    with torch.no_grad():
        for b in range(0, n_win, batch):
            xb = x[b:b + batch].to(device)
            logits = model(input_ids=xb, use_cache=False).logits.float()     # [B, T, V]
            lp = torch.log_softmax(logits[:, :-1], -1)
            tgt = xb[:, 1:]
            nll -= lp.gather(-1, tgt[..., None]).sum().item()
            count += tgt.numel()
    mean = nll / max(1, count)
    return {"tokens": count, "nll": round(mean, 4), "perplexity": round(math.exp(mean), 3),
            "bits_per_byte": round(mean / math.log(2) / bytes_per_token, 4), "bytes_per_token": round(bytes_per_token, 3)}


def pick_lines(docs, n: int, seed: int) -> list[tuple[str, str, str]]:
    """-> n (before, line, after) triples: a uniform non-blank line (not the first) of a uniform file."""
    rng = random.Random(seed)
    pool = [d for d in docs if sum(1 for l in d.text.splitlines() if l.strip()) >= 3]
    out = []
    while pool and len(out) < n:
        d = rng.choice(pool)
        lines = d.text.splitlines(keepends=True)
        cand = [i for i, l in enumerate(lines) if l.strip() and i > 0]
        i = rng.choice(cand)
        out.append(("".join(lines[:i]), lines[i], "".join(lines[i + 1:])))
    return out


class _HealProcessor:
    """HF logits processor: row r's first generated tokens must re-spell removed[r] (healing.Constraint)."""

    def __init__(self, vocab, removed: list[bytes], prompt_len: int):
        self.cons = [healing.Constraint(vocab, b) if b else None for b in removed]
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """input_ids: [B, prompt_len + t]; scores: [B, V] for step t."""
        t = input_ids.shape[1] - self.prompt_len
        for r, con in enumerate(self.cons):
            if con is None:
                continue
            if t > 0:
                con.advance(int(input_ids[r, -1]))
            if con.done:
                self.cons[r] = None
                continue
            scores[r] = con.mask(scores[r])
        return scores


class _LineDone:
    """HF stopping criterion: a row is done once its output has a newline past the re-spelled healed text
    (only the first line is scored, so the rest of max_new would be wasted work)."""

    def __init__(self, tok, skip: list[str], prompt_len: int):
        self.tok, self.skip, self.prompt_len = tok, skip, prompt_len

    def __call__(self, input_ids: torch.Tensor, scores, **kw) -> torch.Tensor:
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for r in range(input_ids.shape[0]):
            text = self.tok.decode(input_ids[r, self.prompt_len:].tolist(), skip_special_tokens=True)
            done[r] = "\n" in text[len(self.skip[r]):]
        return done


def greedy_batch(model, prompts: list[list[int]], *, max_new: int, eos_id: int, device: str,
                 batch: int = 64, heal_vocab=None, removed: list[bytes] | None = None, tok=None) -> list[list[int]]:
    """Greedy continuations of left-padded prompts (HF generate computes positions from the mask).
    removed (with heal_vocab): per prompt, the bytes token healing took off; its output must spell them first.
    tok: when given, a row stops at the end of its first line (what the line tasks score)."""
    from transformers import LogitsProcessorList, StoppingCriteriaList
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    outs: list = [None] * len(prompts)
    for b in range(0, len(order), batch):
        group = [order[k] for k in range(b, min(b + batch, len(order)))]
        L = max(len(prompts[i]) for i in group)
        ids = torch.full((len(group), L), eos_id, dtype=torch.long)
        mask = torch.zeros((len(group), L), dtype=torch.long)
        for r, i in enumerate(group):
            p = prompts[i]
            ids[r, L - len(p):] = torch.tensor(p)
            mask[r, L - len(p):] = 1
        procs = None
        if removed is not None and any(removed[i] for i in group):
            procs = LogitsProcessorList([_HealProcessor(heal_vocab, [removed[i] for i in group], L)])
        stops = None
        if tok is not None:
            skip = [(removed[i] if removed else b"").decode("utf-8", "replace") for i in group]
            stops = StoppingCriteriaList([_LineDone(tok, skip, L)])
        with torch.no_grad():
            g = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new,
                               do_sample=False, eos_token_id=eos_id, pad_token_id=eos_id,
                               num_beams=1, logits_processor=procs, stopping_criteria=stops)
        for r, i in enumerate(group):
            new = g[r, L:].tolist()
            if eos_id in new:
                new = new[: new.index(eos_id)]
            outs[i] = new
    return outs


def first_line(tok, ids: list[int], skip: str = "") -> str:
    """The first line of the decoded ids, after dropping `skip` (text healing removed and the output re-spelled)."""
    text = tok.decode(ids, skip_special_tokens=True)
    if skip:
        text = text[len(skip):] if text.startswith(skip) else text
    return text.split("\n", 1)[0]


VARIANTS = ("line", "indent", "mid")


def cursor_split(before: str, line: str, after: str, variant: str, rng: random.Random) -> tuple[str, str, str]:
    """-> (text before the cursor, the line's text before the cursor, text after the cursor) for a masked line."""
    body = line.rstrip("\n")
    indent = body[: len(body) - len(body.lstrip(" \t"))]
    if variant == "line":
        return before, "", after
    if variant == "indent":
        return before + indent, indent, line[len(body):] + after
    if variant == "mid":
        content = len(body) - len(indent)
        k = len(indent) + (rng.randint(1, content - 1) if content > 1 else 0)
        return before + body[:k], body[:k], line[len(body):] + after
    raise ValueError(f"variant must be one of {VARIANTS}, not {variant!r}")


def line_tasks(model, tok, docs, *, n: int, seed: int, device: str, fim_ids, batch: int = 64,
               variant: str = "line", heal: bool = False, order: str = "psm") -> dict:
    """Masked single-line FIM exact match and next-line exact match on the same n held-out lines.
    tok: a `tokenizers.Tokenizer`; variant: where the cursor sits (module docstring); heal: token healing;
    order: FIM prompt order, "psm" (<pre>P<suf>S<mid>) or "spm" (<pre><suf>S<mid>P, tools/fim_data.py)."""
    if order not in ("psm", "spm"):
        raise ValueError(f"order must be 'psm' or 'spm', not {order!r}")
    samples = pick_lines(docs, n, seed)
    rng = random.Random(seed + 1)
    vocab = healing.heal_vocab(EngineTokenizer(tok)) if heal else None
    fim_prompts, nl_prompts, fim_rm, nl_rm, heads = [], [], [], [], []
    for before, line, after in samples:
        pre_text, head, post_text = cursor_split(before, line, after, variant, rng)
        p = tok.encode(pre_text, add_special_tokens=False).ids[-PREFIX_TOKENS:]
        s = tok.encode(post_text, add_special_tokens=False).ids[:SUFFIX_TOKENS]
        if order == "psm":
            fp, cursor = [fim_ids.prefix] + p + [fim_ids.suffix] + s + [fim_ids.middle], 1 + len(p)
        else:
            fp = [fim_ids.prefix, fim_ids.suffix] + s + [fim_ids.middle] + p
            cursor = len(fp)
        npr = p if p else [fim_ids.eos]
        fr = nr = b""
        if heal:
            hf = healing.plan(vocab, fp, cursor)
            hn = healing.plan(vocab, npr, len(npr)) if p else None
            if hf is not None:
                fp, fr = hf.ids, hf.removed
            if hn is not None and hn.ids:
                npr, nr = hn.ids, hn.removed
        fim_prompts.append(fp)
        nl_prompts.append(npr)
        fim_rm.append(fr)
        nl_rm.append(nr)
        heads.append(head)
    kw = dict(max_new=MAX_NEW, eos_id=fim_ids.eos, device=device, batch=batch, heal_vocab=vocab, tok=tok)
    fim_out = greedy_batch(model, fim_prompts, removed=fim_rm if heal else None, **kw)
    nl_out = greedy_batch(model, nl_prompts, removed=nl_rm if heal else None, **kw)
    fim_hits = nl_hits = long_n = long_fim = 0
    examples = []
    for k, ((before, line, after), fo, no) in enumerate(zip(samples, fim_out, nl_out)):
        target = line.strip()
        head = heads[k]
        f = (head + first_line(tok, fo, fim_rm[k].decode("utf-8", "replace"))).strip()
        nx = (head + first_line(tok, no, nl_rm[k].decode("utf-8", "replace"))).strip()
        fim_hits += f == target
        nl_hits += nx == target
        if len(target.replace(" ", "")) >= 10:               # lines with some content, not ")" or "else:"
            long_n += 1
            long_fim += f == target
        if k < 12:
            examples.append({"target": target, "fim": f, "next_line": nx})
    m = max(1, len(samples))
    return {"samples": len(samples), "variant": variant, "heal": heal, "order": order,
            "fim_line_exact_match": round(fim_hits / m, 4),
            "next_line_exact_match": round(nl_hits / m, 4),
            "fim_line_exact_match_10plus_chars": round(long_fim / max(1, long_n), 4), "lines_10plus_chars": long_n,
            "healed_fim_prompts": sum(1 for b in fim_rm if b), "healed_next_line_prompts": sum(1 for b in nl_rm if b),
            "examples": examples}


def main(argv=None) -> None:
    """Re-run the line tasks on a saved model directory (CPU is fine: ~2 min per 100 lines x task)."""
    import argparse
    import json
    import time
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "engine" / "models" / "default"))
    ap.add_argument("--lines", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variant", nargs="+", choices=VARIANTS, default=["line"])
    ap.add_argument("--heal", choices=("off", "on", "both"), default="both")
    ap.add_argument("--order", nargs="+", choices=("psm", "spm"), default=["psm"], help="FIM prompt order(s)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from tokenizers import Tokenizer
    from transformers import Qwen2ForCausalLM

    from corpus import build_corpus
    from fim_data import FimIds
    mdir = Path(a.model)
    tok = Tokenizer.from_file(str(mdir / "tokenizer.json"))
    holdout = json.loads((mdir / "metrics.json").read_text())["corpus"]["holdout"]
    _, docs, man = build_corpus(max_bytes=1, holdout=holdout, log=lambda m: None)
    print(f"held out {holdout}: {man['eval_files']} files, {man['eval_bytes'] / 1e6:.1f} MB", flush=True)
    model = Qwen2ForCausalLM.from_pretrained(mdir, dtype=torch.float32).to(a.device).eval()
    results = []
    for order, variant in ((o, v) for o in a.order for v in a.variant):
        for heal in {"off": [False], "on": [True], "both": [False, True]}[a.heal]:
            t = time.time()
            r = line_tasks(model, tok, docs, n=a.lines, seed=a.seed, device=a.device,
                           fim_ids=FimIds.from_tokenizer(tok), batch=a.batch, variant=variant, heal=heal,
                           order=order)
            r["seconds"] = round(time.time() - t, 1)
            results.append(r)
            print(f"{order} variant {variant:6} heal {heal!s:5}: FIM EM {r['fim_line_exact_match']:.1%}  next-line EM "
                  f"{r['next_line_exact_match']:.1%}  ({r['samples']} lines, healed {r['healed_fim_prompts']} FIM / "
                  f"{r['healed_next_line_prompts']} next-line prompts, {r['seconds']}s)", flush=True)
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
