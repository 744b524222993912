"""Editor-loop latency: replay realistic edit traces and report keystroke-to-ghost-text latency.

Traces are built from held-out Python files (the packages engine/models/default/corpus_manifest.json lists as
"holdout", else the standard library): a region of each file is removed and typed back character by character
with human-like pauses (log-normal inter-key gaps, thinking pauses at line ends), typos fixed with backspace,
a word deleted and retyped now and then, and cursor jumps to an earlier line and back. Every keystroke sends
an inline completion request; the request the next keystroke makes stale is cancelled (what VS Code does).

Modes
  server  (default) spawn `python -m kog_lsp` over stdio and drive it like an editor (kog_lsp.demo's Editor and
          kog_lsp.rpc_client): latency = didChange sent -> answer with an item received, for the newest request.
  engine  no language server (the GPU machine has no pygls): the same traces, the server's own prompt building
          (kog_lsp.context / fim / postprocess / suggest_cache) and the engine worker, newest job per document
          wins. Latency = keystroke -> post-processed suggestion. No debounce and no JSON-RPC in this mode.

    python bench/editor_loop.py                                   # CPU, default model, server mode
    python bench/editor_loop.py --mode engine --device cuda --random-shape qwen2.5-coder-1.5b --max-tokens 16

Reports p50/p95 latency of shown suggestions, the prefix-cache hit rate (share of prompt tokens whose KV was
reused), tokens prefilled per keystroke, cancellations, and the server's (or this process's) memory over the
replay. Prints a table, then one JSON line last.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import importlib.util
import json
import math
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kog_lsp.settings import Settings  # noqa: E402  (stdlib only: usable on the GPU machine)
from kog_lsp.stats import percentile as pct  # noqa: E402  (no pygls import: usable on the GPU machine)

DEFAULTS = Settings()  # engine mode uses the server's own defaults, so the two modes measure the same prompts

MANIFEST = REPO / "engine" / "models" / "default" / "corpus_manifest.json"
GOAL_P50_MS = {"cpu": 150.0, "cuda": 30.0}
_DEF = re.compile(r"^\s*(async\s+def|def|class)\s")


# ---------------------------------------------------------------- traces


def source_files(n_files: int, seed: int) -> tuple[list[Path], str]:
    """Held-out package files if installed, else standard-library files. Returns (files, description)."""
    pkgs = []
    if MANIFEST.exists():
        pkgs = json.loads(MANIFEST.read_text()).get("holdout") or []
    files, found = [], []
    for name in pkgs:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        found.append(name)
        files += sorted(Path(list(spec.submodule_search_locations)[0]).rglob("*.py"))
    source = f"held-out packages {', '.join(found)}" if found else ""
    if not files:
        stdlib = Path(os.__file__).parent
        files = sorted(p for p in stdlib.glob("*.py") if not p.name.startswith("_"))
        source = f"standard library {stdlib} (held-out packages not installed)"
    files = [p for p in files if 2_000 <= p.stat().st_size <= 80_000]
    random.Random(seed).shuffle(files)
    return files[:n_files], source


def _keys(text: str) -> list[str]:
    """Keystrokes: one char each; a newline plus the next line's indentation is one (auto-indent)."""
    keys, i = [], 0
    while i < len(text):
        j = i + 1
        if text[i] == "\n":
            while j < len(text) and text[j] in " \t":
                j += 1
        keys.append(text[i:j])
        i = j
    return keys


def make_trace(path: Path, rng: random.Random, chars: int) -> dict | None:
    """Remove a region starting at a def/class line from the file, and the events that type it back."""
    try:
        src = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    lines = src.splitlines(keepends=True)
    starts = [i for i, ln in enumerate(lines) if _DEF.match(ln) and i > 3]
    if not starts:
        return None
    first = rng.choice(starts)
    end, size = first, 0
    while end < len(lines) and size + len(lines[end]) <= chars:
        size += len(lines[end])
        end += 1
    if end == first:
        return None
    a = sum(len(ln) for ln in lines[:first])
    region = "".join(lines[first:end])
    text = src[:a] + src[a + len(region):]
    events: list[dict] = []
    doc, cur = text, a  # the live document while the trace is written (events apply to it in order)
    shift = 0  # characters inserted before the typed region (comments added after cursor jumps)
    typed_since_jump = 0

    def emit(ev: dict) -> None:
        nonlocal doc
        events.append(ev)
        doc, _ = apply_event(doc, 0, ev)

    def gap(lo=40.0, hi=450.0, mu=math.log(115.0), sigma=0.35) -> float:
        return round(min(hi, max(lo, rng.lognormvariate(mu, sigma))), 1)

    prev = ""
    for key in _keys(region):
        wait = gap()
        if prev.startswith("\n") or prev in (":", ")"):
            wait += rng.uniform(200, 900) if rng.random() < 0.5 else 0.0  # thinking at a line end
        if key.isalpha() and rng.random() < 0.03:  # typo, noticed, backspaced
            emit({"wait_ms": wait, "op": "type", "at": cur, "text": rng.choice("qwertyuiopasdfghjklzxcvbnm")})
            emit({"wait_ms": gap(120, 500), "op": "delete", "at": cur, "n": 1})
            wait = gap()
        emit({"wait_ms": wait, "op": "type", "at": cur, "text": key})
        cur += len(key)
        typed_since_jump += 1
        if key == " " and rng.random() < 0.02:  # delete the last word and type it again
            m = re.search(r"(\w+) $", doc[a + shift: cur])
            if m:
                word = m.group(1) + " "
                for _ in word:
                    cur -= 1
                    emit({"wait_ms": gap(60, 200, math.log(90.0)), "op": "delete", "at": cur, "n": 1})
                for ch in word:
                    emit({"wait_ms": gap(), "op": "type", "at": cur, "text": ch})
                    cur += 1
        if key.startswith("\n") and typed_since_jump > 30 and rng.random() < 0.15:
            # Jump to the end of an earlier line (before the typed region), add a short comment, jump back.
            line_ends = [m.start() for m in re.finditer("\n", doc[: max(0, a + shift - 1)])]
            if line_ends:
                j = rng.choice(line_ends[-60:])
                emit({"wait_ms": gap(300, 1500, math.log(700.0)), "op": "jump", "to": j})
                note = "  # " + rng.choice(["check", "todo", "why?", "ok"])
                for ch in note:
                    emit({"wait_ms": gap(), "op": "type", "at": j, "text": ch})
                    j += 1
                cur += len(note)
                shift += len(note)
                emit({"wait_ms": gap(300, 1500, math.log(600.0)), "op": "jump", "to": cur})
                typed_since_jump = 0
        prev = key
    return {"file": str(path), "text": text, "cursor": a, "events": events}


def build_traces(n_files: int, seed: int, chars: int) -> tuple[list[dict], str]:
    files, source = source_files(n_files * 4, seed)
    rng = random.Random(seed)
    traces = []
    for p in files:
        t = make_trace(p, rng, chars)
        if t is not None:
            traces.append(t)
        if len(traces) == n_files:
            break
    return traces, source


def apply_event(text: str, cursor: int, ev: dict) -> tuple[str, int]:
    if ev["op"] == "type":
        return text[: ev["at"]] + ev["text"] + text[ev["at"]:], ev["at"] + len(ev["text"])
    if ev["op"] == "delete":
        return text[: ev["at"]] + text[ev["at"] + ev["n"]:], ev["at"]
    return text, ev["to"]


# ---------------------------------------------------------------- measurement helpers


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


class RssSampler:
    def __init__(self, pid: int, period: float = 0.5):
        self.pid, self.period, self.samples = pid, period, []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            v = rss_mb(self.pid)
            if v is not None:
                self.samples.append(v)
            self._stop.wait(self.period)

    def stop(self) -> dict:
        self._stop.set()
        self._t.join(2)
        s = self.samples
        return {"start": round(s[0], 1), "max": round(max(s), 1), "end": round(s[-1], 1)} if s else {}


# ---------------------------------------------------------------- server mode


async def replay_server(args, traces) -> dict:
    from kog_lsp import demo

    log_file = tempfile.NamedTemporaryFile(prefix="kog-editor-loop-", suffix=".log", delete=False).name
    argv = demo.server_argv(args.model, args.device, args.backend, log_file, args.threads or None)
    settings = {"maxTokens": args.max_tokens, **json.loads(args.server_settings)}
    client, status, load_s = await demo.start_server(argv, settings, timeout=600)
    rows = []
    try:
        if status.get("state") != "ready":
            raise SystemExit(f"server could not load the model: {status.get('message')} (log: {log_file})")
        sampler = RssSampler(client.proc.pid)
        s0 = await client.call("kog/stats", {})
        open_uris: list[str] = []
        for tr in traces:
            uri = Path(tr["file"]).as_uri()
            res = demo.ReplayResult()
            ed = demo.Editor(client, uri, tr["text"], lambda *_: None, res)
            ed.cursor = tr["cursor"]
            ed.open()
            open_uris.append(uri)
            for ev in tr["events"]:
                await asyncio.sleep(ev["wait_ms"] / 1000.0 / args.speed)
                text, cur = apply_event(ed.text, ed.cursor, ev)
                if ev["op"] == "type":
                    ed.edit(ev["at"], ev["at"], ev["text"])
                elif ev["op"] == "delete":
                    ed.edit(ev["at"], ev["at"] + ev["n"], "")
                ed.cursor = cur
                assert ed.text == text
                res.keystrokes += 1
                ed.request()
            await ed.settle()
            rows.append((Path(tr["file"]).name, res))
            if len(open_uris) > 3:  # an editor keeps a few files open (context chunks), not all of them
                client.notify("textDocument/didClose", {"textDocument": {"uri": open_uris.pop(0)}})
        s1 = await client.call("kog/stats", {})
        rss = sampler.stop()
    finally:
        await client.close()
    eng0, eng1 = (s0.get("engine") or {}), (s1.get("engine") or {})
    c0, c1 = eng0.get("cache") or {}, eng1.get("cache") or {}
    return {
        "rows": rows, "backend": s1.get("backend"), "device": eng1.get("device"), "load_s": round(load_s, 1),
        "reused": c1.get("reused_tokens", 0) - c0.get("reused_tokens", 0),
        "prefilled": c1.get("prefilled_tokens", 0) - c0.get("prefilled_tokens", 0),
        "generations": eng1.get("generations", 0) - eng0.get("generations", 0),
        "cancellations": s1["cancellations"] - s0["cancellations"],
        "cache_hits": s1["cacheHits"] - s0["cacheHits"],
        "tok_s": s1.get("tokPerS"), "rss_mb": rss, "rss_of": "server process", "log": log_file,
    }


# ---------------------------------------------------------------- engine mode


class _Row:
    def __init__(self):
        self.latencies_ms, self.keystrokes, self.requests = [], 0, 0
        self.cancelled = self.superseded = self.empty = 0
        self.prefill_ms, self.decode_ms, self.gen_tokens = [], [], []  # of the timed (newest, answered) requests
        self.prompt_ms = []   # engine mode: keystroke to prompt ids (context + build_prompt), every generation


def build_engine(args):
    import engine as eng

    if args.random_shape:
        import torch

        from engine.config import preset
        from engine.tokenizer import Tokenizer
        from kernels.testing import random_model

        cfg = preset(args.random_shape)
        dev = "cuda" if args.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu"
        dtype = torch.bfloat16 if dev == "cuda" else torch.float32
        # Random weights: latency does not depend on their values.
        model = random_model(cfg, device=dev, dtype=dtype, max_len=4096, seed=args.seed)
        tok = Tokenizer.from_dir(REPO / "engine" / "models" / "default")
        return eng.Engine(model, tok, kv_slots=4, backend=args.backend, name=f"random {args.random_shape}")
    return eng.Engine.load(model=args.model, device=args.device, backend=args.backend)


def replay_engine(args, traces) -> dict:
    import engine as eng
    from kog_lsp.context import ContextBuilder, display_path
    from kog_lsp.fim import build_prompt, stop_ids_for
    from kog_lsp.positions import line_content_end, line_starts
    from kog_lsp.postprocess import Policy, make_stop_fn, postprocess
    from kog_lsp.suggest_cache import SuggestionCache
    from kog_lsp.token_cache import PromptTokenCache

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    engine = build_engine(args)
    load_s = time.perf_counter() - t0
    print(f"engine ready in {load_s:.1f} s: {engine.stats().get('backend')}; replaying {len(traces)} traces",
          file=sys.stderr, flush=True)
    worker = eng.EngineWorker(engine)
    tok = engine.tokenizer
    stop_ids = stop_ids_for(tok)
    # Random weights never write a useful line: generate a fixed number of tokens (no stop token, no end-of-line
    # stop) and time every answer of the newest request, shown or not.
    fixed = bool(args.random_shape)
    if fixed:
        stop_ids = frozenset()
    ctx, cache, prompt_tokens = ContextBuilder(), SuggestionCache(), PromptTokenCache()
    sampling = eng.SamplingParams(temperature=0.0)
    root = Path(traces[0]["file"]).parent.as_uri() if traces else None
    docs: dict[str, tuple[int, str]] = {}
    lock = threading.Lock()
    latest: dict[str, int] = {}
    s0 = worker.submit(lambda e, c: e.stats()).result()
    sampler = RssSampler(os.getpid())
    rows = []
    cache_hits = 0

    def finish(row, uri, seq, t_key, policy, line_after, after, before, job):
        def cb(fut):
            with lock:
                if fut.exception() is not None:
                    row.cancelled += 1
                    return
                if latest.get(uri) != seq:
                    row.superseded += 1
                    return
                r = fut.result()
                sug = postprocess(r.text, policy, line_after, after[:4000]) if r.finish_reason != "cancelled" else None
                if sug is None and not fixed:
                    row.empty += 1
                    return
                row.latencies_ms.append((time.perf_counter() - t_key) * 1000.0)
                row.prefill_ms.append(r.prefill_ms)
                row.decode_ms.append(r.decode_ms)
                row.gen_tokens.append(len(r.token_ids))
                if sug is not None:
                    cache.put(uri, before, after, sug.text, sug.replace_to_eol)
        job.future.add_done_callback(cb)

    seq = 0
    for tr in traces:
        uri = Path(tr["file"]).as_uri()
        text, cursor, version = tr["text"], tr["cursor"], 1
        row = _Row()
        for ev in tr["events"]:
            time.sleep(ev["wait_ms"] / 1000.0 / args.speed)
            t_key = time.perf_counter()
            text, cursor = apply_event(text, cursor, ev)
            version += 1
            docs[uri] = (version, text)
            row.keystrokes += 1
            row.requests += 1
            seq += 1
            with lock:
                latest[uri] = seq
            before, after = text[:cursor], text[cursor:]
            hit = cache.lookup(uri, before, after)
            if hit is not None:
                cache_hits += 1
                row.latencies_ms.append((time.perf_counter() - t_key) * 1000.0)
                continue
            starts = line_starts(text)
            ln = bisect.bisect_right(starts, cursor) - 1
            line_after = text[cursor: line_content_end(text, starts, ln)]
            policy = Policy.decide(args.multiline, text[starts[ln]:cursor], line_after)
            t_prompt = time.perf_counter()
            others = [(u, v, t) for u, (v, t) in docs.items()]
            context_ids = ctx.build(tok, others, uri, args.context_tokens, root)
            prompt = build_prompt(tok, text, cursor, prefix_tokens=args.prefix_tokens,
                                  suffix_tokens=args.suffix_tokens, context_ids=context_ids,
                                  path=display_path(uri, root), starts=starts,  # as the server does
                                  token_cache=prompt_tokens, doc=uri)
            stop_fn = None if fixed else make_stop_fn(policy)
            ids = prompt.ids
            row.prompt_ms.append((time.perf_counter() - t_prompt) * 1000.0)

            def work(e, cancel, ids=ids, stop_fn=stop_fn):
                return e.complete(ids, max_new_tokens=args.max_tokens, sampling=sampling, stop_ids=stop_ids,
                                  cancel=cancel, stop_fn=stop_fn, heal=True)   # as kog_lsp/completer.py
            job = worker.submit(work, priority=eng.Priority.COMPLETION, key=f"completion:{uri}")
            finish(row, uri, seq, t_key, policy, line_after, after, before, job)
        # Let the last request of the file finish before the next file starts.
        time.sleep(0.5)
        rows.append((Path(tr["file"]).name, row))
        if len(docs) > 3:
            docs.pop(next(iter(docs)))
    time.sleep(1.0)
    s1 = worker.submit(lambda e, c: e.stats()).result()
    rss = sampler.stop()
    gpu_mem = None
    if "cuda" in str(s1.get("device")):
        import torch

        gpu_mem = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    worker.shutdown()
    c0, c1 = s0["cache"], s1["cache"]
    return {
        "rows": rows, "backend": s1["backend"], "device": s1["device"], "load_s": round(load_s, 1),
        "reused": c1["reused_tokens"] - c0["reused_tokens"],
        "prefilled": c1["prefilled_tokens"] - c0["prefilled_tokens"],
        "generations": s1["generations"] - s0["generations"],
        "cancellations": s1["cancellations"] - s0["cancellations"],
        "cache_hits": cache_hits, "tok_s": s1.get("decode_tok_s_last"), "rss_mb": rss, "rss_of": "bench process",
        "gpu_max_alloc_mb": gpu_mem, "backend_reason": s1.get("backend_reason"),
        "prefill_ms_p50": pct([x for _, row in rows for x in row.prefill_ms], 50),
        "decode_ms_p50": pct([x for _, row in rows for x in row.decode_ms], 50),
        "prompt_ms_p50": pct([x for _, row in rows for x in row.prompt_ms], 50),
        "prompt_token_cache": prompt_tokens.stats(),
        # monokernel backends: host-side launch timing means (engine/backends/monokernel.py _LaunchClock)
        "launch_clock_us": {k: s1["backend_stats"][k] for k in ("launch_host_us", "first_token_us",
                                                                 "token_interval_us", "finish_us")
                            if k in s1.get("backend_stats", {})} or None,
        # monokernel: prefill chunks run as kernel steps (engine/backends/kernel_prefill.py) and the warm-up timing
        "kernel_prefill": {k: s1["backend_stats"][k] for k in ("kernel_prefill_max", "kernel_prefills",
                                                                "kernel_prefill_ms")
                           if k in s1.get("backend_stats", {})} or None,
        # token healing as the server asks for it (engine/healing.py): requests, healed ones, prompt tokens removed
        "healing": {k: s1["healing"][k] - s0["healing"].get(k, 0) for k in ("requests", "healed", "tokens_removed")},
        "generated_tokens_mean": (statistics.fmean([x for _, row in rows for x in row.gen_tokens])
                                  if any(row.gen_tokens for _, row in rows) else None),
        "note": (f"random weights: {args.max_tokens} tokens generated per request, no stop; every answer to the "
                 "newest request is timed" if fixed else None),
    }


# ---------------------------------------------------------------- report


def report(args, traces, source, r: dict) -> dict:
    lat = [x for _, row in r["rows"] for x in row.latencies_ms]
    keys = sum(row.keystrokes for _, row in r["rows"])
    device = str(r.get("device") or args.device)
    goal = GOAL_P50_MS["cuda" if "cuda" in device else "cpu"]
    f = lambda v: "n/a" if v is None else f"{v:.1f}"  # noqa: E731
    print(f"editor loop: mode={args.mode} model={args.random_shape or args.model} backend={r['backend']} "
          f"device={device} (load {r['load_s']} s); traces from {source}")
    print(f"{'file':<28}{'keys':>6}{'shown':>7}{'p50 ms':>9}{'p95 ms':>9}")
    for name, row in r["rows"]:
        print(f"{name[:27]:<28}{row.keystrokes:>6}{len(row.latencies_ms):>7}{f(pct(row.latencies_ms, 50)):>9}"
              f"{f(pct(row.latencies_ms, 95)):>9}")
    prompt = r["reused"] + r["prefilled"]
    hit = r["reused"] / prompt if prompt else None
    out = {
        "kind": "editor-loop", "mode": args.mode, "model": args.random_shape or args.model, "backend": r["backend"],
        "device": device, "files": len(traces), "trace_source": source, "seed": args.seed, "speed": args.speed,
        "threads": args.threads or None,
        "max_tokens": args.max_tokens, "keystrokes": keys, "suggestions_shown": len(lat),
        "p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95), "mean_ms": statistics.fmean(lat) if lat else None,
        "prefix_cache_hit_rate": hit, "prefilled_tokens_per_keystroke": r["prefilled"] / keys if keys else None,
        "reused_tokens": r["reused"], "prefilled_tokens": r["prefilled"], "generations": r["generations"],
        "cancellations": r["cancellations"], "suggestion_cache_hits": r["cache_hits"], "decode_tok_s": r["tok_s"],
        "rss_mb": r["rss_mb"], "rss_of": r["rss_of"], "gpu_max_alloc_mb": r.get("gpu_max_alloc_mb"),
        "goal_p50_ms": goal, "note": r.get("note"), "prefill_ms_p50": r.get("prefill_ms_p50"),
        "decode_ms_p50": r.get("decode_ms_p50"), "generated_tokens_mean": r.get("generated_tokens_mean"),
        "prompt_ms_p50": r.get("prompt_ms_p50"), "launch_clock_us": r.get("launch_clock_us"),
        "kernel_prefill": r.get("kernel_prefill"), "healing": r.get("healing"),
        "settings": json.loads(args.server_settings) if args.mode == "server" else None,
    }
    out["meets_goal"] = out["p50_ms"] is not None and out["p50_ms"] <= goal
    print(f"{'all':<28}{keys:>6}{len(lat):>7}{f(out['p50_ms']):>9}{f(out['p95_ms']):>9}   goal p50 <= {goal:.0f} ms: "
          f"{'met' if out['meets_goal'] else 'NOT met'}")
    print(f"prefix-cache hit rate {f(None if hit is None else 100 * hit)}%, prefilled tokens/keystroke "
          f"{f(out['prefilled_tokens_per_keystroke'])}, generations {r['generations']}, cancellations "
          f"{r['cancellations']}, suggestion-cache hits {r['cache_hits']}, decode {f(r['tok_s'])} tok/s")
    print(f"memory ({r['rss_of']}) RSS MB start/max/end: {r['rss_mb']}"
          + (f", GPU max allocated {r['gpu_max_alloc_mb']} MB" if r.get("gpu_max_alloc_mb") else ""))
    if r.get("prefill_ms_p50") is not None:
        print(f"engine time of timed answers: prefill p50 {f(r['prefill_ms_p50'])} ms, decode p50 "
              f"{f(r['decode_ms_p50'])} ms, {f(r['generated_tokens_mean'])} tokens generated on average; "
              f"host prompt building p50 {f(r['prompt_ms_p50'])} ms (prompt token cache "
              f"{'on' if r['prompt_token_cache']['enabled'] else 'off: ' + str(r['prompt_token_cache']['reason'])})")
    if r.get("healing"):
        print("token healing: " + ", ".join(f"{k} {v}" for k, v in r["healing"].items()))
    if r.get("launch_clock_us"):
        print("kernel launches as the host sees them (means, us): " + ", ".join(
            f"{k} {v}" for k, v in r["launch_clock_us"].items()))
    if r.get("kernel_prefill"):
        print("prefill chunks as kernel steps: " + ", ".join(f"{k} {v}" for k, v in r["kernel_prefill"].items()))
    if r.get("note"):
        print(f"note: {r['note']}")
    print(json.dumps(out))
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["server", "engine"], default="server")
    ap.add_argument("--model", default="default", help="'default' or a Hugging Face model dir")
    ap.add_argument("--random-shape", default=None, help="engine mode: random weights of a preset shape "
                    "(e.g. qwen2.5-coder-1.5b) with the default model's tokenizer")
    ap.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--backend", default="auto", choices=["auto", "reference", "graph", "monokernel"])
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for the engine (0: torch's default)")
    ap.add_argument("--files", type=int, default=4, help="source files (one trace each)")
    ap.add_argument("--chars", type=int, default=300, help="characters typed per file")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--speed", type=float, default=1.0, help="typing speed multiplier (pauses / speed)")
    ap.add_argument("--max-tokens", type=int, default=DEFAULTS.max_tokens, help="server setting maxTokens")
    ap.add_argument("--multiline", default=DEFAULTS.multiline, choices=["auto", "always", "never"])
    ap.add_argument("--prefix-tokens", type=int, default=DEFAULTS.prefix_tokens)
    ap.add_argument("--suffix-tokens", type=int, default=DEFAULTS.suffix_tokens)
    ap.add_argument("--context-tokens", type=int, default=DEFAULTS.context_tokens)
    ap.add_argument("--server-settings", default="{}", help="server mode: extra kog settings as JSON, e.g. "
                    "'{\"reviewEnable\": false}'")
    ap.add_argument("--save-traces", help="write the traces as JSON here")
    ap.add_argument("--traces", help="replay traces from this JSON file instead of building them")
    args = ap.parse_args(argv)
    if args.traces:
        data = json.loads(Path(args.traces).read_text())
        traces, source = data["traces"], data["source"] + f" (via {args.traces})"
    else:
        traces, source = build_traces(args.files, args.seed, args.chars)
    if args.save_traces:
        Path(args.save_traces).write_text(json.dumps({"source": source, "seed": args.seed, "traces": traces}))
    if not traces:
        raise SystemExit("no traces: no usable source files found")
    if args.mode == "server":
        r = asyncio.run(replay_server(args, traces))
    else:
        r = replay_engine(args, traces)
    return report(args, traces, source, r)


if __name__ == "__main__":
    main()
