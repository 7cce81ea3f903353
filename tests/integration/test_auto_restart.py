"""A kernel that dies by itself is restarted by jupyter_client's restarter: the transcript
says so once, and what a client sends at once, while the new kernel starts, runs on it.

Found by the sandbox's limit tests, whose first request after a kill waited out its timeout
every time. The restarter's restart announced itself as any restart does (the kernel
manager's hook, jupyter_server's ``restart`` event), so the gateway recorded a second
``restarting`` mark, "restart_requested", a moment after the first; the execute API closes
the kernel's executor at every such mark (its sockets were the old kernel's), and so closed
the one a request had just made and was waiting on: the request was sent on closed sockets,
to nobody, and its execution stayed ``queued`` for ever.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kernel_gateway_stream.client import GatewayClient, KernelDied

from ..timing import seconds
from .daemon import TOKEN, Daemon

CRASH = "import os\nos._exit(1)"


def restart_marks(records: list[dict[str, Any]]) -> list[tuple[str, int | None]]:
    return [
        (r["content"].get("reason"), r["content"].get("epoch"))
        for r in records
        if r["msg_type"] == "status" and r["content"].get("execution_state") == "restarting"
    ]


async def test_a_kernel_that_died_is_marked_once_and_what_is_sent_at_once_runs_on_the_new_one(
    daemon: Daemon,
) -> None:
    daemon.start()
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN, request_timeout=seconds(60)) as client:
        kernel_id = await client.start_kernel()
        # Both surfaces' sockets exist before the crash: the execute API's, and a named
        # /channels session's (JupyterLab's: it reconnects with its session id).
        assert (await client.execute(kernel_id, "x = 1")).ok
        page = await daemon.channels(kernel_id, protocol="v1")
        await page.until_idle(page.execute("y = 2"))
        page.close()
        try:
            crashed = await client.execute(kernel_id, CRASH)
        except KernelDied as died:
            crashed = died.result
        # "aborted" when the kernel died before its busy status went out.
        assert crashed is not None
        assert crashed.reason == "kernel_died", crashed
        # At once: the restarter has only begun the restart.
        result = await asyncio.wait_for(client.execute(kernel_id, "print('back')"), seconds(60))
        assert result.stdout == "back\n", result
        fresh = await client.execute(kernel_id, "print('x' in globals())")
        assert fresh.stdout == "False\n", fresh  # the new kernel ran it
        again = await daemon.channels(kernel_id, protocol="v1", session_id=page.session_id)
        reply = await again.until_idle(again.execute("print('page back')"), timeout=60)
        assert reply.text() == "page back\n"
        again.close()
        records = (await client.transcript(kernel_id, limit=1000))["records"]
        assert restart_marks(records) == [("kernel_died", 1)], restart_marks(records)
        lifecycle = "kernel_gateway_stream_lifecycle"
        notes = [r["content"] for r in records if r["msg_type"] == lifecycle]
        assert notes == [], notes  # nobody asked for a restart
        # A restart asked for is marked as one, and begins the next life.
        await client.restart(kernel_id)
        records = (await client.transcript(kernel_id, limit=1000))["records"]
        assert restart_marks(records) == [("kernel_died", 1), ("restart_requested", 2)]
        assert (await client.execute(kernel_id, "print('after')")).stdout == "after\n"
