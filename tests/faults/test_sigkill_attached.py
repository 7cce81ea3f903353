"""Issue 25: a SIGKILL of the gateway in the middle of a flood of a kernel **attached by
connection file** (a plain ipykernel the gateway did not start: it holds nothing).

Such a kernel prints on while no gateway listens, and its IOPub drops what nobody
subscribes to; the killed gateway's last records, sent to clients and not yet durable, are
lost too. What must hold: the restarted gateway re-attaches the kernel under its id, and
every line missing from the transcript is inside the gap records there, whose counts are
at least what is missing: the numbers the killed gateway had given out (``gateway_stopped``,
a range) and what the kernel printed unwatched (``gateway_restart``, with ``lost`` counted
by jupyter_client's message numbering: an upper bound, no longer ``null``). The control is
tests/faults/test_sigkill_launcher.py: a kernel of the gateway's launcher loses nothing.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from kernel_gateway_stream.client import GatewayClient

from ..integration.daemon import TOKEN, Daemon
from ..integration.test_attach import OutsideKernel
from .test_kernels_outlive import all_records

GAP = "kernel_gateway_stream_gap"
LINES = 20_000
#: A line per message: written whole (print writes the number and its newline apart, and a
#: timed flush may send them apart), then flushed (which waits until its message is sent);
#: paced so that the flood outlasts the restart.
FLOOD = (
    f"import sys, time\nfor i in range({LINES}):\n"
    "    sys.stdout.write(f'{i}\\n'); sys.stdout.flush(); time.sleep(0.0003)"
)


@pytest.mark.parametrize("kill_after", [1_000, 6_000])
async def test_a_sigkill_mid_flood_of_an_attached_kernel_leaves_every_missing_line_counted(
    daemon: Daemon, tmp_path: Path, kill_after: int
) -> None:
    (tmp_path / "outside").mkdir()
    outside = OutsideKernel(tmp_path / "outside" / "kernel-outside.json")
    try:
        daemon.start()
        await daemon.wait_ready()
        async with GatewayClient(daemon.url, TOKEN) as client:
            kernel_id = await client.attach_kernel(outside.info)
        ws = await daemon.channels(kernel_id, protocol="v1")
        msg_id = ws.execute(FLOOD)
        seen = 0
        while seen < kill_after:
            message = await ws.receive()
            assert message is not None
            if message["msg_type"] == "stream":
                seen += message["content"]["text"].count("\n")
        assert daemon.process is not None
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait()
        ws.close()
        assert outside.alive(), "the kernel outlives the gateway"

        daemon.start()
        await daemon.wait_ready()
        await daemon.until_execution_ended(kernel_id, msg_id)
        records = await all_records(daemon, kernel_id)
        log = daemon.log_text()
    finally:
        outside.stop()
    kept = [
        int(line)
        for r in records
        if r["msg_type"] == "stream" and r["parent_header"].get("msg_id") == msg_id
        for line in r["content"]["text"].splitlines()
    ]
    assert kept == sorted(set(kept)), "in order, none twice"
    missing = sorted(set(range(LINES)) - set(kept))
    gaps = [r["content"] for r in records if r["msg_type"] == GAP]
    restart = [g for g in gaps if g["reason"] == "gateway_restart"]
    stopped = [g for g in gaps if g["reason"] == "gateway_stopped"]
    print(
        f"kill after {kill_after} lines: {len(missing)} of {LINES} lines missing; gaps "
        f"{[(g['reason'], g.get('lost'), g['last_seq'] - g['first_seq'] + 1) for g in gaps]}; "
        + (re.findall(r"(\d+) records were given out but not kept", log) or ["none"])[0]
        + " records not kept"
    )
    assert len(restart) == 1, gaps
    assert isinstance(restart[0].get("lost"), int), "what the kernel printed unseen is counted"
    # One run of missing lines, where the gateway was away.
    assert missing == list(range(missing[0], missing[-1] + 1)) if missing else True
    # At most what the gaps count (a line a message): the records the killed gateway had
    # numbered and not kept (the restarted one logs how many; its gap spans the numbers
    # reserved ahead too), and the messages the kernel numbered while it was away.
    assert len(stopped) == 1, gaps
    not_kept = re.search(
        rf"Transcript of kernel {kernel_id}: (\d+) records were given out but not kept", log
    )
    assert not_kept is not None, log[-3000:]
    assert len(missing) <= int(not_kept.group(1)) + restart[0]["lost"]
