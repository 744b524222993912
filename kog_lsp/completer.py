"""Inline completion pipeline, independent of the LSP plumbing (features/completion.py is the handler).

request -> suggestion cache -> (debounce, automatic only) -> FIM prompt -> engine job on the worker
        -> post-process -> cache entry -> candidates

Newest wins per document: a new request supersedes the older one still debouncing and cancels its
engine job at once (the worker also cancels a running job with the same key when the next one is
submitted), so a stale generation never delays the next keystroke.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from kog_lsp.context import ContextBuilder, display_path
from kog_lsp.debounce import Debouncer, Superseded
from kog_lsp.fim import build_prompt, stop_ids_for
from kog_lsp.postprocess import Policy, make_stop_fn, postprocess
from kog_lsp.suggest_cache import SuggestionCache
from kog_lsp.token_cache import PromptTokenCache

log = logging.getLogger(__name__)

INVOKED, AUTOMATIC = 1, 2
INVOKED_SAMPLE_TEMPERATURE = 0.8
SUFFIX_HEAD_CHARS = 4000  # bounded look-ahead for post-processing (dedupe, brackets)


DEFAULT_MAX_SEQ_LEN = 4096
PROMPT_MARGIN = 32  # FIM markers + file path header


def fit_budgets(prefix: int, suffix: int, context: int, max_new: int, max_seq_len: int) -> tuple[int, int, int]:
    """Scale the prompt windows down (same proportions) so prompt + generated tokens fit the engine."""
    room = max(16, max_seq_len - max_new - PROMPT_MARGIN)
    total = prefix + suffix + context
    if total <= room:
        return prefix, suffix, context
    scale = room / total
    return max(1, int(prefix * scale)), int(suffix * scale), int(context * scale)


@dataclass(frozen=True)
class Candidate:
    text: str  # inserted at the cursor (after any selected completion text)
    replace_to_eol: bool
    from_cache: bool


@dataclass
class Request:
    uri: str
    text: str  # document text (with the selected completion item applied, if any)
    cursor: int  # string offset of the cursor in `text`
    line_start: int
    line_end: int
    trigger_kind: int = AUTOMATIC
    use_cache: bool = True
    extra_samples: int = 0  # sampled candidates after the greedy one (invoked completions: cycling)
    starts: list[int] | None = None  # line starts of `text` when known (the document's cached ones)


class Completer:
    def __init__(self, runtime, settings, stats):
        self.runtime = runtime
        self.settings = settings
        self.stats = stats
        self.cache = SuggestionCache()
        self.prompt_tokens = PromptTokenCache()  # encodings of unchanged lines, per open document
        self.context = ContextBuilder()
        self.debouncer = Debouncer(settings.debounce_ms)
        self._jobs: dict[str, object] = {}  # uri -> newest engine job

    def _cancel_previous(self, uri: str) -> None:
        """A newer request for `uri` arrived: stop whatever the older one is doing."""
        self.debouncer.supersede(uri)
        job = self._jobs.pop(uri, None)
        if job is not None:
            job.cancel()

    def forget(self, uri: str) -> None:
        """The document closed: stop its work and drop its cached suggestions."""
        self._cancel_previous(uri)
        self.cache.forget(uri)
        self.prompt_tokens.forget(uri)

    async def complete(self, req: Request, documents=(), root_uri: str | None = None) -> list[Candidate]:
        """Candidates for one request (possibly empty). Raises CancelledError when the request itself
        is cancelled; returns [] when superseded by a newer request for the same document."""
        s = self.settings
        before, after = req.text[: req.cursor], req.text[req.cursor :]  # O(size) copies; ~ms for 10 MB
        line_before = req.text[req.line_start : req.cursor]
        line_after = req.text[req.cursor : req.line_end]
        self._cancel_previous(req.uri)

        # Invoked requests (explicit shortcut) want fresh candidates to cycle through: no cache.
        if req.use_cache and req.trigger_kind == AUTOMATIC:
            hit = self.cache.lookup(req.uri, before, after)
            if hit is not None:
                self.stats.bump("cache_hits")
                return [Candidate(hit[0], hit[1], True)]

        rt = self.runtime
        if not rt.ready:
            return []

        if req.trigger_kind == AUTOMATIC:
            self.debouncer.set_period(s.debounce_ms)
            try:
                await self.debouncer.wait(req.uri)
            except Superseded:
                self.stats.bump("cancellations")
                return []
            except asyncio.CancelledError:
                self.stats.bump("cancellations")
                raise

        tok = rt.tokenizer
        pre, suf, ctx = fit_budgets(s.prefix_tokens, s.suffix_tokens, s.context_tokens, s.max_tokens,
                                    (rt.engine_stats or {}).get("max_seq_len") or DEFAULT_MAX_SEQ_LEN)
        context_ids = self.context.build(tok, documents, req.uri, ctx, root_uri)
        prompt = build_prompt(tok, req.text, req.cursor, prefix_tokens=pre, suffix_tokens=suf,
                              context_ids=context_ids, path=display_path(req.uri, root_uri), starts=req.starts,
                              token_cache=self.prompt_tokens, doc=req.uri)
        policy = Policy.decide(s.multiline, line_before, line_after)
        samplings = [rt.sampling(temperature=s.temperature, seed=None)]
        samplings += [rt.sampling(temperature=INVOKED_SAMPLE_TEMPERATURE, seed=i + 1)
                      for i in range(req.extra_samples)]
        work = _GenerationWork(prompt.ids, samplings, s.max_tokens, stop_ids_for(tok), make_stop_fn(policy))

        job = rt.submit_completion(work, key=f"completion:{req.uri}")
        self._jobs[req.uri] = job
        rt.set_busy(True)
        try:
            outcome = await rt.wait_job(job)
        except asyncio.CancelledError:
            job.cancel()
            self.stats.bump("cancellations")
            raise
        except rt.job_cancelled_error:
            self.stats.bump("cancellations")
            return []
        except Exception as exc:  # engine failure: this request answers empty, the server stays up
            log.exception("completion generation failed for %s", req.uri)
            self.stats.bump("errors")
            rt.generation_failed(exc)
            return []
        finally:
            if self._jobs.get(req.uri) is job:
                del self._jobs[req.uri]
            rt.set_busy(False)

        rt.engine_stats = outcome.engine_stats
        out: list[Candidate] = []
        seen: set[str] = set()
        for g in outcome.generations:
            self.stats.add_generation(g.prompt_tokens, g.reused_tokens, g.decode_tok_s)
            if g.finish_reason == "cancelled":
                continue
            sug = postprocess(g.text, policy, line_after, after[:SUFFIX_HEAD_CHARS])
            if sug is None or sug.text in seen:
                continue
            seen.add(sug.text)
            out.append(Candidate(sug.text, sug.replace_to_eol, False))
        if not out and outcome.generations and all(g.finish_reason == "cancelled" for g in outcome.generations):
            self.stats.bump("cancellations")
            return []
        if out and req.use_cache:
            self.cache.put(req.uri, before, after, out[0].text, out[0].replace_to_eol)
        return out


@dataclass
class GenerationOut:
    text: str
    finish_reason: str
    prompt_tokens: int
    reused_tokens: int
    decode_tok_s: float | None
    prefill_ms: float | None
    decode_ms: float | None


@dataclass
class Outcome:
    generations: list[GenerationOut]
    engine_stats: dict | None


class _GenerationWork:
    """The job run on the engine worker thread: fn(engine, cancel_event) -> Outcome."""

    def __init__(self, ids, samplings, max_tokens, stop_ids, stop_fn):
        self.ids, self.samplings, self.max_tokens = ids, samplings, max_tokens
        self.stop_ids, self.stop_fn = stop_ids, stop_fn

    def __call__(self, engine, cancel) -> Outcome:
        gens: list[GenerationOut] = []
        for sampling in self.samplings:
            if cancel.is_set():
                break
            t0 = time.perf_counter()
            r = engine.complete(self.ids, max_new_tokens=self.max_tokens, sampling=sampling,
                                stop_ids=self.stop_ids, cancel=cancel, stop_fn=self.stop_fn, heal=True)
            log.debug("generation: %s tokens=%d reused=%d/%d %.1f ms (%s)", repr(r.text[:40]), len(r.token_ids),
                      r.reused_tokens, r.prompt_tokens, (time.perf_counter() - t0) * 1000, r.finish_reason)
            gens.append(GenerationOut(r.text, r.finish_reason, r.prompt_tokens, r.reused_tokens,
                                      r.decode_tok_s, r.prefill_ms, r.decode_ms))
        return Outcome(gens, engine.stats())
