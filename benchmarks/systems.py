"""The systems under test, each a real server subprocess on 127.0.0.1, and the references.

Every server gets the same token, the same kernels (ipykernel and the firehose kernelspec on
``JUPYTER_PATH``) and its own Jupyter directories. Peers run on their defaults; the
"limit off" variant of jupyter_server sets ``ZMQChannelsWebsocketConnection.limit_rate``
to False (the old ``ServerApp.iopub_*`` options no longer take effect).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

TOKEN = "benchmark-token"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def headers() -> dict[str, str]:
    return {"Authorization": f"token {TOKEN}"}


@dataclass(frozen=True)
class System:
    """One system under test: its name, how it is started, which protocols it speaks."""

    name: str
    kind: str  # "gateway", "jupyter_server", "kernel_gateway" or "enterprise_gateway"
    options: tuple[str, ...] = ()
    protocols: tuple[str, ...] = ("v1",)
    #: Environment variables set for its process.
    env: tuple[tuple[str, str], ...] = ()

    @property
    def ours(self) -> bool:
        return self.kind == "gateway"


GATEWAY = System("kernel_gateway_stream", "gateway", protocols=("legacy", "v1"))
JUPYTER_SERVER = System("jupyter_server", "jupyter_server")
JUPYTER_SERVER_NO_LIMIT = System(
    "jupyter_server (limit off)",
    "jupyter_server",
    ("--ZMQChannelsWebsocketConnection.limit_rate=False",),
)
KERNEL_GATEWAY = System("jupyter_kernel_gateway", "kernel_gateway")
#: Enterprise Gateway 3.3 on its defaults, from its own virtualenv (made by
#: ``python -m tests.integration.enterprise_gateway``; see ``enterprise_gateway_venv``).
ENTERPRISE_GATEWAY = System("Enterprise Gateway 3.3", "enterprise_gateway", protocols=("legacy",))


def enterprise_gateway_venv() -> Path:
    """Where the tests keep Enterprise Gateway's virtualenv (made if it is not there)."""
    from tests.integration.enterprise_gateway import ensure_venv

    return ensure_venv()


SYSTEMS = (GATEWAY, JUPYTER_SERVER, JUPYTER_SERVER_NO_LIMIT, KERNEL_GATEWAY)


class Server:
    """A running system: a subprocess with a port, a log, and its CPU time and memory."""

    def __init__(self, system: System, home: Path, jupyter_path: Path) -> None:
        self.system = system
        self.port = free_port()
        self.home = home
        self.home.mkdir(parents=True, exist_ok=True)
        self.jupyter_path = jupyter_path
        self.process: subprocess.Popen[bytes] | None = None
        self.ps: psutil.Process | None = None
        self.http = AsyncHTTPClient(max_clients=50)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def transcript_path(self) -> Path:
        return self.home / "transcripts.sqlite3"

    def argv(self) -> list[str]:
        kind = self.system.kind
        if kind == "gateway":
            return [
                sys.executable,
                "-m",
                "kernel_gateway_stream",
                f"--port={self.port}",
                f"--IdentityProvider.token={TOKEN}",
                f"--SQLiteTranscriptStore.path={self.transcript_path}",
                # The transcript scenario records a million messages into one kernel.
                f"--SQLiteTranscriptStore.max_bytes_per_kernel={4 << 30}",
                *self.system.options,
            ]
        if kind == "jupyter_server":
            return [
                sys.executable,
                "-m",
                "jupyter_server",
                f"--port={self.port}",
                f"--IdentityProvider.token={TOKEN}",
                "--no-browser",
                "--allow-root",
                # Our extension is enabled for every jupyter server once installed.
                "--ServerApp.jpserver_extensions=kernel_gateway_stream=False",
                *self.system.options,
            ]
        if kind == "enterprise_gateway":
            return [
                str(enterprise_gateway_venv() / "bin" / "jupyter-enterprisegateway"),
                "--ip=127.0.0.1",
                f"--port={self.port}",
                f"--EnterpriseGatewayApp.auth_token={TOKEN}",
                *self.system.options,
            ]
        return [
            sys.executable,
            "-m",
            "kernel_gateway",
            f"--KernelGatewayApp.port={self.port}",
            "--KernelGatewayApp.ip=127.0.0.1",
            f"--KernelGatewayApp.auth_token={TOKEN}",
            *self.system.options,
        ]

    async def start(self) -> None:
        env = dict(
            os.environ,
            JUPYTER_PATH=str(self.jupyter_path),
            JUPYTER_DATA_DIR=str(self.home / "data"),
            JUPYTER_RUNTIME_DIR=str(self.home / "runtime"),
            JUPYTER_CONFIG_DIR=str(self.home / "config"),
        )
        env.update(self.system.env)
        if self.system.kind == "enterprise_gateway":
            # Its kernelspec says "python": the virtualenv's (jupyter_client 6).
            bin_dir = enterprise_gateway_venv() / "bin"
            env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
            env["VIRTUAL_ENV"] = str(bin_dir.parent)
        log = open(self.home / "server.log", "wb")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(self.argv(), env=env, stdout=log, stderr=log)
        self.ps = psutil.Process(self.process.pid)
        for _ in range(600):
            if self.process.poll() is not None:
                break
            try:
                await self.http.fetch(f"{self.base}/api/kernelspecs", headers=headers())
                return
            except (OSError, HTTPClientError):
                await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.system.name} did not start: see {self.home / 'server.log'}")

    async def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.process.wait, 30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        response = await self.http.fetch(
            self.base + path,
            method=method,
            headers=headers(),
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            request_timeout=120,
        )
        return json.loads(response.body) if response.body else None

    async def start_kernel(self, name: str = "python3") -> str:
        body: dict[str, Any] = {"name": name}
        if self.system.kind == "enterprise_gateway":
            # It refuses kernels for root unless KERNEL_USERNAME says who they are for.
            body["env"] = {"KERNEL_USERNAME": "benchmark"}
        model = await self.request("POST", "/api/kernels", body)
        kernel_id: str = model["id"]
        return kernel_id

    async def shutdown_kernel(self, kernel_id: str) -> None:
        with contextlib.suppress(HTTPClientError):
            await self.request("DELETE", f"/api/kernels/{kernel_id}")

    def cpu_seconds(self) -> float:
        """User plus system CPU time of the server process itself (not its kernels)."""
        assert self.ps is not None
        times = self.ps.cpu_times()
        return float(times.user + times.system)

    def rss(self) -> int:
        assert self.ps is not None
        rss: int = self.ps.memory_info().rss
        return rss
