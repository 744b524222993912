"""The shipped default model (trained weights) on the GPU: the monokernel's and the graph backend's greedy completions
against the reference model's (fp32 on the same GPU), for fill-in-the-middle prompts built as the server builds them
(kog_lsp.fim.build_prompt), with token healing as the server asks for it and without: the engine's whole completion
path (prefill chunks as kernel steps or graphs, the healed first tokens sampled from logits, the kernel's token loop).
Token for token equal, except that a completion may part from the reference's at a near-tie of the reference's own
logits (TIE_NATS): bf16 arithmetic cannot promise more. Skips cleanly without CUDA / sm_90."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

cuda_ok = torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0)
pytestmark = pytest.mark.skipif(not cuda_ok, reason="needs an sm_90 (Hopper) CUDA GPU")

ROOT = Path(__file__).resolve().parents[2]
FILES = ["engine/healing.py", "kog_lsp/fim.py", "engine/sampling.py"]   # code the model never trained on
NEW_TOKENS = 32


def cursors(text: str, n: int = 4) -> list[int]:
    """n lines spread over the text, each with two cursors: mid-word in its code (where healing removes the word's
    head) and right after its indentation."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln))
    out = []
    for k in range(n):
        i = len(lines) * (k + 1) // (n + 1)
        while i < len(lines) - 1 and len(lines[i].strip()) < 8:   # a line with some code on it
            i += 1
        ln = lines[i]
        indent = len(ln) - len(ln.lstrip())
        code = ln.strip()
        out += [starts[i] + indent + len(code) // 2, starts[i] + indent]
    return out


def prompts(tok) -> list[list[int]]:
    """Two requests per cursor, as typing makes them: the file without the character at the cursor, then with it typed
    (the cursor one further), so the second request reuses the first's cached prompt and prefills a token or two (the
    keystroke path: kernel steps on the monokernel)."""
    from kog_lsp.fim import build_prompt
    out = []
    for f in FILES:
        text = (ROOT / f).read_text()
        for c in cursors(text):
            for doc, at in ((text[:c] + text[c + 1:], c), (text, c + 1)):
                out.append(build_prompt(tok, doc, at, prefix_tokens=1024, suffix_tokens=64).ids)
    return out


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def logprob(ref, prefix: list[int], tokens) -> float:
    """The fp32 reference's largest logprob among `tokens` after `prefix` (a stop: any of the stop ids)."""
    return max(ref.score(prefix + [t]).token_logprobs[-1] for t in tokens)


def near_tie(ref, ids: list[int], heal: bool, want, got, i: int) -> float:
    """Where two greedy completions first differ (token i): how much likelier the reference found its own token than
    the other's there (nats, >= 0 up to rounding), on the prompt as the reference ran it (healed or not). A token
    past a completion's end is its stop: the likeliest of the stop ids."""
    from engine import healing
    tok = ref.tokenizer
    hp = healing.plan(healing.heal_vocab(tok), ids, healing.default_boundary(ids, tok.fim)) if heal else None
    prefix = (ids if hp is None else hp.ids) + want.token_ids[:i]
    pick = lambda r: [r.token_ids[i]] if i < len(r.token_ids) else sorted(ref.default_stop_ids)  # noqa: E731
    return logprob(ref, prefix, pick(want)) - logprob(ref, prefix, pick(got))


# bf16 weights and K / V with fp32 arithmetic (the kernel) or bf16 activations too (the graphs) against fp32
# throughout: a greedy pick may flip only where the reference's two best tokens are this close (nats; a kernel bug moves
# logits by whole nats), and most completions stay equal to the end. Measured on an H200 (bench/NOTES.md, session 36):
# monokernel 83 of 96 equal, ties <= 0.029; graph 66 of 96, ties <= 0.091.
TIE_NATS = {"monokernel": 0.05, "graph": 0.15}
EQUAL_SHARE = {"monokernel": 0.75, "graph": 0.6}


@pytest.mark.parametrize("backend", ["monokernel", "graph"])
def test_default_model_greedy_completions_equal_the_reference(backend):
    from engine import Engine
    ref = Engine.load("default", device="cuda", backend="reference", dtype="float32", max_seq_len=2048, kv_slots=2)
    eng = Engine.load("default", device="cuda", backend=backend, max_seq_len=2048, kv_slots=2)
    assert eng.stats()["backend"] == backend, eng.stats()
    ps = prompts(eng.tokenizer)
    healed = equal = tokens = 0
    ties = []
    for heal in (True, False):
        for j, ids in enumerate(ps):
            want = ref.complete(ids, max_new_tokens=NEW_TOKENS, heal=heal)
            got = eng.complete(ids, max_new_tokens=NEW_TOKENS, heal=heal)
            healed += bool(got.healed)
            assert got.healed == want.healed
            i = first_difference(got.token_ids, want.token_ids)
            if i is None:
                assert got.text == want.text
                equal += 1
                tokens += len(got.token_ids)
                continue
            tokens += i
            gap = near_tie(ref, ids, heal, want, got, i)
            ties.append(gap)
            print(f"\nprompt {j} heal={heal}: first different token at {i}: the reference's token "
                  f"{gap:.4f} nats likelier than the {backend}'s")
            assert gap <= TIE_NATS[backend], (j, heal, i, gap, got.text, want.text)
    n = 2 * len(ps)
    stats = eng.stats()["backend_stats"]
    print(f"\n{backend}: {equal} of {n} greedy completions equal the fp32 reference's ({tokens} tokens equal); the "
          f"others first differ at near-ties of {', '.join(f'{g:.4f}' for g in ties) or '-'} nats; {healed} healed; "
          f"{ {k: v for k, v in stats.items() if 'prefill' in k} }")
    assert equal >= EQUAL_SHARE[backend] * n
    assert healed >= len(ps) // 2, "the prompts should exercise the healed path"
    if backend == "monokernel":   # the keystroke path: short chunks as kernel steps, then the token loop
        assert stats["kernel_prefills"] > 0 and stats["launches"] > n, stats
