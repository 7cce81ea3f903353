"""Several nodes on one Redis, side by side with one node, in one run (``--only nodes``).

* **fanout**: one kernel's burst to 300 clients on one node, against 100 on each of three
  nodes (two of them fed by the record bus): seconds until every client has everything,
  and the CPU seconds of all the servers together.
* **per message**: the 20,000-line flood and the firehose kernel's 100,000 lines of 64 B,
  each to one client, on one node with the embedded defaults (SQLite, in-process), against
  one node on Redis (Streams store): the cost of the Redis path (``cpu_x_one_node``).
* **committed-only delivery**: a line printed every 10 ms, to one client on the node that
  records the kernel: time from the kernel's print (its clock, in the line) to the
  client, p50 and p99, with one node in-process (SQLite; live delivery before commit)
  against one node on Redis, whose owner sends a record to its own clients only once
  Redis has confirmed its fenced append. ``added_p50_ms`` / ``added_p99_ms``: the
  difference of those percentiles; CPU per message of the server over the run.
* **takeover**: the owner of a kernel SIGKILLed (its lease runs out) or stopped with
  SIGTERM (it hands the kernel over); seconds until another node holds the lease, and
  until an execution sent afterwards through a survivor has ended.

Needs Redis: ``KGS_BENCH_REDIS_URL``, else ``KGS_REDIS_URL`` (default
``redis://127.0.0.1:6379/0``). ``KGS_BENCH_REDIS_URL`` leaves the other systems of the run
on their embedded defaults (``KGS_REDIS_URL`` in the environment would make every gateway
started a node of several).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from . import scenarios as sc
from .systems import GATEWAY, Server, System
from .wsclient import Tally, follow_all

Row = dict[str, Any]
CLIENTS = 300


def _cluster_system(name: str, prefix: str) -> System:
    return System(
        name,
        "gateway",
        (
            f"--RedisTranscriptStore.key_prefix={prefix}",
            "--ClusterNode.lease_ttl=3",
            "--ClusterNode.sync_interval=0.3",
            # This machine's Redis asks for no password (see docs/several-nodes.md).
            "--ClusterNode.allow_unauthenticated_redis=True",
        ),
    )


async def nodes(home: Path, plan: sc.Plan) -> list[Row]:
    url = (
        os.environ.get("KGS_BENCH_REDIS_URL")
        or os.environ.get("KGS_REDIS_URL")
        or "redis://127.0.0.1:6379/0"
    )
    prefix = f"kgs-bench-{uuid.uuid4().hex[:8]}:"
    rows: list[Row] = []
    os.environ["KGS_REDIS_URL"] = url
    os.environ.setdefault("KGS_CLUSTER_SECRET", f"kgs-bench-{uuid.uuid4().hex}")
    try:
        rows += await _latency(home, plan, prefix)
        rows += await _per_message(home, plan, prefix)
        rows += await _fanout(home, plan, prefix)
        rows.append(await _takeover(home, prefix, signal.SIGKILL))
        rows.append(await _takeover(home, prefix, signal.SIGTERM))
    finally:
        os.environ.pop("KGS_REDIS_URL", None)
        await _clean(url, prefix)
    return rows


#: The two systems of the per-message rows (and the latency rows' first).
LOCAL = "one node, in-process bus and SQLite"
ON_REDIS = "one node on Redis"


async def _start(system: System, where: Path, home: Path, *, redis: bool) -> Server:
    server = Server(system, where, home / "jp")
    saved = os.environ.pop("KGS_REDIS_URL", None)
    if redis and saved:
        os.environ["KGS_REDIS_URL"] = saved
    try:
        await server.start()
    finally:
        if saved:
            os.environ["KGS_REDIS_URL"] = saved
    return server


async def _latency(home: Path, plan: sc.Plan, prefix: str) -> list[Row]:
    rows = []
    for label, system, redis in (
        (LOCAL, GATEWAY, False),
        ("one node on Redis (committed-only)", _cluster_system("on Redis", prefix + "lat:"), True),
    ):
        server = await _start(system, home / "nodes" / f"lat-{redis}", home, redis=redis)
        try:
            kernel_id = await server.start_kernel()
            (ws,) = await sc.connect_many(server.port, kernel_id, "v1", 1)
            try:
                warm = Tally(ws.execute("print('warm')"))
                await follow_all([(ws, warm)], plan.timeout)
                cpu = server.cpu_seconds()
                tally = sc.LatencyTally(ws.execute(sc.PACED.format(n=plan.latency_prints)))
                await follow_all([(ws, tally)], plan.timeout + plan.latency_prints * 0.02)
                cpu = server.cpu_seconds() - cpu
            finally:
                ws.close()
            await server.shutdown_kernel(kernel_id)
        finally:
            await server.stop()
        delays = tally.delays or [float("nan")]
        rows.append(
            sc.row(
                "nodes",
                label,
                f"latency, a line every 10 ms ({plan.latency_prints}), owner's client",
                p50_ms=1000 * sc.percentile(delays, 0.5),
                p99_ms=1000 * sc.percentile(delays, 0.99),
                cpu_seconds=cpu,
                server_us_per_message=1e6 * cpu / max(1, tally.lines),
                lines=tally.lines,
            )
        )
    rows[1]["added_p50_ms"] = rows[1]["p50_ms"] - rows[0]["p50_ms"]
    rows[1]["added_p99_ms"] = rows[1]["p99_ms"] - rows[0]["p99_ms"]
    return rows


async def _per_message(home: Path, plan: sc.Plan, prefix: str) -> list[Row]:
    """The flood (ipykernel's flushed prints) and the firehose kernel's first workload
    (issue 23: the Redis firehose), each to one client, on one node in-process and on one
    node on Redis; each Redis row says how it compares with its in-process row."""
    count, size = plan.throughput[0]
    workloads = (
        (f"flood of {plan.flood_lines:,} lines, 1 client", "python3", plan.flood_lines,
         sc.FLOOD.format(n=plan.flood_lines)),
        (f"firehose {count:,} x {size} B, 1 client", "firehose", count, sc.firehose(count, size)),
    )  # fmt: skip
    rows = []
    for label, system, redis in (
        (LOCAL, GATEWAY, False),
        (ON_REDIS, _cluster_system("on Redis", prefix + "pm:"), True),
    ):
        server = await _start(system, home / "nodes" / f"pm-{redis}", home, redis=redis)
        try:
            for case, kernel, messages, code in workloads:
                kernel_id = await server.start_kernel(kernel)
                seconds, tallies, cpu, finished = await sc.run_on(
                    server, kernel_id, "v1", code, 1, plan.timeout * 4, repeats=3
                )
                await server.shutdown_kernel(kernel_id)
                rows.append(
                    sc.row(
                        "nodes",
                        label,
                        case,
                        seconds=seconds,
                        cpu_seconds=cpu,
                        server_us_per_message=1e6 * cpu / messages,
                        lines=sc.delivered(tallies)[0],
                        finished=finished,
                    )
                )
        finally:
            await server.stop()
    for mine in rows:
        local = next(r for r in rows if r["system"] == LOCAL and r["case"] == mine["case"])
        if mine is not local:
            mine["x_one_node"] = mine["seconds"] / local["seconds"]
            mine["cpu_x_one_node"] = mine["server_us_per_message"] / local["server_us_per_message"]
    return rows


async def _fanout(home: Path, plan: sc.Plan, prefix: str) -> list[Row]:
    rows = []
    for count in (1, 3):
        system = _cluster_system(f"{count} nodes", f"{prefix}fan{count}:")
        servers = [
            await _start(system, home / "nodes" / f"fan{count}-{i}", home, redis=True)
            for i in range(count)
        ]
        try:
            kernel_id = await servers[0].start_kernel("firehose")
            per_node = CLIENTS // count
            sockets = []
            for server in servers:
                sockets += await sc.connect_many(server.port, kernel_id, "v1", per_node)
            try:
                code = sc.firehose(plan.fanout_messages, 64)
                warm = sockets[0].execute("1 64 0")
                await follow_all([(ws, Tally(warm)) for ws in sockets], plan.fanout_timeout)
                cpu = sum(server.cpu_seconds() for server in servers)
                started = time.perf_counter()
                msg_id = sockets[0].execute(code)
                tallies = [Tally(msg_id) for _ in sockets]
                finished = await follow_all(
                    list(zip(sockets, tallies, strict=True)), plan.fanout_timeout * 4
                )
                ended = max((t.done_at or time.perf_counter()) for t in tallies)
                cpu = sum(server.cpu_seconds() for server in servers) - cpu
            finally:
                for ws in sockets:
                    ws.close()
            await servers[0].shutdown_kernel(kernel_id)
        finally:
            for server in servers:
                await server.stop()
        lines, disordered = sc.delivered(tallies)
        rows.append(
            sc.row(
                "nodes",
                f"{CLIENTS} clients on {count} node{'s' if count > 1 else ''} (Redis)",
                f"fan-out of {plan.fanout_messages:,} messages",
                seconds=ended - started,
                cpu_seconds=cpu,
                lines=lines,
                complete_clients=sum(1 for t in tallies if t.lines == plan.fanout_messages),
                disordered_clients=disordered,
                finished=finished,
            )
        )
    rows[1]["x_one_node"] = rows[1]["seconds"] / rows[0]["seconds"]
    return rows


async def _takeover(home: Path, prefix: str, how: signal.Signals = signal.SIGKILL) -> Row:
    """The owner stopped by ``how`` (SIGKILL: a crash, the lease runs out; SIGTERM: a
    graceful stop, which hands the kernel over)."""
    import redis.asyncio as aioredis

    tag = f"to{how.value}"
    system = _cluster_system("takeover", f"{prefix}{tag}:")
    servers = [
        await _start(system, home / "nodes" / f"{tag}-{i}", home, redis=True) for i in range(3)
    ]
    client = aioredis.Redis.from_url(os.environ["KGS_REDIS_URL"])
    try:
        kernel_id = await servers[0].start_kernel()
        survivor = servers[1]
        for _ in range(300):  # the directory has it a moment after the start returns
            listed = await survivor.request("GET", "/api/kernels")
            if any(kernel["id"] == kernel_id for kernel in listed):
                break
            await asyncio.sleep(0.05)
        # The kernel up and recorded (one execution through the survivor) before the stop.
        warm = await survivor.request(
            "POST", f"/api/kernels/{kernel_id}/execute", {"code": "print('before')"}
        )
        for _ in range(600):
            summary = await survivor.request(
                "GET", f"/api/kernels/{kernel_id}/executions/{warm['msg_id']}"
            )
            if summary["status"] not in ("queued", "running"):
                break
            await asyncio.sleep(0.05)
        lease_key = f"{prefix}{tag}:{{{kernel_id}}}:lease"
        before = await client.get(lease_key)
        owner = servers[0]
        assert owner.process is not None
        process = owner.process
        killed = time.perf_counter()
        process.send_signal(how)
        exited = asyncio.get_running_loop().run_in_executor(None, process.wait)
        owner.process = None
        held = None
        while time.perf_counter() - killed < 60:
            now = await client.get(lease_key)
            if now is not None and now != before:
                held = time.perf_counter() - killed
                break
            await asyncio.sleep(0.01)
        answered = None
        started = await survivor.request(
            "POST", f"/api/kernels/{kernel_id}/execute", {"code": "print('after')"}
        )
        while time.perf_counter() - killed < 120:
            summary = await survivor.request(
                "GET", f"/api/kernels/{kernel_id}/executions/{started['msg_id']}"
            )
            if summary["status"] not in ("queued", "running"):
                answered = time.perf_counter() - killed
                break
            await asyncio.sleep(0.05)
        await exited
        for server in servers[1:]:
            await server.shutdown_kernel(kernel_id)
        return sc.row(
            "nodes",
            f"3 nodes, owner {'SIGKILLed' if how == signal.SIGKILL else 'stopped (SIGTERM)'} "
            "(lease_ttl 3 s, sync 0.3 s)",
            "takeover",
            lease_taken_seconds=held,
            execution_after_kill_seconds=answered,
        )
    finally:
        await client.aclose()
        for server in servers:
            await server.stop()


async def _clean(url: str, prefix: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    with contextlib.suppress(Exception):
        keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
        if keys:
            await client.delete(*keys)
    await client.aclose()
