"""Kernels attached by connection info: started by a separate process, the daemon only
knows where they listen. Attach, use on every surface, detach (the kernel runs on),
attach again (numbering goes on), a watched connection directory, and a kernel that
stops answering."""

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
from tornado.httpclient import HTTPClientError

from kernel_gateway_stream.client import GatewayClient
from kernel_gateway_stream.core.errors import GatewayHTTPError

from ..timing import seconds
from .daemon import TOKEN, Daemon


class OutsideKernel:
    """An ipykernel started by the test, not by the daemon: only its connection file is
    shared."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ipykernel_launcher", "-f", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYDEVD_DISABLE_FILE_VALIDATION": "1"},
        )
        deadline = time.monotonic() + seconds(30)
        while not (path.exists() and path.stat().st_size > 0):
            assert time.monotonic() < deadline, "the kernel wrote no connection file"
            time.sleep(0.05)
        time.sleep(0.2)  # written in one go, but let it finish

    @property
    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = json.loads(self.path.read_text())
        return info

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.process.kill()
            self.process.wait()


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[OutsideKernel]:
    kernel = OutsideKernel(tmp_path / "outside" / "kernel-outside.json")
    yield kernel
    kernel.stop()


@pytest.fixture(autouse=True)
def _outside_dir(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir(exist_ok=True)


async def _text(client: GatewayClient, kernel_id: str) -> str:
    return await client.transcript_text(kernel_id)


async def test_attach_use_detach_and_attach_again(daemon: Daemon, outside: OutsideKernel) -> None:
    daemon.start()
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN) as client:
        kernel_id = await client.attach_kernel(outside.info, display_name="outside")
        kernels = {k["id"]: k for k in await client.list_kernels()}
        assert kernel_id in kernels
        first = await client.execute(kernel_id, "x = 41\nprint('first', x)")
        assert first.status == "ok"
        assert first.stdout == "first 41\n"
        head = (await client.transcript(kernel_id))["head"]

        await client.detach(kernel_id)
        assert outside.alive(), "detaching must not shut the kernel down"
        assert kernel_id not in {k["id"] for k in await client.list_kernels()}
        records = (await client.transcript(kernel_id, since=head - 1))["records"]
        assert records[-1]["content"]["reason"] == "detached"

        again = await client.attach_kernel(outside.info, kernel_id=kernel_id)
        assert again == kernel_id
        second = await client.execute(kernel_id, "print('second', x + 1)")
        assert second.stdout == "second 42\n", "the kernel kept its state"
        page = await client.transcript(kernel_id)
        seqs = [record["seq"] for record in page["records"]]
        assert seqs == sorted(set(seqs))
        assert seqs[-1] > head
        assert await _text(client, kernel_id) == "first 41\nsecond 42\n"

        # Restarting is the owner's business.
        with pytest.raises(GatewayHTTPError) as refused:
            await client.restart(kernel_id)
        assert refused.value.status == 409
        assert refused.value.reason == "kernel_not_owned"

        # An explicit shutdown does shut it down.
        await daemon.fetch(f"/api/kernels/{kernel_id}?shutdown=true", method="DELETE")
        deadline = time.monotonic() + seconds(30)
        while outside.alive():
            assert time.monotonic() < deadline, "shutdown=true left the kernel running"
            await asyncio.sleep(0.1)


async def test_channels_and_stream_on_an_attached_kernel(
    daemon: Daemon, outside: OutsideKernel
) -> None:
    daemon.start()
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN) as client:
        kernel_id = await client.attach_kernel(outside.info)
    ws = await daemon.channels(kernel_id)
    try:
        msg_id = ws.execute("for i in range(2000): print(i, flush=True)")
        received = await ws.until_idle(msg_id, timeout=60)
        assert received.text() == "".join(f"{i}\n" for i in range(2000))
    finally:
        ws.close()


async def test_bad_connection_info_is_a_clear_400(daemon: Daemon, outside: OutsideKernel) -> None:
    # A kernel that cannot answer (a wrong key) fails once attach_timeout has passed: half a
    # second, not the default 10, and not scaled: no kernel here is meant to answer, so a
    # slow machine cannot turn a short wait into a wrong result.
    daemon.start("--KernelAttacher.attach_timeout=0.5")
    await daemon.wait_ready()
    cases: list[tuple[Any, str]] = [
        ({"ip": "127.0.0.1"}, "invalid_connection_info"),
        ({**outside.info, "shell_port": 70000}, "invalid_connection_info"),
        ({**outside.info, "transport": "udp"}, "invalid_connection_info"),
        ("not an object", "invalid_connection_info"),
        ({**outside.info, "key": "wrong-key"}, "kernel_not_answering"),
    ]
    for info, reason in cases:
        with pytest.raises(HTTPClientError) as refused:
            await daemon.fetch(
                "/api/kernels",
                method="POST",
                body=json.dumps({"connection_info": info}),
                request_timeout=seconds(60),
            )
        assert refused.value.code == 400
        assert refused.value.response is not None
        assert json.loads(refused.value.response.body)["reason"] == reason
    kernels = await daemon.fetch("/api/kernels")
    assert kernels == []


async def test_a_watched_directory_attaches_and_detaches(daemon: Daemon, tmp_path: Path) -> None:
    watched = tmp_path / "watched"
    watched.mkdir()
    daemon.start(
        f"--KernelAttacher.connection_dir={watched}",
        "--KernelAttacher.connection_dir_interval=0.2",
    )
    await daemon.wait_ready()
    kernel = OutsideKernel(watched / "kernel-0b5b7a6e-3f1c-4d5e-9a8b-7c6d5e4f3a2b.json")
    kernel_id = "0b5b7a6e-3f1c-4d5e-9a8b-7c6d5e4f3a2b"
    try:
        async with GatewayClient(daemon.url, TOKEN) as client:
            deadline = time.monotonic() + seconds(30)
            while kernel_id not in {k["id"] for k in await client.list_kernels()}:
                assert time.monotonic() < deadline, daemon.log_text()
                await asyncio.sleep(0.1)
            result = await client.execute(kernel_id, "print('from the file')")
            assert result.stdout == "from the file\n"
            moved = tmp_path / "moved.json"
            (watched / kernel.path.name).rename(moved)
            deadline = time.monotonic() + seconds(30)
            while kernel_id in {k["id"] for k in await client.list_kernels()}:
                assert time.monotonic() < deadline, daemon.log_text()
                await asyncio.sleep(0.1)
            assert kernel.alive()
            moved.rename(watched / kernel.path.name)
            deadline = time.monotonic() + seconds(30)
            while kernel_id not in {k["id"] for k in await client.list_kernels()}:
                assert time.monotonic() < deadline, daemon.log_text()
                await asyncio.sleep(0.1)
            result = await client.execute(kernel_id, "print('back')")
            assert result.stdout == "back\n"
            assert await _text(client, kernel_id) == "from the file\nback\n"
    finally:
        kernel.stop()


async def test_a_kernel_that_stops_answering_shows_it(
    daemon: Daemon, outside: OutsideKernel
) -> None:
    daemon.start("--TapManager.heartbeat_interval=0.2", "--TapManager.heartbeat_timeout=1")
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN) as client:
        kernel_id = await client.attach_kernel(outside.info)
        await client.execute(kernel_id, "print('before')")
        outside.process.send_signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + seconds(30)
            while True:
                model = await daemon.fetch(f"/api/kernels/{kernel_id}")
                if model["execution_state"] == "unreachable":
                    break
                assert time.monotonic() < deadline, daemon.log_text()
                await asyncio.sleep(0.1)
            health = await daemon.fetch("/api/gateway/health")
            assert health["status"] == "degraded"
            assert kernel_id in json.dumps(health)
        finally:
            outside.process.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + seconds(30)
        while (await daemon.fetch(f"/api/kernels/{kernel_id}"))["execution_state"] == "unreachable":
            assert time.monotonic() < deadline, daemon.log_text()
            await asyncio.sleep(0.1)
        after = await client.execute(kernel_id, "print('after')")
        assert after.stdout == "after\n"
        records = (await client.transcript(kernel_id))["records"]
        events = [
            r["content"].get("event")
            for r in records
            if r["msg_type"] == "kernel_gateway_stream_lifecycle"
        ]
        assert events == ["unreachable", "reachable"]
        # A SIGSTOPped kernel keeps its connections: nothing was lost, so no gap record.
        assert not [r for r in records if r["msg_type"] == "kernel_gateway_stream_gap"]


def test_a_kernel_listed_before_jupyter_server_stamped_it_is_listed() -> None:
    """A kernel in the manager's list before jupyter_server stamped its ``last_activity``
    (another node's kernel being attached, one re-attached): jupyter_server's model raised
    on it, and ``GET /api/kernels`` answered 500 (seen polling a node of a cluster whose
    Redis had restarted empty, and a node listing a kernel another node had just started).
    A plain object raises AttributeError there; jupyter_server's own kernel manager, whose
    ``last_activity`` is a datetime trait with no default, raises TraitError."""
    from jupyter_server.services.kernels.kernelmanager import ServerKernelManager

    from kernel_gateway_stream.kernels.mapping import StreamMappingKernelManager

    class Unstamped:
        kernel_name = "python3"
        execution_state = "starting"

    manager = StreamMappingKernelManager()
    manager._kernels["k1"] = Unstamped()
    manager._kernels["k2"] = ServerKernelManager(kernel_name="python3")
    models = {model["id"]: model for model in manager.list_kernels()}
    assert set(models) == {"k1", "k2"}
    assert models["k1"]["execution_state"] == "starting"
    for model in models.values():
        assert model["last_activity"].endswith("Z")
