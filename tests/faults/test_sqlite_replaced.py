"""Issue 25 item 4: the SQLite database replaced under a running daemon.

An empty file put in the database's place (as a careless restore or copy would), its
write-ahead log and shared memory removed, while a kernel prints. Before, every later
``GET /transcript`` of the live kernel answered 404 and the whole transcript was lost with
no gap record. Now the daemon moves that file aside (kept whole) and restores the database
it holds open: the transcript is served from then on, every line is in it once and in
order, and it is still whole after a restart of the daemon on that path.
"""

from __future__ import annotations

import asyncio

from tornado.httpclient import HTTPClientError

from ..integration.daemon import Daemon
from ..integration.waits import wait_until
from .harness import Harness

LINES = 400
#: A line every 10 ms: the replacement lands while the cell prints.
SLOW = f"import time\nfor i in range({LINES}):\n    print(i, flush=True)\n    time.sleep(0.01)"
EXPECTED = "".join(f"{i}\n" for i in range(LINES))


async def test_a_replaced_database_is_set_aside_and_the_transcript_goes_on_whole(
    daemon: Daemon,
) -> None:
    daemon.start("--SQLiteTranscriptStore.file_check_interval=0.2")
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    transcript = f"/api/kernels/{kernel_id}/transcript"
    ws = await daemon.channels(kernel_id)
    try:
        msg_id = ws.execute(SLOW)
        first = await ws.until_lines(50)
        await asyncio.to_thread(Harness._replace_sqlite, daemon)
        # Once the daemon has set the other file aside (within file_check_interval), the
        # live kernel's transcript is served: never a 404 (nor any other error). Before,
        # a reader that opens a new connection meanwhile may open the other file (a
        # fresh-clone run got one 500 there): that window is what is left.
        statuses = []
        running = asyncio.ensure_future(ws.until_idle(msg_id))
        while not running.done():
            restored = "kept as" in daemon.log_text()
            try:
                await daemon.fetch(f"{transcript}?limit=1")
                status = 200
            except HTTPClientError as error:
                status = error.code
            if restored:
                statuses.append(status)
            await asyncio.sleep(0.05)
        received = await running
    finally:
        ws.close()
    assert statuses, "the cell ended before the other file was set aside"
    assert set(statuses) == {200}, statuses
    assert first.text() + received.text() == EXPECTED, "the client got every line once"
    path = daemon.transcript_path
    [aside] = path.parent.glob(f"{path.name}.replaced-*")
    assert aside.stat().st_size == 0, "the file that replaced it is kept as it was"
    assert "kept as" in daemon.log_text()

    async def whole() -> bool:
        text = await daemon.fetch(f"{transcript}?format=text&parent={msg_id}")
        return bool(text == EXPECTED)

    await wait_until(whole, "every line in the transcript, once, in order")
    gaps = await daemon.fetch(f"{transcript}?msg_type=kernel_gateway_stream_gap")
    assert gaps["records"] == []
    daemon.stop()
    daemon.start()
    await daemon.wait_ready()
    await wait_until(whole, "the transcript still whole after a restart")
