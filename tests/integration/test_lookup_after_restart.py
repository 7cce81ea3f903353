"""Just after a restart of the gateway, while the kernels its earlier run left are being
re-attached, every surface waits for its kernel as ``/channels`` does, instead of saying
that the kernel does not exist (one lookup, one policy: ``Services.locate``).

The window is held open on purpose: the kernel is stopped (SIGSTOP) while the gateway is
killed and started again, so the re-attachment's heartbeat ping waits until the test lets
the kernel go on (SIGCONT), with the requests already in.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

from tornado.httpclient import AsyncHTTPClient

from ..faults.test_kernels_outlive import alive
from ..timing import seconds
from .daemon import Daemon
from .sseclient import SSEReader, stream_text

SLEEP = 2.0
OPTIONS = ("--KernelAttacher.attach_timeout=60",)


async def kernel_ids(daemon: Daemon) -> set[str]:
    return {kernel["id"] for kernel in await daemon.fetch("/api/kernels")}


async def store_health(daemon: Daemon) -> dict[str, Any]:
    health = await daemon.fetch("/api/gateway/health")
    details: dict[str, Any] = health["components"]["store"]
    return details


async def test_every_surface_waits_for_a_kernel_being_re_attached(daemon: Daemon) -> None:
    daemon.start(*OPTIONS)
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    kernel_pid = await daemon.kernel_pid()
    base = f"/api/kernels/{kernel_id}"
    try:
        code = f"import time\ntime.sleep({SLEEP})\nprint('slept')"
        started = await daemon.fetch(
            f"{base}/execute", method="POST", body=json.dumps({"code": code})
        )
        msg_id = started["msg_id"]
        deadline = time.monotonic() + seconds(60)
        while (await daemon.fetch(f"{base}/executions/{msg_id}"))["status"] != "running":
            assert time.monotonic() < deadline, daemon.log_text()
            await asyncio.sleep(0.05)
        # Its start is written (a SIGKILL loses what is not: that is another test's subject).
        while (await store_health(daemon))["pending_records"]:
            assert time.monotonic() < deadline, daemon.log_text()
            await asyncio.sleep(0.05)
        assert daemon.process is not None
        daemon.process.send_signal(signal.SIGKILL)  # the gateway only: its kernel runs on
        daemon.process.wait()

        os.kill(kernel_pid, signal.SIGSTOP)  # mid-sleep: it answers no ping until SIGCONT
        daemon.start(*OPTIONS)
        await daemon.wait_ready()
        assert kernel_id not in await kernel_ids(daemon), "re-attached already: no window"

        url = daemon.url + base
        events = SSEReader(f"{url}/executions/{msg_id}/events", daemon.headers)
        stream = SSEReader(f"{url}/stream?since=0", daemon.headers)
        execute = AsyncHTTPClient().fetch(
            f"{url}/execute",
            method="POST",
            headers=daemon.headers,
            body=json.dumps({"code": "print('after the restart')"}),
            raise_error=False,
            request_timeout=seconds(120),
        )
        try:
            # The requests are in while the kernel cannot be re-attached: each waits for it.
            await asyncio.sleep(seconds(1))
            assert not execute.done(), execute.result().body
            assert not events.response.done(), events.raw
            assert not stream.response.done(), stream.raw
            os.kill(kernel_pid, signal.SIGCONT)
            answered = await execute
            assert answered.code == 201, answered.body
            done = await events.until(lambda seen: any(e.event == "done" for e in seen))
            # Followed live to its real end (not "done" at once from the transcript, with the
            # execution still running). What it printed just after SIGCONT may have gone to
            # the old gateway's subscription: not this test's subject.
            assert done[-1].data["status"] == "ok", done[-1].data
            after = "after the restart\n"
            events_seen = await stream.until(lambda seen: after in stream_text(seen))
            assert after in stream_text(events_seen)
        finally:
            events.close()
            stream.close()
        assert kernel_id in await kernel_ids(daemon)
    finally:
        if alive(kernel_pid):
            os.kill(kernel_pid, signal.SIGKILL)
            os.kill(kernel_pid, signal.SIGCONT)
