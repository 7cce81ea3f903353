"""The execute API against a real server and real kernels."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from ..timing import seconds
from .sseclient import Event, SSEReader
from .waits import until_restarted


@pytest.fixture
def api(
    http_server_client: Any, jp_http_port: int, jp_auth_header: dict[str, str], jp_base_url: str
) -> Any:
    base = f"http://127.0.0.1:{jp_http_port}{jp_base_url.rstrip('/')}"
    readers: list[SSEReader] = []

    class Api:
        async def call(self, method: str, path: str, body: Any = None) -> Any:
            payload = (
                None if body is None else (body if isinstance(body, str) else json.dumps(body))
            )
            if method == "POST" and payload is None:
                payload = ""
            response = await AsyncHTTPClient().fetch(
                base + path, method=method, body=payload, headers=jp_auth_header
            )
            return json.loads(response.body)

        def events(
            self, path: str, method: str = "GET", body: Any = None, **headers: str
        ) -> SSEReader:
            reader = SSEReader(
                base + path,
                {**jp_auth_header, **headers},
                method=method,
                body=None if body is None else json.dumps(body),
            )
            readers.append(reader)
            return reader

    yield Api()
    for reader in readers:
        reader.close()


def done(events: list[Event]) -> bool:
    return any(e.event == "done" for e in events)


def text(events: list[Event], name: str = "stdout") -> str:
    return "".join(e.data["text"] for e in events if e.event == name)


@pytest.mark.smoke
async def test_execute_streams_every_event_type_and_done(start_kernel: Any, api: Any) -> None:
    kernel_id = await start_kernel()
    code = (
        "import sys\nfrom IPython.display import display, Markdown\n"
        "print('out')\nprint('err', file=sys.stderr)\ndisplay(Markdown('*md*'))\n6 * 7"
    )
    reader = api.events(
        f"/api/kernels/{kernel_id}/execute", "POST", {"code": code}, Accept="text/event-stream"
    )
    events = await reader.until(done)
    kinds = [e.event for e in events]
    assert kinds[:2] == ["execution", "status"]
    assert kinds[-2:] == ["status", "done"]
    assert text(events) == "out\n"
    assert text(events, "stderr") == "err\n"
    display = next(e for e in events if e.event == "display")
    assert display.data["data"]["text/markdown"] == "*md*"
    result = next(e for e in events if e.event == "result")
    assert result.data["data"]["text/plain"] == "42"
    summary = events[-1].data
    assert summary["status"] == "ok"
    assert (summary["stdout"], summary["stderr"]) == ("out\n", "err\n")
    assert [o["type"] for o in summary["outputs"]] == ["display", "result"]
    assert summary["execution_count"] == result.data["execution_count"]
    assert summary["duration"] >= 0
    await reader.response  # the response ends after done
    failing = api.events(
        f"/api/kernels/{kernel_id}/execute", "POST", {"code": "1/0"}, Accept="text/event-stream"
    )
    events = await failing.until(done)
    error = next(e for e in events if e.event == "error")
    assert error.data["ename"] == "ZeroDivisionError"
    assert events[-1].data["status"] == "error"


async def test_201_then_summary_and_resumable_events(start_kernel: Any, api: Any) -> None:
    """Invariant 5 for an execution's events: resume by Last-Event-ID, nothing twice."""
    kernel_id = await start_kernel()
    code = "import time\nfor i in range(2000):\n    print(i, flush=True)\n    time.sleep(0.0005)"
    started = await api.call("POST", f"/api/kernels/{kernel_id}/execute", {"code": code})
    msg_id = started["msg_id"]
    path = f"/api/kernels/{kernel_id}/executions/{msg_id}/events"
    first = api.events(path)
    await first.until(lambda events: len(text(events).splitlines()) >= 300)
    first.close()
    seen = list(first.events)
    second = api.events(path, **{"Last-Event-ID": str(seen[-1].id)})
    rest = await second.until(done)
    expected = "".join(f"{i}\n" for i in range(2000))
    assert text(seen) + text(rest) == expected
    summary = await api.call("GET", f"/api/kernels/{kernel_id}/executions/{msg_id}")
    assert summary["status"] == "ok"
    assert summary["stdout"] == expected
    assert summary == {**rest[-1].data, "kernel_id": kernel_id}


async def test_stdin_round_trip(start_kernel: Any, api: Any) -> None:
    kernel_id = await start_kernel()
    code = "name = input('who? ')\nprint('hello', name)"
    reader = api.events(
        f"/api/kernels/{kernel_id}/execute",
        "POST",
        {"code": code, "allow_stdin": True},
        Accept="text/event-stream",
    )
    events = await reader.until(lambda events: any(e.event == "input_request" for e in events))
    request = next(e for e in events if e.event == "input_request")
    assert request.data == {"prompt": "who? ", "password": False}
    assert events[0].event == "execution"
    msg_id = events[0].data["msg_id"]
    answered = await api.call(
        "POST", f"/api/kernels/{kernel_id}/executions/{msg_id}/input", {"value": "gateway"}
    )
    assert answered["sent"] is True
    events = await reader.until(done)
    assert text(events) == "hello gateway\n"
    with pytest.raises(HTTPClientError) as again:
        await api.call(
            "POST", f"/api/kernels/{kernel_id}/executions/{msg_id}/input", {"value": "twice"}
        )
    assert again.value.code == 409
    assert json.loads(again.value.response.body)["reason"] == "no_input_pending"


@pytest.mark.parametrize(
    "code",
    [
        "import time\nwhile True:\n    time.sleep(0.01)",
        "x = 0\nwhile True:\n    x += 1",
    ],
    ids=["sleep-loop", "tight-loop"],
)
async def test_interrupt_ends_the_execution_promptly(
    start_kernel: Any, api: Any, code: str
) -> None:
    """Interrupt works for a sleeping and for a busy pure-Python loop. The bound asserted
    here is generous (the benchmark measures it); the issue's target is one second."""
    kernel_id = await start_kernel()
    started = await api.call("POST", f"/api/kernels/{kernel_id}/execute", {"code": code})
    msg_id = started["msg_id"]
    reader = api.events(f"/api/kernels/{kernel_id}/executions/{msg_id}/events")
    await reader.until(lambda events: any(e.event == "status" for e in events))
    await asyncio.sleep(0.2)
    asked = time.monotonic()
    await api.call("POST", f"/api/kernels/{kernel_id}/executions/{msg_id}/interrupt")
    events = await reader.until(done)
    latency = time.monotonic() - asked
    assert events[-1].data["status"] == "interrupted"
    assert latency < seconds(5)


async def test_timeout_interrupts(start_kernel: Any, api: Any) -> None:
    kernel_id = await start_kernel()
    reader = api.events(
        f"/api/kernels/{kernel_id}/execute",
        "POST",
        {"code": "import time\ntime.sleep(60)", "timeout": 0.5},
        Accept="text/event-stream",
    )
    events = await reader.until(done, timeout=60)
    assert events[-1].data["status"] == "interrupted"
    assert events[-1].data["error"]["ename"] == "KeyboardInterrupt"


async def test_executions_from_the_channels_socket_are_visible(
    start_kernel: Any, connect: Any, api: Any
) -> None:
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    msg_id = ws.execute("print('from a notebook')")
    await ws.until_idle(msg_id)
    summary = await api.call("GET", f"/api/kernels/{kernel_id}/executions/{msg_id}")
    assert (summary["status"], summary["stdout"]) == ("ok", "from a notebook\n")


async def test_kernel_killed_mid_execution_ends_the_stream(
    jp_serverapp: Any, start_kernel: Any, api: Any
) -> None:
    """The kernel dies: the execution's stream ends (no hang) and its summary says so."""
    kernel_id = await start_kernel()
    started = await api.call(
        "POST",
        f"/api/kernels/{kernel_id}/execute",
        {"code": "import time\nprint('working', flush=True)\ntime.sleep(60)"},
    )
    msg_id = started["msg_id"]
    reader = api.events(f"/api/kernels/{kernel_id}/executions/{msg_id}/events")
    await reader.until(lambda events: "working" in text(events))
    pid = jp_serverapp.kernel_manager.get_kernel(kernel_id).provisioner.process.pid
    os.kill(pid, signal.SIGKILL)
    events = await reader.until(done, timeout=60)
    assert events[-1].data["status"] == "died"
    summary = await api.call("GET", f"/api/kernels/{kernel_id}/executions/{msg_id}")
    assert summary["status"] == "died"
    assert summary["stdout"] == "working\n"
    # Let the automatic restart settle, so the fixture can shut the kernel down.
    await until_restarted(jp_serverapp.kernel_manager.get_kernel(kernel_id))


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "reason"),
    [
        ("POST", "/api/kernels/{k}/execute", "not json", 400, "bad_request"),
        ("POST", "/api/kernels/{k}/execute", "[1]", 400, "bad_request"),
        ("POST", "/api/kernels/{k}/execute", {}, 400, "bad_request"),
        ("POST", "/api/kernels/{k}/execute", {"code": 1}, 400, "bad_request"),
        ("POST", "/api/kernels/{k}/execute", {"code": "1", "timeout": -1}, 400, "bad_request"),
        (
            "POST",
            "/api/kernels/{k}/execute",
            {"code": "1", "allow_stdin": "yes"},
            400,
            "bad_request",
        ),
        ("POST", "/api/kernels/nope/execute", {"code": "1"}, 404, "unknown_kernel"),
        ("GET", "/api/kernels/{k}/executions/nope", None, 404, "unknown_execution"),
        ("GET", "/api/kernels/{k}/executions/nope/events", None, 404, "unknown_execution"),
        ("GET", "/api/kernels/{k}/executions/x/events?since=abc", None, 400, "bad_request"),
        ("POST", "/api/kernels/{k}/executions/nope/input", {"value": "x"}, 409, "no_input_pending"),
        ("POST", "/api/kernels/{k}/executions/nope/input", {}, 400, "bad_request"),
    ],
)
async def test_bad_requests_get_4xx_with_a_reason(
    start_kernel: Any, api: Any, method: str, path: str, body: Any, status: int, reason: str
) -> None:
    """Invariant 8 for the execute API."""
    kernel_id = await start_kernel()
    with pytest.raises(HTTPClientError) as error:
        await api.call(method, path.format(k=kernel_id), body)
    assert error.value.code == status
    assert json.loads(error.value.response.body)["reason"] == reason


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/kernels/{k}/execute"),
        ("GET", "/api/kernels/{k}/executions/x"),
        ("GET", "/api/kernels/{k}/executions/x/events"),
        ("POST", "/api/kernels/{k}/executions/x/input"),
        ("POST", "/api/kernels/{k}/executions/x/interrupt"),
        ("GET", "/api/kernels/{k}/stream"),
        ("GET", "/api/kernels/{k}/transcript"),
    ],
)
async def test_every_endpoint_needs_the_token(
    start_kernel: Any, jp_http_port: int, jp_base_url: str, method: str, path: str
) -> None:
    kernel_id = await start_kernel()
    url = f"http://127.0.0.1:{jp_http_port}{jp_base_url.rstrip('/')}{path.format(k=kernel_id)}"
    body = "{}" if method == "POST" else None
    for headers in ({}, {"Authorization": "token wrong"}):
        with pytest.raises(HTTPClientError) as denied:
            await AsyncHTTPClient().fetch(url, method=method, body=body, headers=headers)
        assert denied.value.code == 403


async def test_events_of_an_execution_whose_kernel_is_gone_replay_from_the_transcript(
    start_kernel: Any, api: Any, jp_fetch: Any
) -> None:
    """A client resuming an execution's events after its kernel shut down gets the events
    it missed from the transcript, then ``done`` (not a 404: the transcript has them)."""
    kernel_id = await start_kernel()
    code = "for i in range(50): print(i)"
    started = await api.call("POST", f"/api/kernels/{kernel_id}/execute", {"code": code})
    path = f"/api/kernels/{kernel_id}/executions/{started['msg_id']}/events"
    whole = await api.events(path).until(done)
    middle = next(e.id for e in whole if e.event == "stdout")
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    resumed = await api.events(path, **{"Last-Event-ID": str(middle - 1)}).until(done)
    assert text(resumed) == text(whole) == "".join(f"{i}\n" for i in range(50))
    assert resumed[-1].data["status"] == "ok"
