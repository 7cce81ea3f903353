"""Item 13: a graceful stop. SIGTERM (or SIGINT without a terminal) stops accepting,
flushes the store within a bounded time, sends every client a last word with reason
``gateway_shutdown`` and the last seq it was sent, and exits."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

from benchmarks.firehose import install_kernelspec

from ..integration.daemon import Daemon
from ..integration.sseclient import SSEReader
from ..integration.wsclient import KernelWS
from ..timing import seconds

SLOW = "import time\nfor i in range(100000):\n    print(i, flush=True)\n    time.sleep(0.01)"


def last_seq(ws: KernelWS) -> int:
    """The last sequence number a client received (its whole history)."""
    return max(
        message["metadata"]["kernel_gateway_stream"]["seq"]
        for message in ws.history
        if "kernel_gateway_stream" in message["metadata"]
    )


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
async def test_every_client_learns_why_and_where_to_resume(
    daemon: Daemon, stop: signal.Signals
) -> None:
    daemon.start()
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    legacy = await daemon.channels(kernel_id)
    v1 = await daemon.channels(kernel_id, protocol="v1")
    reader = SSEReader(f"{daemon.url}/api/kernels/{kernel_id}/stream?since=0", daemon.headers)
    msg_id = legacy.execute(SLOW)
    await legacy.until_lines(50)
    await reader.until(lambda events: len(events) > 20)
    assert daemon.process is not None
    daemon.process.send_signal(stop)
    for ws in (legacy, v1):
        await ws.drain_until_closed()
        assert ws.ws.close_code == 1001
        reason = json.loads(ws.ws.close_reason or "{}")
        assert reason["reason"] == "gateway_shutdown"
        assert reason["last_seq"] == last_seq(ws)
    response = await asyncio.wait_for(reader.response, seconds(60))
    assert response.code == 200
    final = reader.events[-1]
    assert final.event == "gateway_shutdown"
    assert final.data["reason"] == "gateway_shutdown"
    assert final.data["last_seq"] == max(e.id for e in reader.events[:-1] if e.id is not None)
    code = await asyncio.get_running_loop().run_in_executor(None, daemon.process.wait, seconds(60))
    assert code == 0
    # The transcript was flushed: what the clients were sent is there after a restart.
    daemon.start()
    await daemon.wait_ready()
    page = await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?limit=1")
    assert page["head"] >= final.data["last_seq"]
    gaps = await daemon.fetch(
        f"/api/kernels/{kernel_id}/transcript?msg_type=kernel_gateway_stream_gap"
    )
    assert gaps["records"] == [], "a graceful stop leaves no gap"
    assert msg_id
    reader.close()


async def test_a_stop_during_a_firehose_ends_by_itself(daemon: Daemon, tmp_path: Path) -> None:
    """SIGTERM while a kernel floods at full speed: the stop reads what had arrived, within
    a bound, and ends (it read for ever while the kernel kept sending: the process never
    exited and was killed)."""
    install_kernelspec(tmp_path)
    daemon.start(env={"JUPYTER_PATH": str(tmp_path)})
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel("firehose")
    runner = await daemon.channels(kernel_id, protocol="v1")
    runner.execute("5000000 200")
    await runner.until_lines(20000)
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGTERM)
    try:
        code = daemon.process.wait(seconds(25))
    finally:
        runner.close()
    assert code == 0, daemon.log_text()[-3000:]
