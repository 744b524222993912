"""A raw LSP wire client for reliability tests: hand-framed bytes over the server's stdin/stdout.

Deliberately independent of kog_lsp.rpc_client: these tests send malformed frames and must not share the
server's (or the demo's) assumptions about framing. A reader thread unframes the server's output; the
test thread writes raw bytes and waits on responses by id.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]


def frame(body: bytes | str | dict, length: int | None = None) -> bytes:
    """One LSP frame; `length` overrides the true Content-Length (malformed-frame tests)."""
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    n = len(body) if length is None else length
    return b"Content-Length: %d\r\n\r\n" % n + body


def server_env(home: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # One torch thread: CI runners are small and shared (see tests/lsp/conftest.py).
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if home is not None:
        env["HOME"] = str(home)
        env["XDG_CACHE_HOME"] = str(home / ".cache")
    return env


class RawServer:
    """`python -m kog_lsp ...` (or any argv) over pipes; frames in, parsed messages out."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None,
                 stderr_path: Path | None = None):
        self._stderr_file = open(stderr_path, "wb") if stderr_path else subprocess.DEVNULL
        self.stderr_path = stderr_path
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr_file, env=env or server_env(), cwd=cwd or REPO)
        self._lock = threading.Condition()
        self.responses: dict[Any, dict] = {}
        self.response_times: dict[Any, float] = {}
        self.messages: list[tuple[float, dict]] = []  # every server message, in order (time, msg)
        self.server_requests: list[dict] = []
        self._next_id = 1000
        self._write_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()

    # ---- wire ----
    def send_raw(self, data: bytes) -> None:
        with self._write_lock:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

    def send(self, msg: dict) -> None:
        self.send_raw(frame(msg))

    def _read_loop(self) -> None:
        out = self.proc.stdout
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    with self._lock:
                        self._lock.notify_all()
                    return
                line = line.strip()
                if not line:
                    break
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v)
            body = out.read(length or 0)
            msg = json.loads(body)
            now = time.perf_counter()
            if "method" in msg and "id" in msg:
                # Answer server->client requests like an editor would (progress create, configuration).
                result = None
                if msg["method"] == "workspace/configuration":
                    result = [None for _ in (msg.get("params") or {}).get("items", [])]
                self.send({"jsonrpc": "2.0", "id": msg["id"], "result": result})
            with self._lock:
                self.messages.append((now, msg))
                if "id" in msg and "method" not in msg:
                    self.responses[msg["id"]] = msg
                    self.response_times[msg["id"]] = now
                self._lock.notify_all()

    # ---- JSON-RPC ----
    def request(self, method: str, params: Any = None, msg_id: Any = None) -> Any:
        if msg_id is None:
            self._next_id += 1
            msg_id = self._next_id
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        return msg_id

    def notify(self, method: str, params: Any = None) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def wait_response(self, msg_id: Any, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        with self._lock:
            while msg_id not in self.responses:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no response to id {msg_id!r}{self._exit_note()}")
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise EOFError(f"server exited (rc={self.proc.returncode}) before answering {msg_id!r}")
                self._lock.wait(min(left, 0.2))
            return self.responses[msg_id]

    def call(self, method: str, params: Any = None, timeout: float = 30.0) -> dict:
        """Request and wait: returns the whole response message (result or error)."""
        return self.wait_response(self.request(method, params), timeout)

    def result(self, method: str, params: Any = None, timeout: float = 30.0) -> Any:
        resp = self.call(method, params, timeout)
        assert "error" not in resp, f"{method} failed: {resp['error']}"
        return resp.get("result")

    def wait_message(self, pred: Callable[[dict], bool], timeout: float = 30.0, after: int = 0) -> dict:
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for _, m in self.messages[after:]:
                    if pred(m):
                        return m
                left = deadline - time.monotonic()
                if left <= 0:
                    methods = [m.get("method") for _, m in self.messages[after:]]
                    raise TimeoutError(f"no matching server message; saw {methods}{self._exit_note()}")
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise EOFError(f"server exited (rc={self.proc.returncode})")
                self._lock.wait(min(left, 0.2))

    def notifications(self, method: str) -> list[Any]:
        with self._lock:
            return [m.get("params") for _, m in self.messages if m.get("method") == method and "id" not in m]

    def _exit_note(self) -> str:
        rc = self.proc.poll()
        return "" if rc is None else f" (server exited rc={rc})"

    def stderr_text(self) -> str:
        if self.stderr_path is None or not Path(self.stderr_path).exists():
            return ""
        return Path(self.stderr_path).read_text(errors="replace")

    # ---- LSP conveniences ----
    def initialize(self, encodings=("utf-16",), init_options: dict | None = None, root: str = "file:///work",
                   timeout: float = 60.0) -> dict:
        caps = {
            "general": {"positionEncodings": list(encodings)},
            "window": {"workDoneProgress": True, "showMessage": {}},
            "workspace": {"configuration": True, "executeCommand": {}},
            "textDocument": {"synchronization": {"didSave": True}, "inlineCompletion": {},
                             "publishDiagnostics": {}},
        }
        res = self.result("initialize", {"processId": os.getpid(), "rootUri": root, "capabilities": caps,
                                         "initializationOptions": init_options or {}}, timeout)
        self.notify("initialized", {})
        return res

    def wait_status(self, states=("ready", "error"), timeout: float = 120.0) -> dict:
        m = self.wait_message(lambda m: m.get("method") == "kog/status"
                              and (m.get("params") or {}).get("state") in states, timeout)
        return m["params"]

    def open(self, uri: str, text: str, version: int = 1, language: str = "python") -> None:
        self.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": language,
                                                              "version": version, "text": text}})

    def change(self, uri: str, version: int, changes: list[dict]) -> None:
        self.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                               "contentChanges": changes})

    def document(self, uri: str, timeout: float = 30.0) -> dict:
        """The server's copy of a document (the server's kog/document request)."""
        return self.result("kog/document", {"uri": uri}, timeout)

    def inline(self, uri: str, line: int, character: int, kind: int = 2) -> Any:
        return self.request("textDocument/inlineCompletion", {
            "textDocument": {"uri": uri}, "position": {"line": line, "character": character},
            "context": {"triggerKind": kind}})

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, timeout: float = 10.0) -> int | None:
        if self.proc.poll() is None:
            try:
                self.call("shutdown", None, timeout=timeout)
                self.notify("exit")
            except Exception:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        try:
            self.proc.stdin.close()
        except Exception:
            pass
        if self._stderr_file is not subprocess.DEVNULL:
            self._stderr_file.close()
        return self.proc.returncode


def kog_argv(model: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kog_lsp", "--model", model, "--device", "cpu", *extra]
