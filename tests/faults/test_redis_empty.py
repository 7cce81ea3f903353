"""Redis SIGKILLed in the middle of a kernel's output and restarted empty (issue 25, item 3).

Three real daemons on a redis-server of the test's own (no persistence: ``--save ""``,
``--appendonly no``), a real kernel started on A printing a numbered line every 10 ms, a
channels client on every node, and a sampler of every node's health. Redis is SIGKILLed
once every client has output, and restarted empty on the same port once every node has
noticed. What must hold, each checked against the run and reported together:

* the kernel keeps running and every node keeps serving it: no client is closed (but
  with ``lease_lost`` and its last seq, by a node that could not renew the kernel's lease
  in time: it resumes there), no node answers 404 for it, and output printed after the
  restart reaches every client;
* the nodes rebuild what Redis forgot: the kernel's directory entry and its lease;
* nothing is skipped silently and no number is reused: every seq a client saw is, in the
  durable transcript, either the same content or inside a gap record, the transcript has
  no hole that is not a gap, and no seq came with two contents;
* health was never ``ok`` on a node from the moment it noticed Redis gone until the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient

from ..integration.daemon import Daemon
from ..integration.redis_server import RedisServer
from ..integration.test_several_nodes import Cluster, transcript
from ..integration.waits import wait_until
from ..integration.wsclient import KernelWS
from ..timing import seconds

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("several-nodes")]

GAP = "kernel_gateway_stream_gap"

#: Kernel code: a numbered line every 10 ms until the stop file exists.
TICKER = """
import os, time
i = 0
while not os.path.exists({stop!r}):
    print(i, flush=True)
    i += 1
    time.sleep(0.01)
"""


@dataclass
class Watcher:
    """One channels client, read in the background until the server closes it. Ended with
    ``lease_lost`` (its node stopped recording the kernel), it connects to its node again
    with ``?since=`` the ``last_seq`` it was told, as JupyterLab does after a 1012, when it
    knows its node's URL (:func:`watch`)."""

    node: str
    ws: KernelWS
    messages: list[dict[str, Any]] = field(default_factory=list)
    closed: tuple[Any, Any] | None = None
    task: asyncio.Task[None] | None = None
    node_url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    #: ``(code, reason, the last seq the client had got)`` of each ``lease_lost`` close,
    #: after which it resumed.
    resumed: list[tuple[Any, Any, int]] = field(default_factory=list)

    def start(self) -> None:
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while True:
            message = await self.ws.receive(timeout=600)
            if message is not None:
                self.messages.append(message)
                continue
            code, reason = self.ws.ws.close_code, self.ws.ws.close_reason
            try:
                fields = json.loads(reason or "")
            except ValueError:
                fields = {}
            if not self.node_url or code != 1012 or fields.get("reason") != "lease_lost":
                self.closed = (code, reason)
                return
            self.resumed.append((code, reason, self.last_seq()))
            self.ws = await KernelWS.open(self.node_url, self.headers, since=fields["last_seq"])

    def last_seq(self) -> int:
        """The last seq the client got (0: none)."""
        seqs = [
            m["metadata"]["kernel_gateway_stream"]["seq"]
            for m in self.messages
            if m["metadata"].get("kernel_gateway_stream")
        ]
        return seqs[-1] if seqs else 0

    def check_resumes(self, problems: list[str]) -> None:
        """Each ``lease_lost`` close said the last seq the client had got."""
        for _, reason, got in self.resumed:
            if json.loads(reason).get("last_seq") != got:
                problems.append(f"node {self.node} closed its client with {reason}; it had {got}")

    def lines(self, parent: str) -> list[int]:
        text = "".join(
            m["content"]["text"]
            for m in self.messages
            if m["msg_type"] == "stream" and m["parent_header"].get("msg_id") == parent
        )
        return [int(line) for line in text.split()]

    def idle(self, parent: str) -> bool:
        return any(
            m["msg_type"] == "status"
            and m["content"]["execution_state"] == "idle"
            and m["parent_header"].get("msg_id") == parent
            for m in self.messages
        )

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.ws.close()


async def watch(name: str, node: Daemon, kernel_id: str) -> Watcher:
    """A :class:`Watcher` on ``node``'s channels socket of ``kernel_id``, not started."""
    url = f"ws://127.0.0.1:{node.port}/api/kernels/{kernel_id}/channels"
    ws = await KernelWS.open(url, node.headers)
    return Watcher(name, ws, node_url=url, headers=node.headers)


class HealthSampler:
    """Every node's ``/api/gateway/health``, asked again and again in the background."""

    def __init__(self, nodes: dict[str, Daemon]) -> None:
        self.nodes = nodes
        #: node -> [(loop time, status, reasons)]
        self.samples: dict[str, list[tuple[float, str, str]]] = {name: [] for name in nodes}
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        client = AsyncHTTPClient()
        while True:
            for name, node in self.nodes.items():
                try:
                    response = await client.fetch(
                        f"{node.url}/api/gateway/health",
                        headers=node.headers,
                        raise_error=False,
                        request_timeout=seconds(10),
                    )
                    body = json.loads(response.body)
                except (OSError, ValueError) as error:
                    self.samples[name].append((loop.time(), "unanswered", str(error)))
                    continue
                reasons = ",".join(
                    f"{c}:{v['reason']}" for c, v in body["components"].items() if v["reason"]
                )
                self.samples[name].append((loop.time(), body["status"], reasons))
            await asyncio.sleep(0.1)  # a sampling period, not a wait for anything

    def noticed(self, since: float) -> bool:
        """Every node has said it is not ok since ``since``."""
        return all(
            any(t >= since and status != "ok" for t, status, _ in samples)
            for samples in self.samples.values()
        )

    def ok_after_noticing(self, since: float) -> dict[str, list[tuple[float, str, str]]]:
        """Per node, the samples that said ``ok`` after the node first said it was not,
        from ``since`` on."""
        found: dict[str, list[tuple[float, str, str]]] = {}
        for name, samples in self.samples.items():
            after = [s for s in samples if s[0] >= since]
            first = next((i for i, s in enumerate(after) if s[1] != "ok"), None)
            if first is None:
                found[name] = [(since, "never noticed", "")]
                continue
            oks = [s for s in after[first:] if s[1] == "ok"]
            if oks:
                found[name] = oks[:3]
        return found

    def stop(self) -> None:
        self.task.cancel()


async def soon(predicate: Any, what: str, problems: list[str], timeout: float = 30) -> bool:
    """Wait until ``predicate()``; on a timeout note ``what`` among ``problems``."""
    try:
        await wait_until(predicate, what, timeout)
    except AssertionError as error:
        problems.append(str(error))
        return False
    return True


def span(record: dict[str, Any]) -> range:
    """The seqs a transcript record stands for (a gap record: its whole range)."""
    if record["msg_type"] == GAP:
        return range(record["content"]["first_seq"], record["content"]["last_seq"] + 1)
    return range(record["seq"], record["seq"] + 1)


async def durable_transcript(
    reader: Daemon, kernel_id: str, top: int, problems: list[str]
) -> list[dict[str, Any]]:
    """The kernel's transcript read on ``reader`` once it holds seq ``top`` (what the
    clients got); what it holds after 30 s if not, with the wait's problem noted."""
    records: list[dict[str, Any]] = []

    async def durable() -> bool:
        nonlocal records
        records = await transcript(reader, kernel_id)
        return bool(records) and records[-1]["seq"] >= top

    await soon(durable, "the transcript to have what the clients got", problems)
    return records


def check_transcript(records: list[dict[str, Any]], problems: list[str]) -> None:
    """No hole in the transcript that is not a gap record."""
    expected = 1
    for record in records:
        covered = span(record)
        if covered.start > expected:
            problems.append(
                f"seqs {expected}..{covered.start - 1} are in no record and no gap of the "
                "transcript (skipped silently)"
            )
        expected = max(expected, covered.stop)


def check_clients(
    watchers: list[Watcher], records: list[dict[str, Any]], problems: list[str]
) -> None:
    """Every seq a client saw is, in the transcript, the same content or inside a gap, and
    no seq came to the clients with two contents."""
    by_seq = {r["seq"]: r for r in records if r["msg_type"] != GAP}
    lost = {seq for r in records if r["msg_type"] == GAP for seq in span(r)}
    seen: dict[int, tuple[str, Any]] = {}
    unaccounted: dict[str, list[int]] = {}
    for watcher in watchers:
        for message in watcher.messages:
            numbered = message["metadata"].get("kernel_gateway_stream")
            if not numbered or message["msg_type"] == GAP:
                continue
            first, last = numbered["first_seq"], numbered["seq"]
            seqs = range(first, last + 1)
            missing = [s for s in seqs if s not in by_seq and s not in lost]
            if missing:
                unaccounted.setdefault(watcher.node, []).extend(missing)
                continue
            if any(s in lost for s in seqs):
                continue
            if message["msg_type"] == "stream":
                stored = "".join(by_seq[s]["content"]["text"] for s in seqs)
                got: Any = message["content"]["text"]
            else:
                stored = json.dumps(by_seq[last]["content"], sort_keys=True)
                got = json.dumps(message["content"], sort_keys=True)
            if stored != got:
                problems.append(
                    f"node {watcher.node}: seqs {first}..{last} came to a client as "
                    f"{got!r:.80} but the transcript has {stored!r:.80}"
                )
            if first == last:
                before = seen.setdefault(last, (message["msg_type"], got))
                if before != (message["msg_type"], got):
                    problems.append(
                        f"seq {last} came to clients with two contents: {before!r:.80} "
                        f"and {got!r:.80}"
                    )
    for node, missing in unaccounted.items():
        problems.append(
            f"node {node}: a client got {len(missing)} seqs ({missing[0]}..{missing[-1]}) "
            "for which the transcript has neither a record nor a gap"
        )


async def answers(node: Daemon, kernel_id: str) -> int:
    response = await AsyncHTTPClient().fetch(
        f"{node.url}/api/kernels/{kernel_id}", headers=node.headers, raise_error=False
    )
    return response.code


@pytest.mark.parametrize("owner_too", [False, True], ids=["redis", "redis-and-owner"])
async def test_redis_restarted_empty_mid_output_loses_no_kernel_and_nothing_silently(
    own_redis: RedisServer, tmp_path: Path, owner_too: bool
) -> None:
    """``redis``: Redis alone; A, which records the kernel, writes back what it owns.
    ``redis-and-owner``: A is SIGKILLed with Redis (its kernel runs on): nobody writes
    the kernel back, and B or C takes it over once ``lease_ttl`` has passed."""
    import redis

    await own_redis.wait_ready()
    (tmp_path / "nodes").mkdir()
    cluster = Cluster(tmp_path / "nodes", own_redis.url)
    cluster.start()
    problems: list[str] = []
    watchers: list[Watcher] = []
    sampler: HealthSampler | None = None
    kernel_pids: list[int] = []
    stop_file = tmp_path / "stop"
    try:
        await cluster.wait_ready()
        nodes = cluster.nodes
        a = nodes["a"]
        kernel_id = await a.start_kernel()
        kernel_pids = a.kernel_pids()

        async def listed_everywhere() -> bool:
            for node in nodes.values():
                if not any(k["id"] == kernel_id for k in await node.fetch("/api/kernels")):
                    return False
            return True

        await wait_until(listed_everywhere, "the kernel on every node")
        for name, node in nodes.items():
            watcher = await watch(name, node, kernel_id)
            watcher.start()
            watchers.append(watcher)
        msg_id = watchers[0].ws.execute(TICKER.format(stop=str(stop_file)))
        await wait_until(
            lambda: all(len(w.lines(msg_id)) >= 100 for w in watchers),
            "100 lines on every client",
            60,
        )
        # The nodes that must serve the kernel throughout, and their clients.
        survivors = {n: node for n, node in nodes.items() if not (owner_too and n == "a")}
        serving = [w for w in watchers if w.node in survivors]
        loop = asyncio.get_running_loop()
        sampler = HealthSampler(survivors)
        killed_at = loop.time()
        own_redis.kill()
        if owner_too:
            assert a.process is not None
            a.process.send_signal(signal.SIGKILL)  # the node only: its kernel runs on
            a.process.wait()
        await soon(lambda: sampler.noticed(killed_at), "every node to notice", problems)
        last_before = max(max(w.lines(msg_id), default=0) for w in watchers)
        own_redis.start()
        await own_redis.wait_ready()
        back_at = loop.time()

        client = redis.Redis.from_url(own_redis.url)
        try:
            keys = cluster.prefix

            def rebuilt() -> bool:
                return bool(
                    client.hexists(f"{keys}kernels", kernel_id)
                    and client.exists(f"{keys}{{{kernel_id}}}:lease")
                )

            await soon(rebuilt, "the directory entry and lease rebuilt in Redis", problems, 60)
            print(f"rebuilt {loop.time() - back_at:.2f} s after Redis answered again")
            if not owner_too:
                # A, alive, writes its lease back: no follower takes the kernel over
                # meanwhile (one that did wrote its gap before A handed over the execution
                # ends it kept, and those executions never ended in the transcript).
                lease = client.get(f"{keys}{{{kernel_id}}}:lease") or b""
                assert a.process is not None
                assert isinstance(lease, bytes)  # the client does not decode responses
                holder = lease.decode().rsplit(":", 1)[0]
                if holder.split("-")[-2:-1] != [str(a.process.pid)]:
                    problems.append(f"the lease is {holder!r}'s, not A's (the live owner)")
        finally:
            client.close()

        def printed_after_restart(watcher: Watcher) -> bool:
            return watcher.closed is not None or any(
                line > last_before + 50 for line in watcher.lines(msg_id)
            )

        await soon(
            lambda: all(printed_after_restart(w) for w in serving),
            "output printed after the restart on every client",
            problems,
            60,
        )
        print(f"50 lines more on every client {loop.time() - back_at:.2f} s after it")
        stop_file.touch()
        await soon(
            lambda: all(w.closed is not None or w.idle(msg_id) for w in serving),
            "the execution's end on every client",
            problems,
            60,
        )
        for watcher in serving:
            if watcher.closed is not None:
                problems.append(f"node {watcher.node} closed its client: {watcher.closed}")
            watcher.check_resumes(problems)
            if not any(line > last_before + 50 for line in watcher.lines(msg_id)):
                problems.append(f"node {watcher.node}: no output printed after the restart")
        for name, node in survivors.items():
            code = await answers(node, kernel_id)
            if code != 200:
                problems.append(f"node {name} answers {code} for the live kernel")
        for pid in kernel_pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                problems.append(f"the kernel process {pid} ended")
        sampler.stop()
        for name, oks in sampler.ok_after_noticing(killed_at).items():
            problems.append(f"node {name}: health ok after it noticed Redis gone: {oks}")

        # The durable transcript, once it has everything the clients saw.
        top = max((m["metadata"]["kernel_gateway_stream"]["seq"]
                   for w in serving for m in w.messages
                   if m["metadata"].get("kernel_gateway_stream")), default=0)  # fmt: skip
        records = await durable_transcript(survivors["b"], kernel_id, top, problems)
        check_transcript(records, problems)
        check_clients(watchers, records, problems)
        gaps = [r["content"] for r in records if r["msg_type"] == GAP]
        print(f"gaps in the transcript: {gaps}")
        assert not problems, "\n".join(problems)
    finally:
        stop_file.touch()
        if sampler is not None:
            sampler.stop()
        for watcher in watchers:
            watcher.stop()
        cluster.stop()
        for pid in kernel_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
