"""The idle-memory reference: what one idle WebSocket client costs a bare tornado server.

    python -m benchmarks.idle_floor --clients 1000
    python -m benchmarks.idle_floor --clients 500 --breakdown

A process of its own serves ``/api/kernels/<id>/channels`` with a tornado
``WebSocketHandler`` that accepts the v1 subprotocol and does nothing else (no kernel, no
authentication, no jupyter_server); the benchmark's own clients connect to it as they
connect to every system, and the row is the growth of its resident memory per client, as
``python -m benchmarks --only idle_memory`` measures each system. What a gateway's client
costs above this is its own.

``--breakdown`` measures the gateway instead, with ``tracemalloc`` on
(:mod:`.traced_daemon`): the Python heap's growth per idle client, by the package that
allocated it (tornado, jupyter_server, traitlets, asyncio, the gateway's own modules).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from typing import Any

import psutil

Row = dict[str, Any]
SYSTEM = "bare tornado WebSocket server"


def serve(port: int) -> None:
    """The bare server (run in its own process)."""
    from tornado import web, websocket

    class Channels(websocket.WebSocketHandler):
        def select_subprotocol(self, subprotocols: list[str]) -> str | None:
            return subprotocols[0] if subprotocols else None

        def on_message(self, message: str | bytes) -> None:
            pass

    async def main() -> None:
        app = web.Application([(r"/api/kernels/[^/]+/channels", Channels)])
        app.listen(port, "127.0.0.1")
        await asyncio.Event().wait()

    asyncio.run(main())


async def measure(clients: int) -> Row:
    """Start the bare server, connect ``clients`` idle clients, and give the RSS growth per
    client (the first client connected before the RSS before, as for every system)."""
    from .scenarios import connect_many, row

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.idle_floor", "--serve", str(port)],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    sockets = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                sockets = await connect_many(port, "floor", "v1", 1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        ps = psutil.Process(process.pid)
        await asyncio.sleep(1.0)
        before = ps.memory_info().rss
        while len(sockets) < clients:
            sockets += await connect_many(port, "floor", "v1", min(50, clients - len(sockets)))
        await asyncio.sleep(2.0)
        after = ps.memory_info().rss
    finally:
        for ws in sockets:
            ws.close()
        process.terminate()
        process.wait(10)
    return row(
        "idle_memory",
        SYSTEM,
        f"{len(sockets)} clients",
        clients=len(sockets),
        rss_before_mib=before / 2**20,
        rss_after_mib=after / 2**20,
        kib_per_client=(after - before) / max(1, len(sockets) - 1) / 1024,
        live_clients=len(sockets),
        note="no kernel, no jupyter_server: the floor of a tornado WebSocket connection",
    )


async def breakdown(clients: int) -> list[tuple[str, float]]:
    """KiB of Python heap per idle client of the gateway, by who allocated it, largest
    first (the last entry is the total)."""
    import signal as signals
    import tempfile
    import tracemalloc
    from pathlib import Path

    from .firehose import install_kernelspec
    from .scenarios import connect_many
    from .systems import GATEWAY, Server

    home = Path(tempfile.mkdtemp(prefix="kgs-idle-"))
    install_kernelspec(home / "jp")
    os.environ["JUPYTER_PATH"] = str(home / "jp")
    snapshots = home / "heap"
    server = Server(GATEWAY, home / "gateway", home / "jp")
    argv = server.argv()
    argv[argv.index("kernel_gateway_stream")] = "benchmarks.traced_daemon"
    server.argv = lambda: argv  # type: ignore[method-assign]
    os.environ["KGS_BENCH_SNAPSHOT"] = str(snapshots)
    await server.start()
    sockets = []
    try:
        kernel_id = await server.start_kernel("firehose")
        sockets = await connect_many(server.port, kernel_id, "v1", 1)
        for count in (0, clients):
            sockets += await connect_many(server.port, kernel_id, "v1", count) if count else []
            await asyncio.sleep(2.0)
            assert server.process is not None
            server.process.send_signal(signals.SIGUSR2)
            for _ in range(100):
                if Path(f"{snapshots}.{1 if count else 0}").exists():
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # the dump is written whole
    finally:
        for ws in sockets:
            ws.close()
        await server.stop()
    before = tracemalloc.Snapshot.load(f"{snapshots}.0")
    after = tracemalloc.Snapshot.load(f"{snapshots}.1")
    owners: dict[str, float] = {}
    for stat in after.compare_to(before, "filename"):
        name = stat.traceback[0].filename
        owner = next(
            (
                label
                for key, label in (
                    ("kernel_gateway_stream", "kernel_gateway_stream"),
                    ("tornado", "tornado"),
                    ("jupyter_server", "jupyter_server"),
                    ("traitlets", "traitlets"),
                    ("asyncio", "asyncio"),
                )
                if key in name
            ),
            "other",
        )
        owners[owner] = owners.get(owner, 0.0) + stat.size_diff / clients / 1024
    ranked = sorted(owners.items(), key=lambda item: -item[1])
    return [*ranked, ("all", sum(owners.values()))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--breakdown", action="store_true", help="see the module docstring")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.breakdown:
        for owner, kib in asyncio.run(breakdown(args.clients)):
            print(f"{owner:>22}: {kib:5.1f} KiB of Python heap per idle client")
        return
    result = asyncio.run(measure(args.clients))
    print(
        f"{result['clients']} idle clients: {result['kib_per_client']:.1f} KiB each "
        f"(RSS {result['rss_before_mib']:.1f} -> {result['rss_after_mib']:.1f} MiB)"
    )


if __name__ == "__main__":
    main()
