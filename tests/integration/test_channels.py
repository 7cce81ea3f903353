"""The channels WebSocket against a real server and real ipykernel kernels.

Each test names the invariant it states (docs/how-it-works.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError
from tornado.websocket import WebSocketClosedError

from kernel_gateway_stream.handlers.channels import StreamChannelsConnection

from ..timing import seconds
from .daemon import Daemon
from .floods import flood_code, flood_text
from .waits import wait_until
from .wsclient import Received

FLOOD = 20000
FLOOD_CODE = flood_code(FLOOD)
FLOOD_TEXT = flood_text(FLOOD)


def assert_contiguous(received: Received) -> None:
    """Every IOPub message once, in order: the seq ranges tile an interval exactly."""
    ranges = received.seq_ranges()
    assert ranges, "no IOPub message carried a sequence number"
    for (_, previous_last), (first, last) in itertools.pairwise(ranges):
        assert first == previous_last + 1, f"gap or duplicate between {previous_last} and {first}"
        assert last >= first


async def test_flood_reaches_three_clients_complete_once_in_order(
    start_kernel: Any, connect: Any, transcript: Any
) -> None:
    """Invariants 2, 3, 6: 20,000 flushed prints reach three clients (both protocols),
    every line once and in order, coalesced into far fewer frames."""
    kernel_id = await start_kernel()
    runner = await connect(kernel_id, protocol="legacy")
    watchers = [await connect(kernel_id, protocol="v1"), await connect(kernel_id, protocol="v1")]
    msg_id = runner.execute(FLOOD_CODE)
    results = await asyncio.gather(
        runner.until_idle(msg_id), *(watcher.until_idle(msg_id) for watcher in watchers)
    )
    for received in results:
        assert received.text() == FLOOD_TEXT
        assert_contiguous(received)
        assert len(received.messages) < FLOOD, "stream messages were not coalesced"
    assert await transcript(kernel_id, format="text", parent=msg_id) == FLOOD_TEXT


@pytest.mark.smoke
async def test_every_iopub_message_has_one_seq_gap_free(
    start_kernel: Any, connect: Any, transcript: Any
) -> None:
    """Invariant 1: the transcript numbers every message 1..head with no gap or repeat."""
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    msg_id = ws.execute(
        "import sys\n"
        "for i in range(300):\n"
        "    print(i, file=sys.stderr if i % 3 else sys.stdout, flush=True)\n"
        "1+1"
    )
    await ws.until_idle(msg_id)
    page = await transcript(kernel_id, limit=10000)
    seqs = [record["seq"] for record in page["records"]]
    assert seqs == list(range(1, page["head"] + 1))
    types = {record["msg_type"] for record in page["records"]}
    assert {"status", "execute_input", "stream", "execute_result"} <= types


async def test_stdout_and_stderr_never_merged_across(start_kernel: Any, connect: Any) -> None:
    """Invariant 6: merging never crosses a stream name; the rendered order is kept."""
    kernel_id = await start_kernel()
    ws = await connect(kernel_id, protocol="v1")
    code = (
        "import sys\n"
        "for i in range(2000):\n"
        "    print(i, file=sys.stderr if (i // 7) % 2 else sys.stdout, flush=True)\n"
    )
    msg_id = ws.execute(code)
    received = await ws.until_idle(msg_id)
    runs: list[tuple[str, str]] = []
    for message in received.messages:
        if message["msg_type"] != "stream" or message["parent_header"].get("msg_id") != msg_id:
            continue
        name, text = message["content"]["name"], message["content"]["text"]
        if runs and runs[-1][0] == name:
            runs[-1] = (name, runs[-1][1] + text)
        else:
            runs.append((name, text))
    expected: list[tuple[str, str]] = []
    for i in range(2000):
        name = "stderr" if (i // 7) % 2 else "stdout"
        if expected and expected[-1][0] == name:
            expected[-1] = (name, expected[-1][1] + f"{i}\n")
        else:
            expected.append((name, f"{i}\n"))
    assert runs == expected


async def test_reconnect_with_session_id_gets_exactly_what_it_missed(
    start_kernel: Any, connect: Any
) -> None:
    """Invariant 5: a client that leaves mid-run and returns with its session_id gets
    exactly the lines it missed: nothing twice, nothing lost."""
    kernel_id = await start_kernel()
    first = await connect(kernel_id, session_id="notebook-tab")
    msg_id = first.execute(
        "import time\nfor i in range(4000):\n    print(i, flush=True)\n    time.sleep(0.0005)"
    )
    before = await first.until_lines(500)
    first.close()
    before.messages.extend((await first.drain_until_closed()).messages)
    await asyncio.sleep(seconds(0.5))  # output goes on with nobody connected
    second = await connect(kernel_id, session_id="notebook-tab")
    after = await second.until_idle(msg_id)
    assert before.text() + after.text() == "".join(f"{i}\n" for i in range(4000))
    assert after.seq_ranges()[0][0] == before.seq_ranges()[-1][1] + 1
    assert_contiguous(after)


async def test_a_new_client_gets_everything_after_its_socket_opened(
    start_kernel: Any, connect: Any, services: Any, monkeypatch: Any
) -> None:
    """Invariant 3: a client that asks for no ``since`` gets every message published after
    its socket opened, even those published while the gateway was still setting the
    connection up (here: its cursor lookup held until another client's execution ended)."""
    kernel_id = await start_kernel()
    runner = await connect(kernel_id)
    lookup_started, release = asyncio.Event(), asyncio.Event()
    load_cursor = services.store.load_cursor

    async def slow_load_cursor(kernel: str, session_id: str) -> int | None:
        lookup_started.set()
        await release.wait()
        return await load_cursor(kernel, session_id)

    monkeypatch.setattr(services.store, "load_cursor", slow_load_cursor)
    watcher = await connect(kernel_id)  # open: the 101 came; its connect() waits
    await asyncio.wait_for(lookup_started.wait(), seconds(30))
    msg_id = runner.execute("for i in range(100): print(i, flush=True)")
    await runner.until_idle(msg_id)
    release.set()
    seen = await watcher.until_idle(msg_id, timeout=20)  # the runner has seen it already
    assert seen.text() == "".join(f"{i}\n" for i in range(100))
    first = next(m for m in seen.messages if m["parent_header"].get("msg_id") == msg_id)
    assert (first["msg_type"], first["content"]["execution_state"]) == ("status", "busy")
    assert_contiguous(seen)
    assert services.subscribers.replays == 0  # nobody asked for the past (replays_total)


@pytest.mark.smoke
async def test_since_resumes_exactly_across_replay_to_live(
    start_kernel: Any, connect: Any, transcript: Any
) -> None:
    """Invariant 5: ?since=S yields every message after S once, in order, and then live,
    while the kernel is still printing."""
    kernel_id = await start_kernel()
    live = await connect(kernel_id)
    msg_id = live.execute(
        "import time\nfor i in range(3000):\n    print(i, flush=True)\n    time.sleep(0.0005)"
    )
    early = await live.until_lines(300)
    since = early.seq_ranges()[-1][1] - 50
    late = await connect(kernel_id, since=since, protocol="v1")
    resumed = await late.until_idle(msg_id)
    assert resumed.seq_ranges()[0][0] == since + 1
    assert_contiguous(resumed)
    page = await transcript(kernel_id, since=since, limit=10000, msg_type="stream")
    expected = "".join(record["content"]["text"] for record in page["records"])
    assert resumed.text() == expected
    await live.until_idle(msg_id)


async def test_output_with_no_client_connected_is_recorded(
    start_kernel: Any, connect: Any, transcript: Any
) -> None:
    """Invariant 2: output is recorded whether or not anybody watches."""
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    msg_id = ws.execute("import time\ntime.sleep(0.3)\nfor i in range(1000): print(i, flush=True)")
    ws.close()
    await ws.drain_until_closed()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(60)
    while loop.time() < deadline:
        page = await transcript(kernel_id, parent=msg_id, msg_type="status", limit=10)
        if any(r["content"]["execution_state"] == "idle" for r in page["records"]):
            break
        await asyncio.sleep(0.1)
    text = await transcript(kernel_id, format="text", parent=msg_id)
    assert text == "".join(f"{i}\n" for i in range(1000))


async def test_slow_client_is_disconnected_with_its_resume_point(
    start_kernel: Any, connect: Any, services: Any
) -> None:
    """Invariant 3: a client that stops reading is disconnected with a reason and the last
    seq it was sent, the other client gets everything, and the slow one resumes exactly."""
    services.policy.max_bytes = 4 * 1024 * 1024
    kernel_id = await start_kernel()
    stalled = await connect(kernel_id, protocol="legacy")
    runner = await connect(kernel_id, protocol="v1")
    line = "x" * 1000
    lines = 25000
    msg_id = runner.execute(flood_code(lines, line=f"{line!r} + ' ' + str(i)"))
    expected = "".join(f"{line} {i}\n" for i in range(lines))

    async def run() -> Received:
        # The reading client keeps up, on a quiet machine; on one starved of CPU it may
        # fall 4 MiB behind and be cut off as well: then it resumes after the last seq it
        # got, as a client does (the close's reason may not reach it: a client that does
        # not read the close in 5 s is aborted).
        nonlocal runner
        received = Received(parent=msg_id)
        while True:
            try:
                await runner.until_idle(msg_id, timeout=300)
            except AssertionError:
                if runner.ws.close_code not in (4008, None):
                    raise
                received.messages += runner.history
                last_seq = received.seq_ranges()[-1][1]
                runner = await connect(kernel_id, protocol="v1", since=last_seq)
                continue
            received.messages += runner.history
            return received

    running = asyncio.ensure_future(run())
    # Once the gateway has cut the stalled client off, it reads: what it was sent, then
    # the close with its reason. (Not later: a client that does not answer a close within
    # tornado's 5 s is aborted, and would never see the reason.)
    # The server registers the session after the WebSocket opens: under load, not yet.
    sessions = StreamChannelsConnection._open_sessions
    key = f"{kernel_id}:{stalled.session_id}"
    await wait_until(lambda: key in sessions, "the stalled client's session", 60)
    connection = sessions[key]
    await wait_until(
        lambda: connection.subscriber is not None and connection.subscriber._closed,
        "the stalled client to be cut off",
        300,
    )
    got = await stalled.drain_until_closed()
    received = await running
    assert received.text() == expected
    assert_contiguous(received)
    assert stalled.ws.close_code == 4008
    reason = json.loads(stalled.ws.close_reason)
    assert reason["reason"] == "slow_consumer"
    assert reason["last_seq"] == got.seq_ranges()[-1][1]
    resumed = await connect(kernel_id, since=reason["last_seq"])
    rest = await resumed.until_idle(msg_id)
    assert got.text() + rest.text() == expected


async def test_stdin_and_replies_reach_the_client_that_asked(
    start_kernel: Any, connect: Any
) -> None:
    """Shell replies and input_request go to the asking client only; IOPub to all."""
    kernel_id = await start_kernel()
    asker = await connect(kernel_id, protocol="v1")
    other = await connect(kernel_id)
    msg_id = asker.execute("name = input('who? ')\nprint('hello', name)", allow_stdin=True)
    while True:
        message = await asker.receive()
        assert message is not None
        if message["msg_type"] == "input_request":
            assert message["channel"] == "stdin"
            assert message["content"]["prompt"] == "who? "
            break
    asker.send("stdin", "input_reply", {"value": "gateway"})
    received = await asker.until_idle(msg_id)
    assert received.text() == "hello gateway\n"
    # The reply comes on shell, the idle on IOPub: two sockets, in either order.
    while not any(m["msg_type"] == "execute_reply" for m in asker.history):
        assert await asker.receive() is not None
    seen = await other.until_idle(msg_id)
    assert seen.text() == "hello gateway\n"
    assert not [m for m in seen.messages if m["channel"] in ("shell", "stdin")]


async def test_watchers_cost_no_zmq_sockets_and_a_first_request_gets_its_input(
    start_kernel: Any, connect: Any
) -> None:
    """A client that only watches opens no shell/control/stdin sockets; a client whose very
    first message is an execute asking for input gets the input_request (its stdin socket
    is known to the kernel before the request is sent)."""
    kernel_id = await start_kernel()
    watchers = [await connect(kernel_id) for _ in range(5)]
    for attempt in range(5):
        asker = await connect(kernel_id, protocol="v1")
        msg_id = asker.execute(f"print(input('n{attempt}? '))", allow_stdin=True)
        while True:
            message = await asker.receive(timeout=30)
            assert message is not None
            if message["msg_type"] == "input_request":
                assert message["content"]["prompt"] == f"n{attempt}? "
                break
        asker.send("stdin", "input_reply", {"value": f"answer {attempt}"})
        assert (await asker.until_idle(msg_id)).text() == f"answer {attempt}\n"
        asker.close()
    for watcher in watchers:
        assert (await watcher.until_idle(msg_id)).text() == "answer 4\n"
    open_connections = [
        connection
        for key, connection in StreamChannelsConnection._open_sessions.items()
        if key.startswith(kernel_id)
    ]
    sessions = {watcher.session_id for watcher in watchers}
    assert sessions <= {connection.session_id for connection in open_connections}
    for connection in open_connections:
        if connection.session_id in sessions:
            assert connection.channels == {}


async def test_kernel_restart_keeps_numbering_and_clients(
    start_kernel: Any, connect: Any, jp_fetch: Any
) -> None:
    """Invariant 1 across a kernel restart: the client stays attached, the one request it
    sends after the restart is answered, and every IOPub message it gets, before, during
    and after the restart, is numbered on without a gap."""
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    before = await ws.until_idle(ws.execute("print('before')"))
    await jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body="")
    after = await ws.until_idle(ws.execute("print('after')"))
    assert after.text() == "after\n"
    assert_contiguous(Received(before.messages + after.messages))


async def test_a_restart_is_an_epoch_boundary_in_the_old_lifes_session(
    start_kernel: Any, connect: Any, jp_fetch: Any, transcript: Any
) -> None:
    """The restart mark numbers the life it begins (epoch) and carries the header session
    of the life it ends, so that a frontend which drops messages of an older session than
    the newest it saw (JupyterLab) does not take the mark for a new life."""
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    await ws.until_idle(ws.execute("print('first life')"))
    for _ in range(2):
        await jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body="")
        await ws.until_idle(ws.execute("print('next life')"))
    ws.close()
    page = await transcript(kernel_id, limit=1000)
    records = page["records"]
    marks = [
        (index, record)
        for index, record in enumerate(records)
        if record["msg_type"] == "status" and record["content"]["execution_state"] == "restarting"
    ]
    assert [record["content"]["epoch"] for _, record in marks] == [1, 2]
    for index, mark in marks:
        before = [
            r for r in records[:index] if not r["msg_type"].startswith("kernel_gateway_stream")
        ]
        after = records[index + 1 :]
        assert mark["header"]["session"] == before[-1]["header"]["session"]
        assert any(r["header"]["session"] != mark["header"]["session"] for r in after)


async def test_unknown_kernel_and_bad_since_get_json_errors(
    start_kernel: Any, connect: Any
) -> None:
    """Invariant 8: errors before the upgrade are HTTP 4xx with a JSON reason."""
    with pytest.raises(HTTPClientError) as unknown:
        await connect("00000000-0000-0000-0000-000000000000")
    assert unknown.value.code == 404
    assert json.loads(unknown.value.response.body)["reason"] == "unknown_kernel"
    kernel_id = await start_kernel()
    for since, reason in (
        ("abc", "bad_request"),
        ("-1", "bad_request"),
        ("99999999", "since_ahead_of_head"),
    ):
        with pytest.raises(HTTPClientError) as bad:
            await connect(kernel_id, since=since)
        assert bad.value.code == 400
        assert json.loads(bad.value.response.body)["reason"] == reason


async def test_malformed_frame_closes_only_its_connection(
    start_kernel: Any, connect: Any, transcript: Any
) -> None:
    """Invariant 8: a malformed frame closes that socket (1007 and a reason); other clients
    and the transcript are untouched."""
    kernel_id = await start_kernel()
    good = await connect(kernel_id, protocol="v1")
    msg_id = good.execute(
        "import time\nfor i in range(500):\n    print(i, flush=True)\n    time.sleep(0.001)"
    )
    for payload, protocol in (
        ("not json", "legacy"),
        (b"\x01\x00", "v1"),
        ('{"channel": "iopub", "header": {}}', "legacy"),
    ):
        bad = await connect(kernel_id, protocol=protocol)
        await bad.ws.write_message(payload, binary=isinstance(payload, bytes))
        await bad.drain_until_closed()
        assert bad.ws.close_code == 1007
        assert json.loads(bad.ws.close_reason)["reason"] == "malformed_message"
    received = await good.until_idle(msg_id)
    assert received.text() == "".join(f"{i}\n" for i in range(500))
    assert await transcript(kernel_id, format="text", parent=msg_id) == received.text()


async def test_shutdown_sends_what_was_queued_then_closes(
    start_kernel: Any, connect: Any, jp_fetch: Any, transcript: Any
) -> None:
    """Invariant 3 at shutdown: a kernel shut down in the middle of a burst of output; its
    clients get everything recorded before the close (1001, with the last seq), and the
    transcript is still served."""
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    msg_id = ws.execute(flood_code(100_000))
    await ws.until_lines(200)
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    await ws.drain_until_closed()
    assert ws.ws.close_code == 1001
    reason = json.loads(ws.ws.close_reason)
    page = await transcript(kernel_id, limit=1)
    assert page["running"] is False
    assert reason == {"reason": "kernel_shutdown", "last_seq": page["head"]}
    text = await transcript(kernel_id, format="text", parent=msg_id)
    received = Received()
    received.messages = [m for m in ws.history if m["parent_header"].get("msg_id") == msg_id]
    assert received.text() == text


async def test_local_ipykernel_iopub_queues_instead_of_dropping(
    start_kernel: Any, connect: Any
) -> None:
    """The kernel's IOPub socket has no high-water mark, so a busy machine makes it queue
    output for the Tap rather than drop it (no lost output, even before the gateway)."""
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    msg_id = ws.execute(
        "import zmq\n"
        "from ipykernel.kernelapp import IPKernelApp\n"
        "app = IPKernelApp.instance()\n"
        "print(type(app).__name__, app.iopub_thread.socket.getsockopt(zmq.SNDHWM))"
    )
    received = await ws.until_idle(msg_id)
    assert received.text() == "LosslessIOPubKernelApp 0\n"


async def test_the_tap_keeps_kernel_activity_for_the_kernels_api(
    jp_serverapp: Any, start_kernel: Any, connect: Any, jp_fetch: Any
) -> None:
    """The Tap replaces jupyter_server's second IOPub socket per kernel: the kernels API
    still reports execution_state and last_activity (culling depends on them)."""
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    before = json.loads((await jp_fetch("api", "kernels", kernel_id)).body)
    msg_id = ws.execute("import time; time.sleep(0.5)")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(30)
    states = set()
    while loop.time() < deadline and "busy" not in states:
        states.add(
            json.loads((await jp_fetch("api", "kernels", kernel_id)).body)["execution_state"]
        )
        await asyncio.sleep(0.05)
    await ws.until_idle(msg_id)
    after = json.loads((await jp_fetch("api", "kernels", kernel_id)).body)
    assert "busy" in states
    assert after["execution_state"] == "idle"
    assert after["last_activity"] > before["last_activity"]
    kernel = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    assert getattr(kernel, "_activity_stream", None) is None


async def test_a_new_kernel_turns_idle_with_no_client_and_its_session_says_so(
    daemon: Daemon,
) -> None:
    """A deliberate difference (docs/jupyterlab.md): jupyter_server keeps a new kernel
    ``starting`` until a client connects; the gateway reads a kernel from its start
    (nudging it with ``kernel_info_request``), so its model goes ``starting`` (or already
    ``idle`` on a quick start) to ``idle`` with nobody connected, never back, and the
    sessions API says what the kernels API says. (It failed under load, a slow kernel
    start, while nudging stopped at the first IOPub message, the kernel's welcome or
    its held ``starting``, before the kernel had answered a request.)"""
    daemon.start()
    await daemon.wait_ready()
    body = {"path": "a.ipynb", "name": "a.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
    session = await daemon.fetch("/api/sessions", method="POST", body=json.dumps(body))
    kernel_id = session["kernel"]["id"]
    states = [session["kernel"]["execution_state"]]

    async def idle() -> bool:
        if states[-1] != "idle":
            states.append((await daemon.fetch(f"/api/kernels/{kernel_id}"))["execution_state"])
        return states[-1] == "idle"

    await wait_until(idle, "the new kernel's model to turn idle with no client", 60)
    assert model_sequence(states) in (["starting", "idle"], ["idle"]), states
    model = await daemon.fetch(f"/api/kernels/{kernel_id}")
    assert model["connections"] == 0
    [listed] = await daemon.fetch("/api/sessions")
    assert listed["kernel"]["execution_state"] == "idle"
    await asyncio.sleep(0.5)  # no later status takes it back to starting
    assert (await daemon.fetch(f"/api/kernels/{kernel_id}"))["execution_state"] == "idle"


def model_sequence(states: list[str]) -> list[str]:
    """``states`` with repeats folded: ``[starting, starting, idle]`` is ``[starting, idle]``."""
    return [state for index, state in enumerate(states) if index == 0 or states[index - 1] != state]


async def test_oversized_inbound_frame_closes_only_its_socket(
    start_kernel: Any, connect: Any, transcript: Any
) -> None:
    """Invariant 8 (F7): an inbound frame over tornado's size limit (10 MiB) closes that
    socket; other clients and the transcript are untouched."""
    kernel_id = await start_kernel()
    good = await connect(kernel_id)
    big = await connect(kernel_id)
    with contextlib.suppress(WebSocketClosedError):
        # The server may close before the client has finished sending.
        await big.ws.write_message("x" * (11 * 1024 * 1024))
    await big.drain_until_closed()  # times out unless the server closed it
    # tornado sends 1009 and aborts at once, so the close frame may not reach the client.
    assert big.ws.close_code in (1009, None)
    msg_id = good.execute("print('still here')")
    assert (await good.until_idle(msg_id)).text() == "still here\n"
    assert await transcript(kernel_id, format="text", parent=msg_id) == "still here\n"


async def test_a_failure_recording_one_message_does_not_stop_the_tap(
    start_kernel: Any, connect: Any, services: Any, transcript: Any
) -> None:
    """Invariant 2, defensively: if recording one IOPub message raises (a bug, a full
    disk), the Tap logs it and keeps reading; everything after it is recorded and sent."""
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    await ws.until_idle(ws.execute("print('warm')"))
    tap = services.taps.taps[kernel_id]
    record, failed = tap._record, []

    def record_but_fail_once(message: Any) -> None:
        if message.msg_type == "stream" and not failed:
            failed.append(message)
            raise RuntimeError("injected failure")
        record(message)

    tap._record = record_but_fail_once
    msg_id = ws.execute("for i in range(3): print(i, flush=True)")
    received = await ws.until_idle(msg_id)
    assert failed, "the injected failure did not happen"
    assert received.text().endswith("2\n")
    later = ws.execute("print('after')")
    assert (await ws.until_idle(later)).text() == "after\n"
    assert (await transcript(kernel_id, format="text", parent=later)) == "after\n"
