"""The engine: token ids in, tokens out. Prefix-reusing KV cache, backends, streaming generation, scoring.

Not thread-safe: exactly one thread (engine.worker.EngineWorker) calls it.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from . import healing
from .backends import select_backend
from .config import ModelConfig
from .kv_cache import KVCache
from .loader import load_model
from .sampling import SamplingParams, make_generator, sample
from .tokenizer import Tokenizer

log = logging.getLogger("engine")

DEFAULT_MODEL_DIR = Path(__file__).parent / "models" / "default"
PREFILL_CHUNK = 512   # tokens per prefill call: bounds activation memory and lets cancel act between chunks
SCORE_CHUNK = 256     # all-logits prefill keeps [chunk, vocab] fp32 logits alive


@dataclass
class TokenEvent:
    token_id: int | None   # None only for a last event carrying text held back until the end
    text: str              # decoded delta ("" while a UTF-8 character or a possible stop string is incomplete)


@dataclass
class GenerationResult:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = "length"   # length | stop | stop_string | stop_fn | cancelled
    prompt_tokens: int = 0
    reused_tokens: int = 0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    decode_tok_s: float = 0.0
    healed: str = ""                # prompt text removed by token healing and regenerated (not part of `text`)


@dataclass
class ScoreResult:
    token_logprobs: list[float]     # logprob of ids[i] given ids[:i], i >= 1
    top_ids: list[int]              # the model's argmax at that position
    top_logprobs: list[float]
    prompt_tokens: int = 0
    reused_tokens: int = 0
    ms: float = 0.0
    cancelled: bool = False         # True: lists cover only the scored head


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    d = torch.device(device)
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
    return d


def _resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(table)})")
    return table[dtype]


def resolve_model_dir(model: str | Path) -> Path:
    if str(model) == "default":
        d = DEFAULT_MODEL_DIR
        if not (d / "config.json").exists():
            raise ValueError(f"the default model is missing: {d} has no config.json (it ships with the package once "
                             f"trained; pass a Hugging Face model directory instead)")
        return d
    d = Path(model).expanduser()
    if not d.is_dir():
        raise ValueError(f"model directory {d} does not exist")
    return d


class Engine:
    def __init__(self, model, tokenizer: Tokenizer | None, kv_slots: int = 4, backend: str = "auto",
                 tp: int = 1, tp_mode: str = "exact", name: str = ""):
        if tp_mode not in ("exact", "delayed"):
            raise ValueError(f"tp_mode must be 'exact' or 'delayed', not {tp_mode!r}")
        from .lanes import check_tp_mode
        lanes = getattr(model, "lane_config", None)
        check_tp_mode(getattr(model, "checkpoint_kind", "dense"), tp_mode, tp, getattr(lanes, "num_lanes", None))
        self.model = model
        self.config: ModelConfig = model.cfg
        self.tokenizer = tokenizer
        self.max_seq_len = model.max_len
        cfg = model.cfg
        self.cache = KVCache(kv_slots, cfg.n_layers, cfg.n_kv_heads, model.max_len, cfg.head_dim,
                             dtype=model.dtype, device=model.device)
        self.backend, self.backend_reason = select_backend(backend, model, self.cache, tp=tp, tp_mode=tp_mode)
        self.name = name
        self.tp, self.tp_mode = tp, tp_mode   # reported in stats(); select_backend refuses what cannot run
        self.last_result: GenerationResult | None = None
        self.last_score: ScoreResult | None = None
        self._generations = 0
        self._cancellations = 0
        self._scores = 0
        self._prefill_ms_last = None
        self._decode_tok_s_last = None
        self._heal = {"requests": 0, "healed": 0, "tokens_removed": 0, "unavailable": 0}
        stop = set(tokenizer.eos_ids) if tokenizer else set()
        stop.update(cfg.eos_token_ids)
        if tokenizer is not None and tokenizer.fim is not None:
            stop.update(tokenizer.fim.marker_ids())
        self.default_stop_ids = frozenset(stop)

    @classmethod
    def load(cls, model: str | Path = "default", device: str = "auto", backend: str = "auto", tp: int = 1,
             tp_mode: str = "exact", dtype=None, kv_slots: int = 4, max_seq_len: int = 4096,
             threads: int | None = None) -> "Engine":
        """threads: torch intra-op threads for CPU work (process-wide; None leaves torch's setting). At batch
        size 1 every matmul is an OpenMP fork/join: on a busy machine a descheduled worker stalls each one,
        and 1 thread was 7x faster than 2 on a loaded 2-core box (bench/cpu_decode.py)."""
        if threads is not None:
            if threads < 1:
                raise ValueError("threads must be >= 1")
            torch.set_num_threads(threads)
        d = resolve_model_dir(model)
        kind = _check_checkpoint_kind(d, tp, tp_mode)
        dev = _resolve_device(device)
        dt = _resolve_dtype(dtype, dev)
        name = "default" if str(model) == "default" else str(d)
        if kind == "lane":
            # A Laneformer lane checkpoint: the lane reference model behind the engine's model interface
            # (engine/lanes/serving.py); its tokenizer files are read like any checkpoint's.
            from .lanes.serving import load_lane_serving
            m = load_lane_serving(d, device=dev, dtype=dt, max_len=max_seq_len, name=name)
            tok = Tokenizer.from_dir(d, eos_ids=m.cfg.eos_token_ids)
        else:
            cfg = ModelConfig.from_json(d)
            tok = Tokenizer.from_dir(d, eos_ids=cfg.eos_token_ids)
            m = load_model(d, device=dev, dtype=dt, max_len=max_seq_len, config=cfg)
        return cls(m, tok, kv_slots=kv_slots, backend=backend, tp=tp, tp_mode=tp_mode, name=name)

    # ---- helpers ----
    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("empty token id list")
        if len(ids) > self.max_seq_len:
            raise ValueError(f"sequence of {len(ids)} tokens exceeds max_seq_len {self.max_seq_len}; "
                             f"truncate the prompt before calling the engine")
        V = self.config.vocab_size
        bad = [i for i in ids if not 0 <= i < V]
        if bad:
            raise ValueError(f"token ids out of range [0, {V}): {bad[:5]}")
        return ids

    def _prefill(self, ids: list[int], cancel, all_logits_cb=None) -> tuple[int, int, torch.Tensor | None]:
        """Acquire a slot, prefill what the cache lacks; returns (slot, reused, last logits or None if cancelled)."""
        slot, lcp = self.cache.acquire(ids)
        reuse = min(lcp, len(ids) - 1)   # at least one token runs so the last position has logits
        self.cache.truncate(slot, reuse)
        self._count_reuse(reuse, len(ids) - reuse)
        logits = None
        # One host-to-device copy for all chunks: a copy from pageable memory waits for the stream, so one per
        # chunk would stall the host on the previous chunk's GPU work.
        todo = torch.tensor(ids[reuse:], dtype=torch.long, device=self.model.device)
        for c in range(reuse, len(ids), PREFILL_CHUNK):
            if cancel is not None and cancel.is_set():
                return slot, reuse, None
            chunk = ids[c:c + PREFILL_CHUNK]
            logits = self.backend.prefill(slot, todo[c - reuse:c - reuse + len(chunk)], c)
            self.cache.record(slot, chunk)
        if logits is not None and logits.is_cuda:
            # prefill_ms is then the time until the logits exist, not until the last launch returned; no latency
            # is added: sampling the first token waits for them anyway.
            torch.cuda.synchronize(logits.device)
        return slot, reuse, logits

    def _count_reuse(self, reused: int, prefilled: int) -> None:
        c = self.cache
        if reused > 0:
            c.hits += 1
        else:
            c.misses += 1
        c.reused_tokens += reused
        c.prefilled_tokens += prefilled

    # ---- generation ----
    def generate(self, ids, max_new_tokens: int = 64, sampling: SamplingParams | None = None, stop_ids=None,
                 stop_strings=(), cancel: threading.Event | None = None,
                 stop_fn: Callable[[str], bool] | None = None, heal: bool = False,
                 heal_at: int | None = None) -> Iterator[TokenEvent]:
        """heal: token healing (engine/healing.py): up to 2 tokens before the cursor are removed from the prompt
        and the first generated token(s) must re-spell them; the returned text still starts at the cursor.
        heal_at: index in `ids` where the text before the cursor ends (default: before the last <fim_suffix>
        of a PSM FIM prompt, else the end of `ids`; healing.default_boundary)."""
        ids = self._check_ids(ids)   # validate eagerly so errors surface before iteration starts
        hp = self._heal_plan(ids, heal_at) if heal else None
        return self._generate(ids if hp is None else hp.ids, max_new_tokens, sampling or SamplingParams(), stop_ids,
                              tuple(stop_strings), cancel, stop_fn, hp)

    def _heal_plan(self, ids: list[int], heal_at: int | None) -> healing.HealPlan | None:
        self._heal["requests"] += 1
        if self.tokenizer is None:
            self._heal["unavailable"] += 1
            return None
        vocab = healing.heal_vocab(self.tokenizer)
        if not vocab.ok:
            self._heal["unavailable"] += 1
            return None
        b = healing.default_boundary(ids, self.tokenizer.fim) if heal_at is None else heal_at
        if not 0 <= b <= len(ids):
            raise ValueError(f"heal_at {heal_at} outside the prompt (0..{len(ids)})")
        hp = healing.plan(vocab, ids, b)
        if hp is not None:
            if not hp.ids:   # the prompt was nothing but the healed tail: nothing to condition on
                return None
            self._heal["healed"] += 1
            self._heal["tokens_removed"] += len(hp.removed_ids)
        return hp

    def _generate(self, ids, max_new, sampling, stop_ids, stop_strings, cancel, stop_fn,
                  hp: healing.HealPlan | None = None) -> Iterator[TokenEvent]:
        stop = frozenset(stop_ids) if stop_ids is not None else self.default_stop_ids
        res = GenerationResult(prompt_tokens=len(ids), healed=hp.text if hp is not None else "")
        self.last_result = res
        self._generations += 1
        t0 = time.perf_counter()
        if cancel is not None and cancel.is_set():
            res.finish_reason = "cancelled"
            self._cancellations += 1
            return
        slot, reuse, logits = self._prefill(ids, cancel)
        res.reused_tokens = reuse
        t1 = time.perf_counter()
        res.prefill_ms = (t1 - t0) * 1e3
        self._prefill_ms_last = res.prefill_ms
        if logits is None or max_new <= 0:
            res.finish_reason = "cancelled" if logits is None else "length"
            self._cancellations += logits is None
            return
        gen = make_generator(sampling, logits.device)
        pos = len(ids)
        # Decode steps needed: each generated token but the last is fed back; the KV must fit max_len.
        steps = min(max_new - 1, self.max_seq_len - pos)
        dec = self.tokenizer.stream_decoder() if self.tokenizer else None
        if hp is None:
            first = sample(logits, sampling, gen)
            loop = self.backend.decode_loop(slot, first, pos, steps, sampling, stop, cancel, gen) if steps > 0 \
                else iter(())
        else:
            # Healing: the first token comes from the prefill logits here in Python for every backend, so the
            # constraint needs nothing from the backends; a token that spells only part of the removed text is
            # followed by constrained single decode() steps, then the backend's own loop takes over.
            con = healing.Constraint(healing.heal_vocab(self.tokenizer), hp.removed)
            first = sample(con.mask(logits), sampling, gen)
            con.advance(first)
            loop = self._healed_loop(slot, first, pos, steps, sampling, stop, cancel, gen, con)
            dec = healing.SkipDecoder(dec, hp.text)
        text = ""          # full decoded text so far
        emitted = 0        # chars of `text` already yielded
        max_stop = max((len(s) for s in stop_strings), default=0)
        finish = None
        prev = None
        n_fed = 0
        try:
            token = first
            it = iter(loop)
            while True:
                if prev is not None:
                    self.cache.record(slot, [prev])   # its KV was written by the step that produced `token`
                    n_fed += 1
                if token in stop:
                    finish = "stop"
                    break
                res.token_ids.append(token)
                if dec is not None:
                    text += dec.push(token)
                end = len(text)
                hit = None
                if stop_strings:
                    lo = max(0, emitted - max_stop)
                    found = [(text.find(s, lo), s) for s in stop_strings]
                    found = [(i, s) for i, s in found if i >= 0]
                    if found:
                        hit = min(found)[0]
                        text = text[:hit]
                        end = hit
                    else:
                        end = len(text) - _held_back(text, stop_strings)
                if hit is not None:
                    finish = "stop_string"
                elif stop_fn is not None and stop_fn(text):
                    finish = "stop_fn"
                elif len(res.token_ids) >= max_new:
                    finish = "length"
                if finish is not None and finish != "stop_string":
                    if dec is not None:
                        text += dec.flush()
                    end = len(text)
                yield TokenEvent(token, text[emitted:end])
                emitted = end
                if finish is not None:
                    break
                prev = token
                token = next(it, None)
                if token is None:
                    finish = "cancelled" if cancel is not None and cancel.is_set() else "length"
                    break
            if finish in ("stop", "length"):
                # Release text held back (a possible stop-string head, an incomplete character) at a normal end.
                if dec is not None:
                    text += dec.flush()
                if emitted < len(text):
                    tail = text[emitted:]
                    emitted = len(text)
                    yield TokenEvent(None, tail)
        except GeneratorExit:
            finish = "cancelled"   # the consumer stopped iterating
            raise
        finally:
            close = getattr(loop, "close", None)
            if close is not None:
                close()
            res.finish_reason = finish or "cancelled"
            if res.finish_reason == "cancelled":
                self._cancellations += 1
            res.text = text[:emitted]
            t2 = time.perf_counter()
            res.decode_ms = (t2 - t1) * 1e3
            res.decode_tok_s = n_fed / (t2 - t1) if n_fed and t2 > t1 else 0.0
            self._decode_tok_s_last = res.decode_tok_s or self._decode_tok_s_last
            log.debug("generate: %d prompt (%d reused) -> %d tokens, %s, prefill %.1f ms, %.1f tok/s",
                      res.prompt_tokens, res.reused_tokens, len(res.token_ids), res.finish_reason, res.prefill_ms,
                      res.decode_tok_s)

    def _healed_loop(self, slot, token, pos, steps, sampling, stop, cancel, gen, con) -> Iterator[int]:
        """decode_loop's contract (feed `token` at `pos`, yield up to `steps` tokens) with the healing constraint
        on the steps until the removed text is spelled out."""
        i = 0
        while not con.done and i < steps:
            if cancel is not None and cancel.is_set():
                return
            logits = self.backend.decode(slot, token, pos + i)
            token = sample(con.mask(logits), sampling, gen)
            con.advance(token)
            i += 1
            yield token
        if i < steps:
            yield from self.backend.decode_loop(slot, token, pos + i, steps - i, sampling, stop, cancel, gen)

    def complete(self, ids, **kw) -> GenerationResult:
        for _ in self.generate(ids, **kw):
            pass
        return self.last_result

    # ---- scoring ----
    @torch.inference_mode()
    def score(self, ids, cancel: threading.Event | None = None) -> ScoreResult:
        ids = self._check_ids(ids)
        self._scores += 1
        t0 = time.perf_counter()
        T = len(ids)
        slot, lcp = self.cache.acquire(ids)
        s = self.cache.slots[slot]
        # Cached predictions cover ids[1..r]; recompute from position r (its logits predict ids[r+1]).
        r = min(len(s.scores), T - 1)
        scores = s.scores[:r]
        if r == T - 1 and lcp == T:
            self._count_reuse(T, 0)
            out = ScoreResult(*map(list, zip(*scores)) if scores else ([], [], []), prompt_tokens=T, reused_tokens=T)
            out.ms = (time.perf_counter() - t0) * 1e3
            self.last_score = out
            return out
        self.cache.truncate(slot, r)
        self._count_reuse(r, T - r)
        cancelled = False
        dev = self.model.device
        for c in range(r, T, SCORE_CHUNK):
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            chunk = ids[c:c + SCORE_CHUNK]
            logits = self.backend.prefill(slot, torch.tensor(chunk, dtype=torch.long, device=dev), c, all_logits=True)
            self.cache.record(slot, chunk)
            n = min(len(chunk), T - 1 - c)   # rows that predict a token inside ids
            if n > 0:
                lp = torch.log_softmax(logits[:n].float(), dim=-1)
                tgt = torch.tensor(ids[c + 1:c + 1 + n], device=lp.device)
                tok_lp = lp.gather(1, tgt[:, None])[:, 0]
                top_lp, top_id = lp.max(dim=-1)
                scores.extend(zip(tok_lp.tolist(), top_id.tolist(), top_lp.tolist()))
        s.scores = scores[:max(0, len(s.ids) - 1)]
        if cancelled:
            self._cancellations += 1
        cols = list(map(list, zip(*scores))) if scores else [[], [], []]
        out = ScoreResult(cols[0], cols[1], cols[2], prompt_tokens=T, reused_tokens=r,
                          ms=(time.perf_counter() - t0) * 1e3, cancelled=cancelled)
        self.last_score = out
        return out

    # ---- introspection ----
    def stats(self) -> dict:
        c = self.cache
        return {
            "backend": self.backend.name, "backend_reason": self.backend_reason, "device": str(self.model.device),
            "dtype": str(self.model.dtype).replace("torch.", ""), "model": self.name or self.config.name,
            "params": self.model.n_params(), "kv_slots": c.n_slots, "max_seq_len": self.max_seq_len,
            "threads": torch.get_num_threads(), "tp": self.tp, "tp_mode": self.tp_mode,
            "prefill_ms_last": self._prefill_ms_last, "decode_tok_s_last": self._decode_tok_s_last,
            "cache": {"hits": c.hits, "misses": c.misses, "reused_tokens": c.reused_tokens,
                      "prefilled_tokens": c.prefilled_tokens},
            "kv_cache_mb": round(c.nbytes() / 2**20, 1),
            "generations": self._generations, "cancellations": self._cancellations, "scores": self._scores,
            "healing": dict(self._heal),
            "backend_stats": self._backend_stats(), "backend_detail": self.backend.describe(),
        }

    def _backend_stats(self) -> dict:
        bs = getattr(self.backend, "stats", None)
        if callable(bs):
            bs = bs()
        return dict(bs) if isinstance(bs, dict) else {}


def _check_checkpoint_kind(model_dir: Path, tp: int, tp_mode: str) -> str:
    """'dense' or 'lane'. Ordinary checkpoints run in tp_mode 'exact' only; Laneformer (delayed-TP-trained)
    checkpoints only in 'delayed', on tp=1 (every lane simulated by the reference) or tp = their lane count
    (engine/lanes decides which is which and words the refusal)."""
    if tp_mode not in ("exact", "delayed"):
        raise ValueError(f"tp_mode must be 'exact' or 'delayed', not {tp_mode!r}")
    if not (model_dir / "config.json").exists():
        return "dense"   # ModelConfig.from_json reports it
    from .lanes import check_tp_mode, checkpoint_kind
    d = json.loads((model_dir / "config.json").read_text())
    kind = checkpoint_kind(d)
    check_tp_mode(kind, tp_mode, tp, d.get("num_lanes") if kind == "lane" else None)
    return kind


def _held_back(text: str, stop_strings) -> int:
    """Length of the longest tail of `text` that is a proper head of a stop string (may still become one)."""
    best = 0
    for s in stop_strings:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best
