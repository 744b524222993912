"""Editor-loop latency bench: replay the kog-lsp demo typing session N times against one server.

Prints a table of keystroke-to-suggestion latency (p50 / p95 / mean over the suggestions shown) per run
and overall, then one JSON line. Each run types into a fresh document URI, so the server's suggestion
cache starts empty per run while the engine's prefix KV cache is warm after run 1 (as in an editor
session); use --fresh-server to pay a cold start per run instead.

    python bench/demo_latency.py --model default --runs 5
    python bench/demo_latency.py --model /path/to/hf_dir --device cuda --backend graph --speed 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kog_lsp.demo import DEMO_DATA, default_model_present, replay, server_argv, start_server, summarize  # noqa: E402
from kog_lsp.stats import percentile  # noqa: E402


def _fmt(v) -> str:
    return "    n/a" if v is None else f"{v:7.1f}"


async def bench(args) -> int:
    session = json.loads((DEMO_DATA / "session.json").read_text())
    log_file = tempfile.NamedTemporaryFile(prefix="kog-bench-", suffix=".log", delete=False).name
    argv = server_argv(args.model, args.device, args.backend, log_file, args.threads or None)
    settings = {"debounceMs": args.debounce_ms, "reviewEnable": bool(args.with_review)}
    rows, all_lat, all_fresh = [], [], []
    client = None
    backend = device = None
    try:
        for run in range(args.runs):
            if client is None or args.fresh_server:
                if client is not None:
                    await client.close()
                client, status, load_s = await start_server(argv, settings)
                if status.get("state") != "ready":
                    print(f"server could not load the model: {status.get('message')} (log: {log_file})",
                          file=sys.stderr)
                    return 2
                backend = status.get("backend")
            uri = f"file:///kog-bench/run{run}/{session['file']}"
            result = await replay(client, uri, session, args.speed, out=print if args.verbose else (lambda *_: None))
            s = summarize(result)
            rows.append(s)
            all_lat += result.latencies_ms
            all_fresh += result.fresh_ms
            print(f"run {run + 1:2d}: p50 {_fmt(s['p50_ms'])} ms  p95 {_fmt(s['p95_ms'])} ms  | generated p50 "
                  f"{_fmt(s['fresh_p50_ms'])} ms  p95 {_fmt(s['fresh_p95_ms'])} ms  | shown "
                  f"{s['suggestions_shown']:3d}/{s['keystrokes']} keystrokes  cancelled {s['cancelled']}")
        stats = await client.call("kog/stats", {})
        device = (stats.get("engine") or {}).get("device")
    finally:
        if client is not None:
            await client.close()
    p50, p95 = percentile(all_lat, 50), percentile(all_lat, 95)
    f50, f95 = percentile(all_fresh, 50), percentile(all_fresh, 95)
    print(f"all   : p50 {_fmt(p50)} ms  p95 {_fmt(p95)} ms  | generated p50 {_fmt(f50)} ms  p95 {_fmt(f95)} ms"
          f"  | {len(all_lat)} suggestions shown (backend {backend} on {device}, speed {args.speed}x)")
    print("(all: every suggestion shown, including the ones answered from the suggestion cache while typing into"
          " ghost text; generated: the others, which needed the engine)")
    print(json.dumps({"kind": "kog-demo-latency", "model": args.model, "backend": backend, "device": device,
                      "runs": args.runs, "speed": args.speed, "p50_ms": p50, "p95_ms": p95,
                      "generated_p50_ms": f50, "generated_p95_ms": f95,
                      "suggestions_shown": len(all_lat), "cache_hits": stats.get("cacheHits"),
                      "prefix_cache_hit_rate": stats.get("prefixCacheHitRate"), "tok_s": stats.get("tokPerS"),
                      "per_run": [{k: r[k] for k in ("p50_ms", "p95_ms", "fresh_p50_ms", "fresh_p95_ms", "suggestions_shown",
                                                     "cancelled")}
                                  for r in rows]}))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--backend", default="auto", choices=["auto", "reference", "graph", "monokernel"])
    p.add_argument("--threads", type=int, default=1, help="engine CPU threads (0: torch's default)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--debounce-ms", type=int, default=50)
    p.add_argument("--with-review", action="store_true", help="keep review diagnostics on (shares the worker)")
    p.add_argument("--fresh-server", action="store_true", help="start a new server for every run")
    p.add_argument("--verbose", action="store_true", help="print every suggestion")
    args = p.parse_args()
    if args.model == "default" and not default_model_present():
        print("the default model is not installed (engine/models/default/); pass --model PATH", file=sys.stderr)
        return 2
    if args.runs < 1 or args.speed <= 0:
        print("--runs must be >= 1 and --speed > 0", file=sys.stderr)
        return 2
    return asyncio.run(bench(args))


if __name__ == "__main__":
    raise SystemExit(main())
