"""A fault harness in the manner of a Jepsen test (issue 25): three gateway nodes on a
redis-server of the harness's own, each behind a proxy the harness can cut
(tests/faults/proxy.py), one real kernel started on node ``a`` flooding numbered lines in
bursts, a WebSocket client on every node recording every numbered message, gap record and
close (tests/faults/recorder.py), and faults from a seeded schedule, one at a time
(tests/faults/schedule.py). At the end the durable transcript is read from a live node
and tests/faults/checker.py counts what went wrong, per kind of fault.

    python -m benchmarks --only faults --seed 1 --faults 50     # the full schedule
    python -m pytest -s tests/faults/test_fault_schedule.py     # a short one, in the suite

The kernel writes what it printed to a file of its own after each burst (lines, times):
the checker's ground truth, which no fault of the gateway or Redis can touch. Nodes on
Redis keep no SQLite file: the SQLite files replaced under a node is a run of its own,
one node on SQLite (``Options.sqlite``), with its pauses and SIGKILLs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tornado.httpclient import HTTPClientError

from kernel_gateway_stream.core.marks import GAP_MSG_TYPE

from ..integration.daemon import Daemon
from ..integration.redis_server import RedisServer
from ..integration.test_several_nodes import Cluster, transcript
from ..integration.waits import wait_until
from ..timing import seconds
from .checker import (
    Burst,
    Closed,
    Counts,
    Delivery,
    Fault,
    Gap,
    HealthSample,
    History,
    Outage,
    Report,
    check,
)
from .proxy import RedisProxy
from .recorder import Recorder, transcript_history
from .schedule import KINDS, ROLES, SQLITE_REPLACED, Step, plan
from .test_redis_empty import HealthSampler

__all__ = ["Options", "Outcome", "run", "table"]

#: One burst: numbered lines, then a line in the kernel's own log saying so.
FLOOD = """
import time as _time
_started = _time.time()
for _i in range({first}, {end}):
    print(_i, flush=True)
with open({log!r}, "a") as _log:
    _log.write("{number} {first} {end} %r %r\\n" % (_started, _time.time()))
"""


@dataclass(frozen=True)
class Options:
    seed: int = 1
    faults: int = 10
    burst_lines: int = 500
    #: Seconds between bursts sent (the kernel queues them while it is busy).
    burst_interval: float = 0.5
    shortest: float = 0.5
    longest: float = 4.0
    settle: tuple[float, float] = (1.0, 3.0)
    kinds: tuple[str, ...] = tuple(KINDS)
    #: One node on SQLite, no Redis (for ``sqlite_replaced``: nodes on Redis keep no file).
    sqlite: bool = False
    #: Seconds a node may take to notice it cannot write before its health must say so:
    #: the lease's time to live (tests/integration/test_several_nodes.py), by which a node
    #: that cannot renew its lease must know.
    health_grace: float = seconds(2)


@dataclass
class Outcome:
    options: Options
    steps: list[Step]
    report: Report
    seconds: float
    bursts: int
    lines: int
    #: Close codes the clients got, with their reasons, and how often.
    closes: Counter[str] = field(default_factory=Counter)
    #: The transcript's gap records: reason -> how many.
    gaps: Counter[str] = field(default_factory=Counter)
    #: What the harness could not do, once each.
    notes: list[str] = field(default_factory=list)


class Harness:
    """See the module docstring: :meth:`start`, :meth:`apply` each step, :meth:`finish`."""

    def __init__(self, root: Path, options: Options) -> None:
        self.root = root
        self.options = options
        self.redis = RedisServer(root / "redis")
        self.proxies: dict[str, RedisProxy] = {}
        (root / "nodes").mkdir(parents=True)
        self.cluster = Cluster(root / "nodes", self.redis.url, "a" if options.sqlite else "abc")
        self.nodes = self.cluster.nodes
        #: Set while a node answers (cleared while it is paused or killed).
        self.up = {name: asyncio.Event() for name in self.nodes}
        #: The nodes the running fault is on: no burst is sent through them.
        self.faulted: set[str] = set()
        self.recorders: list[Recorder] = []
        self.faults: list[Fault] = []
        self.outages: list[Outage] = []
        self.sent: dict[int, str] = {}
        #: What the harness could not do (and the checker then counts as lost).
        self.notes: list[str] = []
        #: The transcript's records as read before each fault that empties Redis.
        self.durable: list[dict[str, Any]] = []
        self.kernel_log = root / "kernel.log"
        self.kernel_id = ""
        self.kernel_pids: list[int] = []
        self.sampler: HealthSampler | None = None
        self.flooder: asyncio.Task[None] | None = None
        loop = asyncio.get_running_loop()
        #: The kernel's clock (time.time()) minus the harness's (the loop's).
        self.offset = time.time() - loop.time()

    async def start(self) -> None:
        if not self.options.sqlite:
            self.redis.start()
            await self.redis.wait_ready()
            for name in self.nodes:
                proxy = RedisProxy(self.redis.port)
                await proxy.start()
                self.proxies[name] = proxy
        for name in self.nodes:
            self._start_node(name)
        await self.cluster.wait_ready()
        for event in self.up.values():
            event.set()
        a = self.nodes["a"]
        self.kernel_id = await a.start_kernel()
        self.kernel_pids = a.kernel_pids()

        async def listed_everywhere() -> bool:
            for node in self.nodes.values():
                if not any(k["id"] == self.kernel_id for k in await node.fetch("/api/kernels")):
                    return False
            return True

        await wait_until(listed_everywhere, "the kernel on every node", 60)
        for name, node in self.nodes.items():
            self.recorders.append(Recorder(name, node, self.kernel_id, self.up[name]))
        await wait_until(
            lambda: all(r.ws is not None for r in self.recorders), "a client on every node", 60
        )
        self.sampler = HealthSampler(self.nodes)
        self.flooder = asyncio.ensure_future(self._flood())
        await wait_until(
            lambda: all(any(isinstance(e, Delivery) for e in r.events) for r in self.recorders),
            "the first output on every client",
            60,
        )

    async def _flood(self) -> None:
        number = 0
        while True:
            await asyncio.sleep(self.options.burst_interval)
            through = [r for r in self.recorders if r.ws is not None and r.name not in self.faulted]
            if not through:
                continue
            recorder = through[number % len(through)]
            first = number * self.options.burst_lines
            code = FLOOD.format(
                first=first,
                end=first + self.options.burst_lines,
                number=number,
                log=str(self.kernel_log),
            )
            try:
                assert recorder.ws is not None
                self.sent[number] = recorder.ws.execute(code, store_history=False)
            except Exception:  # closed under us: the next burst goes elsewhere
                continue
            number += 1

    def _start_node(self, name: str) -> None:
        if self.options.sqlite:
            self.nodes[name].start()
        else:
            self.cluster.start_node(name, url=self.proxies[name].url)

    def owner(self) -> str:
        """The node holding the kernel's lease ("a" if none does, or Redis cannot say)."""
        return self.lease_holder() or "a"

    def lease_holder(self) -> str | None:
        """The node whose running process holds the kernel's lease; None if none does (a
        killed owner's lease not yet expired, none taken, or Redis cannot say). On one
        SQLite node, "a"."""
        import redis

        if self.options.sqlite:
            return "a"

        client = redis.Redis(port=self.redis.port, socket_timeout=1)
        try:
            value = client.get(f"{self.cluster.prefix}{{{self.kernel_id}}}:lease")
        except redis.RedisError:
            value = None
        finally:
            client.close()
        if value:
            text = value.decode() if isinstance(value, bytes) else str(value)
            pid = text.rsplit(":", 1)[0].split("-")[-2]
            for name, node in self.nodes.items():
                process = node.process
                if process is not None and str(process.pid) == pid and process.poll() is None:
                    return name
        return None

    async def apply(self, step: Step) -> Fault:
        loop = asyncio.get_running_loop()
        role = ROLES[step.kind]
        target = "redis"
        if role == "sqlite":
            target = "a"
            self.faulted = set()  # the node answers throughout
        elif role != "redis":
            owner = await asyncio.to_thread(self.owner)
            others = sorted(set(self.nodes) - {owner})
            target = owner if step.on_owner else others[len(self.faults) % len(others)]
            self.faulted = {target}
        else:
            self.faulted = set()
        action = step.kind.split("_", 1)[1]
        if action in ("kill", "restart") and role == "redis":
            await self.snapshot()  # Redis forgets: keep what was durable, for the checker
        started = loop.time()
        if role == "redis":
            await self._on_redis(action, step.duration)
            self.outages.append(Outage("*", started, loop.time(), step.kind))
        elif step.kind == SQLITE_REPLACED:
            await asyncio.to_thread(self._replace_sqlite, self.nodes[target])
            await asyncio.sleep(step.duration)
        elif action in ("cut", "blackhole"):
            proxy = self.proxies[target]
            proxy.cut() if action == "cut" else proxy.blackhole()
            await asyncio.sleep(step.duration)
            proxy.heal()
            self.outages.append(Outage(target, started, loop.time(), step.kind))
        else:
            await self._on_node(target, action, step.duration)
        fault = Fault(step.kind, target, started, loop.time())
        self.faults.append(fault)
        self.faulted = set()
        return fault

    async def _highest(self) -> tuple[Daemon, int]:
        """The node serving the highest transcript head, and that head."""
        found, top = self.nodes["a"], -1
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                page = await node.fetch(f"/api/kernels/{self.kernel_id}/transcript?limit=1")
                if page["head"] > top:
                    found, top = node, page["head"]
        return found, top

    async def snapshot(self) -> None:
        """Read what the transcript gained since the last snapshot (its records only),
        again and again until a read finds little new: the flood goes on while a read of
        thousands of records takes its time, and what Redis then forgets of the records
        written meanwhile would count as delivered but never durable."""
        node, _ = await self._highest()
        for _ in range(5):
            read = 0
            since = self.durable[-1]["seq"] if self.durable else 0
            while True:  # page by page: a read that fails keeps the pages before it
                path = f"/api/kernels/{self.kernel_id}/transcript?since={since}&limit=10000"
                try:
                    page = await node.fetch(path)
                except Exception as error:  # none answers: nothing (more) to keep
                    self.notes.append(f"a snapshot of the transcript stopped short: {error}")
                    return
                self.durable += [r for r in page["records"] if r["msg_type"] != GAP_MSG_TYPE]
                read += len(page["records"])
                if not page["records"] or page["next_since"] >= page["head"]:
                    break
                since = page["next_since"]
            if read < 200:
                return

    @staticmethod
    def _replace_sqlite(node: Daemon) -> None:
        """The node's database replaced by an empty file (as a restore or a careless copy
        would), its write-ahead log and shared memory removed."""
        path = node.transcript_path
        fresh = path.with_name(path.name + ".fresh")
        fresh.write_bytes(b"")  # an empty file is an empty SQLite database
        os.replace(fresh, path)
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                path.with_name(path.name + suffix).unlink()

    async def _on_redis(self, action: str, duration: float) -> None:
        process = self.redis.process
        assert process is not None
        if action == "pause":
            process.send_signal(signal.SIGSTOP)
            await asyncio.sleep(duration)
            process.send_signal(signal.SIGCONT)
            return
        if action == "kill":
            await asyncio.to_thread(self.redis.kill)
            await asyncio.sleep(duration)
        else:
            await asyncio.to_thread(self.redis.stop)
        self.redis.start()
        await self.redis.wait_ready()

    async def _on_node(self, name: str, action: str, duration: float) -> None:
        node = self.nodes[name]
        process = node.process
        assert process is not None
        self.up[name].clear()
        if action == "pause":
            process.send_signal(signal.SIGSTOP)
            await asyncio.sleep(duration)
            process.send_signal(signal.SIGCONT)
        else:  # the daemon alone: its kernels run on
            process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(process.wait)
            await asyncio.sleep(duration)
            self._start_node(name)
            await node.wait_ready()
        self.up[name].set()

    async def finish(self) -> tuple[History, list[Burst]]:
        """Stop the flood, let the kernel and every client catch up, and read the
        transcript: the transcript's history and the bursts the kernel ran."""
        assert self.flooder is not None
        self.flooder.cancel()
        loop = asyncio.get_running_loop()

        def logged() -> list[str]:
            return self.kernel_log.read_text().splitlines() if self.kernel_log.exists() else []

        # The kernel runs what it was sent (a burst sent through a node killed before it
        # passed it on never runs): until every burst is logged, or none for 10 s.
        count, since = -1, loop.time()
        while len(logged()) < len(self.sent) and loop.time() - since < seconds(10):
            if len(logged()) != count:
                count, since = len(logged()), loop.time()
            await asyncio.sleep(0.2)
        bursts = []
        for entry in logged():
            number, first, end, started, ended = entry.split()
            bursts.append(
                Burst(
                    self.sent[int(number)],
                    int(first),
                    int(end),
                    float(started) - self.offset,
                    float(ended) - self.offset,
                )
            )
        heads: list[int] = []
        reader = self.nodes["a"]

        async def caught_up() -> bool:
            # A running node records the kernel (after an owner's kill the head stands
            # still until its lease expires and another takes the kernel over, and what
            # the kernel held meanwhile comes then), the transcript's head (the highest
            # any node serves) has not moved for a second, and every client has it.
            nonlocal reader
            reader, top = await self._highest()
            heads.append(top)
            steady = len(heads) > 5 and len(set(heads[-5:])) == 1
            await asyncio.sleep(0.2)
            if not (steady and all(r.last_seq >= heads[-1] for r in self.recorders)):
                return False
            if await asyncio.to_thread(self.lease_holder) is None:
                heads.clear()  # steady again from the takeover on
                return False
            # And the last burst the kernel ran has ended in the transcript: a head that
            # stood still for a second was not enough, when a node that had just taken
            # the kernel over was busy with what the kernel held for it (3,333 messages
            # once) and read on afterwards: the read stopped there, and the checker
            # counted what the clients got after it as forks and silent loss.
            return not bursts or await self._ended(reader, bursts[-1].msg_id)

        with contextlib.suppress(AssertionError):  # what has not come is what the checker counts
            await wait_until(caught_up, "every client and the transcript to catch up", 60)
        records: list[dict[str, Any]] = []

        async def read() -> bool:
            nonlocal records
            try:
                records = await transcript(reader, self.kernel_id)
            except HTTPClientError as error:  # 404: the store lost the kernel
                self.notes.append(f"the transcript could not be read: {error}")
                return False
            return True

        with contextlib.suppress(AssertionError):  # unreadable: an empty history, counted
            await wait_until(read, "the transcript", 20)
        await self._note_read(reader, records)
        return transcript_history(records, self.offset), bursts

    async def _ended(self, node: Daemon, msg_id: str) -> bool:
        """Whether ``node`` serves the end of execution ``msg_id`` (its idle recorded)."""
        try:
            summary = await node.fetch(f"/api/kernels/{self.kernel_id}/executions/{msg_id}")
        except Exception:  # not there yet (404), or the node is busy: not yet
            return False
        return bool(summary["status"] != "running")

    async def _note_read(self, reader: Daemon, records: list[dict[str, Any]]) -> None:
        """What the final read saw, for a run whose history is then found wrong: the node
        read, each node's head, the lease, Redis's own head and the last entries of its log."""
        import redis

        heads = {}
        for name, node in self.nodes.items():
            with contextlib.suppress(Exception):
                page = await node.fetch(f"/api/kernels/{self.kernel_id}/transcript?limit=1")
                heads[name] = page["head"]
        last = records[-1]["seq"] if records else None
        reader_name = next((n for n, node in self.nodes.items() if node is reader), "?")
        note = (
            f"final read from {reader_name}: {len(records)} records, the last {last}; heads {heads}"
        )
        if not self.options.sqlite:
            client = redis.Redis(port=self.redis.port, socket_timeout=2)
            try:
                key = f"{self.cluster.prefix}{{{self.kernel_id}}}"
                meta = client.hgetall(f"{key}:meta")
                tail = [entry for entry, _ in client.xrevrange(f"{key}:log", count=3) or []]
                note += (
                    f"; Redis: meta {meta}, log length {client.xlen(f'{key}:log')}, last "
                    f"entries {tail}, lease {client.get(f'{key}:lease')!r}"
                )
            except redis.RedisError as error:
                note += f"; Redis could not be read: {error}"
            finally:
                client.close()
        self.notes.append(note)

    async def close(self) -> None:
        for process in (self.redis.process, *(n.process for n in self.nodes.values())):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGCONT)
        if self.flooder is not None:
            self.flooder.cancel()
        if self.sampler is not None:
            self.sampler.stop()
        for recorder in self.recorders:
            recorder.stop()
        await asyncio.to_thread(self.cluster.stop)
        for pid in self.kernel_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proxy in self.proxies.values():
            proxy.close()
        await asyncio.to_thread(self.redis.stop)

    def health(self) -> list[HealthSample]:
        assert self.sampler is not None
        return [
            HealthSample(name, at, status)
            for name, samples in self.sampler.samples.items()
            for at, status, _ in samples
        ]


async def run(root: Path, options: Options, say: Callable[[str], None] = print) -> Outcome:
    """One seeded schedule on a cluster of its own under ``root``; see the module
    docstring. Everything it started is stopped when it returns or raises."""
    steps = plan(
        options.seed,
        options.faults,
        shortest=options.shortest,
        longest=options.longest,
        settle=options.settle,
        kinds=options.kinds,
    )
    harness = Harness(root, options)
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        await harness.start()
        for index, step in enumerate(steps):
            fault = await harness.apply(step)
            say(
                f"  fault {index + 1}/{len(steps)}: {fault.kind} on {fault.target}, "
                f"{fault.end - fault.start:.1f} s"
            )
            await asyncio.sleep(step.settle)
        history, bursts = await harness.finish()
        clients = [r.history() for r in harness.recorders]
        report = check(
            clients,
            history,
            bursts,
            harness.faults,
            harness.health(),
            harness.outages,
            options.health_grace,
            [transcript_history(harness.durable, harness.offset)],
        )
        closes = Counter(
            f"{e.code} {e.reason}" for c in clients for e in c.events if isinstance(e, Closed)
        )
        gaps = Counter(e.reason for e in history.events if isinstance(e, Gap))
        return Outcome(
            options,
            steps,
            report,
            loop.time() - began,
            len(bursts),
            sum(b.end_line - b.first_line for b in bursts),
            closes,
            gaps,
            sorted(set(harness.notes)),
        )
    finally:
        await harness.close()


COLUMNS = (
    ("faults", "faults"),
    ("lines_lost", "lines lost (transcript)"),
    ("lines_missing_on_clients", "lines missing (clients)"),
    ("forks", "forks"),
    ("reused_seqs", "reused seqs"),
    ("silent_loss", "silent loss (lines)"),
    ("understated_gaps", "understated gaps"),
    ("never_ended", "never ended"),
    ("never_ended_on_clients", "never ended (client x execution)"),
    ("lost_whole", "lost whole (executions)"),
    ("health_ok_while_failing", "health ok while failing"),
    ("delivered_not_durable", "delivered, not durable"),
)


def table(report: Report) -> str:
    """The counts per fault kind and in all, as a Markdown table."""
    out = [
        "| fault | " + " | ".join(title for _, title in COLUMNS) + " |",
        "|---|" + "---|" * len(COLUMNS),
    ]
    rows: list[tuple[str, Counts]] = sorted(report.by_kind.items())
    for kind, counts in [*rows, ("**all**", report.total)]:
        cells = [f"{getattr(counts, name):,}" for name, _ in COLUMNS]
        out.append(f"| {kind} | " + " | ".join(cells) + " |")
    return "\n".join(out)
