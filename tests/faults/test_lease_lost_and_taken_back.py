"""Issue 25: a node that loses its kernel's lease while Redis does not answer, and takes it
back, records what the kernel publishes again.

While Redis is paused the owner goes on numbering what the kernel prints, and writes none
of it; past the lease's TTL it lets the kernel go, and what it numbered and did not write
is not the history (its takeover covers those numbers with a gap). The kernel, of the
gateway's launcher, holds whatever was not acknowledged and publishes it again to the
node that reads it next. Found by the 50-fault schedule (executions that never ended): when
that node was the same one, it passed over those messages as ones it had, since it still
knew their msg_ids; their lines and the execution's idle were in the transcript nowhere.
One real node on a redis-server of the test's own, a kernel printing a line every 10 ms:
after the pause every line is in the transcript, once, in order, and the execution ended.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from ..integration.redis_server import RedisServer
from ..integration.waits import wait_until
from .test_redis_paused_health import ticking_node

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("several-nodes")]

LINES = 1000
#: The lease's TTL, and how long Redis is paused: past it, the lease is lost.
LEASE_TTL = 2.0
PAUSE = LEASE_TTL + 2.0


async def test_a_lease_lost_while_redis_was_paused_and_taken_back_loses_no_line(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    async with ticking_node(own_redis, tmp_path, LEASE_TTL, LINES) as ticking:
        node, kernel_id, ws, msg_id = ticking.node, ticking.kernel_id, ticking.ws, ticking.msg_id
        await ws.until_lines(50)
        assert own_redis.process is not None
        own_redis.process.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(PAUSE)  # the fault itself: Redis silent for this long
        finally:
            own_redis.process.send_signal(signal.SIGCONT)
        ws.close()

        def lost_and_taken_back() -> bool:
            log = node.log_text()
            return "Lost the lease of kernel" in log and f"Took kernel {kernel_id} over" in log

        await wait_until(lost_and_taken_back, "the node to lose the lease and take it back", 60)
        await node.until_execution_ended(kernel_id, msg_id)
        summary = await node.fetch(f"/api/kernels/{kernel_id}/executions/{msg_id}")
        assert summary["status"] == "ok", summary
        text = await node.fetch(f"/api/kernels/{kernel_id}/transcript?format=text&parent={msg_id}")
        lines = [int(line) for line in text.splitlines()]
        missing = sorted(set(range(LINES)) - set(lines))
        assert missing == [], f"{len(missing)} lines missing, from {missing[:3]}"
        assert lines == list(range(LINES)), "every line once, in order"
