"""Issue 25, item 3: health is never ``ok`` while Redis does not answer.

A paused Redis (SIGSTOP), like one the network cut off, fails no request until the client's
socket times out, 10 s later: meanwhile nothing becomes durable and the kernel directory is
not read, and every node's health said ``ok`` (the fault runs counted 36 to 59 such samples
per three pauses). One real node on a redis-server of the test's own, a kernel printing
a line every 10 ms: within a few seconds of the pause the node's health is ``degraded``,
the cluster component ``directory_stalled`` and the store ``writes_stalled``; after it,
``ok`` again, and every line is in the transcript once, in order.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient

from ..integration.daemon import Daemon
from ..integration.redis_server import RedisServer
from ..integration.test_several_nodes import CLUSTER_SECRET, Cluster
from ..integration.waits import wait_until
from ..integration.wsclient import KernelWS
from ..timing import seconds

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("several-nodes")]

LINES = 500


@dataclass
class Ticking:
    """One node of a cluster of its own, with a kernel printing ``lines`` numbered lines,
    one every 10 ms, to the client ``ws`` that asked (execution ``msg_id``)."""

    node: Daemon
    kernel_id: str
    ws: KernelWS
    msg_id: str


@contextlib.asynccontextmanager
async def ticking_node(
    own_redis: RedisServer, tmp_path: Path, lease_ttl: float, lines: int
) -> AsyncIterator[Ticking]:
    """A cluster of one node, ``a``, on the test's own redis-server, its kernel ticking;
    on the way out the node stops and the kernel is killed (a node's kernels outlive its
    stop: another node would take them over)."""
    await own_redis.wait_ready()
    cluster = Cluster(tmp_path, own_redis.url, names="a")
    node = cluster.nodes["a"]
    node.start(
        f"--RedisTranscriptStore.key_prefix={cluster.prefix}",
        f"--ClusterNode.lease_ttl={lease_ttl}",
        "--ClusterNode.sync_interval=0.3",
        "--ClusterNode.allow_unauthenticated_redis=True",
        env={"KGS_REDIS_URL": own_redis.url, "KGS_CLUSTER_SECRET": CLUSTER_SECRET},
    )
    kernel_pids: list[int] = []
    try:
        await node.wait_ready()
        kernel_id = await node.start_kernel()
        kernel_pids = node.kernel_pids()
        ws = await node.channels(kernel_id)
        code = (
            f"import time\nfor i in range({lines}):\n    print(i, flush=True)\n    time.sleep(0.01)"
        )
        yield Ticking(node, kernel_id, ws, ws.execute(code))
    finally:
        cluster.stop()
        for pid in kernel_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_health_leaves_ok_while_redis_is_paused(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    # A lease that outlasts the pause: this test is about health, not a takeover.
    async with ticking_node(own_redis, tmp_path, seconds(20), LINES) as ticking:
        node, kernel_id, ws, msg_id = ticking.node, ticking.kernel_id, ticking.ws, ticking.msg_id
        await ws.until_lines(20)

        async def health() -> dict[str, Any]:
            response = await AsyncHTTPClient().fetch(
                node.url + "/api/gateway/health", headers=node.headers, raise_error=False
            )
            body: dict[str, Any] = json.loads(response.body)
            return body

        assert (await health())["status"] == "ok"
        assert own_redis.process is not None
        own_redis.process.send_signal(signal.SIGSTOP)
        try:
            seen: dict[str, str] = {}

            async def both_stalled() -> bool:
                components = (await health())["components"]
                for name in ("cluster", "store"):
                    seen[name] = str(components[name].get("reason"))
                return seen == {"cluster": "directory_stalled", "store": "writes_stalled"}

            await wait_until(both_stalled, "the cluster and the store to say they wait", 5)
            assert (await health())["status"] == "degraded"
        finally:
            own_redis.process.send_signal(signal.SIGCONT)
        received = await ws.until_idle(msg_id, timeout=60)
        ws.close()

        async def ok_again() -> bool:
            return bool((await health())["status"] == "ok")

        await wait_until(ok_again, "health ok again", 30)
        text = await node.fetch(f"/api/kernels/{kernel_id}/transcript?format=text&parent={msg_id}")
        assert text == "".join(f"{i}\n" for i in range(LINES))
        assert received.messages, "the client was not cut off"
