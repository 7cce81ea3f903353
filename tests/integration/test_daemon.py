"""The standalone daemon as a real subprocess: service defaults, SIGKILL and restart."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import subprocess

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from ..timing import seconds
from .daemon import Daemon
from .waits import wait_until


@pytest.mark.smoke
async def test_daemon_serves_kernels_not_files_and_needs_its_token(daemon: Daemon) -> None:
    daemon.start()
    await daemon.wait_ready()
    client = AsyncHTTPClient()
    for headers in ({}, {"Authorization": "token wrong"}):
        with pytest.raises(HTTPClientError) as denied:
            await client.fetch(f"{daemon.url}/api/kernels", headers=headers)
        assert denied.value.code == 403
    specs = await daemon.fetch("/api/kernelspecs")
    assert "python3" in specs["kernelspecs"]
    for path in ("/api/contents", "/files/x", "/lab", "/tree", "/terminals/websocket/1"):
        with pytest.raises(HTTPClientError) as missing:
            await daemon.fetch(path)
        assert missing.value.code == 404
    listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout
    assert f"127.0.0.1:{daemon.port}" in listening


async def test_sigkilled_daemon_restarts_with_transcripts_and_numbering(daemon: Daemon) -> None:
    """Invariant 1 across a gateway restart: the transcript of a kernel recorded before a
    SIGKILL is served after it, and numbering for that kernel id continues above every
    number it may have given out (its durable reservation), the skipped range one
    explicit gap record."""
    daemon.start()
    await daemon.wait_ready()
    kernel = await daemon.fetch("/api/kernels", method="POST", body="{}")
    kernel_id = kernel["id"]
    ws = await daemon.channels(kernel_id, protocol="v1")
    msg_id = ws.execute("for i in range(5000): print(i, flush=True)")
    received = await ws.until_idle(msg_id)
    expected = "".join(f"{i}\n" for i in range(5000))
    assert received.text() == expected
    ws.close()
    before = await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?limit=1")

    async def all_written() -> bool:
        health = await daemon.fetch("/api/gateway/health")
        return health["components"]["store"]["pending_records"] == 0

    await wait_until(all_written, "the writer to commit its last batch")
    daemon.kill_hard()

    daemon.start()
    await daemon.wait_ready()
    text = await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?format=text&parent={msg_id}")
    assert text == expected
    after_restart = await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?limit=1")
    assert after_restart["running"] is False
    head = after_restart["head"]
    assert head > before["head"]
    gap = await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?since={before['head']}")
    records = gap["records"]
    # What the kernel published after `before` and was durable before the kill stays
    # (the statuses answering the Tap's own kernel_info nudges may come late on a slow
    # machine: the kernel reads its shell sockets fair-queued); the rest of the
    # reserved range is one gap record at the head.
    kept = records[:-1]
    assert "kernel_gateway_stream_gap" not in [r["msg_type"] for r in kept]
    assert [r["seq"] for r in kept] == list(
        range(before["head"] + 1, before["head"] + 1 + len(kept))
    )
    assert records[-1]["msg_type"] == "kernel_gateway_stream_gap"
    assert records[-1]["seq"] == head
    assert records[-1]["content"] == {
        "first_seq": before["head"] + 1 + len(kept),
        "last_seq": head,
        "reason": "gateway_stopped",
    }
    # The log says how many records were lost, not the reservation's size: none here
    # (everything was durable when the daemon was killed).
    logged = re.search(
        rf"Transcript of kernel {kernel_id}: (\d+) records were given out but not kept "
        r".*\(seqs (\d+)-(\d+)\)",
        daemon.log_text(),
    )
    assert logged is not None, daemon.log_text()[-3000:]
    assert [int(value) for value in logged.groups()] == [
        0,
        records[-1]["content"]["first_seq"],
        head,
    ]
    # A kernel started under the same id numbers on above the gap.
    await daemon.fetch("/api/kernels", method="POST", body=json.dumps({"kernel_id": kernel_id}))
    ws = await daemon.channels(kernel_id)
    msg_id = ws.execute("print('after the restart')")
    received = await ws.until_idle(msg_id)
    assert received.text() == "after the restart\n"
    assert received.seq_ranges()[0][0] > head
    page = await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?since={head}")
    assert page["records"][0]["seq"] == head + 1
    ws.close()


async def test_a_sigkill_logs_how_many_records_it_lost(daemon: Daemon) -> None:
    """Records numbered (and sent to clients) but not yet committed when the daemon is
    SIGKILLed are lost: the next start logs how many, not the reservation's range (which
    runs ``reserve_ahead`` past them). The writer is made to linger so they wait."""
    daemon.start(f"--SQLiteTranscriptStore.batch_linger={seconds(2)}")
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()

    def durable() -> tuple[int, int]:
        with contextlib.closing(sqlite3.connect(daemon.transcript_path)) as database:
            row = database.execute(
                "SELECT head, reserved FROM kernels WHERE kernel_id = ?", (kernel_id,)
            ).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    # The kernel's start is committed (a batch lingers, then commits with a reservation).
    await wait_until(lambda: durable()[1] > durable()[0] > 0, "a first commit", 60)
    ws = await daemon.channels(kernel_id)
    try:
        received = await ws.until_idle(ws.execute("print('lost with the daemon')"))
    finally:
        ws.close()
    head, reserved = durable()  # the print's records linger, not committed
    last_sent = received.seq_ranges()[-1][1]
    assert last_sent > head
    daemon.kill_hard()
    daemon.start()
    await daemon.wait_ready()
    logged = re.search(
        rf"Transcript of kernel {kernel_id}: (\d+) records were given out but not kept "
        r".*\(seqs (\d+)-(\d+)\)",
        daemon.log_text(),
    )
    assert logged is not None, daemon.log_text()[-3000:]
    missing, first, last = (int(value) for value in logged.groups())
    assert (first, last) == (head + 1, reserved)
    # Those the client was sent, and at most a status or two numbered after them.
    assert last_sent - head <= missing <= last_sent - head + 2
