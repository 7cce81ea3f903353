"""Issue 25 item 2: a SIGKILL of the gateway in the middle of a flood loses **no line** of
a kernel started through the gateway's launcher.

The launcher keeps every message it published until the gateway says it is durable, and
publishes what it kept again to the gateway started after the kill, which records what its
transcript does not have yet, and nothing twice (kernel_gateway_stream/kernel_launcher.py).
Each kill here lands further into a 30,000-line flood of a real ipykernel; the gateway is
killed alone (its kernel outlives it), started again, re-attaches the kernel, and the
transcript of the execution must then be every line, in order, once. The control is
tests/faults/test_sigkill.py: a kernel that keeps nothing (the firehose) loses the batch
the killed gateway had not made durable.
"""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from ..integration.daemon import Daemon
from ..integration.floods import flood_code, flood_text

KILLS = 5
#: From this kill on, the killed gateway commits half a second late.
LAGGING_FROM = 3
LINES = 30_000
FLOOD = flood_code(LINES)
EXPECTED = flood_text(LINES)


@pytest.mark.parametrize("attempt", range(KILLS))
async def test_a_sigkill_mid_flood_loses_no_line_of_a_launcher_kernel(
    daemon: Daemon, attempt: int
) -> None:
    # The last kills land while commits lag half a second behind what clients are sent (a
    # slow disk): thousands of lines were received and not yet durable, the kernel's first
    # ones among them (it keeps them only once told that acknowledgements will come, before
    # the first does).
    options = () if attempt < LAGGING_FROM else ("--SQLiteTranscriptStore.batch_linger=0.5",)
    daemon.start(*options)
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    kernel_pid = await daemon.kernel_pid()
    try:
        ws = await daemon.channels(kernel_id, protocol="v1")
        msg_id = ws.execute(FLOOD)
        seen = 0
        while seen < 2_000 + 5_000 * attempt:
            message = await ws.receive()
            assert message is not None
            if message["msg_type"] == "stream":
                seen += message["content"]["text"].count("\n")
        assert daemon.process is not None
        daemon.process.send_signal(signal.SIGKILL)  # the gateway alone
        daemon.process.wait()
        ws.close()

        daemon.start(*options)
        await daemon.wait_ready()
        await daemon.until_execution_ended(kernel_id, msg_id)
        text = await daemon.fetch(
            f"/api/kernels/{kernel_id}/transcript?format=text&parent={msg_id}"
        )
        lines = text.splitlines()
        missing = sorted(set(range(LINES)) - {int(line) for line in lines})
        print(f"kill {attempt}: after {seen} lines seen; {len(lines)} lines in the transcript")
        assert (len(missing), len(lines) - len(set(lines))) == (0, 0), f"missing {missing[:5]}"
        assert text == EXPECTED, "every line, in order"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(kernel_pid, signal.SIGKILL)
