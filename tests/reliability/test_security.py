"""Security: in stdio mode the server opens no network sockets, never executes model output, and writes
only under its cache directory (HOME, XDG_CACHE_HOME, TMPDIR and cwd all point into a scratch tree).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from .conftest import start_server
from .test_model_faults import LAUNCHER
from .wire import kog_argv, server_env
from .fault_launcher import EVIL_MARKER_ENV

INET_TABLES = ("tcp", "tcp6", "udp", "udp6", "raw", "raw6", "udplite", "udplite6")


def inet_socket_inodes(pid: int) -> set[str]:
    """Inodes of every IPv4/IPv6 socket visible in the process's network namespace."""
    inodes = set()
    for name in INET_TABLES:
        p = Path(f"/proc/{pid}/net/{name}")
        if not p.exists():
            continue
        for row in p.read_text().splitlines()[1:]:
            cols = row.split()
            if len(cols) > 9:
                inodes.add(cols[9])
    return inodes


def process_socket_inodes(pid: int) -> set[str]:
    out = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            out.add(target[len("socket:["):-1])
    return out


def all_pids(pid: int) -> list[int]:
    """The server and any children it started."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").iterdir():
            kids = (task / "children").read_text().split() if (task / "children").exists() else []
            todo.extend(int(k) for k in kids)
    return out


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file()}


def scratch_env(root: Path) -> tuple[dict, Path, Path]:
    home, work = root / "home", root / "work"
    for d in (home, work, root / "tmp", home / ".cache"):
        d.mkdir(parents=True, exist_ok=True)
    env = server_env(home)
    env["TMPDIR"] = str(root / "tmp")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env, home / ".cache", work


def exercise(s, uri: str) -> list:
    text = "import os\n\ndef main():\n    \n"
    s.open(uri, text)
    s.change(uri, 2, [{"range": {"start": {"line": 3, "character": 4}, "end": {"line": 3, "character": 4}},
                       "text": "os."}])
    answers = [s.call("textDocument/inlineCompletion", {
        "textDocument": {"uri": uri}, "position": {"line": 3, "character": 7}, "context": {"triggerKind": k}},
        timeout=30) for k in (2, 1)]
    s.call("textDocument/diagnostic", {"textDocument": {"uri": uri}}, timeout=30)
    s.result("kog/stats", {})
    return answers


def test_stdio_server_opens_no_network_socket_and_writes_only_its_cache(tiny_model, tmp_path):
    env, cache, work = scratch_env(tmp_path / "scratch")
    before = snapshot(tmp_path / "scratch")
    s = start_server(tiny_model, tmp_path, argv=kog_argv(tiny_model, "--stdio"), env=env, cwd=work)
    try:
        exercise(s, (work / "main.py").as_uri())
        seen = set()
        for _ in range(3):  # sample a few times while the server is idle and busy
            for pid in all_pids(s.proc.pid):
                inet = inet_socket_inodes(pid)
                socks = process_socket_inodes(pid)
                assert not (socks & inet), f"pid {pid} holds network sockets {socks & inet}"
                seen |= socks
            time.sleep(0.1)
        assert all_pids(s.proc.pid) == [s.proc.pid], "the server started child processes"
    finally:
        s.close()
    after = snapshot(tmp_path / "scratch")
    changed = {p for p in after if before.get(p) != after[p]} | (set(before) - set(after))
    outside = sorted(p for p in changed if not (tmp_path / "scratch" / p).is_relative_to(cache))
    assert outside == [], f"the server wrote outside its cache directory: {outside}"


def test_model_output_is_never_executed(tiny_model, tmp_path):
    env, cache, work = scratch_env(tmp_path / "scratch")
    marker = tmp_path / "scratch" / "PWNED"
    env[EVIL_MARKER_ENV] = str(marker)
    argv = [sys.executable, LAUNCHER, "evil_output", "--", "--model", tiny_model, "--device", "cpu"]
    s = start_server(tiny_model, tmp_path, argv=argv, env=env, cwd=work)
    try:
        answers = exercise(s, (work / "main.py").as_uri())
        texts = [i["insertText"] for a in answers for i in a["result"]["items"]]
        assert any("__import__('os')" in t for t in texts), f"the injected output was not served: {answers}"
        time.sleep(0.3)
        assert s.alive()
    finally:
        s.close()
    assert not marker.exists(), "model output was executed"
