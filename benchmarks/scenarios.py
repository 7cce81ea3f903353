"""The scenarios. Each runs against one started server (or a reference) and returns rows.

Every row has ``scenario``, ``system``, ``case`` and its measures; the runner adds ratios.
Times are ``time.perf_counter()`` seconds from sending the ``execute_request`` to the last
client seeing the execution's ``idle`` status, unless a scenario says otherwise.
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .references import DirectKernel, sequential_read
from .systems import (
    ENTERPRISE_GATEWAY,
    GATEWAY,
    JUPYTER_SERVER,
    JUPYTER_SERVER_NO_LIMIT,
    TOKEN,
    Server,
    System,
)
from .wsclient import Channels, Tally, follow_all

#: The throughput reference: :func:`.references.floor_loop`.
FLOOR = "floor loop (pyzmq, HMAC, orjson, one frame)"

Row = dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """How big each scenario is: ``full`` (about 10 minutes in all) or ``quick``."""

    repeats: int = 5
    flood_lines: int = 20_000
    throughput: tuple[tuple[int, int], ...] = ((100_000, 64), (10_000, 4096))
    throughput_repeats: int = 3
    fanout_clients: tuple[int, ...] = (1, 10, 100, 1000)
    fanout_messages: int = 2_000
    #: The gateway's large-message fan-out (issue 23): these clients, each sent this many
    #: messages of this size. 5,000, not the issue's 10,000: the benchmark's clients share
    #: one Python process, which reads 100 copies of 20 MB in time but falls more than
    #: ``subscriber_max_bytes`` behind on 100 copies of 40 MB (and is then told to resume).
    fanout_large: tuple[tuple[int, ...], int, int] = ((1, 100), 5_000, 4096)
    latency_prints: int = 500
    idle_clients: int = 1000
    transcript_records: int = 1_000_000
    catchup_behind: float = 10.0
    catchup_rate: int = 2_000
    timeout: float = 30.0
    #: A fan-out case not done by then is reported with what each client had.
    fanout_timeout: float = 15.0
    #: Peers repeat the loss flood fewer times than the gateway and the reference: their
    #: ratio is not a target, and the whole run should fit in about 10 minutes.
    peer_repeats: int = 3


FULL = Plan()
QUICK = Plan(
    repeats=1,
    flood_lines=5_000,
    throughput=((20_000, 64), (2_000, 4096)),
    throughput_repeats=1,
    fanout_clients=(1, 10, 100),
    fanout_messages=1_000,
    fanout_large=((1, 100), 1_000, 4096),
    latency_prints=150,
    idle_clients=200,
    transcript_records=50_000,
    catchup_behind=2.0,
    timeout=10.0,
    fanout_timeout=5.0,
    peer_repeats=1,
)

#: Seconds under which a run is noisy enough to be worth repeating (fan-out).
QUICK_RUN = 2.0

FLOOD = "for i in range({n}):\n    print(i, flush=True)"
PACED = (
    "import time\nfor i in range({n}):\n    print(i, time.time(), flush=True)\n    time.sleep(0.01)"
)


def firehose(count: int, size: int, rate: int = 0) -> str:
    return f"{count} {size} {rate}"


def row(scenario: str, system: str, case: str, **measures: Any) -> Row:
    return {"scenario": scenario, "system": system, "case": case, **measures}


async def run_on(
    server: Server,
    kernel_id: str,
    protocol: str,
    code: str,
    clients: int,
    timeout: float,
    repeats: int = 1,
    client_cpu: list[float] | None = None,
    warm: str | None = None,
    quick_run: float = QUICK_RUN,
) -> tuple[float, list[Tally], float, bool]:
    """``clients`` sockets on one kernel, the first executes ``code``: seconds until all
    have seen ``idle``, their tallies, the server's CPU seconds, and whether all finished.

    With ``repeats``, the median of that many runs on the same sockets; a run that takes
    over ``quick_run`` seconds is not repeated (its noise is small next to it). With
    ``client_cpu``, the CPU seconds this process (every client) spent in that run are
    appended to it. ``warm``: the unmeasured execution before them (default: one tiny
    one of the same kernel language)."""
    sockets = await connect_many(server.port, kernel_id, protocol, clients)
    try:
        # Unmeasured: every socket live and the kernel idle before the clock starts.
        first = Tally(sockets[0].execute(warm or firehose_or_print(code)))
        await follow_all([(ws, _same(first)) for ws in sockets], timeout)
        runs = []
        for _ in range(repeats):
            cpu, mine = server.cpu_seconds(), time.process_time()
            started = time.perf_counter()
            msg_id = sockets[0].execute(code)
            tallies = [Tally(msg_id) for _ in sockets]
            finished = await follow_all(list(zip(sockets, tallies, strict=True)), timeout)
            ended = max((t.done_at or time.perf_counter()) for t in tallies)
            used = server.cpu_seconds() - cpu
            runs.append((ended - started, tallies, used, finished, time.process_time() - mine))
            if not finished or ended - started > quick_run:
                break
        seconds, tallies, cpu, finished, mine = sorted(runs, key=lambda run: run[0])[len(runs) // 2]
        if client_cpu is not None:
            client_cpu.append(mine)
        return seconds, tallies, cpu, finished
    finally:
        for ws in sockets:
            ws.close()


def firehose_or_print(code: str) -> str:
    """A tiny execution of the same kernel language as ``code``, to warm up with."""
    return "1 64 0" if code[:1].isdigit() else "print('warm')"


def _same(tally: Tally) -> Tally:
    return Tally(tally.msg_id)


async def connect_many(
    port: int, kernel_id: str, protocol: str, clients: int, batch: int = 50
) -> list[Channels]:
    sockets: list[Channels] = []
    for start in range(0, clients, batch):
        count = min(batch, clients - start)
        sockets += await asyncio.gather(
            *(Channels.connect(port, kernel_id, protocol) for _ in range(count))
        )
    return sockets


def delivered(tallies: list[Tally]) -> tuple[int, int]:
    """Lines of the least served client, and how many clients saw a gap or disorder."""
    return min(t.lines for t in tallies), sum(1 for t in tallies if t.gaps)


# -- Loss: 20,000 flushed prints on ipykernel -----------------------------------------


async def loss(server: Server, protocol: str, plan: Plan) -> Row:
    kernel_id = await server.start_kernel()
    try:
        code = FLOOD.format(n=plan.flood_lines)
        repeats = plan.repeats if server.system.ours else plan.peer_repeats
        runs = [
            await run_on(server, kernel_id, protocol, code, 1, plan.timeout * 4)
            for _ in range(repeats)
        ]
    finally:
        await server.shutdown_kernel(kernel_id)
    lines = min(delivered(tallies)[0] for _, tallies, _, _ in runs)
    return row(
        "loss",
        server.system.name,
        protocol,
        seconds=statistics.median(r[0] for r in runs),
        cpu_seconds=statistics.median(r[2] for r in runs),
        lines=lines,
        expected=plan.flood_lines,
        loss_percent=100 * (1 - lines / plan.flood_lines),
        runs=[r[0] for r in runs],
    )


async def loss_direct(plan: Plan) -> Row:
    code = FLOOD.format(n=plan.flood_lines)
    async with DirectKernel() as kernel:
        await kernel.run("print('warm')", Tally(""))
        seconds, lines = [], []
        for _ in range(plan.repeats):
            started = time.perf_counter()
            tally = await kernel.run(code, Tally(""))
            seconds.append((tally.done_at or 0) - started)
            lines.append(tally.lines)
    return row(
        "loss",
        "direct ZMQ (jupyter_client)",
        "zmq",
        seconds=statistics.median(seconds),
        lines=min(lines),
        expected=plan.flood_lines,
        loss_percent=100 * (1 - min(lines) / plan.flood_lines),
        runs=seconds,
    )


# -- Throughput: the firehose kernel to one client -------------------------------------


async def throughput(server: Server, protocol: str, plan: Plan) -> list[Row]:
    kernel_id = await server.start_kernel("firehose")
    rows = []
    repeats = plan.throughput_repeats if server.system.ours else 1
    try:
        for count, size in plan.throughput:
            runs = [
                await run_on(server, kernel_id, protocol, firehose(count, size), 1, plan.timeout)
                for _ in range(repeats)
            ]
            _, _, _, finished = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
            rows.append(_throughput_row(server.system.name, protocol, count, size, runs))
            if not finished:
                rows[-1]["note"] = f"not done in {plan.timeout:.0f} s"
    finally:
        await server.shutdown_kernel(kernel_id)
    return rows


def _throughput_row(system: str, protocol: str, count: int, size: int, runs: list[Any]) -> Row:
    """The median run (by time) of ``runs``: (seconds, tallies, CPU seconds, finished)."""
    seconds, tallies, cpu, _ = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    lines = tallies[0].lines
    return row(
        "throughput",
        system,
        f"{count:,} x {size} B, {protocol}",
        seconds=seconds,
        messages=lines,
        expected=count,
        messages_per_second=lines / seconds,
        megabytes_per_second=lines * size / seconds / 1e6,
        loss_percent=100 * (1 - lines / count),
        frames=tallies[0].frames,
        cpu_seconds=cpu,
        us_per_message=1e6 * cpu / max(1, lines),
        runs=[r[0] for r in runs],
    )


async def throughput_floor(plan: Plan) -> list[Row]:
    """The floor loop (:func:`.references.floor_loop`) on the same firehose kernel and
    workloads as every system: its rate, and its CPU seconds (its reading thread's)."""
    rows = []
    async with DirectKernel("firehose") as kernel:
        await kernel.run_floor("1 64 0", Tally(""))
        for count, size in plan.throughput:
            runs = []
            for _ in range(plan.throughput_repeats):
                started = time.perf_counter()
                tally, cpu = await kernel.run_floor(firehose(count, size), Tally(""))
                runs.append(((tally.done_at or 0) - started, [tally], cpu, True))
            rows.append(_throughput_row(FLOOR, "zmq", count, size, runs))
    return rows


# -- Fan-out: N clients watch one kernel while one of them executes --------------------


async def fanout(server: Server, plan: Plan) -> list[Row]:
    """Clients on one firehose kernel, one of them executing: ``plan.fanout_clients`` of
    64-byte lines on every system, then (this gateway only: its ratio to its own one
    client is the target) ``plan.fanout_large``."""
    kernel_id = await server.start_kernel("firehose")
    rows: list[Row] = []
    cases = [(clients, plan.fanout_messages, 64, "") for clients in plan.fanout_clients]
    if server.system.ours:
        counts, messages, size = plan.fanout_large
        cases += [(clients, messages, size, f", {size} B") for clients in counts]
    try:
        for clients, messages, size, suffix in cases:
            case = f"{clients} clients{suffix}"
            series = [r for r in rows if r["case"].endswith(suffix or "clients")]
            before = series[-1] if series else None
            if before is not None and not before.get("finished", True):
                rows.append(
                    row(
                        "fanout",
                        server.system.name,
                        case,
                        skipped=True,
                        note=f"not run: {before['case']} did not finish",
                    )
                )
                continue
            client_cpu: list[float] = []
            try:
                seconds, tallies, cpu, finished = await run_on(
                    server,
                    kernel_id,
                    "v1",
                    firehose(messages, size),
                    clients,
                    plan.fanout_timeout,
                    repeats=3 if suffix else 5,
                    client_cpu=client_cpu,
                    # The large case: warmed with lines of its size (the first run of
                    # megabytes to many clients grows the buffers every later one reuses),
                    # and the median of 3 runs however long each takes.
                    warm=firehose(200, size) if suffix else None,
                    quick_run=math.inf if suffix else QUICK_RUN,
                )
            except Exception as error:  # a peer failing is a result
                rows.append(
                    row(
                        "fanout",
                        server.system.name,
                        case,
                        finished=False,
                        note=f"failed: {type(error).__name__}: {error}"[:160],
                    )
                )
                continue
            lines, disordered = delivered(tallies)
            rows.append(
                row(
                    "fanout",
                    server.system.name,
                    case,
                    clients=clients,
                    seconds=seconds,
                    cpu_seconds=cpu,
                    us_per_message=1e6 * cpu / messages,
                    client_cpu_seconds=client_cpu[0],
                    min_lines=lines,
                    expected=messages,
                    complete_clients=sum(1 for t in tallies if t.lines == messages),
                    disordered_clients=disordered,
                    finished=finished,
                    note="" if finished else f"not done in {plan.fanout_timeout:.0f} s",
                )
            )
    finally:
        await server.shutdown_kernel(kernel_id)
    return rows


# -- Latency: a flushed print every 10 ms ----------------------------------------------


class LatencyTally(Tally):
    """Also the delay of every line: now minus the ``time.time()`` the kernel printed."""

    __slots__ = ("delays",)

    def __init__(self, msg_id: str) -> None:
        super().__init__(msg_id)
        self.delays: list[float] = []

    def count(self, text: str) -> None:
        now = time.time()
        joined = self.partial + text
        whole = joined[: joined.rfind("\n") + 1]
        super().count(text)
        for line in whole.splitlines():
            self.delays.append(now - float(line.split(" ")[1]))


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _latency_row(system: str, case: str, tally: LatencyTally, plan: Plan) -> Row:
    delays = tally.delays or [float("nan")]
    return row(
        "latency",
        system,
        case,
        p50_ms=1000 * percentile(delays, 0.5),
        p99_ms=1000 * percentile(delays, 0.99),
        lines=tally.lines,
        expected=plan.latency_prints,
        frames=tally.frames,
        delays_ms=[round(1000 * d, 3) for d in tally.delays],
    )


async def latency(server: Server, protocol: str, plan: Plan) -> Row:
    kernel_id = await server.start_kernel()
    try:
        (ws,) = await connect_many(server.port, kernel_id, protocol, 1)
        try:
            warm = Tally(ws.execute("print('warm')"))
            await follow_all([(ws, warm)], plan.timeout)
            tally = LatencyTally(ws.execute(PACED.format(n=plan.latency_prints)))
            await follow_all([(ws, tally)], plan.timeout + plan.latency_prints * 0.02)
        finally:
            ws.close()
    finally:
        await server.shutdown_kernel(kernel_id)
    return _latency_row(server.system.name, protocol, tally, plan)


async def latency_direct(plan: Plan) -> Row:
    async with DirectKernel() as kernel:
        await kernel.run("print('warm')", Tally(""))
        tally = await kernel.run(PACED.format(n=plan.latency_prints), LatencyTally(""))
    return _latency_row("direct ZMQ (jupyter_client)", "zmq", tally, plan)


# -- Idle memory: RSS per idle subscriber ----------------------------------------------


async def idle_memory(server: Server, plan: Plan) -> Row:
    kernel_id = await server.start_kernel("firehose")
    sockets: list[Channels] = []
    note = ""
    try:
        sockets = await connect_many(server.port, kernel_id, "v1", 1)
        await asyncio.sleep(1.0)
        before = server.rss()
        try:
            for _ in range(0, plan.idle_clients - 1, 50):
                want = min(50, plan.idle_clients - len(sockets))
                sockets += await connect_many(server.port, kernel_id, "v1", want)
        except Exception as error:  # a peer failing is a result
            note = f"stopped at {len(sockets)} clients: {type(error).__name__}: {error}"[:160]
        await asyncio.sleep(2.0)
        # Every socket still works: one execution reaches them all.
        tallies = [Tally("") for _ in sockets]
        msg_id = sockets[0].execute("10 64 0")
        for tally in tallies:
            tally.msg_id = msg_id
        finished = await follow_all(list(zip(sockets, tallies, strict=True)), plan.timeout)
        after = server.rss()
    finally:
        for ws in sockets:
            ws.close()
        await server.shutdown_kernel(kernel_id)
    added = len(sockets) - 1
    return row(
        "idle_memory",
        server.system.name,
        f"{len(sockets)} clients",
        clients=len(sockets),
        rss_before_mib=before / 2**20,
        rss_after_mib=after / 2**20,
        kib_per_client=(after - before) / max(1, added) / 1024,
        all_live=finished and all(t.lines == 10 for t in tallies),
        live_clients=sum(1 for t in tallies if t.lines == 10),
        note=note,
    )


# -- Transcript: records written per second, and replay of the whole transcript -------


async def transcript(server: Server, plan: Plan) -> list[Row]:
    """Writing a firehose to the transcript through the daemon (until durable, and the
    largest unwritten backlog meanwhile), the store's writer on its own, bytes on disk per
    byte of output, then a new client replaying it all."""
    count = plan.transcript_records
    kernel_id = await server.start_kernel("firehose")
    rows: list[Row] = []
    try:
        await server.request("POST", f"/api/kernels/{kernel_id}/execute", {"code": "1 64 0"})
        await asyncio.sleep(0.5)
        cpu = server.cpu_seconds()
        started = time.perf_counter()
        answer = await server.request(
            "POST", f"/api/kernels/{kernel_id}/execute", {"code": firehose(count, 64)}
        )
        msg_id = answer["msg_id"]
        deadline = started + plan.timeout + count / 10_000
        backlog = 0
        while time.perf_counter() < deadline:
            store = (await server.request("GET", "/api/gateway/health"))["components"]["store"]
            backlog = max(backlog, store["pending_records"])
            top = await server.request("GET", f"/api/kernels/{kernel_id}/transcript?limit=1")
            last = await server.request(
                "GET", f"/api/kernels/{kernel_id}/transcript?since={top['head'] - 1}&limit=1"
            )
            ended = any(
                r["msg_type"] == "status"
                and r["parent_msg_id"] == msg_id
                and r["content"].get("execution_state") == "idle"
                for r in last["records"]
            )
            if ended and not store["pending_records"]:
                break
            await asyncio.sleep(0.02)
        written = time.perf_counter() - started
        write_cpu = server.cpu_seconds() - cpu
        page = await server.request("GET", f"/api/kernels/{kernel_id}/transcript?limit=1")
        head = page["head"]
        rows.append(
            row(
                "transcript",
                server.system.name,
                f"write {count:,} records through the gateway",
                records=head,
                seconds=written,
                records_per_second=head / written,
                cpu_seconds=write_cpu,
                max_unwritten=backlog,
                note="the kernel's pace; the writer's own is the next row",
            )
        )
        rows.append(await _replay(server, kernel_id, msg_id, head, count))
        rows.append(_file_reference(server.transcript_path, kernel_id, head))
    finally:
        await server.shutdown_kernel(kernel_id)
    rows.append(await asyncio.get_running_loop().run_in_executor(None, writer_capacity, count))
    for size in (64, 1024, 65536):
        rows.append(await asyncio.get_running_loop().run_in_executor(None, disk_ratio, size))
    return rows


def _firehose_records(count: int, size: int) -> list[Any]:
    """Records as the firehose kernel's messages are: its header, an execute_request parent."""
    import json

    from kernel_gateway_stream.core.messages import KernelMessage, Record

    parent = json.dumps(
        {
            "msg_id": uuid.uuid4().hex,
            "msg_type": "execute_request",
            "username": "bench",
            "session": uuid.uuid4().hex,
            "date": "2026-11-22T10:11:12.131415Z",
            "version": "5.3",
        }
    ).encode()
    session = uuid.uuid4().hex
    records = []
    for i in range(count):
        header = (
            b'{"msg_id": "%s_%d", "msg_type": "stream", "username": "firehose", '
            b'"session": "%s", "date": "2026-11-22T10:11:12.131415Z", "version": "5.3"}'
            % (session.encode(), i, session.encode())
        )
        text = f"{i} ".ljust(size - 1, "x") + "\n"
        content = json.dumps({"name": "stdout", "text": text}).encode()
        message = KernelMessage.from_parts([header, parent, b"{}", content])
        records.append(Record("bench", i + 1, time.time(), message))
    return records


def _fed_store(records: list[Any], directory: str) -> tuple[float, float, Any]:
    """Append ``records`` to a fresh SQLite store as fast as it takes them; seconds until
    all are durable, CPU seconds (both threads), and the store (closed)."""
    from kernel_gateway_stream.stores.sqlite import SQLiteTranscriptStore

    store = SQLiteTranscriptStore(path=str(Path(directory) / "t.sqlite3"))
    store.open()

    async def feed() -> None:
        for index, record in enumerate(records):
            store.append(record)
            if index % 5000 == 0:
                await asyncio.sleep(0)  # as the Tap does: batches, the loop runs between
        assert await store.flush(600)

    cpu = time.process_time()
    started = time.perf_counter()
    asyncio.run(feed())
    seconds = time.perf_counter() - started
    store.close()
    return seconds, time.process_time() - cpu, store


def writer_capacity(count: int) -> Row:
    """The SQLite store fed firehose records (64 B lines) as fast as it takes them."""
    records = _firehose_records(count, 64)
    with tempfile.TemporaryDirectory() as directory:
        seconds, cpu, _ = _fed_store(records, directory)
    return row(
        "transcript",
        "kernel_gateway_stream",
        f"writer alone: {count:,} records",
        records=count,
        seconds=seconds,
        records_per_second=count / seconds,
        cpu_seconds=cpu,
    )


def disk_ratio(size: int) -> Row:
    """Bytes on disk (database and WAL, after a checkpoint) per byte of output (the
    messages as the kernel sent them), for ``size``-byte lines."""
    count = max(200, 20_000_000 // (size + 500))
    records = _firehose_records(count, size)
    output = sum(record.message.size for record in records)
    with tempfile.TemporaryDirectory() as directory:
        _fed_store(records, directory)
        path = Path(directory) / "t.sqlite3"
        connection = sqlite3.connect(path)
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        connection.close()
        on_disk = sum(p.stat().st_size for p in Path(directory).glob("t.sqlite3*"))
    return row(
        "transcript",
        "kernel_gateway_stream",
        f"bytes on disk, {size:,} B lines",
        records=count,
        megabytes=output / 1e6,
        disk_per_output_byte=on_disk / output,
    )


async def _replay(server: Server, kernel_id: str, msg_id: str, head: int, count: int) -> Row:
    """A new client asks for everything (``?since=0``): time to its first message and to
    the end of the transcript."""
    cpu = server.cpu_seconds()
    started = time.perf_counter()
    ws = await Channels.connect(server.port, kernel_id, "v1", since=0)
    tally = Tally(msg_id)
    first: float | None = None
    try:
        while not tally.done:
            message = await ws.read()
            if message is None:
                break
            if first is None:
                first = time.perf_counter() - started
            tally.feed(message)
    finally:
        ws.close()
    seconds = (tally.done_at or time.perf_counter()) - started
    return row(
        "transcript",
        server.system.name,
        f"replay {head:,} records",
        records=head,
        first_record_ms=1000 * (first or float("nan")),
        seconds=seconds,
        records_per_second=head / seconds,
        lines=tally.lines,
        expected=count,
        cpu_seconds=server.cpu_seconds() - cpu,
    )


def _file_reference(path: Path, kernel_id: str, head: int) -> Row:
    """The same bytes, written to a plain file and read back sequentially (a warm page
    cache, as the transcript's own pages are)."""
    from kernel_gateway_stream.core.records import ParentHeader, decode_chunk
    from kernel_gateway_stream.stores.sqlite_schema import kernel_range

    database = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    (key,) = database.execute(
        "SELECT key FROM kernels WHERE kernel_id = ?", (kernel_id,)
    ).fetchone()
    parents = {
        ref: ParentHeader(header, msg_id, msg_type)
        for ref, header, msg_id, msg_type in database.execute(
            "SELECT ref, header, msg_id, msg_type FROM parents WHERE kernel_key = ?", (key,)
        )
    }
    with tempfile.NamedTemporaryFile(suffix=".bin", delete=False) as file:
        for (data,) in database.execute(
            "SELECT data FROM chunks WHERE id BETWEEN ? AND ? ORDER BY id", kernel_range(key)
        ):
            for record in decode_chunk(data, kernel_id, parents.get):
                file.write(b"".join(record.message.parts()))
        reference = Path(file.name)
    database.close()
    try:
        size = reference.stat().st_size
        first, seconds = sequential_read(reference)
    finally:
        reference.unlink()
    return row(
        "transcript",
        "sequential file read",
        f"replay {head:,} records",
        records=head,
        first_record_ms=1000 * first,
        seconds=seconds,
        records_per_second=head / seconds,
        megabytes=size / 1e6,
    )


# -- Catch-up: reconnect 10 s behind a live firehose -----------------------------------


async def catchup(server: Server, plan: Plan) -> Row:
    """A client follows a paced firehose, leaves, comes back ``catchup_behind`` seconds
    later: seconds from its reconnect until it receives the first message the kernel
    published after that moment (everything before it delivered, in order)."""
    rate = plan.catchup_rate
    live = 2.0
    total = int(rate * (live + plan.catchup_behind + plan.timeout + 5))
    kernel_id = await server.start_kernel("firehose")
    session = uuid.uuid4().hex
    try:
        ws = await Channels.connect(server.port, kernel_id, "v1", session=session)
        warm = Tally(ws.execute("1 64 0"))
        await follow_all([(ws, warm)], plan.timeout)
        tally = Tally(ws.execute(firehose(total, 64, rate)))
        await follow_all([(ws, tally)], live)
        ws.close()
        seen = tally.lines
        await asyncio.sleep(plan.catchup_behind)
        since = tally.last_seq if server.system.ours else None
        reconnected = time.time()
        started = time.perf_counter()
        ws = await Channels.connect(server.port, kernel_id, "v1", session=session, since=since)
        caught_up = None
        deadline = started + plan.timeout
        while time.perf_counter() < deadline and not tally.done:
            try:
                message = await asyncio.wait_for(ws.read(), deadline - time.perf_counter())
            except TimeoutError:
                break
            if message is None:
                break
            tally.feed(message)
            if tally.last_line and float(tally.last_line.split(" ")[1]) >= reconnected:
                caught_up = time.perf_counter() - started
                break
        ws.close()
        missed = tally.next_index - tally.lines
        await server.request("POST", f"/api/kernels/{kernel_id}/interrupt")
    finally:
        await server.shutdown_kernel(kernel_id)
    return row(
        "catchup",
        server.system.name,
        f"{plan.catchup_behind:.0f} s behind at {rate:,} msg/s",
        seconds=caught_up,
        backlog=tally.next_index - seen,
        missed=missed,
        disordered=tally.gaps,
        note="" if caught_up is not None else f"not live within {plan.timeout:.0f} s",
    )


# -- Upstream: the loss flood through the gateway in front of another server ------------

#: Watchers of the flood in the upstream scenario (the first runs it).
UPSTREAM_WATCHERS = (1, 3)


async def upstream(home: Path, plan: Plan) -> list[Row]:
    """The 20,000-line flush flood read by 1 and 3 clients of an upstream server alone, and
    read through the gateway in front of it (``--gateway-url``), side by side: lines of the
    least served client, the gateway's ``upstream_lost`` gap records (and the messages they
    count), seconds. Upstreams: jupyter_server on its defaults and with its limit off,
    Enterprise Gateway 3.3 on its defaults, and another kernel_gateway_stream. The kernel is
    the upstream's stock ``python3`` (ipykernel)."""
    rows: list[Row] = []
    for upstream_system in (
        JUPYTER_SERVER,
        JUPYTER_SERVER_NO_LIMIT,
        ENTERPRISE_GATEWAY,
        GATEWAY,
    ):
        where = home / "upstream" / upstream_system.name.replace(" ", "_")
        server = Server(upstream_system, where / "upstream", home / "jp")
        await server.start()
        front_system = System(
            f"kernel_gateway_stream in front of {upstream_system.name}",
            "gateway",
            (f"--gateway-url={server.base}", f"--GatewayClient.auth_token={TOKEN}"),
            # Enterprise Gateway refuses kernels for root unless KERNEL_USERNAME says who.
            env=(("KERNEL_USERNAME", "benchmark"),),
        )
        front = Server(front_system, where / "front", home / "jp")
        await front.start()
        try:
            for watchers in UPSTREAM_WATCHERS:
                for label, via in (("upstream alone", server), ("through the gateway", front)):
                    measures = await _flood_row(via, plan, watchers)
                    case = f"{label}, {watchers} watcher{'s' if watchers > 1 else ''}"
                    rows.append(row("upstream", upstream_system.name, case, **measures))
        finally:
            await front.stop()
            await server.stop()
    for item in rows:
        if item["case"].startswith("through the gateway"):
            alone_case = item["case"].replace("through the gateway", "upstream alone")
            alone = next(
                r for r in rows if r["system"] == item["system"] and r["case"] == alone_case
            )
            item["x_alone"] = item["seconds"] / alone["seconds"] if alone["seconds"] else None
    return rows


async def _flood_row(server: Server, plan: Plan, watchers: int = 1) -> dict[str, Any]:
    kernel_id = await server.start_kernel()
    protocol = server.system.protocols[-1]
    try:
        code = FLOOD.format(n=plan.flood_lines)
        took, tallies, _, finished = await run_on(
            server, kernel_id, protocol, code, watchers, plan.timeout * 4
        )
        gaps = await _upstream_lost(server, kernel_id) if server.system.ours else (0, 0)
    finally:
        await server.shutdown_kernel(kernel_id)
    lines = delivered(tallies)[0]
    return {
        "seconds": took,
        "lines": lines,
        "expected": plan.flood_lines,
        "loss_percent": 100 * (1 - lines / plan.flood_lines),
        "gap_records": gaps[0],
        "lost_in_gaps": gaps[1],
        "finished": finished,
    }


async def _upstream_lost(server: Server, kernel_id: str) -> tuple[int, int]:
    """The ``upstream_lost`` gap records in the kernel's transcript, and the messages they
    count, once the reordering window has judged what was still pending."""
    await asyncio.sleep(UPSTREAM_QUIET_WINDOW)
    records, since = [], 0
    while True:
        page = await server.request(
            "GET", f"/api/kernels/{kernel_id}/transcript?since={since}&limit=10000"
        )
        if not page["records"]:
            break
        records += page["records"]
        since = page["records"][-1]["seq"]
    lost = [
        r["content"]
        for r in records
        if r["msg_type"] == "kernel_gateway_stream_gap"
        and r["content"].get("reason") == "upstream_lost"
    ]
    return len(lost), sum(gap.get("lost") or 0 for gap in lost)


#: A little over the gateway's quiet window for numbers still missing (10 s by default).
UPSTREAM_QUIET_WINDOW = 11.0
