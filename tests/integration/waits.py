"""Waiting on a real kernel's state in the tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..timing import seconds


async def until_restarted(kernel: Any, timeout: float = 60) -> None:
    """Until a kernel that died has been restarted by jupyter_client's restarter, so the
    fixtures can shut it down (jupyter_client trips over a restart still in progress)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(timeout)
    while not (kernel.ready.done() and await kernel.is_alive()) and loop.time() < deadline:
        await asyncio.sleep(0.1)


async def wait_until(predicate: Any, what: str | Callable[[], str], timeout: float = 30) -> None:
    """Until ``predicate()`` (a function, or a coroutine function) is true; fails naming
    ``what`` (or what ``what()`` says then) after ``timeout`` seconds, scaled for this
    machine."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(timeout)
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if loop.time() > deadline:
            raise AssertionError(
                f"timed out waiting for {what if isinstance(what, str) else what()}"
            )
        await asyncio.sleep(0.05)
