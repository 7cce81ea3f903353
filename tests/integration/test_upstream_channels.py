"""One upstream WebSocket per kernel, whatever the number of clients: the gateway in front
of a real jupyter_server (its rate limit off, so what a client misses is ours to explain).

Every watcher here also sends requests, so each has kernel channels of its own on our side;
the upstream's log line ``Connecting to kernel <id>.`` (jupyter_server writes it for every
channels WebSocket it opens) is counted from outside: one per kernel with 1, 3 and 100
watchers. Replies reach the watcher that asked and no other, ``input()`` is answered by
the watcher that ran it while others watch, a watcher that leaves mid-execution disturbs
nobody, and interrupt and restart work through the one connection."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernel_gateway_stream.client import GatewayClient

from ..timing import seconds
from .daemon import TOKEN, Daemon
from .floods import flood_code, flood_text
from .test_upstream import (
    FLOOD,
    GAP,
    LOSSLESS,
    Upstream,
    gateway_options,
    install_lossless_python,
    numbers,
)
from .waits import wait_until
from .wsclient import KernelWS, Received


@pytest.fixture
def stock_upstream(tmp_path: Path) -> Iterator[Upstream]:
    """jupyter_server, rate limit off, its kernels plain ipykernel (drops past its HWM)."""
    upstream = Upstream(
        tmp_path / "upstream", "jupyter_server", "--ZMQChannelsWebsocketConnection.limit_rate=False"
    )
    upstream.start()
    yield upstream
    upstream.stop()


@pytest.fixture
def default_upstream(tmp_path: Path) -> Iterator[Upstream]:
    """jupyter_server on its defaults: its IOPub rate limit drops a flood's messages."""
    upstream = Upstream(tmp_path / "upstream", "jupyter_server")
    upstream.start()
    yield upstream
    upstream.stop()


@pytest.fixture
def lossless_upstream(tmp_path: Path) -> Iterator[Upstream]:
    """jupyter_server, rate limit off, its default kernel started by our launcher (no
    drops)."""
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


def upstream_connections(upstream: Upstream, kernel_id: str) -> int:
    """Channels WebSockets the upstream opened for ``kernel_id``, from its own log."""
    log = (upstream.home / "upstream.log").read_text(errors="replace")
    return log.count(f"Connecting to kernel {kernel_id}.")


async def in_front(daemon: Daemon, upstream: Upstream) -> str:
    """Our daemon in front of ``upstream``, and a kernel started through it."""
    await upstream.wait_ready()
    daemon.start(*gateway_options(upstream.url))
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN) as client:
        kernel_id = await client.start_kernel()
    await wait_until(
        lambda: upstream_connections(upstream, kernel_id) == 1, "the Tap's upstream WebSocket"
    )
    return kernel_id


async def until(ws: KernelWS, wanted: Any, timeout: float = 60) -> Any:
    """The first message ``wanted(message)`` accepts, received already or read now; every
    shell, control or stdin message ``ws`` gets on the way must answer its own requests."""
    for message in ws.history:
        if wanted(message):
            return message
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(timeout)
    while True:
        message = await ws.receive(max(0.1, deadline - loop.time()))
        assert message is not None, "connection closed"
        if message["channel"] != "iopub":
            assert message["parent_header"]["session"] == ws.session_id, message
        if wanted(message):
            return message


async def reply_to(ws: KernelWS, msg_id: str, msg_type: str, timeout: float = 60) -> Any:
    """The ``msg_type`` whose parent is ``msg_id`` (see :func:`until`)."""
    return await until(
        ws,
        lambda m: m["msg_type"] == msg_type and m["parent_header"].get("msg_id") == msg_id,
        timeout,
    )


def own_replies_only(ws: KernelWS) -> None:
    """Every shell, control and stdin message ``ws`` received answers its own requests."""
    for message in ws.history:
        if message["channel"] != "iopub":
            assert message["parent_header"].get("session") == ws.session_id, message


async def test_one_upstream_connection_for_1_3_and_100_watchers(
    lossless_upstream: Upstream, daemon: Daemon
) -> None:
    kernel_id = await in_front(daemon, lossless_upstream)
    # Started without a name: the upstream's own default kernelspec, as the upstream alone
    # would start (jupyter_server's gateway mode asks for "python3" until it lists them).
    assert (await daemon.fetch(f"/api/kernels/{kernel_id}"))["name"] == LOSSLESS
    watchers: list[KernelWS] = []
    try:
        for count, lines in ((1, 500), (3, 20_000), (100, 500)):
            while len(watchers) < count:
                watchers.append(await daemon.channels(kernel_id))
            # Each watcher asks something, so each has kernel channels of its own here,
            # and gets its own answer.
            asks = [ws.send("shell", "kernel_info_request", {}) for ws in watchers]
            for ws, msg_id in zip(watchers, asks, strict=True):
                await reply_to(ws, msg_id, "kernel_info_reply")
            code = flood_code(lines)
            msg_id = watchers[0].execute(code)
            expected = flood_text(lines)
            texts = [(await ws.until_idle(msg_id, timeout=120)).text() for ws in watchers]
            # The launcher's kernel drops nothing: every line, once, in order, for every
            # watcher (and if not, what is missing, and where the gap records are).
            if texts[0] != expected:
                async with GatewayClient(daemon.url, TOKEN) as client:
                    records = await all_records(client, kernel_id)
                received = [int(line) for line in texts[0].split("\n") if line]
                missing = sorted(set(range(lines)) - set(received))
                recorded = numbers(records, msg_id)
                idle = [
                    r["seq"]
                    for r in records
                    if r["msg_type"] == "status"
                    and r["parent_header"].get("msg_id") == msg_id
                    and r["content"].get("execution_state") == "idle"
                ]
                gaps = [(r["seq"], r["content"]) for r in records if r["msg_type"] == GAP]
                pytest.fail(
                    f"{count} watchers: {len(missing)} lines missing ({missing[:5]}…), "
                    f"{len(received)} received; {len(recorded)} recorded, missing ones "
                    f"recorded: {len(set(missing) & set(recorded))}; idle at {idle}; "
                    f"gaps {gaps}; last seq {records[-1]['seq']}"
                )
            assert all(text == texts[0] for text in texts)
            # The reply comes on shell, the idle on IOPub: either may arrive first.
            await reply_to(watchers[0], msg_id, "execute_reply")
            replies = [m for m in watchers[0].history if m["msg_type"] == "execute_reply"]
            assert [m["parent_header"]["msg_id"] for m in replies][-1:] == [msg_id]
            for ws in watchers[1:]:
                assert not [m for m in ws.history if m["msg_type"] == "execute_reply"]
            for ws in watchers:
                own_replies_only(ws)
            assert upstream_connections(lossless_upstream, kernel_id) == 1, count
    finally:
        for ws in watchers:
            ws.close()


async def test_input_interrupt_restart_and_a_watcher_that_leaves(
    lossless_upstream: Upstream, daemon: Daemon
) -> None:
    kernel_id = await in_front(daemon, lossless_upstream)
    asker, first, second = [await daemon.channels(kernel_id) for _ in range(3)]
    try:
        for ws in (first, second):  # they have channels too: an input_request could stray
            await reply_to(ws, ws.send("shell", "kernel_info_request", {}), "kernel_info_reply")
        # input() answered by the client that asked, while two others watch.
        msg_id = asker.execute("print('got', input('name? '))", allow_stdin=True)
        request = await reply_to(asker, msg_id, "input_request")
        assert request["content"]["prompt"] == "name? "
        asker.send("stdin", "input_reply", {"value": "ada"})
        for ws in (asker, first, second):
            received = await ws.until_idle(msg_id)
            assert received.text() == "got ada\n"
        await reply_to(asker, msg_id, "execute_reply")
        for ws in (first, second):
            assert not [m for m in ws.history if m["channel"] == "stdin"]
            own_replies_only(ws)
        # A watcher that leaves mid-execution: the others get every line and the idle.
        leaving = first.execute(
            "import time\nfor i in range(30): print(i, flush=True); time.sleep(0.02)"
        )
        await first.until_lines(1)
        first.close()
        for ws in (asker, second):
            received = await ws.until_idle(leaving)
            assert received.text() == "".join(f"{i}\n" for i in range(30))
        # Its execute_reply went nowhere; the next request of another client is answered.
        await reply_to(second, second.send("shell", "kernel_info_request", {}), "kernel_info_reply")
        # Interrupt through the gateway while a watcher's cell sleeps.
        sleeping = second.execute("import time; time.sleep(600)")
        await reply_to(second, sleeping, "execute_input")
        async with GatewayClient(daemon.url, TOKEN) as client:
            await client.interrupt(kernel_id)
        reply = await reply_to(second, sleeping, "execute_reply")
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        # Restart through the gateway: the same connection serves the new kernel process.
        async with GatewayClient(daemon.url, TOKEN) as client:
            await client.restart(kernel_id)
        after = asker.execute("print('after restart')")
        received: Received = await asker.until_idle(after)
        assert received.text() == "after restart\n"
        await reply_to(asker, after, "execute_reply")
        own_replies_only(asker)
        own_replies_only(second)
        assert upstream_connections(lossless_upstream, kernel_id) == 1
        # The launcher's kernel loses nothing: no gap, not even for the notice its new
        # process publishes after the restart, which the gateway refuses (only the gateway
        # writes kernel_gateway_stream_* records) but counts as arrived.
        async with GatewayClient(daemon.url, TOKEN) as client:
            assert lost_messages(await all_records(client, kernel_id)) == 0
    finally:
        for ws in (asker, first, second):
            ws.close()


async def all_records(client: GatewayClient, kernel_id: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    since = 0
    while True:
        page = (await client.transcript(kernel_id, since=since, limit=10000))["records"]
        if not page:
            return records
        records += page
        since = page[-1]["seq"]


def lost_messages(records: list[dict[str, Any]]) -> int:
    """Messages the ``upstream_lost`` gap records count."""
    gaps = [r["content"] for r in records if r["msg_type"] == GAP]
    return sum(gap["lost"] for gap in gaps if gap["reason"] == "upstream_lost")


def runs(missing: list[int]) -> int:
    """How many runs of consecutive numbers ``missing`` (sorted) holds."""
    return sum(1 for i, n in enumerate(missing) if i == 0 or missing[i - 1] != n - 1)


async def test_what_the_upstreams_kernel_drops_is_an_upstream_lost_gap(
    stock_upstream: Upstream, daemon: Daemon
) -> None:
    """A second client connected directly to the upstream's kernel doubles the upstream's
    work during a flood; the stock ipykernel drops IOPub past its high-water mark. Every
    line the gateway lacks is inside an ``upstream_lost`` gap record counting at least as
    many messages as there are runs of missing lines, and the watcher has that record
    before the execution's ``idle`` (the gateway holds an ``idle`` back while numbers below
    it are still missing), so the execution's summary lists it; with nothing missing,
    there is no such record. The execution ends either way (if its idle was lost, the
    gateway's)."""
    kernel_id = await in_front(daemon, stock_upstream)
    direct = await KernelWS.open(
        f"ws://127.0.0.1:{stock_upstream.port}/api/kernels/{kernel_id}/channels",
        {"Authorization": f"token {TOKEN}"},
    )
    try:
        await flood_accounted_for(daemon, kernel_id)
    finally:
        direct.close()


async def flood_accounted_for(daemon: Daemon, kernel_id: str) -> None:
    """A watcher runs the flood: every numbered line it lacks is inside ``upstream_lost``
    gap records it got before the execution's idle, counting at least as many messages as
    there are runs of missing lines; the transcript agrees with it, and the execution's
    summary lists the gaps. With nothing missing, no such record."""
    ws = await daemon.channels(kernel_id)
    try:
        msg_id = ws.execute(FLOOD)
        received = await ws.until_idle(msg_id, timeout=180)
        async with GatewayClient(daemon.url, TOKEN) as client:
            records = await all_records(client, kernel_id)
        summary = await daemon.fetch(f"/api/kernels/{kernel_id}/executions/{msg_id}")
    finally:
        ws.close()
    # Numbered lines on stdout (jupyter_server's rate-limit notice is on stderr, with the
    # execution as its parent).
    stdout = [r for r in records if r["msg_type"] != "stream" or r["content"]["name"] == "stdout"]
    lines = whole_lines(stdout, msg_id)
    assert whole_lines(received.messages, msg_id) == lines
    assert lines == sorted(set(lines)), "lines out of order or twice"
    missing = sorted(set(range(20000)) - set(lines))
    gaps_seen = sum(
        m["content"]["lost"]
        for m in received.messages
        if m["msg_type"] == GAP and m["content"]["reason"] == "upstream_lost"
    )
    assert summary["status"] == "ok"
    if missing:
        assert gaps_seen >= runs(missing) > 0, (len(missing), gaps_seen)
        assert lost_messages(records) >= gaps_seen
        assert summary["gaps"], "the execution's summary lists the gaps"
    else:
        assert lost_messages(records) == gaps_seen == 0


def whole_lines(records: list[dict[str, Any]], msg_id: str) -> list[int]:
    """The numbered lines the execution ``msg_id`` printed, in record order, but for those
    a gap record cuts: a line's number and its newline may come in two messages, and the
    upstream may drop one of them (a line ending just before a gap, or starting just after
    one, may be a piece of a line: "8583" then, after the gap, "11512" read as 858311512)."""
    lines: list[int] = []
    pieces: list[list[str]] = [[]]
    for record in records:
        if record["msg_type"] == GAP:
            pieces.append([])
        elif (
            record["msg_type"] == "stream"
            and record["parent_header"].get("msg_id") == msg_id
            and record["content"]["name"] == "stdout"
        ):
            pieces[-1].append(record["content"]["text"])
    for index, piece in enumerate(pieces):
        parts = "".join(piece).split("\n")
        if index < len(pieces) - 1:
            parts = parts[:-1]  # after the last newline before the gap: perhaps cut
        if index > 0:
            parts = parts[1:]  # before the first newline after the gap: perhaps cut
        lines += [int(part) for part in parts if part]
    return lines


async def test_what_a_rate_limited_upstream_drops_is_an_upstream_lost_gap_before_idle(
    default_upstream: Upstream, daemon: Daemon
) -> None:
    """jupyter_server on its defaults drops IOPub past its rate limit ("IOPub message rate
    exceeded"), numbered by the kernel and never sent on: what the gateway lacks is inside
    ``upstream_lost`` gap records the watcher has before the execution's idle, and the
    execution's summary lists them."""
    kernel_id = await in_front(daemon, default_upstream)
    # On a machine too slow for the kernel to pass the limit (1,000 messages a second),
    # nothing is dropped, and then no gap may be recorded either.
    await flood_accounted_for(daemon, kernel_id)
