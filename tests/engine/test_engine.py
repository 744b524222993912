import threading

import pytest
import torch

from engine import Engine, SamplingParams
from engine.engine import resolve_model_dir


@pytest.fixture
def eng(tiny_qwen):
    return Engine.load(str(tiny_qwen), device="cpu", kv_slots=3, max_seq_len=128)


def _cold_logits(e, ids):
    """Last-position logits of `ids` computed from scratch in a throwaway cache."""
    from engine.kv_cache import KVCache
    c = e.config
    cache = KVCache(1, c.n_layers, c.n_kv_heads, e.max_seq_len, c.head_dim)
    return e.model.forward(cache.k, cache.v, 0, torch.tensor(ids), 0, all_logits=True)


def _prompt(e, text="def fibonacci(n):\n    result = [0, 1]\n"):
    return e.tokenizer.encode(text)


def test_stats_and_backend(eng):
    s = eng.stats()
    assert s["backend"] == "reference" and "reference selected" in s["backend_reason"]
    assert s["device"] == "cpu" and s["dtype"] == "float32" and s["kv_slots"] == 3
    assert s["params"] == eng.model.n_params() > 0
    assert set(s["cache"]) == {"hits", "misses", "reused_tokens", "prefilled_tokens"}


def test_default_model_missing_is_clear(monkeypatch, tmp_path):
    import engine.engine as em
    monkeypatch.setattr(em, "DEFAULT_MODEL_DIR", tmp_path / "nope")
    with pytest.raises(ValueError, match="default model is missing"):
        resolve_model_dir("default")


def test_greedy_is_reference_argmax_chain(eng):
    ids = _prompt(eng)
    r = eng.complete(ids, max_new_tokens=8, stop_ids=())
    assert r.finish_reason == "length" and len(r.token_ids) == 8
    seq = list(ids)
    for t in r.token_ids:   # each token is the argmax of a cold forward over everything before it
        assert int(_cold_logits(eng, seq)[-1].argmax()) == t
        seq.append(t)
    assert r.text == eng.tokenizer.decode(r.token_ids)
    assert r.prompt_tokens == len(ids) and r.prefill_ms > 0


def test_prefix_reuse_identical_logits_and_counted(eng):
    ids = _prompt(eng)
    b = eng.backend
    eng.complete(ids, max_new_tokens=1, stop_ids=())
    before = eng.stats()["cache"]
    longer = ids + eng.tokenizer.encode("    for i in range(2, n):")
    slot, lcp = eng.cache.acquire(longer)
    assert lcp == len(ids)
    warm = b.prefill(slot, torch.tensor(longer[lcp:]), lcp, all_logits=True)
    cold = _cold_logits(eng, longer)[lcp:]
    assert (warm - cold).abs().max().item() <= 1e-5
    eng.cache.record(slot, longer[lcp:])
    r = eng.complete(longer + [7], max_new_tokens=2, stop_ids=())
    assert r.reused_tokens == len(longer)
    after = eng.stats()["cache"]
    assert after["hits"] == before["hits"] + 1 and after["reused_tokens"] - before["reused_tokens"] == len(longer)
    assert after["prefilled_tokens"] - before["prefilled_tokens"] == 1


def test_edit_in_middle_and_same_prompt(eng):
    ids = _prompt(eng)
    a = eng.complete(ids, max_new_tokens=4, stop_ids=())
    same = eng.complete(ids, max_new_tokens=4, stop_ids=())
    assert same.token_ids == a.token_ids and same.reused_tokens == len(ids) - 1
    edited = ids[:5] + [9, 9] + ids[5:]
    r = eng.complete(edited, max_new_tokens=3, stop_ids=())
    cold_first = int(_cold_logits(eng, edited)[-1].argmax())
    assert r.token_ids[0] == cold_first


def test_two_documents_keep_their_slots(eng):
    a = _prompt(eng, "class Stack:\n    def push(self, item):\n")
    b = a[:3] + _prompt(eng, " read_file(path):\n    with open(path) as f:\n")
    eng.complete(a, max_new_tokens=1, stop_ids=())
    eng.complete(b, max_new_tokens=1, stop_ids=())   # shares a short head: forks instead of clobbering a
    r = eng.complete(a + [5], max_new_tokens=1, stop_ids=())
    assert r.reused_tokens == len(a)
    assert int(_cold_logits(eng, a + [5])[-1].argmax()) == r.token_ids[0]


def test_lru_eviction_bounded(eng):
    prompts = [_prompt(eng, f"x{i} = {i} * {i}\n") for i in range(5)]
    prompts = [[i + 20] + p for i, p in enumerate(prompts)]   # distinct first tokens
    for p in prompts:
        eng.complete(p, max_new_tokens=1, stop_ids=())
    assert sum(1 for s in eng.cache.slots if s.ids) == 3
    r = eng.complete(prompts[0] + [3], max_new_tokens=1, stop_ids=())
    assert r.reused_tokens == 0            # the oldest was evicted
    r = eng.complete(prompts[4] + [3], max_new_tokens=1, stop_ids=())
    assert r.reused_tokens == len(prompts[4])


def test_too_long_and_bad_ids(eng):
    with pytest.raises(ValueError, match="max_seq_len"):
        eng.generate([1] * 129)
    with pytest.raises(ValueError, match="out of range"):
        eng.generate([10 ** 6])
    with pytest.raises(ValueError, match="empty"):
        eng.score([])
    r = eng.complete([1] * 126, max_new_tokens=10, stop_ids=())   # runs out of positions
    assert r.finish_reason == "length" and len(r.token_ids) == 3


def test_seeded_sampling_reproducible(eng):
    ids = _prompt(eng)
    sp = SamplingParams(temperature=1.5, top_p=0.9, seed=123)
    a = eng.complete(ids, max_new_tokens=12, sampling=sp, stop_ids=())
    b = eng.complete(ids, max_new_tokens=12, sampling=sp, stop_ids=())
    c = eng.complete(ids, max_new_tokens=12, sampling=SamplingParams(temperature=1.5, seed=7), stop_ids=())
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


def test_stop_id(eng):
    ids = _prompt(eng)
    free = eng.complete(ids, max_new_tokens=6, stop_ids=())
    stop_tok = free.token_ids[3]
    r = eng.complete(ids, max_new_tokens=6, stop_ids={stop_tok})
    k = free.token_ids.index(stop_tok)
    assert r.finish_reason == "stop" and r.token_ids == free.token_ids[:k]
    assert eng.cache.slots[eng.cache.acquire(ids)[0]].ids[:len(ids)] == ids


def test_default_stop_ids_include_fim_markers(eng):
    fim = eng.tokenizer.fim
    assert {fim.prefix, fim.suffix, fim.middle, fim.file_sep, eng.tokenizer.token_to_id("<|endoftext|>")} \
        <= eng.default_stop_ids


def test_stop_string_cut_and_streaming(eng):
    ids = _prompt(eng)
    free = eng.complete(ids, max_new_tokens=16, stop_ids=())
    text = free.text
    assert len(text) >= 6
    stop = text[3:5]
    events = list(eng.generate(ids, max_new_tokens=16, stop_ids=(), stop_strings=[stop]))
    r = eng.last_result
    assert r.finish_reason == "stop_string"
    assert r.text == text[:text.index(stop)]
    assert "".join(e.text for e in events) == r.text
    # A stop string that never occurs: everything is released, held-back text included.
    events = list(eng.generate(ids, max_new_tokens=16, stop_ids=(), stop_strings=["\x00never"]))
    assert "".join(e.text for e in events) == text == eng.last_result.text


def test_stop_fn(eng):
    ids = _prompt(eng)
    seen = []

    def stop_fn(t):
        seen.append(t)
        return len(seen) == 3
    r = eng.complete(ids, max_new_tokens=10, stop_ids=(), stop_fn=stop_fn)
    assert r.finish_reason == "stop_fn" and len(r.token_ids) == 3 and seen[-1] == r.text


def test_cancel_between_tokens_keeps_cache_consistent(eng):
    ids = _prompt(eng)
    cancel = threading.Event()
    got = []
    for ev in eng.generate(ids, max_new_tokens=50, stop_ids=(), cancel=cancel):
        got.append(ev.token_id)
        if len(got) == 4:
            cancel.set()
    r = eng.last_result
    assert r.finish_reason == "cancelled" and r.token_ids == got and len(got) == 4
    slot = max(range(eng.cache.n_slots), key=lambda i: eng.cache.slots[i].last_used)
    cached = eng.cache.slots[slot].ids
    assert cached == ids + got[:3]          # the 4th token was sampled but never fed: its KV is not claimed
    assert eng.stats()["cancellations"] >= 1
    # Continuing from the cancelled state reuses the cache and matches a cold forward.
    cont = ids + got
    r2 = eng.complete(cont, max_new_tokens=1, stop_ids=())
    assert r2.reused_tokens == len(ids) + 3
    assert int(_cold_logits(eng, cont)[-1].argmax()) == r2.token_ids[0]


def test_cancel_before_start_and_consumer_break(eng):
    ev = threading.Event()
    ev.set()
    r = eng.complete(_prompt(eng), max_new_tokens=5, cancel=ev)
    assert r.finish_reason == "cancelled" and r.token_ids == []
    g = eng.generate(_prompt(eng), max_new_tokens=20, stop_ids=())
    next(g)
    g.close()
    assert eng.last_result.finish_reason == "cancelled" and len(eng.last_result.token_ids) == 1


def test_score_matches_full_forward_and_reuses(eng):
    ids = _prompt(eng) + _prompt(eng, "    return result")
    s = eng.score(ids)
    lp = torch.log_softmax(_cold_logits(eng, ids), -1)
    exp = [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]
    assert len(s.token_logprobs) == len(ids) - 1
    assert max(abs(a - b) for a, b in zip(s.token_logprobs, exp)) <= 1e-4
    assert s.top_ids == [int(lp[i - 1].argmax()) for i in range(1, len(ids))]
    assert max(abs(a - lp[i].max().item()) for i, a in enumerate(s.top_logprobs)) <= 1e-4
    # Rescore after appending: the head comes from the cache, the result is the same as cold.
    more = ids + [11, 12, 13]
    s2 = eng.score(more)
    assert s2.reused_tokens == len(ids) - 1
    lp2 = torch.log_softmax(_cold_logits(eng, more), -1)
    exp2 = [lp2[i - 1, more[i]].item() for i in range(1, len(more))]
    assert max(abs(a - b) for a, b in zip(s2.token_logprobs, exp2)) <= 1e-4
    # Identical rescore: nothing to compute.
    s3 = eng.score(more)
    assert s3.token_logprobs == s2.token_logprobs and s3.reused_tokens == len(more)
    # Edit in the middle: scores after the edit change, before it stay.
    edited = more[:6] + [40] + more[7:]
    s4 = eng.score(edited)
    assert s4.token_logprobs[:5] == s2.token_logprobs[:5]
    lp4 = torch.log_softmax(_cold_logits(eng, edited), -1)
    assert abs(s4.token_logprobs[5] - lp4[5, 40].item()) <= 1e-4


def test_score_cancel(eng):
    ev = threading.Event()
    ev.set()
    s = eng.score(_prompt(eng), cancel=ev)
    assert s.cancelled and s.token_logprobs == []


def test_threads_option_and_bad_dir(tiny_qwen, tmp_path):
    e = Engine.load(str(tiny_qwen), device="cpu", threads=1)
    assert e.stats()["threads"] == 1 == torch.get_num_threads()
    with pytest.raises(ValueError, match="threads"):
        Engine.load(str(tiny_qwen), device="cpu", threads=0)
    with pytest.raises(ValueError, match="does not exist"):
        Engine.load(str(tmp_path / "nope"), device="cpu")
    with pytest.raises(ValueError, match="dtype"):
        Engine.load(str(tiny_qwen), device="cpu", dtype="int3")


def test_delayed_tp_mode_refused_for_ordinary_checkpoint(tiny_qwen):
    with pytest.raises(ValueError, match="delayed"):
        Engine.load(str(tiny_qwen), device="cpu", tp_mode="delayed")
    with pytest.raises(ValueError, match="tp_mode"):
        Engine.load(str(tiny_qwen), device="cpu", tp_mode="fast")
