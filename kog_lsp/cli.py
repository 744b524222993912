"""Command line: `kog-lsp [--stdio | --tcp HOST:PORT] [--model ...] ...` and `kog-lsp demo ...`."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from kog_lsp import __version__


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def _positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return int(value)


def _non_negative_int(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value!r}")
    return int(value)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="'default' (shipped model) or a Hugging Face model dir")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--backend", default="auto", choices=["auto", "reference", "graph", "monokernel"])
    p.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel GPUs")
    p.add_argument("--tp-mode", default="exact", choices=["exact", "delayed"])
    p.add_argument("--threads", type=_non_negative_int, default=None,
                   help="CPU threads for the engine (OMP/MKL); default: half the cores, 1 to 4 (the editor keeps "
                        "the rest; more threads contend on a busy laptop); 0: torch's default")


def engine_threads(requested: int | None, cpu_count: int | None = None) -> int | None:
    """CPU threads for torch: requested (>= 1) as given, 0 -> None (torch's default), None -> half the cores,
    between 1 and 4. Measured on 2 cores: 1 thread decodes the default model at 136 tok/s, 2 at 87-107 (bench/NOTES.md)."""
    if requested == 0:
        return None
    if requested is not None:
        return requested
    return max(1, min(4, (cpu_count if cpu_count is not None else os.cpu_count() or 2) // 2))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kog-lsp", description="Language server for real-time AI code suggestions.")
    p.add_argument("--version", action="version", version=f"kog-lsp {__version__}")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--stdio", action="store_true", help="talk LSP over stdin/stdout (default)")
    mode.add_argument("--tcp", type=_host_port, metavar="HOST:PORT", help="listen on a TCP port instead")
    add_engine_args(p)
    p.add_argument("--log-file", help="write the server log here (stderr otherwise)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = p.add_subparsers(dest="command")
    from kog_lsp.demo import add_demo_parser

    add_demo_parser(sub)
    return p


def _setup_logging(log_file: str | None, level: str) -> None:
    # stdout carries JSON-RPC in stdio mode: logs go to a file or stderr, never stdout.
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    if level != "DEBUG":
        logging.getLogger("pygls").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from kog_lsp.demo import run_demo

        return run_demo(args)
    _setup_logging(args.log_file, args.log_level)
    threads = engine_threads(args.threads)
    if threads:
        # torch reads these when it is first imported (by the model loader thread, after this).
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    logging.getLogger("kog_lsp").info("engine CPU threads: %s", threads or "torch default")
    from kog_lsp.runtime import EngineOptions
    from kog_lsp.server import create_server

    server = create_server(EngineOptions(args.model, args.device, args.backend, args.tp, args.tp_mode))
    if args.tcp:
        server.start_tcp(*args.tcp)
    else:
        server.start_io()
    return 0
