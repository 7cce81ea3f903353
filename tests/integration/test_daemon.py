"""The standalone daemon as a real subprocess: service defaults, SIGKILL and restart."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from ..timing import seconds
from .daemon import Daemon


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
    await asyncio.sleep(seconds(1))  # let the writer commit its last batch
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
