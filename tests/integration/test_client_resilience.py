"""The clients when the network or the gateway misbehaves: an unreachable gateway, a stream
that drops and stays down, a gateway that shuts down, a reader that falls behind. Both the
async and the blocking client, over real sockets."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from traitlets.config import Config

from kernel_gateway_stream.client import (
    Event,
    GatewayClient,
    GatewayUnreachable,
    Reconnect,
    SyncGatewayClient,
)

from ..timing import seconds
from .daemon import free_port
from .scripted import HANG, ScriptedGateway, sse, sse_response
from .test_client import CuttableProxy

KERNEL = "k1"


async def collect(events: AsyncIterator[Event]) -> list[Event]:
    return [event async for event in events]


def read_all(client: GatewayClient | SyncGatewayClient, since: int | None = None) -> list[Event]:
    """Every event of kernel ``k1``'s stream, with either client."""
    if isinstance(client, SyncGatewayClient):
        return list(client.stream(KERNEL, since))
    return asyncio.run(collect(client.stream(KERNEL, since)))


@pytest.fixture(params=["async", "sync"])
def make_client(request: Any) -> Iterator[Any]:
    """A factory of clients of one kind; they are closed after the test."""
    made: list[GatewayClient | SyncGatewayClient] = []

    def make(url: str, **options: Any) -> GatewayClient | SyncGatewayClient:
        kind = GatewayClient if request.param == "async" else SyncGatewayClient
        client = kind(url, "token", **options)
        made.append(client)
        return client

    yield make
    for client in made:
        if isinstance(client, SyncGatewayClient):
            client.close()


# -- an unreachable gateway -----------------------------------------------------------


async def test_an_unreachable_gateway_is_the_clients_own_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with GatewayClient(url, "token") as gateway:
        with pytest.raises(GatewayUnreachable) as refused:
            await gateway.list_kernels()
        assert refused.value.url == url
        assert "\n" not in str(refused.value)
        with pytest.raises(GatewayUnreachable):
            await collect(gateway.stream(KERNEL))
    with SyncGatewayClient(url, "token") as blocking:
        with pytest.raises(GatewayUnreachable):
            blocking.start_kernel()
        with pytest.raises(GatewayUnreachable):
            list(blocking.stream(KERNEL))


def test_a_first_stream_connection_that_fails_is_not_retried(make_client: Any) -> None:
    """Fail fast: one connection, not a minute of retries, when the gateway never answered."""
    server = ScriptedGateway([])  # closes every connection without a word
    try:
        with pytest.raises(GatewayUnreachable):
            read_all(make_client(server.url))
        assert len(server.requests) == 1
    finally:
        server.close()


# -- resuming -------------------------------------------------------------------------


def test_gateway_shutdown_resumes_after_its_last_seq_with_a_pause(make_client: Any) -> None:
    """The gateway says it is stopping: the client waits, reconnects, and resumes from
    ``last_seq`` with Last-Event-ID; ``on_reconnect`` hears of it."""
    out = {"name": "stdout", "text": "a"}
    server = ScriptedGateway(
        [
            sse_response(
                sse("stream", {"content": out}, 1),
                sse("stream", {"content": out}, 2),
                sse("gateway_shutdown", {"reason": "stopping", "last_seq": 2}),
            ),
            b"",  # the gateway is gone for a moment: closed without an answer
            sse_response(sse("stream", {"content": out}, 3), sse("kernel_shutdown", {})),
        ]
    )
    reconnects: list[Reconnect] = []
    try:
        client = make_client(server.url, reconnect_delay=0.01, on_reconnect=reconnects.append)
        events = read_all(client, since=0)
    finally:
        server.close()
    assert [(event.event, event.id) for event in events] == [
        ("stream", 1),
        ("stream", 2),
        ("stream", 3),
        ("kernel_shutdown", 3),
    ]
    assert [headers.get("last-event-id") for _, headers in server.requests] == ["0", "2", "2"]
    assert [(r.attempt, r.since) for r in reconnects] == [(1, 2), (2, 2)]
    assert "gateway_shutdown" in reconnects[0].reason
    assert all(0 < r.delay <= 5.0 for r in reconnects)


def test_an_outage_past_the_deadline_gives_up(make_client: Any) -> None:
    """After a working stream drops, the client retries with growing pauses and gives up
    with GatewayUnreachable at its deadline, not never."""
    server = ScriptedGateway([sse_response(sse("stream", {"content": {}}, 1))])
    reconnects: list[Reconnect] = []
    client = make_client(
        server.url,
        reconnect_delay=0.01,
        reconnect_max_delay=0.04,
        reconnect_deadline=0.3,
        on_reconnect=reconnects.append,
    )
    try:
        with pytest.raises(GatewayUnreachable, match="gave up after"):
            read_all(client)
    finally:
        server.close()
    assert len(reconnects) >= 3
    assert [r.attempt for r in reconnects] == list(range(1, len(reconnects) + 1))
    assert all(r.since == 1 for r in reconnects)
    assert max(r.delay for r in reconnects) <= 0.04


def test_bare_cr_line_ends_and_unicode_line_separators_over_the_wire(make_client: Any) -> None:
    text = "one\u2028two\u2029three\x85"
    server = ScriptedGateway(
        [
            sse_response(
                b": keepalive\r",
                sse("stream", {"content": {"text": text}}, 1, end=b"\r"),
                sse("kernel_shutdown", {}, end=b"\r\n"),
            )
        ]
    )
    try:
        events = read_all(make_client(server.url))
    finally:
        server.close()
    assert [event.data.get("content", {}).get("text") for event in events] == [text, None]


def test_a_stream_cut_mid_run_resumes_with_backoff(make_client: Any) -> None:
    """The connection breaks mid-stream and the gateway then refuses a few times."""
    out = {"content": {"name": "stdout", "text": "x"}}
    server = ScriptedGateway(
        [
            sse_response(sse("stream", out, 1)),
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            b"",
            sse_response(sse("stream", out, 2), sse("kernel_shutdown", {})),
        ]
    )
    reconnects: list[Reconnect] = []
    try:
        client = make_client(server.url, reconnect_delay=0.01, on_reconnect=reconnects.append)
        events = read_all(client)
    finally:
        server.close()
    assert [event.id for event in events] == [1, 2, 2]
    assert [r.attempt for r in reconnects] == [1, 2, 3]
    assert "HTTP 503" in reconnects[1].reason


def test_a_silent_stream_is_resumed_after_the_idle_timeout(make_client: Any) -> None:
    """No event and no keep-alive for ``idle_timeout``: the connection is taken for dead and
    the stream resumed."""
    server = ScriptedGateway(
        [
            [sse_response(sse("stream", {}, 4)), HANG],
            sse_response(sse("stream", {}, 5), sse("kernel_shutdown", {})),
        ]
    )
    reconnects: list[Reconnect] = []
    client = make_client(
        server.url, idle_timeout=0.2, reconnect_delay=0.01, on_reconnect=reconnects.append
    )
    try:
        events = read_all(client)
    finally:
        server.close()
    assert [event.id for event in events] == [4, 5, 5]
    assert [(r.attempt, r.since) for r in reconnects] == [(1, 4)]
    assert "ReadTimeout" in reconnects[0].reason, reconnects


def test_a_gateway_that_never_answers_is_unreachable_after_the_idle_timeout(
    make_client: Any,
) -> None:
    server = ScriptedGateway([HANG])
    try:
        with pytest.raises(GatewayUnreachable):
            read_all(make_client(server.url, idle_timeout=0.2))
    finally:
        server.close()
    assert len(server.requests) == 1


# -- a slow reader against the real gateway -------------------------------------------


@pytest.fixture
def jp_server_config(transcript_path: str) -> Config:
    """A gateway that drops a reader with more than 256 KiB queued for it."""
    return Config(
        {
            "ServerApp": {"jpserver_extensions": {"kernel_gateway_stream": True}},
            "SQLiteTranscriptStore": {"path": transcript_path},
            "GatewayStreamApp": {"subscriber_max_bytes": 256 * 1024},
        }
    )


@pytest.fixture
def gateway(
    http_server_client: Any,
    jp_http_port: int,
    jp_auth_header: dict[str, str],
    jp_base_url: str,
) -> tuple[str, str]:
    token = jp_auth_header["Authorization"].split(" ", 1)[1]
    return f"http://127.0.0.1:{jp_http_port}{jp_base_url.rstrip('/')}", token


async def test_a_slow_reader_pushes_back_and_the_gateway_drops_and_resumes_it(
    gateway: tuple[str, str], tmp_path: Path
) -> None:
    """The client reads nothing ahead: while its caller pauses, TCP fills up, the gateway's
    queue for it overflows and it gets ``slow_consumer``; it then resumes from the
    transcript and the caller still sees every byte, once, in order.

    The flood starts only once the reader has its first line (the kernel waits for a file
    the test makes then), so the reader's stream is live when it stops reading: one that
    connected after the flood was recorded reads it as a replay, page by page, which waits
    for the reader instead of dropping it (a loaded run's reader once connected that late,
    read everything as a replay and was never dropped)."""
    url, token = gateway
    reconnects: list[Reconnect] = []
    make_block = "''.join(f'{i:07d}' for i in range(9362)) + '\\n'"  # 65,535 bytes
    block: str = eval(make_block)
    # More than the connection and the gateway's queue hold: the reader's receive buffer
    # is set (SO_RCVBUF: no autotuning, which grew it to tcp_rmem's maximum, 32 MiB here,
    # and once took 40 MiB of output without the reader being dropped); the gateway's
    # send buffer may grow to tcp_wmem's maximum.
    blocks = (2 * (READER_BUFFER + send_buffer_max()) + 4 * MiB) // len(block) + 1
    go = tmp_path / "go"
    code = (
        f"import os, sys, time\nblock = {make_block}\nprint('ready', flush=True)\n"
        f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\n"
        f"for _ in range({blocks}):\n    sys.stdout.write(block)\n    sys.stdout.flush()"
    )
    async with (
        SmallBufferClient(url, token, on_reconnect=reconnects.append) as reader,
        GatewayClient(url, token) as watcher,
    ):
        kernel_id = await reader.start_kernel()
        msg_id = await reader.start_execution(kernel_id, code)
        text: list[str] = []
        async for event in reader.execution_events(kernel_id, msg_id):
            if event.event == "stdout":
                text.append(event.data["text"])
                if text == ["ready\n"]:  # pause, reading nothing, until the kernel is done
                    go.touch()
                    await until_finished(watcher, kernel_id, msg_id)
            if event.event == "done":
                assert event.data["status"] == "ok"
        await reader.shutdown(kernel_id)
    assert any("slow_consumer" in reconnect.reason for reconnect in reconnects), reconnects
    assert "".join(text) == "ready\n" + block * blocks


MiB = 1024 * 1024


#: The slow reader's receive buffer (the kernel doubles it for its bookkeeping).
READER_BUFFER = 256 * 1024


class SmallBufferClient(GatewayClient):
    """A GatewayClient whose connections have a fixed, small receive buffer."""

    def _http_options(self) -> dict[str, Any]:
        options = super()._http_options()
        buffer = [(socket.SOL_SOCKET, socket.SO_RCVBUF, READER_BUFFER)]
        options["transport"] = httpx.AsyncHTTPTransport(socket_options=buffer)
        return options


def send_buffer_max() -> int:
    """The most a TCP connection's sender buffers here: tcp_wmem's maximum (8 MiB if it
    cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        return 8 * MiB


async def until_finished(gateway: GatewayClient, kernel_id: str, msg_id: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(120)
    while (await gateway.execution(kernel_id, msg_id)).status in ("queued", "running"):
        assert loop.time() < deadline, "the execution did not finish"
        await asyncio.sleep(0.1)


# -- the real gateway behind a proxy that goes down -----------------------------------


class RefusingProxy(CuttableProxy):
    """A :class:`CuttableProxy` that, while ``refusing``, drops each new connection."""

    refusing = False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        await super()._accept(reader, writer)


async def test_a_kernel_stream_survives_an_outage_of_the_network(
    http_server_client: Any,
    jp_http_port: int,
    jp_auth_header: dict[str, str],
    jp_base_url: str,
) -> None:
    proxy = RefusingProxy(jp_http_port)
    port = await proxy.start()
    token = jp_auth_header["Authorization"].split(" ", 1)[1]
    url = f"http://127.0.0.1:{port}{jp_base_url.rstrip('/')}"
    reconnects: list[Reconnect] = []

    def on_reconnect(reconnect: Reconnect) -> None:
        reconnects.append(reconnect)
        if len(reconnects) == 3:
            proxy.refusing = False  # the network is back

    async def outage(gateway: GatewayClient, kernel_id: str) -> str:
        text = ""
        async for event in gateway.stream(kernel_id, 0, msg_types=["stream"]):
            content = event.data["content"]
            if content["name"] != "stdout":
                continue  # the kernel may warn on stderr
            text += content["text"]  # a print may come in pieces
            if text == "before\n":
                proxy.refusing = True
                proxy.cut()
                # Printed during the outage, through another connection to the gateway.
                async with GatewayClient(direct_url, token) as direct:
                    await direct.execute(kernel_id, "print('during')")
            if text.endswith("during\n"):
                break
        return text

    direct_url = f"http://127.0.0.1:{jp_http_port}{jp_base_url.rstrip('/')}"
    async with GatewayClient(
        url, token, reconnect_delay=0.02, on_reconnect=on_reconnect
    ) as gateway:
        kernel_id = await gateway.start_kernel()
        await gateway.execute(kernel_id, "print('before')")
        text = await asyncio.wait_for(outage(gateway, kernel_id), seconds(60))
        await gateway.shutdown(kernel_id)
    proxy.close()
    assert text == "before\nduring\n"
    assert [r.attempt for r in reconnects] == [1, 2, 3]
    assert reconnects[0].since is not None
