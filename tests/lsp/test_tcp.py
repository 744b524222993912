"""`kog-lsp --tcp HOST:PORT` serves LSP over a socket."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys

from lsp_testutil import server_env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _read_message(reader) -> dict:
    length = None
    while True:
        line = (await reader.readline()).strip()
        if not line:
            break
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return json.loads(await reader.readexactly(length))


async def test_tcp_initialize(tmp_path):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kog_lsp", "--tcp", f"127.0.0.1:{port}", "--model",
                             str(tmp_path / "none"), "--device", "cpu"], env=server_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("server did not listen")
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                           "params": {"processId": None, "rootUri": None, "capabilities": {}}}).encode()
        writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        msg = await asyncio.wait_for(_read_message(reader), 30)
        while msg.get("id") != 1:
            msg = await asyncio.wait_for(_read_message(reader), 30)
        caps = msg["result"]["capabilities"]
        assert "inlineCompletionProvider" in caps and msg["result"]["serverInfo"]["name"] == "kog-lsp"
        writer.close()
    finally:
        proc.terminate()
        proc.wait(10)
