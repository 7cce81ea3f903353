"""The standalone daemon as a real subprocess: service defaults, SIGKILL and restart."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from ..timing import seconds
from .wsclient import KernelWS

TOKEN = "test-token-for-the-daemon"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Daemon:
    """``python -m kernel_gateway_stream`` in its own Jupyter directories."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log = home / "daemon.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {TOKEN}"}

    def start(self) -> None:
        env = dict(os.environ)
        env.update(
            JUPYTER_TOKEN=TOKEN,
            JUPYTER_DATA_DIR=str(self.home / "data"),
            JUPYTER_RUNTIME_DIR=str(self.home / "runtime"),
            JUPYTER_CONFIG_DIR=str(self.home / "config"),
        )
        argv = [sys.executable, "-m", "kernel_gateway_stream", f"--port={self.port}"]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=log)

    async def wait_ready(self) -> None:
        client = AsyncHTTPClient()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds(60)
        while loop.time() < deadline:
            assert self.process is not None
            assert self.process.poll() is None, self.log.read_text()
            try:
                await client.fetch(f"{self.url}/api", headers=self.headers)
                return
            except (ConnectionError, OSError, HTTPClientError):
                await asyncio.sleep(0.2)
        raise TimeoutError(self.log.read_text())

    def kill_hard(self) -> None:
        """SIGKILL the daemon and the kernels it launched (they would outlive it)."""
        assert self.process is not None
        children = subprocess.run(
            ["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True
        ).stdout.split()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(seconds(30))
            except subprocess.TimeoutExpired:
                self.kill_hard()

    async def fetch(self, path: str, **kwargs: Any) -> Any:
        kwargs.setdefault("headers", self.headers)
        response = await AsyncHTTPClient().fetch(self.url + path, **kwargs)
        if response.headers.get("Content-Type", "").startswith("application/json"):
            return json.loads(response.body)
        return response.body.decode()

    async def channels(self, kernel_id: str, **options: Any) -> KernelWS:
        url = f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels"
        return await KernelWS.open(url, self.headers, **options)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    instance = Daemon(tmp_path)
    yield instance
    instance.stop()


async def test_daemon_serves_kernels_not_files_and_needs_its_token(daemon: Daemon) -> None:
    daemon.start()
    await daemon.wait_ready()
    client = AsyncHTTPClient()
    for headers in ({}, {"Authorization": "token wrong"}):
        with pytest.raises(HTTPClientError) as denied:
            await client.fetch(f"{daemon.url}/api/kernels", headers=headers)
        assert denied.value.code == 403
    specs = await daemon.fetch("/api/kernelspecs")
    assert "python3" in specs["kernelspecs"]
    for path in ("/api/contents", "/files/x", "/lab", "/tree", "/terminals/websocket/1"):
        with pytest.raises(HTTPClientError) as missing:
            await daemon.fetch(path)
        assert missing.value.code == 404
    listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout
    assert f"127.0.0.1:{daemon.port}" in listening


async def test_sigkilled_daemon_restarts_with_transcripts_and_numbering(daemon: Daemon) -> None:
    """Invariant 1 across a gateway restart: the transcript of a kernel recorded before a
    SIGKILL is served after it, and numbering for that kernel id continues from its head."""
    daemon.start()
    await daemon.wait_ready()
    kernel = await daemon.fetch("/api/kernels", method="POST", body="{}")
    kernel_id = kernel["id"]
    ws = await daemon.channels(kernel_id, protocol="v1")
    msg_id = ws.execute("for i in range(5000): print(i, flush=True)")
    received = await ws.until_idle(msg_id)
    expected = "".join(f"{i}\n" for i in range(5000))
    assert received.text() == expected
    ws.close()
    before = await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?limit=1")
    await asyncio.sleep(seconds(1))  # let the writer commit its last batch
    daemon.kill_hard()

    daemon.start()
    await daemon.wait_ready()
    text = await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?format=text&parent={msg_id}")
    assert text == expected
    after_restart = await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?limit=1")
    assert after_restart["running"] is False
    assert after_restart["head"] == before["head"]
    # A kernel started under the same id numbers on from the recorded head.
    await daemon.fetch("/api/kernels", method="POST", body=json.dumps({"kernel_id": kernel_id}))
    ws = await daemon.channels(kernel_id)
    msg_id = ws.execute("print('after the restart')")
    received = await ws.until_idle(msg_id)
    assert received.text() == "after the restart\n"
    assert received.seq_ranges()[0][0] > before["head"]
    page = await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?since={before['head']}")
    assert page["records"][0]["seq"] == before["head"] + 1
    ws.close()
