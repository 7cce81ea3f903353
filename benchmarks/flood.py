"""The 20,000-line flood, side by side: direct ZMQ, this gateway, jupyter_server.

    python -m benchmarks.flood            # 5 repeats per system, prints a table, writes JSON
    python -m benchmarks.flood --quick    # 1 repeat, 5,000 lines

Every system runs as a real subprocess on 127.0.0.1 with the same ipykernel; the client code
is the same for the gateway and jupyter_server. Each system gets one unmeasured warm-up
flood first. A run's time is from sending the
execute_request until the last client has seen the execution's ``idle`` status. "lines" is
how many of the printed lines each client received.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from jupyter_server.services.kernels.connection.base import (
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect

TOKEN = "benchmark-token"
V1 = "v1.kernel.websocket.jupyter.org"


@dataclass
class Result:
    system: str
    clients: int
    protocol: str
    seconds: float
    lines_per_client: list[int]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """A server subprocess: this gateway's daemon, or jupyter_server."""

    def __init__(self, kind: str, home: Path) -> None:
        self.kind = kind
        self.port = free_port()
        self.home = home / kind
        self.home.mkdir(parents=True)
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        common = [f"--port={self.port}", f"--IdentityProvider.token={TOKEN}"]
        if self.kind == "gateway":
            return [sys.executable, "-m", "kernel_gateway_stream", *common]
        # Our extension is enabled for every jupyter server once installed: turn it off.
        no_gateway = "--ServerApp.jpserver_extensions=kernel_gateway_stream=False"
        argv = [sys.executable, "-m", "jupyter_server", *common, no_gateway, "--no-browser"]
        argv.append("--allow-root")
        if self.kind == "jupyter_server (limit off)":
            argv.append("--ZMQChannelsWebsocketConnection.limit_rate=False")
        return argv

    async def __aenter__(self) -> Server:
        env = dict(os.environ, JUPYTER_DATA_DIR=str(self.home / "data"))
        env["JUPYTER_RUNTIME_DIR"] = str(self.home / "runtime")
        log = open(self.home / "server.log", "wb")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(self.argv(), env=env, stdout=log, stderr=log)
        client = AsyncHTTPClient()
        for _ in range(300):
            try:
                await client.fetch(f"http://127.0.0.1:{self.port}/api", headers=headers())
                return self
            except Exception:
                await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.kind} did not start: see {self.home / 'server.log'}")

    async def __aexit__(self, *_: object) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def headers() -> dict[str, str]:
    return {"Authorization": f"token {TOKEN}"}


def execute_request(session: str, code: str) -> tuple[str, dict[str, Any]]:
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "session": session,
              "username": "bench", "version": "5.3", "date": ""}  # fmt: skip
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {},
               "allow_stdin": False, "stop_on_error": True}  # fmt: skip
    return msg_id, {"header": header, "parent_header": {}, "metadata": {}, "content": content}


def decode(data: str | bytes, protocol: str) -> dict[str, Any]:
    if protocol == "v1":
        _, parts = deserialize_msg_from_ws_v1(data)
        return {"header": json.loads(parts[0]), "parent_header": json.loads(parts[1]),
                "content": json.loads(parts[3])}  # fmt: skip
    message: dict[str, Any] = json.loads(data)
    return message


async def flood_over_websockets(port: int, lines: int, clients: int, protocol: str) -> Result:
    http = AsyncHTTPClient()
    base = f"http://127.0.0.1:{port}"
    response = await http.fetch(f"{base}/api/kernels", method="POST", body="{}", headers=headers())
    kernel_id = json.loads(response.body)["id"]
    sockets = []
    for _ in range(clients):
        url = (
            f"ws://127.0.0.1:{port}/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4().hex}"
        )
        request = HTTPRequest(url, headers=headers())
        subprotocols = [V1] if protocol == "v1" else None
        sockets.append(await websocket_connect(request, subprotocols=subprotocols))
    # Warm up: one small execution, so the kernel is idle and every socket is live.
    await run_once(sockets, "print('warm')", protocol)
    started = time.perf_counter()
    counts = await run_once(sockets, f"for i in range({lines}): print(i, flush=True)", protocol)
    elapsed = time.perf_counter() - started
    for ws in sockets:
        ws.close()
    await http.fetch(f"{base}/api/kernels/{kernel_id}", method="DELETE", headers=headers())
    return Result("", clients, protocol, elapsed, counts)


async def run_once(sockets: list[Any], code: str, protocol: str) -> list[int]:
    msg_id, message = execute_request(uuid.uuid4().hex, code)
    if protocol == "v1":
        keys = ("header", "parent_header", "metadata", "content")
        parts = [json.dumps(message[key]).encode() for key in keys]
        sockets[0].write_message(serialize_msg_to_ws_v1(parts, "shell"), binary=True)
    else:
        sockets[0].write_message(json.dumps({**message, "channel": "shell", "buffers": []}))

    async def read(ws: Any) -> int:
        count = 0
        while True:
            data = await ws.read_message()
            if data is None:
                raise RuntimeError("socket closed")
            msg = decode(data, protocol)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "stream" and msg["content"]["name"] == "stdout":
                count += msg["content"]["text"].count("\n")
            if kind == "status" and msg["content"]["execution_state"] == "idle":
                return count

    return list(await asyncio.gather(*(read(ws) for ws in sockets)))


async def flood_direct(lines: int) -> Result:
    manager = AsyncKernelManager()
    await manager.start_kernel()
    client = manager.client()
    client.start_channels()
    await client.wait_for_ready(timeout=60)
    try:
        # The same unmeasured warm-up flood every system gets.
        await direct_once(client, f"for i in range({lines}): print(i, flush=True)")
        started = time.perf_counter()
        count = await direct_once(client, f"for i in range({lines}): print(i, flush=True)")
        elapsed = time.perf_counter() - started
    finally:
        client.stop_channels()
        await manager.shutdown_kernel(now=True)
    return Result("direct ZMQ (jupyter_client)", 1, "zmq", elapsed, [count])


async def direct_once(client: Any, code: str) -> int:
    msg_id = client.execute(code)
    count = 0
    while True:
        msg = await client.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            count += msg["content"]["text"].count("\n")
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return count


CASES = [
    ("gateway", 1, "legacy"),
    ("gateway", 1, "v1"),
    ("gateway", 3, "legacy"),
    ("gateway", 3, "v1"),
    ("jupyter_server", 1, "v1"),
    ("jupyter_server", 1, "legacy"),
    ("jupyter_server (limit off)", 1, "v1"),
]


async def main(repeats: int, lines: int, output: Path) -> list[dict[str, Any]]:
    runs: dict[tuple[str, int, str], list[Result]] = {}
    with tempfile.TemporaryDirectory() as home:
        for _ in range(repeats):
            result = await flood_direct(lines)
            runs.setdefault((result.system, 1, "zmq"), []).append(result)
            for system in ("gateway", "jupyter_server", "jupyter_server (limit off)"):
                async with Server(system, Path(home) / uuid.uuid4().hex) as server:
                    # Warm-up, not measured: a fresh server's first flood is slower (files
                    # created, caches filled); every system gets the same one.
                    await flood_over_websockets(server.port, lines, 1, "v1")
                    for kind, clients, protocol in CASES:
                        if kind != system:
                            continue
                        result = await flood_over_websockets(server.port, lines, clients, protocol)
                        result.system = system
                        runs.setdefault((system, clients, protocol), []).append(result)
    direct = statistics.median(r.seconds for r in runs[("direct ZMQ (jupyter_client)", 1, "zmq")])
    rows = []
    for (system, clients, protocol), results in runs.items():
        seconds = statistics.median(r.seconds for r in results)
        delivered = min(min(r.lines_per_client) for r in results)
        rows.append({
            "system": system, "clients": clients, "protocol": protocol,
            "median_seconds": round(seconds, 3), "ratio_to_direct": round(seconds / direct, 3),
            "min_lines_per_client": delivered, "lines": lines,
            "loss_percent": round(100 * (1 - delivered / lines), 2),
            "runs": [asdict(r) for r in results],
        })  # fmt: skip
    report = {
        "benchmark": "flood",
        "lines": lines,
        "repeats": repeats,
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "rows": rows,
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2))
    print(f"{lines:,} flushed prints, median of {repeats}; {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")  # fmt: skip
    print(f"{'system':30} {'clients':>7} {'protocol':>8} {'seconds':>8} {'x direct':>8} "
          f"{'lines/client (min)':>19} {'loss':>7}")  # fmt: skip
    for row in rows:
        print(f"{row['system']:30} {row['clients']:>7} {row['protocol']:>8} "
              f"{row['median_seconds']:>8.2f} {row['ratio_to_direct']:>8.2f} "
              f"{row['min_lines_per_client']:>19,} {row['loss_percent']:>6.1f}%")  # fmt: skip
    print(f"JSON: {output}")
    return rows


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="1 repeat of 5,000 lines")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/flood.json"))
    args = parser.parse_args()
    repeats, lines = (1, 5000) if args.quick else (args.repeats, args.lines)
    asyncio.run(main(repeats, lines, args.output))


if __name__ == "__main__":
    cli()
