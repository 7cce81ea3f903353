"""The gateway in front of an upstream: a real jupyter_server, and a second
kernel_gateway_stream (chained). Kernels are created, used and deleted through our daemon
only; the upstream runs them. Output is recorded with no client attached, complete; an
upstream kernel_gateway_stream that is SIGKILLed and started again is resumed by seq with
no gap. A jupyter_server upstream cut off by the network mid-run is a gap record on every
surface, and one SIGKILLed and started again (it keeps no kernels) leaves the kernel gone:
dead, its execution died, out of the kernel list."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from kernel_gateway_stream.client import GatewayClient

from .. import without_iri
from ..timing import seconds
from .daemon import TOKEN, Daemon, free_port
from .floods import flood_code, flood_text
from .sseclient import Event, SSEReader, stream_text
from .wsclient import KernelWS

FLOOD = flood_code(20000)
EXPECTED = flood_text(20000)
GAP = "kernel_gateway_stream_gap"
LIFECYCLE = "kernel_gateway_stream_lifecycle"


class Upstream:
    """A jupyter_server or a kernel_gateway_stream subprocess, the upstream of our daemon."""

    def __init__(self, home: Path, kind: str, *options: str) -> None:
        self.home = home
        self.kind = kind
        self.options = options
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        home.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        module = "jupyter_server" if self.kind == "jupyter_server" else "kernel_gateway_stream"
        # jupyter_server without rfc3987_syntax's grammar, as our daemon starts (see
        # tests/without_iri.py).
        runner = without_iri.RUN if self.kind == "jupyter_server" else [sys.executable, "-m"]
        argv = [*runner, module, f"--port={self.port}", *self.options]
        if self.kind == "jupyter_server":
            argv += [
                "--no-browser",
                "--allow-root",
                "--ServerApp.jpserver_extensions=kernel_gateway_stream=False",
            ]
        env = dict(
            os.environ,
            JUPYTER_TOKEN=TOKEN,
            JUPYTER_DATA_DIR=str(self.home / "data"),
            JUPYTER_RUNTIME_DIR=str(self.home / "runtime"),
            JUPYTER_CONFIG_DIR=str(self.home / "config"),
            # The upstream's kernels are plain ipykernel: debugpy's "frozen modules"
            # warning would now and then open their stdout (our own kernels set this).
            PYDEVD_DISABLE_FILE_VALIDATION="1",
        )
        with open(self.home / "upstream.log", "ab") as log:
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=log)

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + seconds(60)
        while True:
            assert self.process is not None
            assert self.process.poll() is None, (self.home / "upstream.log").read_text()
            try:
                await AsyncHTTPClient().fetch(
                    f"{self.url}/api/kernels", headers={"Authorization": f"token {TOKEN}"}
                )
                return
            except (OSError, HTTPClientError):
                assert time.monotonic() < deadline, (self.home / "upstream.log").read_text()
                await asyncio.sleep(0.2)

    async def kernels(self) -> list[dict[str, Any]]:
        response = await AsyncHTTPClient().fetch(
            f"{self.url}/api/kernels", headers={"Authorization": f"token {TOKEN}"}
        )
        kernels: list[dict[str, Any]] = json.loads(response.body)
        return kernels

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(seconds(30))
            except subprocess.TimeoutExpired:
                self.kill()


#: The upstream's kernelspec, under a name of its own: installed as "python3" in the
#: upstream's JUPYTER_DATA_DIR, it lost to a virtualenv's own python3 kernelspec (jupyter_core
#: puts the environment's directories first there), and the test ran a plain ipykernel.
LOSSLESS = "python3-lossless-upstream"


def install_lossless_python(data_dir: Path) -> None:
    """The upstream's default kernelspec (:data:`LOSSLESS`), started through
    kernel_gateway_stream's launcher: an ipykernel whose IOPub never drops (docs/kernels.md's
    advice for upstream servers)."""
    spec = data_dir / "kernels" / LOSSLESS
    spec.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "kernel_gateway_stream.kernel_launcher",
        "-f",
        "{connection_file}",
    ]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"})
    )


@pytest.fixture
def jupyter_upstream(tmp_path: Path) -> Iterator[Upstream]:
    upstream = Upstream(
        tmp_path / "upstream",
        "jupyter_server",
        "--ZMQChannelsWebsocketConnection.limit_rate=False",
        f"--MappingKernelManager.default_kernel_name={LOSSLESS}",
    )
    install_lossless_python(upstream.home / "data")
    upstream.start()
    yield upstream
    upstream.stop()


@pytest.fixture
def chained_upstream(tmp_path: Path) -> Iterator[Upstream]:
    # On its defaults. With --SQLiteTranscriptStore.batch_linger=1.0 (it commits a second
    # late, and relays each record at once) a kill leaves a second of lines relayed and not
    # durable, which its kernel publishes again: lines that reached us merged into one frame
    # (which names the first line's msg_id only) are then recorded twice here. A known
    # limit (docs/guarantees.md), not yet fixed.
    upstream = Upstream(tmp_path / "upstream", "gateway")
    upstream.start()
    yield upstream
    upstream.stop()


def gateway_options(url: str) -> tuple[str, ...]:
    return (
        f"--gateway-url={url}",
        f"--GatewayClient.auth_token={TOKEN}",
        "--TapManager.upstream_retry_initial=0.2",
        "--TapManager.upstream_retry_max=1",
    )


async def wait_text(client: GatewayClient, kernel_id: str, expected: str) -> str:
    deadline = time.monotonic() + seconds(120)
    while True:
        text = await client.transcript_text(kernel_id)
        if len(text) >= len(expected) or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.2)


async def test_in_front_of_jupyter_server(daemon: Daemon, jupyter_upstream: Upstream) -> None:
    await jupyter_upstream.wait_ready()
    daemon.start(*gateway_options(jupyter_upstream.url))
    await daemon.wait_ready()
    async with asyncio.timeout(seconds(180)), GatewayClient(daemon.url, TOKEN) as client:
        kernel_id = await client.start_kernel(LOSSLESS)
        # The kernelspec the test means, whatever else the environment holds.
        assert [(k["id"], k["name"]) for k in await jupyter_upstream.kernels()] == [
            (kernel_id, LOSSLESS)
        ]
        # Recorded with no client of ours attached: the execute API reads the transcript.
        result = await client.execute(kernel_id, FLOOD)
        assert result.status == "ok"
        assert result.stdout == EXPECTED
        assert await wait_text(client, kernel_id, EXPECTED) == EXPECTED
        # The channels WebSocket of our daemon, replies and output, through the upstream.
    ws = await daemon.channels(kernel_id)
    try:
        msg_id = ws.execute("print('through', 'both')")
        received = await ws.until_idle(msg_id, timeout=60)
        assert received.text() == "through both\n"
    finally:
        ws.close()
    async with asyncio.timeout(seconds(60)), GatewayClient(daemon.url, TOKEN) as client:
        await client.interrupt(kernel_id)
        await client.shutdown(kernel_id)
    deadline = time.monotonic() + seconds(30)
    while await jupyter_upstream.kernels():
        assert time.monotonic() < deadline, "DELETE did not reach the upstream"
        await asyncio.sleep(0.2)


async def test_chained_upstream_killed_and_started_again_loses_nothing(
    daemon: Daemon, chained_upstream: Upstream, tmp_path: Path
) -> None:
    await chained_upstream.wait_ready()
    daemon.start(*gateway_options(chained_upstream.url))
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN) as client:
        kernel_id = await client.start_kernel()
        # The cell runs until the chain is whole again (then 50 lines more): on a slow
        # machine a cell of fixed length could end while the upstream is down, its idle
        # status lost with the rest, and the execution would never be seen to finish.
        back = tmp_path / "back"
        msg_id = await client.start_execution(kernel_id, ticks(back))
        await wait_lines(daemon, client, kernel_id, 50)
        # The upstream dies (its kernel lives on), and comes back.
        chained_upstream.kill()
        await wait_unreachable(daemon, kernel_id)
        await asyncio.sleep(seconds(0.5))
        chained_upstream.start()
        await chained_upstream.wait_ready()
        await wait_reachable(daemon, kernel_id)
        back.touch()
        await wait_finished(daemon, client, kernel_id, msg_id)
        text = await client.transcript_text(kernel_id)
        async with GatewayClient(chained_upstream.url, TOKEN) as upstream_client:
            upstream_text = await upstream_client.transcript_text(kernel_id)
            upstream_records = (await upstream_client.transcript(kernel_id, limit=10000))["records"]
        # The upstream itself was killed: what its kernel printed while it was down, and
        # its last unwritten batch, it has as gap records. The chain adds no loss of its
        # own: every line the upstream kept (and lines it lost that had reached us already),
        # once, in order, and its gaps as gaps.
        ours = [int(line) for line in text.splitlines()]
        assert ours == sorted(set(ours)), "once each, in order"
        assert set(upstream_text.splitlines()) <= set(text.splitlines())
        assert ours[:50] == list(range(50))
        records = (await client.transcript(kernel_id, limit=10000))["records"]
        gaps = [
            r["content"]["reason"] for r in records if r["msg_type"] == "kernel_gateway_stream_gap"
        ]
        upstream_gaps = [
            r for r in upstream_records if r["msg_type"] == "kernel_gateway_stream_gap"
        ]
        assert len(gaps) == len(upstream_gaps), gaps
        assert all(reason.startswith("upstream_") for reason in gaps), gaps
        events = [
            r["content"].get("event")
            for r in records
            if r["msg_type"] == "kernel_gateway_stream_lifecycle"
        ]
        assert events[:2] == ["unreachable", "reachable"]
        upstream_seqs = [
            r["metadata"]["kernel_gateway_stream_upstream"]["seq"]
            for r in records
            if "kernel_gateway_stream_upstream" in r["metadata"]
        ]
        assert upstream_seqs == sorted(set(upstream_seqs)), "the upstream's seq is kept"
        await client.shutdown(kernel_id)


async def test_a_stock_jupyter_server_in_front_of_the_gateway(
    daemon: Daemon, tmp_path: Path
) -> None:
    """``jupyter server --gateway-url=<this gateway>``: its users' notebooks get every line of
    a 20,000-line flush flood (jupyter_server's gateway client proxies without the rate
    limit that drops such floods from its own kernels)."""
    daemon.start()
    await daemon.wait_ready()
    front = Upstream(
        tmp_path / "front",
        "jupyter_server",
        f"--gateway-url={daemon.url}",
        f"--GatewayClient.auth_token={TOKEN}",
    )
    front.start()
    try:
        await front.wait_ready()
        response = await AsyncHTTPClient().fetch(
            f"{front.url}/api/kernels",
            method="POST",
            body="{}",
            headers={"Authorization": f"token {TOKEN}"},
        )
        kernel_id = json.loads(response.body)["id"]
        ws = await KernelWS.open(
            f"ws://127.0.0.1:{front.port}/api/kernels/{kernel_id}/channels",
            {"Authorization": f"token {TOKEN}"},
        )
        try:
            received = await ws.until_idle(ws.execute(FLOOD), timeout=120)
        finally:
            ws.close()
        assert received.text() == EXPECTED
        async with GatewayClient(daemon.url, TOKEN) as client:
            assert await client.transcript_text(kernel_id) == EXPECTED
    finally:
        front.stop()


class CuttableProxy:
    """A TCP proxy on a port of its own to ``127.0.0.1:target_port``: the network path
    between our daemon and its upstream. :meth:`cut` closes the listener and every
    connection (a cut: nothing passes, new connections are refused); :meth:`start` again
    restores the path on the same port."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True
        )

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            theirs = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            self._drop(writer)
            return
        self._writers.add(theirs[1])
        try:
            await asyncio.gather(_pipe(reader, theirs[1]), _pipe(theirs[0], writer))
        finally:
            self._drop(writer)
            self._drop(theirs[1])

    def _drop(self, writer: asyncio.StreamWriter) -> None:
        self._writers.discard(writer)
        writer.transport.abort()

    async def cut(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for writer in list(self._writers):
            self._drop(writer)
        await asyncio.wait_for(server.wait_closed(), seconds(10))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until either side ends; then the whole connection closes."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.transport.abort()


def ticks(until: Path | None = None, cap: int = 3000) -> str:
    """A cell that prints a numbered line every 20 ms: ``cap`` lines, or 50 more once the
    file ``until`` exists (so it runs on for as long as the test needs, and then ends)."""
    return (
        "import os, time\n"
        "stop = None\n"
        "i = 0\n"
        f"while i < {cap} and (stop is None or i < stop):\n"
        "    print(i, flush=True)\n"
        f"    if stop is None and {str(until)!r} != 'None' and os.path.exists({str(until)!r}):\n"
        "        stop = i + 50\n"
        "    i += 1\n"
        "    time.sleep(0.02)\n"
    )


async def wait_lines(daemon: Daemon, client: GatewayClient, kernel_id: str, count: int) -> None:
    deadline = time.monotonic() + seconds(60)
    # Numbered lines only: a kernel may print a warning of its own at its start.
    while (
        sum(line.isdigit() for line in (await client.transcript_text(kernel_id)).splitlines())
        < count
    ):
        assert time.monotonic() < deadline, daemon.log_text()
        await asyncio.sleep(0.1)


async def kernel_state(daemon: Daemon, kernel_id: str) -> str:
    state: str = (await daemon.fetch(f"/api/kernels/{kernel_id}"))["execution_state"]
    return state


async def wait_unreachable(daemon: Daemon, kernel_id: str) -> None:
    """Until our daemon reports the kernel unreachable: its status, and its health."""
    deadline = time.monotonic() + seconds(30)
    while await kernel_state(daemon, kernel_id) != "unreachable":
        assert time.monotonic() < deadline, daemon.log_text()
        await asyncio.sleep(0.1)
    response = await AsyncHTTPClient().fetch(
        f"{daemon.url}/api/gateway/health", headers=daemon.headers, raise_error=False
    )
    health = json.loads(response.body)
    # Degraded by the kernel; a store that is slow under load may make it worse, not better.
    assert health["status"] in ("degraded", "failing"), health
    taps = health["components"]["taps"]
    assert taps["state"] == "degraded", health
    assert taps["reason"] == "kernel_unreachable", health
    assert taps["unreachable"] == [kernel_id], health


async def wait_reachable(daemon: Daemon, kernel_id: str) -> None:
    deadline = time.monotonic() + seconds(60)
    while await kernel_state(daemon, kernel_id) == "unreachable":
        assert time.monotonic() < deadline, daemon.log_text()
        await asyncio.sleep(0.1)


async def wait_finished(daemon: Daemon, client: GatewayClient, kernel_id: str, msg_id: str) -> Any:
    deadline = time.monotonic() + seconds(60)
    while True:
        summary = await client.execution(kernel_id, msg_id)
        if summary.status not in ("queued", "running"):
            return summary
        assert time.monotonic() < deadline, daemon.log_text()
        await asyncio.sleep(0.2)


def numbers(records: list[dict[str, Any]], msg_id: str) -> list[int]:
    """The numbered lines the execution ``msg_id`` printed, in record order (a line's
    number and its newline may come in two messages)."""
    text = "".join(
        r["content"]["text"]
        for r in records
        if r["msg_type"] == "stream" and r["parent_header"].get("msg_id") == msg_id
    )
    return [int(line) for line in text.split("\n") if line]


def split_at_gap(records: list[dict[str, Any]], msg_id: str) -> tuple[list[int], list[int]]:
    """The execution's lines before and after the kernel's one gap record."""
    gaps = [i for i, r in enumerate(records) if r["msg_type"] == GAP]
    assert len(gaps) == 1, [records[i] for i in gaps]
    return numbers(records[: gaps[0]], msg_id), numbers(records[gaps[0] :], msg_id)


def event_numbers(events: list[Event]) -> list[int]:
    return [int(line) for line in stream_text(events).split("\n") if line]


async def test_network_cut_to_jupyter_server_is_a_gap_on_every_surface(
    daemon: Daemon, jupyter_upstream: Upstream, tmp_path: Path
) -> None:
    """The path to a jupyter_server upstream is cut mid-run while its kernel prints on,
    then restored: the kernel shows unreachable meanwhile, and what may have been lost is
    one gap record (lost: unknown) where the cut was, in the transcript, on SSE and on the
    channels WebSocket. Every line before and after is there once, in order; lines printed
    during the cut are there after the gap record, or lost at it. The execution ends."""
    proxy = CuttableProxy(jupyter_upstream.port)
    await proxy.start()
    sse: SSEReader | None = None
    ws: KernelWS | None = None
    try:
        daemon.start(*gateway_options(proxy.url))
        await asyncio.gather(jupyter_upstream.wait_ready(), daemon.wait_ready())
        async with GatewayClient(daemon.url, TOKEN) as client:
            kernel_id = await client.start_kernel()
            sse = SSEReader(f"{daemon.url}/api/kernels/{kernel_id}/stream?since=0", daemon.headers)
            ws = await daemon.channels(kernel_id)
            reconnected = tmp_path / "reconnected"
            msg_id = await client.start_execution(kernel_id, ticks(reconnected))
            await wait_lines(daemon, client, kernel_id, 50)
            await proxy.cut()
            await wait_unreachable(daemon, kernel_id)
            await asyncio.sleep(seconds(0.5))  # the kernel prints on, upstream
            await proxy.start()
            await wait_reachable(daemon, kernel_id)
            reconnected.touch()  # 50 more lines, and the cell ends
            summary = await wait_finished(daemon, client, kernel_id, msg_id)
            assert summary.status == "ok", daemon.log_text()
            records = (await client.transcript(kernel_id, limit=10000))["records"]
        health = await daemon.fetch("/api/gateway/health")
        assert health["components"]["taps"]["state"] == "ok", health

        # The transcript: unreachable, the gap, reachable; the lines around the gap.
        marks = [r for r in records if r["msg_type"] in (GAP, LIFECYCLE)]
        assert [r["msg_type"] for r in marks] == [LIFECYCLE, GAP, LIFECYCLE], marks
        assert [marks[0]["content"]["event"], marks[2]["content"]["event"]] == [
            "unreachable",
            "reachable",
        ]
        assert marks[1]["content"]["lost"] is None
        assert marks[1]["content"]["reason"] == "upstream_reconnected"
        before, after = split_at_gap(records, msg_id)
        assert len(before) >= 50
        assert before == list(range(len(before))), "every line before the cut, once, in order"
        assert after, "recording went on after the cut"
        assert after == list(range(after[0], after[-1] + 1)), "once each, in order"
        assert after[0] > before[-1], "a line printed during the cut is after the gap, or lost"
        assert len(after) >= 50
        execution = await daemon.fetch(f"/api/kernels/{kernel_id}/executions/{msg_id}")
        gap_seq = marks[1]["seq"]
        assert execution["gaps"] == [[gap_seq, gap_seq]], execution
        assert [int(line) for line in summary.stdout.split("\n") if line] == before + after

        # SSE: the same lines, split by the same gap event.
        events = await sse.until_idle(msg_id)
        names = [e.event for e in events]
        assert names.count(GAP) == 1
        at = names.index(GAP)
        assert events[at].data["content"]["lost"] is None
        assert event_numbers(events[:at]) == before
        assert event_numbers(events[at:]) == after
        lifecycle = [e.data["content"]["event"] for e in events if e.event == LIFECYCLE]
        assert lifecycle == ["unreachable", "reachable"]

        # The channels WebSocket of our daemon: the same, with the gap record in its place.
        received = await ws.until_idle(msg_id, timeout=60)
        history = ws.history
        kinds = [m["msg_type"] for m in history]
        assert kinds.count(GAP) == 1
        at = kinds.index(GAP)
        assert history[at]["content"]["lost"] is None
        assert numbers(history[:at], msg_id) == before
        assert numbers(history[at:], msg_id) == after
        assert received.text() == summary.stdout
        async with GatewayClient(daemon.url, TOKEN) as client:
            await client.shutdown(kernel_id)
    finally:
        if sse is not None:
            sse.close()
        if ws is not None:
            ws.close()
        # The daemon stops through the proxy (it shuts its kernels down upstream), and the
        # proxy runs on this loop: not blocked meanwhile.
        await asyncio.to_thread(daemon.stop)
        await proxy.cut()


async def test_jupyter_server_killed_and_started_again_the_kernel_is_gone(
    daemon: Daemon, jupyter_upstream: Upstream
) -> None:
    """A jupyter_server upstream SIGKILLed and started again keeps no kernels. While it is
    down the kernel shows unreachable; once it answers that the kernel does not exist (404),
    the kernel is gone: a gap (what it printed since is lost) and a dead status, reason
    upstream_kernel_gone, on the transcript and on SSE; its running execution ends died; it
    leaves our kernel list."""
    daemon.start(
        *gateway_options(jupyter_upstream.url), "--TapManager.upstream_kernel_gone_after=2"
    )
    await asyncio.gather(jupyter_upstream.wait_ready(), daemon.wait_ready())
    orphans: list[psutil.Process] = []
    sse: SSEReader | None = None
    try:
        async with GatewayClient(daemon.url, TOKEN) as client:
            kernel_id = await client.start_kernel()
            sse = SSEReader(f"{daemon.url}/api/kernels/{kernel_id}/stream?since=0", daemon.headers)
            msg_id = await client.start_execution(kernel_id, ticks())
            await wait_lines(daemon, client, kernel_id, 50)
            # The upstream dies; its kernel lives on, orphaned (killed below).
            assert jupyter_upstream.process is not None
            orphans = psutil.Process(jupyter_upstream.process.pid).children(recursive=True)
            assert orphans, "the upstream's kernel"
            jupyter_upstream.kill()
            await wait_unreachable(daemon, kernel_id)
            jupyter_upstream.start()
            await jupyter_upstream.wait_ready()
            assert await jupyter_upstream.kernels() == []
            summary = await wait_finished(daemon, client, kernel_id, msg_id)
            assert summary.status == "died", summary
            assert summary.reason == "upstream_kernel_gone", summary
            deadline = time.monotonic() + seconds(30)
            while kernel_id in [k["id"] for k in await client.list_kernels()]:
                assert time.monotonic() < deadline, daemon.log_text()
                await asyncio.sleep(0.2)
            with pytest.raises(HTTPClientError) as missing:
                await daemon.fetch(f"/api/kernels/{kernel_id}")
            assert missing.value.code == 404
            records = (await client.transcript(kernel_id, limit=10000))["records"]
        health = await daemon.fetch("/api/gateway/health")
        assert health["components"]["taps"]["state"] == "ok", health
        assert health["components"]["taps"]["kernels"] == 0, health

        # The transcript: unreachable, then what is lost and that the kernel is gone.
        marks = [
            r
            for r in records
            if r["msg_type"] in (GAP, LIFECYCLE)
            or (r["msg_type"] == "status" and "reason" in r["content"])
        ]
        assert [r["msg_type"] for r in marks] == [LIFECYCLE, GAP, "status"], marks
        assert marks[0]["content"]["event"] == "unreachable"
        assert marks[1]["content"] == {
            "first_seq": marks[1]["seq"],
            "last_seq": marks[1]["seq"],
            "reason": "upstream_kernel_gone",
            "lost": None,
        }
        assert marks[2]["content"] == {"execution_state": "dead", "reason": "upstream_kernel_gone"}
        assert marks[2] is records[-1], "nothing after the end"
        before, after = split_at_gap(records, msg_id)
        assert len(before) >= 50
        assert before == list(range(len(before))), "every line before the kill, once, in order"
        assert after == []
        execution = await daemon.fetch(f"/api/kernels/{kernel_id}/executions/{msg_id}")
        assert execution["gaps"] == [[marks[1]["seq"], marks[1]["seq"]]], execution

        # SSE: the same, and then the stream ends as for a kernel shut down.
        events = await sse.until(lambda events: any(e.event == "kernel_shutdown" for e in events))
        names = [e.event for e in events]
        assert names.count(GAP) == 1
        assert event_numbers(events) == before
        dead = [e for e in events if e.event == "status" and not e.data["parent_header"]]
        assert dead[-1].data["content"]["execution_state"] == "dead"
        assert names.index(GAP) < events.index(dead[-1]) < names.index("kernel_shutdown")
    finally:
        if sse is not None:
            sse.close()
        for orphan in orphans:
            with contextlib.suppress(psutil.NoSuchProcess):
                orphan.kill()
