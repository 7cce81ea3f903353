"""The standalone daemon as a real subprocess, for the tests that need one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from kernel_gateway_stream.core.forking import FORKSERVER_MODULE

from ..timing import seconds
from .waits import wait_until
from .wsclient import KernelWS

TOKEN = "test-token-for-the-daemon"


#: Where the system picks a port for a bind to port 0 (kernels' ZeroMQ ports, every
#: jupyter_client and test server that asks for any free port).
EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The lowest port :func:`free_port` gives.
LOWEST_PORT = 10000


def free_port() -> int:
    """A port nothing listens on, for a server that a test starts and that binds it later.

    Not one the system would hand out for port 0: such a port, released here, may be given
    to a kernel starting meanwhile before the server binds it ("port ... is already in use",
    seen with four workers beside another run). Below that range a port is taken only by
    an explicit bind; it is picked at random and checked free."""
    first_ephemeral = int(EPHEMERAL.read_text().split()[0]) if EPHEMERAL.exists() else 32768
    while True:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", random.randrange(LOWEST_PORT, first_ephemeral)))
            except OSError:
                continue  # taken: pick another
            port: int = sock.getsockname()[1]
            return port


def _is_forkserver(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return FORKSERVER_MODULE.encode() in cmdline.read()
    except OSError:
        return False


def _describe(pid: int) -> str:
    """``pid``, its state, its parent and its command line, as /proc tells them."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state, parent = stat.read().rpartition(b")")[2].split()[:2]
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = cmdline.read().replace(b"\0", b" ").strip()
    except (OSError, ValueError):
        return f"{pid} (gone)"
    shown = command.decode(errors="replace")[:200]
    return f"{pid} {state.decode()} parent {parent.decode()}: {shown}"


def other_processes() -> Iterator[tuple[int, bytes]]:
    """Every process but this one, with its command line (arguments NUL-separated; empty
    for a zombie); those that end while they are read are left out."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                yield int(entry), cmdline.read()
        except OSError:
            continue  # ended meanwhile


def processes_under(directory: Path) -> list[int]:
    """The processes whose command line names something in ``directory``: for a daemon's
    home, the kernels it started (their connection files are in its runtime directory),
    whichever start of the daemon started them and whether or not they are its children."""
    mark = str(directory).encode() + b"/"
    return [pid for pid, command in other_processes() if mark in command]


class Daemon:
    """``python -m kernel_gateway_stream`` in its own Jupyter directories."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log = home / "daemon.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {TOKEN}"}

    def start(self, *args: str, env: dict[str, str] | None = None) -> None:
        """Start it, with extra command-line ``args`` and environment ``env``."""
        environment = dict(os.environ)
        environment.update(
            JUPYTER_TOKEN=TOKEN,
            JUPYTER_DATA_DIR=str(self.home / "data"),
            JUPYTER_RUNTIME_DIR=str(self.home / "runtime"),
            JUPYTER_CONFIG_DIR=str(self.home / "config"),
        )
        environment.update(env or {})
        argv = [sys.executable, "-m", "kernel_gateway_stream", f"--port={self.port}", *args]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                argv, env=environment, stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )

    @property
    def transcript_path(self) -> Path:
        return self.home / "data" / "kernel_gateway_stream" / "transcripts.sqlite3"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def kernel_pids(self) -> list[int]:
        """The processes the daemon started (its kernels): its children, and the children
        of its kernel forkserver (``kernel_gateway_stream.kernel_forkserver``, not a
        kernel itself)."""
        return [pid for pid in self._descendants() if not _is_forkserver(pid)]

    async def kernel_pid(self, timeout: float = 10) -> int:
        """The pid of the daemon's one kernel, once it is the one process the daemon
        started besides its forkserver. Right after a start that is not always so at the
        first look: a fresh clone's run found more than one once (2026-12-08, not
        seen since, nor in 281 tries under load). Fails, after ``timeout`` seconds
        (scaled), saying what each process under the daemon is."""
        pids: list[int] = []

        def one() -> bool:
            pids[:] = self.kernel_pids()
            return len(pids) == 1

        def described() -> str:
            return "one kernel under the daemon; there are: " + "; ".join(
                _describe(pid) for pid in self._descendants()
            )

        await wait_until(one, described, timeout)
        return pids[0]

    def _descendants(self) -> list[int]:
        assert self.process is not None
        found: list[int] = []
        parents = [self.process.pid]
        while parents:
            children = subprocess.run(
                ["pgrep", "-P", ",".join(map(str, parents))], capture_output=True, text=True
            ).stdout.split()
            parents = [int(pid) for pid in children]
            found.extend(parents)
        return found

    async def start_kernel(self, name: str | None = None) -> str:
        body = json.dumps({"name": name} if name else {})
        kernel: dict[str, Any] = await self.fetch("/api/kernels", method="POST", body=body)
        return str(kernel["id"])

    async def wait_ready(self, headers: dict[str, str] | None = None) -> None:
        client = AsyncHTTPClient()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds(60)
        while loop.time() < deadline:
            assert self.process is not None
            assert self.process.poll() is None, self.log.read_text()
            try:
                await client.fetch(f"{self.url}/api/kernels", headers=headers or self.headers)
                return
            except (ConnectionError, OSError, HTTPClientError):
                await asyncio.sleep(0.05)  # a poll, not a wait for anything in particular
        raise TimeoutError(self.log.read_text())

    def kill_hard(self) -> None:
        """SIGKILL the daemon and the kernels it launched (they would outlive it)."""
        assert self.process is not None
        children = self._descendants()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(seconds(30))
            except subprocess.TimeoutExpired:
                self.kill_hard()

    async def until_execution_ended(
        self, kernel_id: str, msg_id: str, timeout: float = 120
    ) -> None:
        """Until execution ``msg_id`` is no longer ``running`` (the kernel may still be being
        re-attached after a restart: 404 until then)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds(timeout)
        path = f"/api/kernels/{kernel_id}/executions/{msg_id}"
        while True:
            with contextlib.suppress(Exception):  # 404 until the kernel is re-attached
                if (await self.fetch(path))["status"] != "running":
                    return
            assert loop.time() < deadline, "the execution never ended in the transcript"
            await asyncio.sleep(0.2)

    async def fetch(self, path: str, **kwargs: Any) -> Any:
        kwargs.setdefault("headers", self.headers)
        response = await AsyncHTTPClient().fetch(self.url + path, **kwargs)
        if response.headers.get("Content-Type", "").startswith("application/json"):
            return json.loads(response.body)
        return response.body.decode()

    async def channels(
        self, kernel_id: str, headers: dict[str, str] | None = None, **options: Any
    ) -> KernelWS:
        url = f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels"
        return await KernelWS.open(url, headers or self.headers, **options)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    instance = Daemon(tmp_path)
    yield instance
    instance.stop()


@pytest.fixture(scope="module")
def module_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon with the default options, started once for a module's tests that each
    use kernels of their own on it and assert only about those (a test that restarts,
    kills or configures its daemon takes ``daemon``). A module-scoped fixture is made once
    per pytest-xdist worker: mark its tests with one ``xdist_group`` so it starts once."""
    instance = Daemon(tmp_path_factory.mktemp("daemon"))
    instance.start()
    try:
        asyncio.run(instance.wait_ready())
        yield instance
    finally:
        instance.stop()
