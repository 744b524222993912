"""Fixtures for the reliability room: a tiny random checkpoint and a started server over raw pipes."""

from __future__ import annotations

import pytest

from .wire import RawServer, kog_argv, server_env


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    from engine.testing import make_tiny_checkpoint

    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("rel-tiny"), seed=0))


def start_server(model: str, tmp_path, name: str = "server", init_options: dict | None = None,
                 encodings=("utf-16",), argv: list[str] | None = None, env=None, cwd=None,
                 wait_ready: bool = True) -> RawServer:
    """Spawn + initialize (+ wait for kog/status ready). stderr goes to tmp_path/<name>.log."""
    s = RawServer(argv or kog_argv(model), env=env or server_env(), cwd=cwd,
                  stderr_path=tmp_path / f"{name}.log")
    try:
        s.init_result = s.initialize(encodings=encodings, init_options=init_options)
        if wait_ready:
            st = s.wait_status(("ready", "error"), timeout=120)
            assert st["state"] == "ready", f"model did not load: {st}\n{s.stderr_text()[-3000:]}"
    except BaseException:
        s.close()
        raise
    return s
