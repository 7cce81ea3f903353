"""Large coalesced frames reach a client that stopped reading and one that did not, whole.

The fan-out writes a turn's frames of 64 KiB and more to each client as the frames
themselves, which all clients share (``sendmsg``, and tornado's buffer for what the socket
does not take), not joined per client. A client that stops reading for the whole flood
fills its socket's buffers, so its writes are cut anywhere, inside a frame too; when it
reads again it must get every line once, in order, byte for byte."""

from __future__ import annotations

import asyncio
from typing import Any

from .test_channels import assert_contiguous
from .wsclient import Received, describe

LINES = 1_500
WIDTH = 8_000
CODE = f"for i in range({LINES}): print(str(i).rjust(8) + 'x' * {WIDTH}, flush=True)"
TEXT = "".join(str(i).rjust(8) + "x" * WIDTH + "\n" for i in range(LINES))


async def test_a_stalled_and_a_live_client_get_every_large_line(
    start_kernel: Any, connect: Any, transcript: Any
) -> None:
    kernel_id = await start_kernel()
    live = await connect(kernel_id, protocol="v1")
    stalled = await connect(kernel_id, protocol="v1")
    legacy = await connect(kernel_id, protocol="legacy")
    msg_id = live.execute(CODE)
    # 12 MB: more than loopback's socket buffers take before the stalled client reads.
    received = await asyncio.gather(live.until_idle(msg_id), legacy.until_idle(msg_id))
    received.append(await stalled.until_idle(msg_id))
    for name, one in zip(("live", "legacy", "stalled"), received, strict=True):
        assert one.text() == TEXT, f"{name}: {difference(one.text())}; {summary(one)}"
        assert_contiguous(one)
    recorded = await transcript(kernel_id, format="text", parent=msg_id)
    assert recorded == TEXT, f"transcript: {difference(recorded)}"


def difference(text: str) -> str:
    """Where ``text`` first departs from TEXT, line by line, without 12 MB of repr."""
    got, want = text.split("\n"), TEXT.split("\n")
    index = next(
        (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
        min(len(got), len(want)),
    )

    def show(lines: list[str]) -> list[str]:
        return [f"{line[:12]!r}…({len(line)})" for line in lines[max(0, index - 1) : index + 2]]

    return (
        f"{len(text)} characters, {len(got) - 1} lines (of {len(want) - 1}); first difference"
        f" at line {index}: got {show(got)}, want {show(want)}"
    )


def summary(received: Received) -> str:
    """The seq ranges around what was received, and the message counts."""
    ranges = received.seq_ranges()
    return f"{describe(received.messages)}; seq ranges {ranges[:3]}…{ranges[-3:]} of {len(ranges)}"
