"""Helpers shared by this room's tests (a uniquely named module: several test folders have a conftest.py,
so `import conftest` would be ambiguous when the whole suite runs)."""

from __future__ import annotations

import os
import sys


def server_env() -> dict[str, str]:
    # One torch thread: CI runners are small and shared; OpenMP spin-waiting across busy cores makes a
    # tiny model's per-token time jump from ~1 ms to ~30 ms.
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    return env


def server_command(model: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kog_lsp", "--model", model, "--device", "cpu", *extra]
