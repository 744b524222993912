"""`kog-lsp demo`: drive a real server process like an editor and print keystroke-to-suggestion latency.

The demo spawns `python -m kog_lsp --model M` over stdio, initializes with VS Code-like capabilities
(inline completion, utf-16), opens kog_lsp/demo_data/inventory.py and replays demo_data/session.json
keystroke by keystroke: didChange + textDocument/inlineCompletion per keystroke, $/cancelRequest for the
request the next keystroke makes stale (what VS Code does). A suggestion counts as shown when the answer
to the newest request arrives with an item; its latency is keystroke (didChange sent) -> answer received.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kog_lsp import positions
from kog_lsp.rpc_client import LspProcess, RpcError
from kog_lsp.stats import percentile

DEMO_DATA = Path(__file__).parent / "demo_data"
KEYSTROKE_MS = 70.0  # ~ 140 words per minute; --speed scales it
REQUEST_CANCELLED = -32800

CLIENT_CAPABILITIES = {
    "general": {"positionEncodings": ["utf-16"]},
    "window": {"workDoneProgress": True, "showMessage": {}},
    "workspace": {"configuration": True, "didChangeConfiguration": {"dynamicRegistration": False},
                  "executeCommand": {}},
    "textDocument": {
        "synchronization": {"didSave": True},
        "inlineCompletion": {"dynamicRegistration": False},
        "completion": {"completionItem": {"snippetSupport": False}},
        "publishDiagnostics": {},
    },
}


def default_model_present() -> bool:
    """True when the shipped default model is installed (checked without importing torch)."""
    spec = importlib.util.find_spec("engine")
    if spec is None or not spec.submodule_search_locations:
        return False
    return (Path(list(spec.submodule_search_locations)[0]) / "models" / "default" / "config.json").exists()


def server_argv(model: str, device: str, backend: str, log_file: str | None = None,
                threads: int | None = None) -> list[str]:
    argv = [sys.executable, "-m", "kog_lsp", "--model", model, "--device", device, "--backend", backend]
    if threads is not None:   # 0 passes through: torch's default
        argv += ["--threads", str(threads)]
    if log_file:
        argv += ["--log-file", log_file]
    return argv


@dataclass
class ReplayResult:
    latencies_ms: list[float] = field(default_factory=list)  # shown suggestions only
    fresh_ms: list[float] = field(default_factory=list)  # ... excluding keystrokes typed into ghost text
    keystrokes: int = 0
    requests: int = 0
    cancelled: int = 0  # answered -32800 after our $/cancelRequest
    superseded: int = 0  # answered, but a newer keystroke had already made it stale
    empty: int = 0  # newest request answered with no item
    accepted: int = 0
    invoked_candidates: list[int] = field(default_factory=list)


class Editor:
    """The client-side document + the 'newest request wins' bookkeeping of an editor."""

    def __init__(self, client: LspProcess, uri: str, text: str, out, result: ReplayResult):
        self.client, self.uri, self.text, self.out, self.r = client, uri, text, out, result
        # Line starts of self.text, updated per edit: positions are computed inside the timed window of every
        # request, so they must not rescan the whole file (edit() is the only writer of self.text).
        self._starts = positions.line_starts(text)
        self.cursor = len(text)
        self.version = 1
        self.latest: int | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.shown: dict | None = None  # item shown for the current text, if any
        self.following = False  # typing into the shown ghost text (the suggestion cache should answer)

    def open(self) -> None:
        self.client.notify("textDocument/didOpen", {"textDocument": {
            "uri": self.uri, "languageId": "python", "version": self.version, "text": self.text}})

    def _pos(self, off: int) -> dict:
        line, ch = positions.position_at(self.text, off, positions.UTF16, self._starts)
        return {"line": line, "character": ch}

    def edit(self, a: int, b: int, new: str) -> None:
        rng = {"start": self._pos(a), "end": self._pos(b)}
        self.text = self.text[:a] + new + self.text[b:]
        self._starts = positions.update_line_starts(self._starts, self.text, a, b, len(new))
        self.version += 1
        self.shown = None
        self.client.notify("textDocument/didChange", {
            "textDocument": {"uri": self.uri, "version": self.version},
            "contentChanges": [{"range": rng, "text": new}]})

    def request(self, kind: int = 2) -> asyncio.Future:
        # The editor cancels the request the keystroke made stale.
        for rid, fut in list(self.pending.items()):
            if not fut.done():
                self.client.cancel(rid)
        t0 = time.perf_counter()
        rid, fut = self.client.request("textDocument/inlineCompletion", {
            "textDocument": {"uri": self.uri}, "position": self._pos(self.cursor),
            "context": {"triggerKind": kind}})
        self.r.requests += 1
        self.latest = rid
        self.pending[rid] = fut
        key = self.text[self.cursor - 1 : self.cursor] if self.cursor else ""
        following = self.following
        fut.add_done_callback(lambda f, rid=rid, t0=t0, key=key, kind=kind: self._answered(rid, f, t0, key, kind,
                                                                                          following))
        return fut

    def _answered(self, rid: int, fut: asyncio.Future, t0: float, key: str, kind: int, following: bool) -> None:
        ms = (time.perf_counter() - t0) * 1000.0
        self.pending.pop(rid, None)
        if fut.cancelled():
            return
        exc = fut.exception()
        if isinstance(exc, RpcError) and exc.code == REQUEST_CANCELLED:
            self.r.cancelled += 1
            return
        if exc is not None:
            self.out(f"  ! request failed: {exc}")
            return
        if rid != self.latest:
            self.r.superseded += 1
            return
        items = (fut.result() or {}).get("items", []) if isinstance(fut.result(), dict) else (fut.result() or [])
        if kind == 1:
            self.r.invoked_candidates.append(len(items))
        if not items:
            self.r.empty += 1
            return
        self.shown = items[0]
        self.r.latencies_ms.append(ms)
        if not following:
            self.r.fresh_ms.append(ms)
        ghost = items[0]["insertText"]
        ghost = ghost if len(ghost) <= 60 else ghost[:57] + "..."
        extra = f" (+{len(items) - 1} more)" if len(items) > 1 else ""
        self.out(f"  {key!r:>6} {ms:7.1f} ms  -> {ghost!r}{extra}")

    async def keystroke(self, s: str, delay: float) -> None:
        self.edit(self.cursor, self.cursor, s)
        self.cursor += len(s)
        self.r.keystrokes += 1
        self.request()
        await asyncio.sleep(delay)

    async def settle(self, timeout: float = 30.0) -> None:
        futs = [f for f in self.pending.values() if not f.done()]
        if futs:
            await asyncio.wait(futs, timeout=timeout)


def _keystrokes(text: str) -> list[str]:
    """Split typed text into keystrokes; a newline plus the next line's indentation is one (auto-indent)."""
    keys, i = [], 0
    while i < len(text):
        if text[i] == "\n":
            j = i + 1
            while j < len(text) and text[j] in " \t":
                j += 1
            keys.append(text[i:j])
            i = j
        else:
            keys.append(text[i])
            i += 1
    return keys


async def replay(client: LspProcess, uri: str, session: dict, speed: float = 1.0, out=print) -> ReplayResult:
    text = (DEMO_DATA / session["file"]).read_text()
    result = ReplayResult()
    ed = Editor(client, uri, text, out, result)
    if session.get("cursor_after"):
        ed.cursor = text.index(session["cursor_after"]) + len(session["cursor_after"])
    ed.open()
    delay = KEYSTROKE_MS / 1000.0 / speed
    for step in session["steps"]:
        if "type" in step:
            for k in _keystrokes(step["type"]):
                await ed.keystroke(k, delay)
        elif "pause" in step:
            await asyncio.sleep(step["pause"] / 1000.0 / speed)
            await ed.settle()
        elif "follow" in step:
            await ed.settle()
            item = ed.shown
            if item is None or item.get("range", {}).get("start") != ed._pos(ed.cursor):
                out("  (no suggestion to follow)")
                continue
            ghost = item["insertText"]
            n = min(step["follow"], len(ghost) - 1)
            out(f"  follow: typing {ghost[:n]!r} into the ghost text, then accept")
            start = ed.cursor
            end_off = positions.offset_at(ed.text, item["range"]["end"]["line"], item["range"]["end"]["character"],
                                          positions.UTF16)
            ed.following = True
            for ch in ghost[:n]:
                await ed.keystroke(ch, delay)
            ed.following = False
            await ed.settle()
            # Tab: the editor applies the rest of the item over its range and runs the item's command.
            ed.edit(ed.cursor, end_off + n, ghost[n:])
            ed.cursor = start + len(ghost)
            if item.get("command"):
                await client.call("workspace/executeCommand", {"command": item["command"]["command"],
                                                               "arguments": item["command"].get("arguments")})
                result.accepted += 1
            await asyncio.sleep(0.2 / speed)
            # Undo the acceptance so the rest of the script types into the same text every run.
            ed.edit(start, ed.cursor, "")
            ed.cursor = start
        elif step.get("invoke"):
            await ed.settle()
            t0 = time.perf_counter()
            fut = ed.request(kind=1)
            await asyncio.wait([fut], timeout=60)
            out(f"  invoked completion: {result.invoked_candidates[-1] if result.invoked_candidates else 0} "
                f"candidate(s) in {(time.perf_counter() - t0) * 1000:.0f} ms")
    await ed.settle()
    client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    return result


async def start_server(argv: list[str], settings: dict | None = None, out=print, timeout: float = 300.0):
    """Spawn + initialize; wait for kog/status ready. Returns (client, status params, load seconds)."""
    client = await LspProcess.spawn(argv)
    t0 = time.perf_counter()
    await client.call("initialize", {
        "processId": os.getpid(), "rootUri": DEMO_DATA.as_uri(), "capabilities": CLIENT_CAPABILITIES,
        "initializationOptions": settings or {}, "clientInfo": {"name": "kog-demo"}}, timeout=60)
    client.notify("initialized", {})
    _, status = await client.wait_for_notification(
        lambda m, p: m == "kog/status" and p.get("state") in ("ready", "error"), timeout)
    return client, status, time.perf_counter() - t0


def summarize(result: ReplayResult) -> dict:
    lat = result.latencies_ms
    return {
        "p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95),
        "mean_ms": (sum(lat) / len(lat)) if lat else None,
        # suggestions that needed a generation (not typed into ghost text, i.e. no suggestion-cache answer)
        "fresh_p50_ms": percentile(result.fresh_ms, 50), "fresh_p95_ms": percentile(result.fresh_ms, 95),
        "keystrokes": result.keystrokes, "requests": result.requests, "suggestions_shown": len(lat),
        "cancelled": result.cancelled, "superseded": result.superseded, "empty": result.empty,
        "accepted": result.accepted,
    }


async def demo_main(args) -> int:
    if args.model == "default" and not default_model_present():
        print("kog-lsp demo: the default model is not installed (engine/models/default/ is missing).\n"
              "Pass a model directory: kog-lsp demo --model /path/to/hf_model_dir", file=sys.stderr)
        return 2
    session = json.loads((DEMO_DATA / "session.json").read_text())
    log_file = tempfile.NamedTemporaryFile(prefix="kog-demo-", suffix=".log", delete=False).name
    argv = server_argv(args.model, args.device, args.backend, log_file, args.threads)
    print(f"kog-lsp demo: starting {' '.join(argv[1:])}")
    # Review diagnostics share the engine worker; the demo measures the completion loop alone unless asked.
    settings = {"debounceMs": args.debounce_ms, "reviewEnable": bool(args.with_review)}
    client, status, load_s = await start_server(argv, settings)
    try:
        if status.get("state") != "ready":
            print(f"kog-lsp demo: the server could not load the model: {status.get('message')}", file=sys.stderr)
            print(f"(server log: {log_file})", file=sys.stderr)
            return 2
        print(f"model ready in {load_s:.1f} s: backend={status.get('backend')} ({status.get('reason')})")
        print(f"replaying {session['file']} at {args.speed}x ({KEYSTROKE_MS / args.speed:.0f} ms per keystroke, "
              f"review diagnostics {'on' if args.with_review else 'off'})")
        print("  key    latency     suggestion")
        result = await replay(client, (DEMO_DATA / session["file"]).as_uri(), session, args.speed)
        stats = await client.call("kog/stats", {})
    finally:
        await client.close()
    s = summarize(result)
    eng = stats.get("engine") or {}
    s.update({"kind": "kog-demo", "model": args.model, "backend": stats.get("backend"),
              "device": eng.get("device"), "cache_hits": stats.get("cacheHits"),
              "server_p50_ms": stats["latencyMs"]["p50"], "tok_s": stats.get("tokPerS"),
              "prefix_cache_hit_rate": stats.get("prefixCacheHitRate"), "load_s": round(load_s, 2),
              "speed": args.speed})

    def f(v):
        return "n/a" if v is None else f"{v:.1f}"

    reuse = s["prefix_cache_hit_rate"]

    print()
    print(f"keystrokes {s['keystrokes']}, requests {s['requests']}, suggestions shown {s['suggestions_shown']}, "
          f"cancelled {s['cancelled']}, stale answers {s['superseded']}, empty {s['empty']}")
    print(f"keystroke -> suggestion latency: p50 {f(s['p50_ms'])} ms, p95 {f(s['p95_ms'])} ms "
          f"(mean {f(s['mean_ms'])} ms); without typing into ghost text: p50 {f(s['fresh_p50_ms'])} ms, "
          f"p95 {f(s['fresh_p95_ms'])} ms")
    print(f"suggestion-cache hits {s['cache_hits']}, accepted {s['accepted']}, backend {s['backend']} "
          f"on {s['device']}, decode {f(s['tok_s'])} tok/s, prefix KV reuse "
          + ("n/a" if reuse is None else f"{100 * reuse:.0f}%"))
    print(json.dumps(s))
    return 0


def add_demo_parser(sub) -> None:
    p = sub.add_parser("demo", help="replay a typing session against a server and print latencies",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    from kog_lsp.cli import add_engine_args

    add_engine_args(p)
    # One engine thread by default: on small shared CPUs OpenMP spin-waiting between the many tiny ops of
    # a 23M-parameter decode step costs more than a second thread gives (measured on a busy 2-core box:
    # 66 tok/s with 1 thread, 14 tok/s with 2). --threads 0 leaves torch's default.
    p.set_defaults(threads=1)
    p.add_argument("--speed", type=float, default=1.0, help="typing speed multiplier")
    p.add_argument("--debounce-ms", type=int, default=50, help="server debounce setting")
    p.add_argument("--with-review", action="store_true", help="keep review diagnostics on while replaying")


def run_demo(args) -> int:
    if args.speed <= 0:
        print("--speed must be > 0", file=sys.stderr)
        return 2
    return asyncio.run(demo_main(args))
