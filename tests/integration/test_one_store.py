"""One gateway per store: a second process on a SQLite store that a gateway holds refuses,
whether it is a second daemon (it stops at start-up with one line) or a ``jupyter server``
with the extension (the extension does not load; the server runs on without it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from ..timing import seconds
from .daemon import TOKEN, Daemon, free_port
from .waits import wait_until


def _refusal(second: Daemon) -> str:
    assert second.process is not None
    code = second.process.wait(seconds(60))
    assert code == 1, second.log_text()[-3000:]
    return second.log_text().strip().splitlines()[-1]


async def _recorded_once(daemon: Daemon, kernel_id: str) -> None:
    """The kernel's transcript is one recording: numbered from 1 with no hole, no gap
    record (a second gateway on the store re-attaches the kernel after a false
    ``gateway_restart`` gap and numbers past its reservation)."""
    page = await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?limit=1000")
    seqs = [record["seq"] for record in page["records"]]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    types = {record["msg_type"] for record in page["records"]}
    assert not any(kind.startswith("kernel_gateway_stream_gap") for kind in types), types


async def test_a_second_daemon_on_the_store_refuses_naming_the_holder(tmp_path: Path) -> None:
    """The second daemon stops with one line naming the first's PID and the option; the
    first's kernel and transcript are untouched (no second recording, no false gap).
    Control: given a store of its own, the second daemon starts."""
    first = Daemon(tmp_path)
    first.start()
    second = Daemon(tmp_path)
    second.log = tmp_path / "second.log"
    try:
        await first.wait_ready()
        kernel_id = await first.start_kernel()
        second.start()
        line = _refusal(second)
        assert first.process is not None
        assert line.startswith("kernel-gateway-stream: the transcript store "), line
        assert f"in use by process {first.process.pid} " in line
        assert "--SQLiteTranscriptStore.path=" in line
        await _recorded_once(first, kernel_id)
        kernels = await first.fetch("/api/kernels")
        assert [kernel["id"] for kernel in kernels] == [kernel_id]

        own = Daemon(tmp_path)
        own.log = tmp_path / "own.log"
        own.start(f"--SQLiteTranscriptStore.path={tmp_path / 'own' / 'transcripts.sqlite3'}")
        try:
            await own.wait_ready()
        finally:
            own.stop()
    finally:
        second.stop()
        first.stop()


async def test_a_jupyter_server_beside_the_daemon_runs_without_the_extension(
    tmp_path: Path,
) -> None:
    """A ``jupyter server`` with the extension enabled, on the daemon's store (the same
    Jupyter data directory), serves on without the extension: its log says why in a line
    naming the daemon's PID, the gateway's endpoints are not there, and the daemon's
    transcript and kernel are untouched after the server stops."""
    daemon = Daemon(tmp_path)
    daemon.start()
    port = free_port()
    log_path = tmp_path / "server.log"
    server: subprocess.Popen[bytes] | None = None
    try:
        await daemon.wait_ready()
        kernel_id = await daemon.start_kernel()
        env = dict(
            os.environ,
            JUPYTER_TOKEN=TOKEN,
            JUPYTER_DATA_DIR=str(tmp_path / "data"),
            JUPYTER_RUNTIME_DIR=str(tmp_path / "server-runtime"),
            JUPYTER_CONFIG_DIR=str(tmp_path / "server-config"),
        )
        argv = [
            sys.executable, "-m", "jupyter_server", f"--port={port}", "--no-browser",
            "--allow-root", "--ServerApp.jpserver_extensions=kernel_gateway_stream=True",
        ]  # fmt: skip
        with open(log_path, "ab") as log:
            server = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
        headers = {"Authorization": f"token {TOKEN}"}
        client = AsyncHTTPClient()

        async def serving() -> bool:
            assert server is not None
            assert server.poll() is None, log_path.read_text()
            try:
                await client.fetch(f"http://127.0.0.1:{port}/api/kernels", headers=headers)
            except (OSError, HTTPClientError):
                return False
            return True

        await wait_until(serving, "the jupyter server to serve", 60)
        text = log_path.read_text()
        assert daemon.process is not None
        assert (
            "kernel_gateway_stream is not loaded: the transcript store "
            f"{daemon.transcript_path} is in use by process {daemon.process.pid} "
        ) in text, text
        response = await client.fetch(
            f"http://127.0.0.1:{port}/api/gateway/health", headers=headers, raise_error=False
        )
        assert response.code == 404
        server.terminate()
        server.wait(seconds(30))
        await _recorded_once(daemon, kernel_id)
        kernels = await daemon.fetch("/api/kernels")
        assert [kernel["id"] for kernel in kernels] == [kernel_id]
        health = await daemon.fetch("/api/gateway/health")
        assert json.dumps(health)  # the daemon still answers
    finally:
        if server is not None and server.poll() is None:
            server.kill()
            server.wait()
        daemon.stop()
