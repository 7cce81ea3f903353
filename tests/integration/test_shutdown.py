"""Shutting a kernel down while it restarts, or after it died; restarting it meanwhile.

A kernel that dies is restarted by jupyter_client's restarter at its next poll (every
``time_to_dead``: 3 s by default, 1 s here); the restart itself takes some 30 ms, and a
REST restart some 130 ms. A DELETE that lands inside either must still answer 204 and leave
nothing of the kernel running, including the process the restart started. Landing inside
the short automatic restart by luck is rare (about 1 % of DELETEs at a random delay after
the death), so that test sends its DELETE from the restarter's own ``restart`` callback,
which jupyter_client calls just before it restarts the kernel: every run hits the race. The
tests of a REST restart wait until ``ready``, the future jupyter_client keeps pending while
it restarts or shuts a kernel down, is pending."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import psutil
import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPResponse
from traitlets.config import Config

from kernel_gateway_stream.kernels import StreamMappingKernelManager

from ..timing import seconds
from .daemon import Daemon

# jupyter_client's KernelRestarter.time_to_dead: seconds between the restarter's polls (3 by
# default; what these tests look at happens before, around and after a poll, whatever the
# period, and each waited it out a few times).
RESTARTER_PERIOD = 1.0


def kernel_processes(kernel_id: str, parent: int | None = None) -> list[psutil.Process]:
    """The live processes, under ``parent`` (default: this one), started for ``kernel_id``:
    every kernel process has its connection file, named after the kernel id, on its command
    line, whichever restart started it and whether or not a manager still knows of it."""
    found = []
    for process in psutil.Process(parent).children(recursive=True):
        try:
            if any(kernel_id in argument for argument in process.cmdline()):
                found.append(process)
        except psutil.Error:  # gone, or a zombie: not running
            pass
    return found


def described(processes: list[psutil.Process]) -> list[str]:
    return [f"{process.pid} started {process.create_time():.3f}" for process in processes]


def running(pids: set[int]) -> set[int]:
    """Those of ``pids`` whose process still runs (neither gone nor a zombie)."""
    alive = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture
def jp_server_config(jp_server_config: Config) -> Config:
    """As the daemon runs, and as an operator opts in under ``jupyter server``."""
    jp_server_config.ServerApp.kernel_manager_class = StreamMappingKernelManager
    jp_server_config.KernelRestarter.time_to_dead = RESTARTER_PERIOD
    return jp_server_config


@pytest.fixture
def kernels(jp_fetch: Any) -> Any:
    class Kernels:
        async def delete(self, kernel_id: str) -> HTTPResponse:
            response: HTTPResponse = await jp_fetch(
                "api", "kernels", kernel_id, method="DELETE", raise_error=False
            )
            return response

        async def restart(self, kernel_id: str) -> HTTPResponse:
            response: HTTPResponse = await jp_fetch(
                "api", "kernels", kernel_id, "restart", method="POST", body="", raise_error=False
            )
            return response

        async def listed(self) -> list[str]:
            response = await jp_fetch("api", "kernels")
            return [kernel["id"] for kernel in json.loads(response.body)]

    return Kernels()


async def assert_gone(kernels: Any, kernel_id: str) -> None:
    assert kernel_id not in await kernels.listed()
    left = kernel_processes(kernel_id)
    assert not left, f"still running: {described(left)}"


async def until(condition: Any, timeout: float = 30) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(timeout)
    while not condition():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.001)


def kill(jp_serverapp: Any, kernel_id: str) -> int:
    """SIGKILL the kernel's process, as a crash would. Returns its pid."""
    pid: int = jp_serverapp.kernel_manager.get_kernel(kernel_id).provisioner.process.pid
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.parametrize("delay", [0, 0.01, 0.1, RESTARTER_PERIOD / 2, RESTARTER_PERIOD + 0.5])
async def test_delete_soon_after_the_kernel_died(
    jp_serverapp: Any, start_kernel: Any, kernels: Any, delay: float
) -> None:
    """Before the restarter noticed, around its poll, and after it restarted the kernel."""
    kernel_id = await start_kernel()
    killed = kill(jp_serverapp, kernel_id)
    await asyncio.sleep(delay)
    # By RESTARTER_PERIOD + 0.5 s, the process the restarter started instead.
    seen = {killed} | {process.pid for process in kernel_processes(kernel_id)}
    response = await kernels.delete(kernel_id)
    assert response.code == 204, response.body
    assert not running(seen)
    await assert_gone(kernels, kernel_id)


async def test_delete_while_the_restarter_restarts_the_kernel(
    jp_serverapp: Any, start_kernel: Any, kernels: Any
) -> None:
    kernel_id = await start_kernel()
    kernel = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    deletes: list[asyncio.Future[HTTPResponse]] = []

    def delete_now() -> None:
        # Called by the restarter, synchronously, just before it restarts the kernel.
        deletes.append(asyncio.ensure_future(kernels.delete(kernel_id)))

    kernel.add_restart_callback(delete_now, "restart")
    kill(jp_serverapp, kernel_id)
    await until(lambda: deletes, timeout=RESTARTER_PERIOD * 3)
    response = await deletes[0]
    assert response.code == 204, response.body
    await assert_gone(kernels, kernel_id)
    # The restart is over, and nothing of it runs.
    assert kernel.ready.done()
    assert not kernel.has_kernel


async def test_delete_during_a_requested_restart(
    jp_serverapp: Any, start_kernel: Any, kernels: Any
) -> None:
    kernel_id = await start_kernel()
    kernel = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    restart = asyncio.ensure_future(kernels.restart(kernel_id))
    await until(lambda: not kernel.ready.done())  # the restart is under way
    response = await kernels.delete(kernel_id)
    assert response.code == 204, response.body
    assert (await restart).code == 200
    await assert_gone(kernels, kernel_id)


async def test_restart_requested_during_a_delete_is_refused(
    jp_serverapp: Any, start_kernel: Any, kernels: Any
) -> None:
    kernel_id = await start_kernel()
    kernel = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    delete = asyncio.ensure_future(kernels.delete(kernel_id))
    await until(lambda: not kernel.ready.done())  # the shutdown is under way
    restart = await kernels.restart(kernel_id)
    # jupyter_server's handler answers every failed restart with 500.
    assert restart.code >= 400
    response = await delete
    assert response.code == 204, response.body
    await assert_gone(kernels, kernel_id)


async def test_two_deletes_at_once_both_answer(start_kernel: Any, kernels: Any) -> None:
    kernel_id = await start_kernel()
    responses = await asyncio.gather(kernels.delete(kernel_id), kernels.delete(kernel_id))
    assert [response.code for response in responses] == [204, 204]
    await assert_gone(kernels, kernel_id)


async def test_two_restarts_at_once_leave_one_kernel(
    jp_serverapp: Any, start_kernel: Any, kernels: Any
) -> None:
    kernel_id = await start_kernel()
    kernel = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    responses = await asyncio.gather(kernels.restart(kernel_id), kernels.restart(kernel_id))
    assert [response.code for response in responses] == [200, 200]
    running = kernel_processes(kernel_id)
    assert [process.pid for process in running] == [kernel.provisioner.process.pid]
    assert (await kernels.delete(kernel_id)).code == 204
    await assert_gone(kernels, kernel_id)


class TestRestartsRanOut:
    """The restarter gives up at once (restart_limit 0): the kernel is dead."""

    @pytest.fixture
    def jp_server_config(self, jp_server_config: Any) -> Any:
        jp_server_config.KernelRestarter.restart_limit = 0
        return jp_server_config

    async def test_delete_a_dead_kernel(
        self, jp_serverapp: Any, start_kernel: Any, kernels: Any
    ) -> None:
        kernel_id = await start_kernel()
        kernel = jp_serverapp.kernel_manager.get_kernel(kernel_id)
        died = asyncio.get_running_loop().create_future()
        kernel.add_restart_callback(lambda: died.set_result(None), "dead")
        kill(jp_serverapp, kernel_id)
        await asyncio.wait_for(died, seconds(RESTARTER_PERIOD * 3))
        response = await kernels.delete(kernel_id)
        assert response.code == 404
        body = json.loads(response.body)
        assert body["reason"] == "unknown_kernel"
        assert kernel_id in body["message"]
        await assert_gone(kernels, kernel_id)
        # jupyter_server only forgets a dead kernel; the gateway also finishes its shutdown.
        await until(lambda: not os.path.exists(kernel.connection_file))


async def test_daemon_delete_during_a_requested_restart(daemon: Daemon) -> None:
    """The daemon, as a subprocess, on its default kernel manager: a DELETE while a REST
    restart waits for the old kernel to exit, which this kernel puts off for a second."""
    exiting = daemon.home / "exiting"
    daemon.start()
    await daemon.wait_ready()
    kernel_id = (await daemon.fetch("/api/kernels", method="POST", body="{}"))["id"]
    ws = await daemon.channels(kernel_id)
    code = (
        "import atexit, pathlib, time\n"
        f"atexit.register(lambda: (pathlib.Path({str(exiting)!r}).touch(), "
        f"time.sleep({seconds(1)})))"
    )
    await ws.until_idle(ws.execute(code))
    ws.close()
    restart = asyncio.ensure_future(
        daemon.fetch(f"/api/kernels/{kernel_id}/restart", method="POST", body="")
    )
    await until(exiting.exists)  # the restart asked the old kernel to shut down
    await daemon.fetch(f"/api/kernels/{kernel_id}", method="DELETE")
    await restart
    assert kernel_id not in [kernel["id"] for kernel in await daemon.fetch("/api/kernels")]
    assert daemon.process is not None
    left = kernel_processes(kernel_id, parent=daemon.process.pid)
    assert not left, f"still running: {described(left)}"
    assert "restarted before its shutdown" in daemon.log.read_text()


async def test_an_interrupt_during_a_shutdown_is_a_clear_409(daemon: Any) -> None:
    """An interrupt that lands while the kernel is being shut down answers 409 with a JSON
    reason (jupyter_client raised, and the API answered 500)."""
    daemon.start()
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    client = AsyncHTTPClient()
    url = f"{daemon.url}/api/kernels/{kernel_id}"
    deleting = asyncio.ensure_future(
        client.fetch(url, method="DELETE", headers=daemon.headers, raise_error=False)
    )
    answers = []
    while not deleting.done():
        response = await client.fetch(
            f"{url}/interrupt", method="POST", body="", headers=daemon.headers, raise_error=False
        )
        answers.append(response.code)
        await asyncio.sleep(0.01)
    assert (await deleting).code == 204
    assert 500 not in answers
    assert set(answers) <= {204, 404, 409}
