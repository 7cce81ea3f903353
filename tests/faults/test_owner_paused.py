"""The owning node paused past its lease TTL mid-flood, then resumed (issue 25, item 1).

Three real daemons on a redis-server of the test's own, a real kernel started on A
printing numbered lines as fast as it can, a channels client on A (the owner) and on B (a
follower). A is SIGSTOPped once both clients have output, and SIGCONTed once another node
has taken the kernel over and numbered on. Before committed-only delivery, A numbered
the backlog its sockets held and sent it to its own client under seqs the new owner gave
to other lines (a fork). What must hold, each checked against the run and reported
together:

* no fork: every seq a client got is, in the durable transcript, the same content (or
  inside a gap record); no seq came to the clients with two contents;
* no silent loss on a client: every seq between a client's first and last is one it got,
  or inside a gap record it got;
* A ends its client with close code 1012 and a reason ``lease_lost`` whose ``last_seq``
  is the last seq that client got, so it can resume on any node;
* A comes back as a follower: it serves the kernel again, with the new owner's records.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from ..integration.redis_server import RedisServer
from ..integration.test_several_nodes import Cluster
from ..integration.waits import wait_until
from .test_redis_empty import (
    GAP,
    Watcher,
    check_clients,
    check_transcript,
    durable_transcript,
    soon,
    span,
    watch,
)

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("several-nodes")]

#: Kernel code: numbered lines, flushed each, until the stop file exists; at most about
#: 2,000 a second (a short sleep every 20 lines): the paused owner's sockets still hold
#: thousands of lines when it resumes, and three nodes on two cores are not kept busy
#: for a minute and a half by lines the test does not need (as fast as the kernel
#: printed, the test took 94 s in a fresh-clone run).
FLOOD = """
import os, time
i = 0
while not os.path.exists({stop!r}):
    print(i, flush=True)
    i += 1
    if i % 20 == 0:
        time.sleep(0.01)
"""


def seqs_of(watcher: Watcher) -> list[tuple[int, int, str]]:
    """``(first_seq, seq, msg_type)`` of every numbered message the client got, in order."""
    found = []
    for message in watcher.messages:
        numbered = message["metadata"].get("kernel_gateway_stream")
        if numbered:
            found.append((numbered["first_seq"], numbered["seq"], message["msg_type"]))
    return found


def check_no_silent_loss(watcher: Watcher, problems: list[str]) -> None:
    """Every seq from the client's first to its last came to it, alone, merged, or inside
    a gap record it got; and its seqs only go up."""
    got: set[int] = set()
    last = 0
    for first, seq, _ in seqs_of(watcher):
        if first <= last:
            problems.append(f"node {watcher.node}: seq {first} came after seq {last}")
        last = max(last, seq)
        got.update(range(first, seq + 1))
    if not got:
        problems.append(f"node {watcher.node}: its client got nothing")
        return
    missing = [s for s in range(min(got), max(got) + 1) if s not in got]
    if missing:
        problems.append(
            f"node {watcher.node}: its client missed {len(missing)} seqs "
            f"({missing[0]}..{missing[-1]}) with no gap record for them"
        )


async def recorder_of(cluster: Cluster, kernel_id: str, besides: str) -> str | None:
    """The node other than ``besides`` whose health says it records the kernel."""
    for name, node in cluster.nodes.items():
        if name == besides:
            continue
        health = await node.fetch("/api/gateway/health")
        if kernel_id in health["components"]["cluster"]["recording"]:
            return name
    return None


async def test_the_owner_paused_past_its_ttl_forks_nothing_and_ends_its_clients(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    await own_redis.wait_ready()
    (tmp_path / "nodes").mkdir()
    cluster = Cluster(tmp_path / "nodes", own_redis.url)
    cluster.start()
    problems: list[str] = []
    watchers: list[Watcher] = []
    kernel_pids: list[int] = []
    stop_file = tmp_path / "stop"
    a_stopped = False
    try:
        await cluster.wait_ready()
        a, b = cluster.nodes["a"], cluster.nodes["b"]
        kernel_id = await a.start_kernel()
        kernel_pids = a.kernel_pids()

        async def listed() -> bool:
            return any(k["id"] == kernel_id for k in await b.fetch("/api/kernels"))

        await wait_until(listed, "the kernel on B")
        on_a = await watch("a", a, kernel_id)
        on_b = await watch("b", b, kernel_id)
        watchers = [on_a, on_b]
        for watcher in watchers:
            watcher.start()
        msg_id = on_b.ws.execute(FLOOD.format(stop=str(stop_file)))
        await wait_until(
            lambda: all(len(w.lines(msg_id)) >= 2000 for w in watchers),
            "2,000 lines on both clients",
            60,
        )
        assert a.process is not None
        a.process.send_signal(signal.SIGSTOP)
        a_stopped = True
        new_owner: str | None = None

        async def taken_over() -> bool:
            nonlocal new_owner
            new_owner = await recorder_of(cluster, kernel_id, "a")
            return new_owner is not None

        await wait_until(taken_over, "another node to take the kernel over", 60)
        # The new owner numbers on: B's client gets lines printed after the takeover.
        taken_at = len(on_b.lines(msg_id))
        await wait_until(
            lambda: len(on_b.lines(msg_id)) > taken_at + 2000,
            "2,000 lines numbered by the new owner on B's client",
            60,
        )
        a.process.send_signal(signal.SIGCONT)
        a_stopped = False
        print(f"A paused; {new_owner} took the kernel over")
        await soon(lambda: bool(on_a.resumed), "A to end its client", problems, 60)
        # A follows the kernel again: its client, resumed there, gets what the new owner
        # records, to the execution's end.
        stop_file.touch()
        await soon(
            lambda: on_b.idle(msg_id) and on_a.idle(msg_id),
            "the execution's end on both clients",
            problems,
            60,
        )
        for watcher in (on_a, on_b):
            if watcher.closed is not None:  # anything but lease_lost (which it resumes)
                problems.append(f"node {watcher.node} closed its client: {watcher.closed}")
            watcher.check_resumes(problems)
        print(f"clients ended with lease_lost: {[(w.node, w.resumed) for w in (on_a, on_b)]}")
        top = max((s for w in watchers for _, s, _ in seqs_of(w)), default=0)
        records = await durable_transcript(b, kernel_id, top, problems)
        check_transcript(records, problems)
        check_clients(watchers, records, problems)
        for watcher in (on_a, on_b):
            check_no_silent_loss(watcher, problems)
        gaps = [r["content"] for r in records if r["msg_type"] == GAP]
        lost = sum(len(span(r)) for r in records if r["msg_type"] == GAP)
        print(f"gaps in the transcript: {gaps} ({lost} seqs)")
        assert not problems, "\n".join(problems)
    finally:
        stop_file.touch()
        if a_stopped and cluster.nodes["a"].process is not None:
            cluster.nodes["a"].process.send_signal(signal.SIGCONT)
        for watcher in watchers:
            watcher.stop()
        cluster.stop()
        for pid in kernel_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
