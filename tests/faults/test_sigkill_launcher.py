"""Issue 25 item 2: a SIGKILL of the gateway in the middle of a flood loses **no line** of
a kernel started through the gateway's launcher.

The launcher keeps every message it published until the gateway says it is durable, and
publishes what it kept again to the gateway started after the kill, which records what its
transcript does not have yet, and nothing twice (kernel_gateway_stream/kernel_launcher.py).
Five kills land one after another, each further into one 40,000-line flood of a real
ipykernel; each time the gateway is killed alone (its kernel outlives it), started again,
and re-attaches the kernel, which floods on meanwhile; the transcript of the execution
must then be every line, in order, once. The control is
tests/faults/test_sigkill.py: a kernel that keeps nothing (the firehose) loses the batch
the killed gateway had not made durable.
"""

from __future__ import annotations

import contextlib
import os
import signal

from ..integration.daemon import Daemon
from ..integration.wsclient import KernelWS

#: Lines of the flood seen (its highest line number) at which each kill lands.
KILL_AT = (2_000, 7_000, 12_000, 17_000, 22_000)
#: From this kill on, the gateway commits half a second late.
LAGGING_FROM = 3
LINES = 40_000
FLOOD = f"for i in range({LINES}): print(i, flush=True)"
EXPECTED = "".join(f"{i}\n" for i in range(LINES))


async def highest_line(ws: KernelWS, at_least: int) -> int:
    """Read the flood until its highest line number is at least ``at_least`` (or the
    flood ended); return that line number."""
    highest = -1
    while highest < at_least:
        message = await ws.receive()
        assert message is not None
        if message["msg_type"] == "stream":
            highest = max([highest, *map(int, message["content"]["text"].split())])
        if highest == LINES - 1:
            break
    return highest


async def test_sigkills_mid_flood_lose_no_line_of_a_launcher_kernel(daemon: Daemon) -> None:
    """Five kills of the gateway in one flood, each further in; the last ones while
    commits lag half a second behind what clients are sent (a slow disk), so thousands of
    lines were received and not yet durable when the gateway died."""
    daemon.start()
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    [kernel_pid] = daemon.kernel_pids()
    try:
        ws = await daemon.channels(kernel_id, protocol="v1")
        msg_id = ws.execute(FLOOD)
        for kill, at in enumerate(KILL_AT):
            highest = await highest_line(ws, at)
            assert highest < LINES - 1, f"kill {kill} would land after the flood ended"
            assert daemon.process is not None
            daemon.process.send_signal(signal.SIGKILL)  # the gateway alone
            daemon.process.wait()
            ws.close()
            options = (
                () if kill + 1 < LAGGING_FROM else ("--SQLiteTranscriptStore.batch_linger=0.5",)
            )
            daemon.start(*options)
            await daemon.wait_ready()
            print(f"kill {kill}: after line {highest}")
            ws = await daemon.channels(kernel_id, protocol="v1")
        ws.close()
        await daemon.until_execution_ended(kernel_id, msg_id)
        text = await daemon.fetch(
            f"/api/kernels/{kernel_id}/transcript?format=text&parent={msg_id}"
        )
        lines = text.splitlines()
        missing = sorted(set(range(LINES)) - {int(line) for line in lines})
        print(f"{len(lines)} lines in the transcript")
        assert (len(missing), len(lines) - len(set(lines))) == (0, 0), f"missing {missing[:5]}"
        assert text == EXPECTED, "every line, in order"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(kernel_pid, signal.SIGKILL)
