"""Issue 25: a store that falls behind loses nothing of a kernel started by the gateway's
launcher.

The SQLite store keeps at most ``max_pending_bytes`` of records not yet durable; past it,
records become gap records, and a gap counts as durable: the gateway used to tell the
launcher's kernel so, and the kernel let go of lines no transcript would ever have. Now the
Tap of a kernel that keeps its output stops reading while the store has no room, and the
kernel keeps what it publishes (its own bound is ``iopub_hold_bytes``) until the store
catches up.

Here another connection holds the database's write lock for a while in the middle of a
flood, so the writer cannot commit, with a bound small enough (1 MiB, about a thousand
lines) to be reached within a second of the flood: every line must still be in the
transcript, in order, once, with no gap record. The control, a kernel that keeps nothing,
is ``tests/integration/test_store.py::test_backlog_past_its_bound_becomes_one_explicit_gap``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3

from ..integration.daemon import Daemon
from ..integration.floods import flood_code, flood_text
from ..timing import seconds
from .test_disk import health

LINES = 8_000
FLOOD = flood_code(LINES)
EXPECTED = flood_text(LINES)
#: How long the writer is locked out, from about line 500.
LOCKED = 3.0


async def test_a_store_behind_its_bound_loses_no_line_of_a_launcher_kernel(
    daemon: Daemon,
) -> None:
    daemon.start(f"--SQLiteTranscriptStore.max_pending_bytes={1024 * 1024}")
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    ws = await daemon.channels(kernel_id, protocol="v1")
    msg_id = ws.execute(FLOOD)
    seen = 0
    while seen < 500:
        message = await ws.receive()
        assert message is not None
        if message["msg_type"] == "stream":
            seen += message["content"]["text"].count("\n")
    blocker = sqlite3.connect(daemon.transcript_path, timeout=seconds(30))
    try:
        blocker.execute("BEGIN EXCLUSIVE")
        await asyncio.sleep(LOCKED)
        _, during = await health(daemon)
    finally:
        with contextlib.suppress(sqlite3.Error):
            blocker.rollback()
        blocker.close()
    ws.close()
    # The writer could not commit: the store said so (it retries), and dropped nothing
    # (failing, with a reason about dropped records, would say it had).
    assert during["status"] == "degraded", json.dumps(during["components"], indent=1)
    await daemon.until_execution_ended(kernel_id, msg_id)
    text = await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?format=text&parent={msg_id}")
    missing = sorted(set(range(LINES)) - {int(line) for line in text.splitlines()})
    assert missing == [], f"{len(missing)} lines missing, from {missing[:3]}"
    assert text == EXPECTED, "every line, in order, once"
    gaps = await daemon.fetch(
        f"/api/kernels/{kernel_id}/transcript?msg_type=kernel_gateway_stream_gap&limit=100"
    )
    assert gaps["records"] == []
