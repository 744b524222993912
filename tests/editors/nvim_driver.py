"""Drive a real headless Neovim over its --listen socket with `nvim --server S --remote-send/--remote-expr`.

No Python Neovim client is needed (none is installed in CI): keys go in through --remote-send (the same path
as typed keys, so TextChangedI, mappings and insert mode behave as for a user) and state comes back as JSON
from the probes defined in nvim_e2e_init.lua.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PLUGIN = ROOT / "editors" / "nvim"
INIT = HERE / "nvim_e2e_init.lua"


def nvim_version() -> tuple[int, int, int] | None:
    exe = shutil.which("nvim")
    if not exe:
        return None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    first = out.splitlines()[0] if out else ""  # "NVIM v0.7.2"
    try:
        nums = first.split("v", 1)[1].split("-")[0].split(".")
        return int(nums[0]), int(nums[1]), int(nums[2])
    except (IndexError, ValueError):
        return None


class Nvim:
    def __init__(self, file: Path, server_cmd: list[str], settings: dict, env: dict | None = None):
        # A short directory: unix socket paths are limited to ~108 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="kognv"))
        self.sock = str(self.dir / "sock")
        e = dict(os.environ)
        e.update(env or {})
        e.update({"KOG_NVIM_PLUGIN": str(PLUGIN), "KOG_E2E_CMD": json.dumps(server_cmd),
                  "KOG_E2E_SETTINGS": json.dumps(settings)})
        self.abort = None  # set by the caller: () -> reason to stop waiting, or None
        self.log = open(self.dir / "nvim.out", "wb")
        # Own session/process group so teardown can end nvim and the server it started, by this group id.
        self.proc = subprocess.Popen(["nvim", "--headless", "--listen", self.sock, "-i", "NONE", "-u", str(INIT),
                                      str(file)], cwd=file.parent, env=e, stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.wait_for(lambda: os.path.exists(self.sock), 30, "nvim socket")

    def _client(self, *args: str) -> str:
        if self.proc.poll() is not None:
            raise RuntimeError(f"nvim exited with {self.proc.returncode}: {self.output()}")
        # nvim 0.7 prints --remote-expr results on stderr, later versions on stdout: take both.
        r = subprocess.run(["nvim", "--server", self.sock, *args], capture_output=True, timeout=30)
        return (r.stdout + r.stderr).decode("utf-8", "replace")

    def send(self, keys: str) -> None:
        self._client("--remote-send", keys)

    def probe(self, call: str):
        """Evaluate KogE2E.<call> (a Lua probe returning JSON) and decode it."""
        out = self._client("--remote-expr", f'luaeval("KogE2E.{call}")').strip()
        return json.loads(out)

    def wait_for(self, fn, timeout: float, what: str, interval: float = 0.1):
        """Poll fn() until it returns something truthy. Every second `self.abort()` (if set) may return a
        reason to stop early, e.g. the server reported a fatal error: no point waiting out the timeout."""
        deadline = time.monotonic() + timeout
        next_abort_check = time.monotonic() + 1.0
        last = None
        while time.monotonic() < deadline:
            last = fn()
            if last:
                return last
            if self.abort is not None and time.monotonic() >= next_abort_check:
                next_abort_check = time.monotonic() + 1.0
                reason = self.abort()
                if reason:
                    raise RuntimeError(f"gave up waiting for {what}: {reason}")
            time.sleep(interval)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}; last={last!r}")

    def output(self) -> str:
        self.log.flush()
        return (self.dir / "nvim.out").read_text(errors="replace")[-4000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("<C-\\><C-n>:qa!<CR>")
                self.proc.wait(timeout=15)
            except (subprocess.TimeoutExpired, RuntimeError, subprocess.SubprocessError):
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        # The server exits when nvim closes its stdin; end its group too if it lingers.
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
