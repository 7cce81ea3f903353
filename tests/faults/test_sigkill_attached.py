"""Issue 25: SIGKILLs of the gateway in the middle of a flood of a kernel **attached by
connection file** (a plain ipykernel the gateway did not start: it holds nothing); two,
one after the other, in one flood.

Such a kernel prints on while no gateway listens, and its IOPub drops what nobody
subscribes to; the killed gateway's last records, sent to clients and not yet durable, are
lost too. What must hold: each restarted gateway re-attaches the kernel under its id, and
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


#: Lines of the flood seen (its highest line number) at which each kill lands.
KILL_AT = (1_000, 6_000)


async def test_sigkills_mid_flood_of_an_attached_kernel_leave_every_missing_line_counted(
    daemon: Daemon, tmp_path: Path
) -> None:
    """Two kills in one flood, each followed by a restart that re-attaches the kernel."""
    (tmp_path / "outside").mkdir()
    outside = OutsideKernel(tmp_path / "outside" / "kernel-outside.json")
    try:
        daemon.start()
        await daemon.wait_ready()
        async with GatewayClient(daemon.url, TOKEN) as client:
            kernel_id = await client.attach_kernel(outside.info)
        ws = await daemon.channels(kernel_id, protocol="v1")
        msg_id = ws.execute(FLOOD)
        for at in KILL_AT:
            highest = await ws.until_line_number(at, LINES - 1)
            assert highest < LINES - 1, "the kill lands before the flood ended"
            assert daemon.process is not None
            daemon.process.send_signal(signal.SIGKILL)
            daemon.process.wait()
            ws.close()
            assert outside.alive(), "the kernel outlives the gateway"
            daemon.start()
            await daemon.wait_ready()
            ws = await daemon.channels(kernel_id, protocol="v1")
        ws.close()
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
    not_kept = re.findall(
        rf"Transcript of kernel {kernel_id}: (\d+) records were given out but not kept", log
    )
    print(
        f"kills at lines {KILL_AT}: {len(missing)} of {LINES} lines missing; gaps "
        f"{[(g['reason'], g.get('lost'), g['last_seq'] - g['first_seq'] + 1) for g in gaps]}; "
        f"records not kept {not_kept}"
    )
    # A restart gap and a stopped gap per kill.
    assert len(restart) == len(KILL_AT), gaps
    assert all(isinstance(g.get("lost"), int) for g in restart), "what was unseen is counted"
    assert len(stopped) == len(KILL_AT), gaps
    # At most one run of missing lines per kill, where the gateway was away.
    runs = sum(1 for i, n in enumerate(missing) if i == 0 or missing[i - 1] != n - 1)
    assert runs <= len(KILL_AT), missing
    # At most what the gaps count (a line a message): the records each killed gateway had
    # numbered and not kept (each restarted one logs how many; its gap spans the numbers
    # reserved ahead too), and the messages the kernel numbered while it was away.
    assert len(not_kept) == len(KILL_AT), log[-3000:]
    assert len(missing) <= sum(map(int, not_kept)) + sum(g["lost"] for g in restart)
