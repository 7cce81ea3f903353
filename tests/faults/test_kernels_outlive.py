"""Kernels outlive the gateway: SIGKILL the daemon (not its kernels) while a kernel
prints, start it again, and the same kernel id answers with its state, its transcript
numbered on above every seq a client saw, the downtime marked as a gap record."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

from kernel_gateway_stream.client import GatewayClient

from ..integration.daemon import TOKEN, Daemon
from ..timing import seconds

PRINTS = """
import time
state = "kept across the gateway's death"
for i in range(1000000):
    print(i, flush=True)
    time.sleep(0.005)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def all_records(daemon: Daemon, kernel_id: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    since = 0
    while True:
        page = await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?since={since}&limit=10000")
        records += page["records"]
        if not page["records"]:
            return records
        since = page["next_since"]


async def test_a_kernel_outlives_a_sigkilled_gateway(daemon: Daemon) -> None:
    daemon.start()
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    kernel_pid = await daemon.kernel_pid()
    # A notebook's session on it (what a JupyterLab page finds its kernel by).
    session = {
        "path": "nb.ipynb",
        "name": "nb.ipynb",
        "type": "notebook",
        "kernel": {"id": kernel_id},
    }
    session_id = (await daemon.fetch("/api/sessions", method="POST", body=json.dumps(session)))[
        "id"
    ]
    ws = await daemon.channels(kernel_id, protocol="v1")
    ws.execute(PRINTS)
    lines = 0
    seen_seq = 0
    while lines < 200:
        message = await ws.receive()
        assert message is not None
        seen_seq = message["metadata"]["kernel_gateway_stream"]["seq"]
        if message["msg_type"] == "stream":
            lines += message["content"]["text"].count("\n")
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait()
    while (message := await ws.receive()) is not None:
        seen_seq = message["metadata"]["kernel_gateway_stream"]["seq"]
    ws.close()
    assert alive(kernel_pid), "the kernel must not die with the gateway"

    try:
        await asyncio.sleep(seconds(0.5))  # it prints on, unseen
        daemon.start()
        await daemon.wait_ready()
        # Asked at once, while the kernel is being re-attached: the session is kept.
        sessions = await daemon.fetch("/api/sessions")
        assert [(s["id"], s["kernel"]["id"]) for s in sessions] == [(session_id, kernel_id)]
        # So is the kernel's model (a page reconnecting at once asks for it).
        assert (await daemon.fetch(f"/api/kernels/{kernel_id}"))["id"] == kernel_id
        deadline = time.monotonic() + seconds(30)
        while kernel_id not in {k["id"] for k in await daemon.fetch("/api/kernels")}:
            assert time.monotonic() < deadline, daemon.log_text()
            await asyncio.sleep(0.1)
        model = await daemon.fetch(f"/api/kernels/{kernel_id}")
        assert model["name"] == "python3"

        # The same kernel, still printing: interrupt it, and its state is there.
        await daemon.fetch(f"/api/kernels/{kernel_id}/interrupt", method="POST", body="{}")
        deadline = time.monotonic() + seconds(30)
        while (await daemon.fetch(f"/api/kernels/{kernel_id}"))["execution_state"] != "idle":
            assert time.monotonic() < deadline, "the interrupt did not stop the cell"
            await asyncio.sleep(0.1)
        async with GatewayClient(daemon.url, TOKEN) as client:
            result = await client.execute(kernel_id, "print(state)")
        assert result.stdout == "kept across the gateway's death\n", result

        records = await all_records(daemon, kernel_id)
        seqs = [record["seq"] for record in records]
        assert seqs == sorted(set(seqs)), "no seq given twice"
        gaps = [r for r in records if r["msg_type"] == "kernel_gateway_stream_gap"]
        # The kernel held what it printed while nobody listened, and published it when the
        # gateway came back: the downtime is no gap at all.
        assert not [g for g in gaps if g["content"]["reason"] == "gateway_restart"], gaps
        after = [r for r in records if r["seq"] > seen_seq]
        assert any(r["msg_type"] == "stream" for r in after), "numbering goes on above"
        # Every line, in order, once: what the killed gateway had not made durable yet the
        # kernel kept, and published again (the numbers it had reserved are a gap record,
        # reason gateway_stopped, with no line in it).
        lines = [
            int(line)
            for r in records
            if r["msg_type"] == "stream" and r["parent_header"].get("msg_type") == "execute_request"
            for line in r["content"]["text"].splitlines()
            if line.isdigit()
        ]
        assert lines == sorted(set(lines)), "in order, once"
        missing = sorted(set(range(lines[-1] + 1)) - set(lines))
        assert not missing, missing
        assert [g["content"]["reason"] for g in gaps] in ([], ["gateway_stopped"]), gaps
        assert not any(r["msg_type"] == "kernel_gateway_stream_spool" for r in records)

        # The gateway started it: DELETE shuts it down, as for any kernel of its own.
        await daemon.fetch(f"/api/kernels/{kernel_id}", method="DELETE")
        deadline = time.monotonic() + seconds(30)
        while alive(kernel_pid):
            assert time.monotonic() < deadline, "DELETE left the recovered kernel running"
            await asyncio.sleep(0.1)
    finally:
        if alive(kernel_pid):
            os.kill(kernel_pid, signal.SIGKILL)


async def test_a_kernel_that_died_meanwhile_is_reported_and_forgotten(daemon: Daemon) -> None:
    daemon.start("--KernelAttacher.attach_timeout=2")
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    async with GatewayClient(daemon.url, TOKEN) as client:
        await client.execute(kernel_id, "print('once')")
    daemon.kill_hard()  # the daemon and its kernel
    daemon.start("--KernelAttacher.attach_timeout=2")
    await daemon.wait_ready()
    deadline = time.monotonic() + seconds(30)
    while "no longer answer" not in daemon.log_text():
        assert time.monotonic() < deadline, daemon.log_text()
        await asyncio.sleep(0.1)
    assert "1 no longer answer" in daemon.log_text()
    assert await daemon.fetch("/api/kernels") == []
    # Its transcript is still there to read.
    async with GatewayClient(daemon.url, TOKEN) as client:
        assert await client.transcript_text(kernel_id) == "once\n"
    daemon.stop()
    daemon.start()
    await daemon.wait_ready()
    assert "left by the previous run" not in daemon.log_text().split("Received signal 15")[-1]
