"""Several gateways sharing one Redis: three real daemon processes, real kernels.

A kernel started through node A is followed from node B on both WebSocket protocols and
SSE, resumed by seq on node C, and taken over when A is SIGKILLed in the middle of a
flood: the transcript is the same on every node, every line is there once and in order
except inside one explicit gap record, and a client on B keeps receiving throughout.

Redis's URL comes from KGS_TEST_REDIS_URL (.ci/run sets it); with CI set and no URL the
tests fail instead of skipping. That Redis asks for no password (it is shared by the
suite): the nodes are told that is on purpose (``allow_unauthenticated_redis``), and share
a cluster secret (tests/security/test_redis_boundary.py runs nodes on a Redis of its own
that asks for one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..timing import seconds
from .daemon import Daemon, processes_under
from .sseclient import SSEReader, stream_text
from .waits import wait_until

#: Several daemons each, and the mid-flood tests share their set-up: one worker, in order.
pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("several-nodes")]

GAP = "kernel_gateway_stream_gap"
#: The cluster secret the test nodes share.
CLUSTER_SECRET = "several-nodes-test-cluster-secret"


def redis_url() -> str:
    url = os.environ.get("KGS_TEST_REDIS_URL", "")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("KGS_TEST_REDIS_URL is not set: CI must run the Redis tests")
        pytest.skip("KGS_TEST_REDIS_URL is not set")
    return url


class Cluster:
    """Daemons (three unless ``names`` says) on one Redis, under a key prefix of their own."""

    def __init__(self, root: Path, url: str, names: str = "abc") -> None:
        self.url = url
        self.prefix = f"kgs-test-{uuid.uuid4().hex[:8]}:"
        self.nodes = {}
        for name in names:
            (root / name).mkdir()
            self.nodes[name] = Daemon(root / name)

    def start(self, *args: str) -> None:
        """Start every node, with extra command-line ``args``."""
        for name in self.nodes:
            self.start_node(name, *args)

    def start_node(self, name: str, *args: str, url: str | None = None) -> None:
        """Start (or start again) one node, on Redis at ``url`` (default: the cluster's;
        tests/faults/harness.py puts a proxy in between)."""
        self.nodes[name].start(
            f"--RedisTranscriptStore.key_prefix={self.prefix}",
            # Long enough that a node slowed down by the machine's load still renews.
            f"--ClusterNode.lease_ttl={seconds(2)}",
            "--ClusterNode.sync_interval=0.3",
            "--ClusterNode.allow_unauthenticated_redis=True",
            *args,
            env={"KGS_REDIS_URL": url or self.url, "KGS_CLUSTER_SECRET": CLUSTER_SECRET},
        )

    async def wait_ready(self) -> None:
        await asyncio.gather(*(node.wait_ready() for node in self.nodes.values()))

    def stop(self) -> None:
        """Stop every node, then kill the kernels they started that still run: a node of a
        cluster leaves its kernels running when it stops (another node may take them over),
        and once all have stopped none is left to (one outlived a run of the suite)."""
        for node in self.nodes.values():
            node.stop()
        for node in self.nodes.values():
            for pid in processes_under(node.home):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def clean(self) -> None:
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            keys = list(client.scan_iter(match=f"{self.prefix}*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Started; each test waits for it to answer (``await cluster.wait_ready()``)."""
    instance = Cluster(tmp_path, redis_url())
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()
        instance.clean()


async def transcript(node: Daemon, kernel_id: str, since: int = 0) -> list[dict[str, Any]]:
    """Every record after ``since``, page by page."""
    records: list[dict[str, Any]] = []
    while True:
        page = await node.fetch(f"/api/kernels/{kernel_id}/transcript?since={since}&limit=10000")
        records.extend(page["records"])
        if not page["records"] or page["next_since"] >= page["head"]:
            return records
        since = page["next_since"]


async def assert_same_span(node: Daemon, kernel_id: str, records: list[dict[str, Any]]) -> None:
    """That ``node`` serves the records another node served, up to the last of them.
    The kernel goes on publishing after the flood's last line (the execution's idle, the
    answers to the new owner's kernel_info_request): a later read has more."""
    served = [r["seq"] for r in await transcript(node, kernel_id)]
    seqs = [r["seq"] for r in records]
    assert served[: len(seqs)] == seqs
    assert all(seq > seqs[-1] for seq in served[len(seqs) :])


def numbers(records: list[dict[str, Any]], parent: str) -> list[int]:
    text = "".join(
        r["content"]["text"]
        for r in records
        if r["msg_type"] == "stream" and r["parent_msg_id"] == parent
    )
    return [int(line) for line in text.split()]


async def until(check: Any, timeout: float, what: str) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(timeout)
    while loop.time() < deadline:
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_kernel_started_on_a_is_followed_on_b_and_resumed_on_c(cluster: Cluster) -> None:
    await cluster.wait_ready()
    a, b, c = (cluster.nodes[name] for name in "abc")
    kernel_id = await a.start_kernel()
    # Every node lists every kernel.
    for node in (b, c):
        listed = await until(
            lambda node=node: _listed(node, kernel_id), 30, "the kernel on every node"
        )
        assert listed
    # A client on B, on each protocol, and one on SSE.
    legacy = await b.channels(kernel_id)
    v1 = await b.channels(kernel_id, protocol="v1")
    sse = SSEReader(f"{b.url}/api/kernels/{kernel_id}/stream", b.headers)
    try:
        # Code sent through B's shell reaches the kernel A recorded; the output comes
        # back to B's clients off the record bus.
        msg_id = legacy.execute("for i in range(3000): print(i)")
        got_legacy = await legacy.until_idle(msg_id)
        got_v1 = await v1.until_idle(msg_id)
        expected = "".join(f"{i}\n" for i in range(3000))
        assert got_legacy.text() == expected
        assert got_v1.text() == expected
        events = await sse.until_idle(msg_id)
        assert (
            stream_text([e for e in events if e.data["parent_header"].get("msg_id") == msg_id])
            == expected
        )
        # Sequence numbers came from the one recorder: the same on every connection.
        seqs = [s for _, s in got_legacy.seq_ranges()]
        assert seqs == sorted(seqs)
    finally:
        legacy.close()
        v1.close()
        sse.close()
    # The transcript is one: the same records on every node (read one node after another,
    # so a record the kernel sends meanwhile, such as a status, can be on the later ones
    # only: read again until the three agree).
    on_a: list[dict[str, Any]] = []
    on_b: list[dict[str, Any]] = []
    on_c: list[dict[str, Any]] = []

    async def agree() -> bool:
        nonlocal on_a, on_b, on_c
        on_a, on_b, on_c = [await transcript(node, kernel_id) for node in (a, b, c)]
        return [r["seq"] for r in on_a] == [r["seq"] for r in on_b] == [r["seq"] for r in on_c]

    await wait_until(agree, "the same records on every node")
    assert numbers(on_c, msg_id) == list(range(3000))
    # Resume by seq on C, after a disconnect from B: exactly what came after.
    middle = on_b[len(on_b) // 2]["seq"]
    resumed = SSEReader(
        f"{c.url}/api/kernels/{kernel_id}/stream",
        {**c.headers, "Last-Event-ID": str(middle)},
    )
    try:
        events = await resumed.until(lambda ev: any(e.id == on_b[-1]["seq"] for e in ev), 60)
        ids = [e.id for e in events if e.id is not None]
        assert ids[0] > middle
        assert ids == sorted(set(ids))
        assert ids[-1] == on_b[-1]["seq"]
    finally:
        resumed.close()
    # Redis's URL (its password) never reaches a kernel.
    asked = await b.fetch(
        f"/api/kernels/{kernel_id}/execute",
        method="POST",
        body=json.dumps({"code": "import os; print('KGS_REDIS_URL' in os.environ)"}),
    )

    async def answered() -> Any:
        summary = await b.fetch(f"/api/kernels/{kernel_id}/executions/{asked['msg_id']}")
        return summary if summary["status"] not in ("queued", "running") else None

    checked = await until(answered, 60, "the environment check")
    assert checked["stdout"] == "False\n", checked
    # A restart and a shutdown asked of B are done by A, which records the kernel.
    restarted = await b.fetch(f"/api/kernels/{kernel_id}/restart", method="POST", body="{}")
    assert restarted["id"] == kernel_id

    async def restart_recorded() -> bool:
        records = await transcript(c, kernel_id, on_b[-1]["seq"])
        return any(r["content"].get("execution_state") == "restarting" for r in records)

    await until(restart_recorded, 60, "the restart, recorded by A, seen on C")
    await b.fetch(f"/api/kernels/{kernel_id}", method="DELETE")
    for node in (a, b, c):
        await until(lambda node=node: _gone(node, kernel_id), 30, "the kernel gone from every node")


async def _gone(node: Daemon, kernel_id: str) -> bool:
    return not await _listed(node, kernel_id)


async def _listed(node: Daemon, kernel_id: str) -> bool:
    kernels = await node.fetch("/api/kernels")
    return any(k["id"] == kernel_id for k in kernels)


LINES = 12000


async def _flood_started_on_a(cluster: Cluster) -> tuple[Any, ...]:
    """A kernel started on A, listed on B and C, flooding LINES lines (sent through B) with
    an SSE client on B that has seen the first 2,000: ``a, b, c, kernel_id, live, msg_id``."""
    await cluster.wait_ready()
    a, b, c = (cluster.nodes[name] for name in "abc")
    kernel_id = await a.start_kernel()
    await until(lambda: _listed(b, kernel_id), 30, "the kernel on B")
    await until(lambda: _listed(c, kernel_id), 30, "the kernel on C")
    live = SSEReader(f"{b.url}/api/kernels/{kernel_id}/stream", b.headers)
    code = (
        f"import time\nfor i in range({LINES}):\n    print(i, flush=True)\n    time.sleep(0.0002)"
    )
    started = await b.fetch(
        f"/api/kernels/{kernel_id}/execute", method="POST", body=json.dumps({"code": code})
    )
    await live.until(lambda ev: len(stream_text(ev).split()) > 2000, 60)
    return a, b, c, kernel_id, live, started["msg_id"]


async def _flood_ended(node: Daemon, kernel_id: str, msg_id: str) -> list[dict[str, Any]]:
    """The transcript, once it has the flood's last line."""

    async def finished() -> list[dict[str, Any]] | None:
        records = await transcript(node, kernel_id)
        done = numbers(records, msg_id)
        return records if done and done[-1] == LINES - 1 else None

    records: list[dict[str, Any]] = await until(finished, 120, "the flood to end in the transcript")
    return records


async def test_the_owner_sigkilled_mid_flood_is_taken_over(cluster: Cluster) -> None:
    a, b, c, kernel_id, live, msg_id = await _flood_started_on_a(cluster)
    try:
        assert a.process is not None
        a.process.send_signal(signal.SIGKILL)  # the node only: its kernel runs on
        a.process.wait()

        records = await _flood_ended(b, kernel_id, msg_id)
        # One explicit gap, where the owner died; lines on either side once, in order.
        gaps = [r for r in records if r["msg_type"] == GAP]
        assert [g["content"]["reason"] for g in gaps] == ["owner_lost"]
        gap_seq = gaps[0]["seq"]
        before = numbers([r for r in records if r["seq"] < gap_seq], msg_id)
        after = numbers([r for r in records if r["seq"] > gap_seq], msg_id)
        assert before == list(range(len(before)))
        assert after == list(range(LINES - len(after), LINES))
        lost = LINES - len(before) - len(after)
        assert lost >= 0
        print(f"lost in the takeover window: {lost} of {LINES} lines")
        # Every surviving node serves the same transcript.
        await assert_same_span(c, kernel_id, records)
        # The client on B kept receiving: the gap, then the rest, live.
        events = await live.until(lambda ev: str(LINES - 1) in stream_text(ev).split(), 60)
        assert any(e.event == GAP for e in events)
        ids = [e.id for e in events if e.id is not None]
        assert ids == sorted(set(ids))
        # The new owner records what comes next, numbered on.
        follow_up = await c.fetch(
            f"/api/kernels/{kernel_id}/execute",
            method="POST",
            body=json.dumps({"code": "print('after the takeover')"}),
        )

        async def printed() -> bool:
            summary = await c.fetch(f"/api/kernels/{kernel_id}/executions/{follow_up['msg_id']}")
            return bool(summary["status"] == "ok")

        await until(printed, 60, "an execution after the takeover")
        summary = await c.fetch(f"/api/kernels/{kernel_id}/executions/{follow_up['msg_id']}")
        assert summary["stdout"] == "after the takeover\n"
        assert summary["last_seq"] > gap_seq
    finally:
        live.close()
        # The kernel outlived A: whichever node took it over shuts it down.
        for node in (b, c):
            try:
                await node.fetch(f"/api/kernels/{kernel_id}", method="DELETE")
                break
            except Exception:  # a follower refuses (409): the other one owns it
                continue


async def test_a_node_stopped_gracefully_hands_its_kernels_over(cluster: Cluster) -> None:
    """SIGTERM of the recording node mid-flood: the kernel runs on, a survivor records it
    at its next pass (no lease to wait out), and what was in flight when the node let go is
    one explicit gap: every other line is there once, in order."""
    a, b, c, kernel_id, live, msg_id = await _flood_started_on_a(cluster)
    try:
        a.stop()  # SIGTERM: a graceful stop
        assert a.process is not None
        assert a.process.returncode == 0, a.log_text()[-3000:]
        assert "Handed kernel" in a.log_text()

        records = await _flood_ended(b, kernel_id, msg_id)
        gaps = [r for r in records if r["msg_type"] == GAP]
        assert [g["content"]["reason"] for g in gaps] == ["owner_stopped"]
        gap_seq = gaps[0]["seq"]
        before = numbers([r for r in records if r["seq"] < gap_seq], msg_id)
        after = numbers([r for r in records if r["seq"] > gap_seq], msg_id)
        assert before == list(range(len(before)))
        assert after == list(range(LINES - len(after), LINES))
        print(f"lost in the hand-over: {LINES - len(before) - len(after)} of {LINES} lines")
        await assert_same_span(c, kernel_id, records)
        events = await live.until(lambda ev: str(LINES - 1) in stream_text(ev).split(), 60)
        assert any(e.event == GAP for e in events)
    finally:
        live.close()
        for node in (b, c):
            try:
                await node.fetch(f"/api/kernels/{kernel_id}", method="DELETE")
                break
            except Exception:  # none records it yet: the next one may
                continue
