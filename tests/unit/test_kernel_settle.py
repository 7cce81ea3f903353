"""until_settled follows a jupyter_client kernel manager's ``ready`` future through a restart."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from kernel_gateway_stream.kernels import until_settled


def test_a_settled_kernel_is_not_waited_for() -> None:
    async def scenario() -> bool:
        ready = asyncio.get_running_loop().create_future()
        ready.set_result(None)
        return await until_settled(SimpleNamespace(ready=ready))

    assert asyncio.run(scenario()) is False


def test_a_restart_is_waited_for_through_both_of_its_futures() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        kernel = SimpleNamespace(ready=loop.create_future())
        settled = asyncio.ensure_future(until_settled(kernel))
        await asyncio.sleep(0)
        # The restart's shutdown is done and its start begins, in one step, as in
        # jupyter_client's KernelManager._async_restart_kernel.
        shutdown, kernel.ready = kernel.ready, loop.create_future()
        shutdown.set_result(None)
        for _ in range(3):
            await asyncio.sleep(0)
        assert not settled.done()
        # A start that failed ends the restart too.
        kernel.ready.set_exception(RuntimeError("the kernel could not be launched"))
        assert await settled is True
        assert isinstance(kernel.ready.exception(), RuntimeError)

    asyncio.run(scenario())
