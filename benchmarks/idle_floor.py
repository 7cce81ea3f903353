"""The idle-memory reference: what one idle WebSocket client costs a bare tornado server.

    python -m benchmarks.idle_floor --clients 1000

A process of its own serves ``/api/kernels/<id>/channels`` with a tornado
``WebSocketHandler`` that accepts the v1 subprotocol and does nothing else (no kernel, no
authentication, no jupyter_server); the benchmark's own clients connect to it as they
connect to every system, and the row is the growth of its resident memory per client, as
``python -m benchmarks --only idle_memory`` measures each system. What a gateway's client
costs above this is its own.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    result = asyncio.run(measure(args.clients))
    print(
        f"{result['clients']} idle clients: {result['kib_per_client']:.1f} KiB each "
        f"(RSS {result['rss_before_mib']:.1f} -> {result['rss_after_mib']:.1f} MiB)"
    )


if __name__ == "__main__":
    main()
