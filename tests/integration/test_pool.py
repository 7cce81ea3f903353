"""The warm pool (``GatewayStreamApp.kernel_pool``, :mod:`kernel_gateway_stream.kernels.pool`)
through the real daemon and real ipykernels: kernels taken in a row are each fresh and
handed out once, the pool fills up again, its kernels are listed nowhere until taken and
are shut down with the gateway, and those a SIGKILL of the gateway left are stopped at its
next start. (Sandboxed kernels from a pool: tests/integration/test_sandbox.py.)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

from kernel_gateway_stream.client import GatewayClient
from kernel_gateway_stream.kernels.pool import POOL_FILE, process_start_time

from ..timing import seconds
from .daemon import TOKEN, Daemon
from .waits import wait_until


def pool_option(sizes: dict[str, int]) -> str:
    return f"--GatewayStreamApp.kernel_pool={json.dumps(sizes)}"


async def pool_status(daemon: Daemon, name: str) -> dict[str, Any]:
    health = await daemon.fetch("/api/gateway/health")
    status: dict[str, Any] = health["components"]["kernel_pool"]["kernelspecs"][name]
    return status


async def until_ready(daemon: Daemon, name: str, count: int) -> None:
    async def full() -> bool:
        return bool((await pool_status(daemon, name))["ready"] >= count)

    await wait_until(full, f"{count} pooled {name} kernels ready", timeout=120)


def pooled_kernels(daemon: Daemon) -> list[dict[str, Any]]:
    path = daemon.home / "data" / "kernel_gateway_stream" / POOL_FILE
    kernels: list[dict[str, Any]] = json.loads(path.read_text())["kernels"]
    return kernels


def running(kernel: dict[str, Any]) -> bool:
    """Whether the pooled kernel's process (pid and start time) still runs."""
    return bool(kernel["pid"]) and process_start_time(kernel["pid"]) == kernel["pid_start"]


async def test_kernels_taken_in_a_row_are_fresh_and_the_pool_fills_again(daemon: Daemon) -> None:
    daemon.start(pool_option({"python3": 2}))
    await daemon.wait_ready()
    await until_ready(daemon, "python3", 2)
    waiting = pooled_kernels(daemon)
    assert len(waiting) == 2
    assert all(running(kernel) for kernel in waiting)
    # Listed nowhere until taken.
    assert await daemon.fetch("/api/kernels") == []
    taken: list[str] = []
    async with GatewayClient(daemon.url, TOKEN, request_timeout=seconds(60)) as client:
        for _ in range(20):
            kernel_id = await client.start_kernel("python3")
            code = "print('secret' in globals(), len(In))\nsecret = 1"
            result = await client.execute(kernel_id, code)
            # No variable of an earlier kernel, no code run before this one.
            assert result.stdout == "False 2\n", result
            transcript = await client.transcript(kernel_id)
            inputs = [r for r in transcript["records"] if r["msg_type"] == "execute_input"]
            assert [r["content"]["code"] for r in inputs] == [code]
            taken.append(kernel_id)
        assert len(set(taken)) == 20
        assert {kernel["kernel_id"] for kernel in waiting} <= set(taken)
        status = await pool_status(daemon, "python3")
        assert status["taken"] >= 2, status  # the first two at least came from the pool
        await until_ready(daemon, "python3", 2)
        listed = {kernel["id"] for kernel in await daemon.fetch("/api/kernels")}
        assert listed == set(taken)
        waiting = pooled_kernels(daemon)
        assert not {kernel["kernel_id"] for kernel in waiting} & set(taken)
    daemon.stop()
    assert daemon.process is not None
    assert daemon.process.returncode == 0
    await wait_until(
        lambda: not any(running(kernel) for kernel in waiting),
        "the pooled kernels to be shut down with the gateway",
    )
    assert json.loads((daemon.home / "data" / "kernel_gateway_stream" / POOL_FILE).read_text()) == {
        "kernels": []
    }


async def test_pooled_kernels_a_sigkill_left_are_stopped_at_the_next_start(
    daemon: Daemon,
) -> None:
    daemon.start(pool_option({"python3": 1}))
    await daemon.wait_ready()
    await until_ready(daemon, "python3", 1)
    [left] = pooled_kernels(daemon)
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGKILL)  # the gateway alone
    daemon.process.wait()
    started: list[dict[str, Any]] = []
    try:
        assert running(left)  # it outlived the gateway, as every kernel of the gateway does
        daemon.start(pool_option({"python3": 1}))
        await daemon.wait_ready()
        await wait_until(lambda: not running(left), "the pooled kernel left by the crash to go")
        assert not Path(left["connection_file"]).exists()
        await until_ready(daemon, "python3", 1)
        [fresh] = started = pooled_kernels(daemon)
        assert fresh["kernel_id"] != left["kernel_id"]
        # The crashed run's kernel was never handed out: nobody sees it.
        assert await daemon.fetch("/api/kernels") == []
        # With no kernel listed, the pool's own go with the gateway too (jupyter_server
        # shuts kernels down only if its kernel manager is truthy, which an empty
        # MultiKernelManager is not: they outlived every such stop).
        daemon.stop()
        assert daemon.process is not None
        assert daemon.process.returncode == 0
        await wait_until(lambda: not running(fresh), "the pooled kernel to go with the gateway")
    finally:
        for kernel in (left, *started):
            if running(kernel):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(kernel["pgid"] or kernel["pid"], signal.SIGKILL)
