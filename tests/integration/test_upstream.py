"""The gateway in front of an upstream: a real jupyter_server, and a second
kernel_gateway_stream (chained). Kernels are created, used and deleted through our daemon
only; the upstream runs them. Output is recorded with no client attached, complete; an
upstream kernel_gateway_stream that is SIGKILLed and started again is resumed by seq with
no gap."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from kernel_gateway_stream.client import GatewayClient

from ..timing import seconds
from .daemon import TOKEN, Daemon, free_port
from .wsclient import KernelWS

FLOOD = "for i in range(20000): print(i, flush=True)"
EXPECTED = "".join(f"{i}\n" for i in range(20000))


class Upstream:
    """A jupyter_server or a kernel_gateway_stream subprocess, the upstream of our daemon."""

    def __init__(self, home: Path, kind: str, *options: str) -> None:
        self.home = home
        self.kind = kind
        self.options = options
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        home.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        module = "jupyter_server" if self.kind == "jupyter_server" else "kernel_gateway_stream"
        argv = [sys.executable, "-m", module, f"--port={self.port}", *self.options]
        if self.kind == "jupyter_server":
            argv += [
                "--no-browser",
                "--allow-root",
                "--ServerApp.jpserver_extensions=kernel_gateway_stream=False",
            ]
        env = dict(
            os.environ,
            JUPYTER_TOKEN=TOKEN,
            JUPYTER_DATA_DIR=str(self.home / "data"),
            JUPYTER_RUNTIME_DIR=str(self.home / "runtime"),
            JUPYTER_CONFIG_DIR=str(self.home / "config"),
        )
        with open(self.home / "upstream.log", "ab") as log:
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=log)

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + seconds(60)
        while True:
            assert self.process is not None
            assert self.process.poll() is None, (self.home / "upstream.log").read_text()
            try:
                await AsyncHTTPClient().fetch(
                    f"{self.url}/api/kernels", headers={"Authorization": f"token {TOKEN}"}
                )
                return
            except (OSError, HTTPClientError):
                assert time.monotonic() < deadline, (self.home / "upstream.log").read_text()
                await asyncio.sleep(0.2)

    async def kernels(self) -> list[dict[str, Any]]:
        response = await AsyncHTTPClient().fetch(
            f"{self.url}/api/kernels", headers={"Authorization": f"token {TOKEN}"}
        )
        kernels: list[dict[str, Any]] = json.loads(response.body)
        return kernels

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(seconds(30))
            except subprocess.TimeoutExpired:
                self.kill()


def install_lossless_python(data_dir: Path) -> None:
    """The upstream's python3 kernelspec, started through kernel_gateway_stream's launcher:
    an ipykernel whose IOPub never drops (the README's advice for upstream servers)."""
    spec = data_dir / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "kernel_gateway_stream.kernel_launcher",
        "-f",
        "{connection_file}",
    ]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"})
    )


@pytest.fixture
def jupyter_upstream(tmp_path: Path) -> Iterator[Upstream]:
    upstream = Upstream(
        tmp_path / "upstream", "jupyter_server", "--ZMQChannelsWebsocketConnection.limit_rate=False"
    )
    install_lossless_python(upstream.home / "data")
    upstream.start()
    yield upstream
    upstream.stop()


@pytest.fixture
def chained_upstream(tmp_path: Path) -> Iterator[Upstream]:
    upstream = Upstream(tmp_path / "upstream", "gateway")
    upstream.start()
    yield upstream
    upstream.stop()


def gateway_options(upstream: Upstream) -> tuple[str, ...]:
    return (
        f"--gateway-url={upstream.url}",
        f"--GatewayClient.auth_token={TOKEN}",
        "--TapManager.upstream_retry_initial=0.2",
        "--TapManager.upstream_retry_max=1",
    )


async def wait_text(client: GatewayClient, kernel_id: str, expected: str) -> str:
    deadline = time.monotonic() + seconds(120)
    while True:
        text = await client.transcript_text(kernel_id)
        if len(text) >= len(expected) or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.2)


async def test_in_front_of_jupyter_server(daemon: Daemon, jupyter_upstream: Upstream) -> None:
    await jupyter_upstream.wait_ready()
    daemon.start(*gateway_options(jupyter_upstream))
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN) as client:
        kernel_id = await client.start_kernel()
        assert [k["id"] for k in await jupyter_upstream.kernels()] == [kernel_id]
        # Recorded with no client of ours attached: the execute API reads the transcript.
        result = await client.execute(kernel_id, FLOOD)
        assert result.status == "ok"
        assert result.stdout == EXPECTED
        assert await wait_text(client, kernel_id, EXPECTED) == EXPECTED
        # The channels WebSocket of our daemon, replies and output, through the upstream.
    ws = await daemon.channels(kernel_id)
    try:
        msg_id = ws.execute("print('through', 'both')")
        received = await ws.until_idle(msg_id, timeout=seconds(60))
        assert received.text() == "through both\n"
    finally:
        ws.close()
    async with GatewayClient(daemon.url, TOKEN) as client:
        await client.interrupt(kernel_id)
        await client.shutdown(kernel_id)
    deadline = time.monotonic() + seconds(30)
    while await jupyter_upstream.kernels():
        assert time.monotonic() < deadline, "DELETE did not reach the upstream"
        await asyncio.sleep(0.2)


async def test_chained_upstream_killed_and_started_again_loses_nothing(
    daemon: Daemon, chained_upstream: Upstream
) -> None:
    await chained_upstream.wait_ready()
    daemon.start(*gateway_options(chained_upstream))
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN) as client:
        kernel_id = await client.start_kernel()
        ticks = (
            "import time\nfor i in range(300):\n    print(i, flush=True)\n    time.sleep(0.02)\n"
        )
        msg_id = await client.start_execution(kernel_id, ticks)
        deadline = time.monotonic() + seconds(60)
        while len((await client.transcript_text(kernel_id)).splitlines()) < 50:
            assert time.monotonic() < deadline, daemon.log_text()
            await asyncio.sleep(0.1)
        # The upstream dies (its kernel lives on), and comes back.
        chained_upstream.kill()
        deadline = time.monotonic() + seconds(30)
        while (await daemon.fetch(f"/api/kernels/{kernel_id}"))["execution_state"] != "unreachable":
            assert time.monotonic() < deadline, daemon.log_text()
            await asyncio.sleep(0.1)
        health = await daemon.fetch("/api/gateway/health")
        assert health["status"] == "degraded"
        await asyncio.sleep(seconds(0.5))
        chained_upstream.start()
        await chained_upstream.wait_ready()
        summary = None
        deadline = time.monotonic() + seconds(120)
        while summary is None or summary.status == "running":
            assert time.monotonic() < deadline, daemon.log_text()
            await asyncio.sleep(0.3)
            summary = await client.execution(kernel_id, msg_id)
        text = await client.transcript_text(kernel_id)
        async with GatewayClient(chained_upstream.url, TOKEN) as upstream_client:
            upstream_text = await upstream_client.transcript_text(kernel_id)
            upstream_records = (await upstream_client.transcript(kernel_id, limit=10000))["records"]
        # The upstream itself was killed: what its kernel printed while it was down, and
        # its last unwritten batch, it has as gap records. The chain adds no loss of its
        # own: every line the upstream kept (and lines it lost that had reached us already),
        # once, in order, and its gaps as gaps.
        ours = [int(line) for line in text.splitlines()]
        assert ours == sorted(set(ours)), "once each, in order"
        assert set(upstream_text.splitlines()) <= set(text.splitlines())
        assert ours[:50] == list(range(50))
        records = (await client.transcript(kernel_id, limit=10000))["records"]
        gaps = [
            r["content"]["reason"] for r in records if r["msg_type"] == "kernel_gateway_stream_gap"
        ]
        upstream_gaps = [
            r for r in upstream_records if r["msg_type"] == "kernel_gateway_stream_gap"
        ]
        assert len(gaps) == len(upstream_gaps), gaps
        assert all(reason.startswith("upstream_") for reason in gaps), gaps
        events = [
            r["content"].get("event")
            for r in records
            if r["msg_type"] == "kernel_gateway_stream_lifecycle"
        ]
        assert events[:2] == ["unreachable", "reachable"]
        upstream_seqs = [
            r["metadata"]["kernel_gateway_stream_upstream"]["seq"]
            for r in records
            if "kernel_gateway_stream_upstream" in r["metadata"]
        ]
        assert upstream_seqs == sorted(set(upstream_seqs)), "the upstream's seq is kept"
        await client.shutdown(kernel_id)


async def test_a_stock_jupyter_server_in_front_of_the_gateway(
    daemon: Daemon, tmp_path: Path
) -> None:
    """``jupyter server --gateway-url=<this gateway>``: its users' notebooks get every line of
    a 20,000-line flush flood (jupyter_server's gateway client proxies without the rate
    limit that drops such floods from its own kernels)."""
    daemon.start()
    await daemon.wait_ready()
    front = Upstream(
        tmp_path / "front",
        "jupyter_server",
        f"--gateway-url={daemon.url}",
        f"--GatewayClient.auth_token={TOKEN}",
    )
    front.start()
    try:
        await front.wait_ready()
        response = await AsyncHTTPClient().fetch(
            f"{front.url}/api/kernels",
            method="POST",
            body="{}",
            headers={"Authorization": f"token {TOKEN}"},
        )
        kernel_id = json.loads(response.body)["id"]
        ws = await KernelWS.open(
            f"ws://127.0.0.1:{front.port}/api/kernels/{kernel_id}/channels",
            {"Authorization": f"token {TOKEN}"},
        )
        try:
            received = await ws.until_idle(ws.execute(FLOOD), timeout=seconds(120))
        finally:
            ws.close()
        assert received.text() == EXPECTED
        async with GatewayClient(daemon.url, TOKEN) as client:
            assert await client.transcript_text(kernel_id) == EXPECTED
    finally:
        front.stop()
