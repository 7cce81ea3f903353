"""Kernel start as a client sees it: cold on jupyter_server and on this gateway, and taken
from this gateway's warm pool (``GatewayStreamApp.kernel_pool``), for local ipykernels and,
where the host can run them, sandboxed ones; and what an idle pooled kernel costs.

A start is timed from ``POST /api/kernels`` to the first output of ``print(1)`` sent on the
kernel's channels WebSocket at once: the time until the kernel is of use. Each pooled start
waits first until the pool is full again, so that it measures a take, not a refill.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from kernel_gateway_stream.kernels.pool import POOL_FILE
from kernel_gateway_stream.kernels.sandbox import install_sandbox_kernelspec, missing_for_sandbox

from .systems import GATEWAY, JUPYTER_SERVER, Server, System
from .wsclient import Channels

Row = dict[str, Any]
SANDBOX = "python3-sandbox"


async def first_output(server: Server, name: str) -> tuple[float, float, float]:
    """Seconds from the start request to its answer, and to the output of a ``print``, and
    the CPU seconds the kernel's process had used when it printed (``time.process_time``:
    since its exec, or since its fork for a kernel the forkserver forked)."""
    began = time.perf_counter()
    kernel_id = await server.start_kernel(name)
    answered = time.perf_counter() - began
    channels = await Channels.connect(server.port, kernel_id)
    try:
        msg_id = channels.execute("import time; print(time.process_time())")
        while True:
            message = await asyncio.wait_for(channels.read(), 120)
            if message is None:
                raise RuntimeError("the channels socket closed")
            if (
                message["header"]["msg_type"] == "stream"
                and message["parent_header"].get("msg_id") == msg_id
            ):
                break
        return answered, time.perf_counter() - began, float(message["content"]["text"])
    finally:
        channels.close()
        await server.shutdown_kernel(kernel_id)


async def pool_status(server: Server) -> dict[str, Any]:
    health = await server.request("GET", "/api/gateway/health")
    component: dict[str, Any] = health["components"]["kernel_pool"]
    return component


async def until_full(server: Server, name: str, size: int) -> None:
    for _ in range(1200):
        status = (await pool_status(server))["kernelspecs"][name]
        if status["ready"] >= size:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"the pool of {name} never filled")


def group_rss(pgid: int) -> int:
    """Bytes resident in every process of process group ``pgid``."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()
            if int(fields[2]) == pgid:
                total += int(fields[21]) * page
    return total


def summary(times: list[float]) -> Row:
    ordered = sorted(times)
    return {
        "p50_ms": statistics.median(ordered) * 1000,
        "p95_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))] * 1000,
        "max_ms": ordered[-1] * 1000,
    }


async def measure(system: System, home: Path, jupyter_path: Path, name: str, starts: int,
                  pool: int) -> Row:  # fmt: skip
    server = Server(system, home, jupyter_path)
    await server.start()
    answered: list[float] = []
    usable: list[float] = []
    cpu: list[float] = []
    memory: list[int] = []
    try:
        if pool:
            await until_full(server, name, pool)
            # The pool's file is beside the transcript database (the gateway's state).
            state = json.loads((server.transcript_path.parent / POOL_FILE).read_text())
            memory = [group_rss(k["pgid"] or k["pid"]) for k in state["kernels"] if k["pid"]]
        for _ in range(starts):
            if pool:
                await until_full(server, name, pool)
            first, last, used = await first_output(server, name)
            answered.append(first)
            usable.append(last)
            cpu.append(used)
        taken = (await pool_status(server))["kernelspecs"][name]["taken"] if pool else 0
    finally:
        await server.stop()
    how = f"pooled ({pool} ready)" if pool else "cold"
    if "--GatewayStreamApp.kernel_forkserver=False" in system.options:
        how += ", exec'd"
    row: Row = {
        "scenario": "kernel_start",
        "system": system.name,
        "case": f"{name}, {how}",
        "starts": starts,
        "taken_from_pool": taken,
        "answer_p50_ms": statistics.median(answered) * 1000,
        **summary(usable),
        "kernel_cpu_p50_ms": statistics.median(cpu) * 1000,
    }
    if memory:
        row["idle_pooled_kernel_mib"] = statistics.mean(memory) / 2**20
    return row


async def kernel_start(home: Path, starts: int = 10, pool: int = 2) -> list[Row]:
    """Cold and pooled starts, side by side (see the module's docstring)."""
    jupyter_path = home / "jp"
    names = ["python3"]
    if os.geteuid() == 0 and not missing_for_sandbox():
        install_sandbox_kernelspec(jupyter_path / "kernels", SANDBOX)
        names.append(SANDBOX)
    rows = [await measure(JUPYTER_SERVER, home / "pool-js", jupyter_path, "python3", starts, 0)]
    execs = System(GATEWAY.name, GATEWAY.kind, ("--GatewayStreamApp.kernel_forkserver=False",))
    rows.append(await measure(execs, home / "pool-exec", jupyter_path, "python3", starts, 0))
    for name in names:
        cold = await measure(GATEWAY, home / f"pool-cold-{name}", jupyter_path, name, starts, 0)
        pooled_system = System(
            GATEWAY.name, GATEWAY.kind, (f'--GatewayStreamApp.kernel_pool={{"{name}": {pool}}}',)
        )
        pooled = await measure(pooled_system, home / f"pool-{name}", jupyter_path, name, starts,
                               pool)  # fmt: skip
        pooled["x_cold"] = pooled["p50_ms"] / cold["p50_ms"]
        rows += [cold, pooled]
    return rows
