"""A small asyncio JSON-RPC (LSP framing) client for a server subprocess: used by the demo and bench.

It answers the server's requests the way an editor would (window/workDoneProgress/create -> null,
workspace/configuration -> one null per item) and keeps notifications for the caller.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable


class RpcError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class LspProcess:
    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self._next_id = 0
        self._pending: dict[int, asyncio.Future] = {}
        self.notifications: list[tuple[float, str, Any]] = []
        self.on_notification: Callable[[str, Any], None] | None = None
        self._reader = asyncio.ensure_future(self._read_loop())

    @classmethod
    async def spawn(cls, argv: list[str], stderr=None) -> "LspProcess":
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr,
            limit=64 * 1024 * 1024)
        return cls(proc)

    def _write(self, msg: dict) -> None:
        body = json.dumps(msg, ensure_ascii=False).encode("utf-8")
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    async def _read_loop(self) -> None:
        out = self.proc.stdout
        try:
            while True:
                length = None
                while True:
                    line = await out.readline()
                    if not line:
                        raise EOFError
                    line = line.strip()
                    if not line:
                        break
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await out.readexactly(length)
                self._dispatch(json.loads(body))
        except (EOFError, asyncio.IncompleteReadError, ConnectionResetError):
            pass
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(EOFError("server exited"))

    def _dispatch(self, msg: dict) -> None:
        if "method" in msg and "id" in msg:  # server -> client request
            method = msg["method"]
            result = None
            if method == "workspace/configuration":
                result = [None for _ in (msg.get("params") or {}).get("items", [])]
            self._write({"jsonrpc": "2.0", "id": msg["id"], "result": result})
            self.notifications.append((time.perf_counter(), method, msg.get("params")))
        elif "method" in msg:
            self.notifications.append((time.perf_counter(), msg["method"], msg.get("params")))
            if self.on_notification:
                self.on_notification(msg["method"], msg.get("params"))
        else:
            fut = self._pending.pop(msg.get("id"), None)
            if fut is not None and not fut.done():
                if "error" in msg:
                    fut.set_exception(RpcError(msg["error"].get("code"), msg["error"].get("message", "")))
                else:
                    fut.set_result(msg.get("result"))

    def request(self, method: str, params: Any = None) -> tuple[int, asyncio.Future]:
        """Send a request; returns (id, future of the result)."""
        self._next_id += 1
        rid = self._next_id
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        self._write({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        return rid, fut

    async def call(self, method: str, params: Any = None, timeout: float = 60.0) -> Any:
        _, fut = self.request(method, params)
        return await asyncio.wait_for(fut, timeout)

    def notify(self, method: str, params: Any = None) -> None:
        self._write({"jsonrpc": "2.0", "method": method, "params": params})

    def cancel(self, rid: int) -> None:
        self.notify("$/cancelRequest", {"id": rid})

    async def wait_for_notification(self, predicate: Callable[[str, Any], bool], timeout: float) -> tuple[str, Any]:
        deadline = time.perf_counter() + timeout
        seen = 0
        while True:
            for _, method, params in self.notifications[seen:]:
                if predicate(method, params):
                    return method, params
            seen = len(self.notifications)
            if self.proc.returncode is not None or self._reader.done():
                raise EOFError("server exited")
            if time.perf_counter() > deadline:
                raise TimeoutError("no matching notification")
            await asyncio.sleep(0.01)

    async def close(self) -> int:
        try:
            await self.call("shutdown", None, timeout=10)
            self.notify("exit")
            await self.proc.stdin.drain()
        except Exception:
            pass
        try:
            return await asyncio.wait_for(self.proc.wait(), 10)
        except asyncio.TimeoutError:
            self.proc.kill()
            return await self.proc.wait()
