"""The screened LM head (kernels/lm_screen.py) on the shipped default model (trained weights), through the engine's
monokernel backend: greedy completions of three prompts and two sampled runs with the screen on and off
(Monokernel.lm_screen_off), the tokens compared, and whether any LMHEAD block overflowed its candidate list.
usage (device): PYTHONPATH=. python3 bench/experiments/lm-screen-default-model.py"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from engine import Engine  # noqa: E402
from engine.engine import DEFAULT_MODEL_DIR  # noqa: E402

eng = Engine.load(DEFAULT_MODEL_DIR, device="cuda", backend="monokernel", max_seq_len=1024, kv_slots=2)
mk = eng.backend.mk
print(eng.stats()["backend"], "| screen off:", mk.lm_screen_off)
same = True
for p0 in (100, 2000, 7000):
    prompt = list(range(p0, p0 + 300, 3))
    out = {}
    for off in (None, "check"):
        mk.lm_screen_off = off
        out[off] = eng.complete(prompt, max_new_tokens=200, stop_ids=frozenset()).token_ids
        print(f"prompt {p0}: {mk.lm_mode:<16} over {mk.lm_over} tokens {len(out[off])} {out[off][:8]}")
    print("greedy equal:", out[None] == out["check"])
    same &= out[None] == out["check"]
for T, seed in ((0.8, 3), (1.2, 4)):
    got = {}
    for off in (None, "check"):
        mk.lm_screen_off = off
        got[off] = mk.run(0, 123, 0, 300, temperature=T, seed=seed)[0]
    print(f"T {T}: sampled equal {got[None] == got['check']} ({len(got[None])} tokens), over {mk.lm_over}")
    same &= got[None] == got["check"]
mk.lm_screen_off = None
print(f'{{"bench": "lm-screen-default-model", "tokens_equal": {str(same).lower()}, "overflows": {mk.lm_over}}}')
