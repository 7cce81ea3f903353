"""What the clients send, how they read answers and errors, and which callbacks an
execution's events call: the shared, pure half of both clients."""

from __future__ import annotations

import json

import httpx
import pytest

from kernel_gateway_stream.client import (
    AuthenticationError,
    ClientError,
    Event,
    GatewayHTTPError,
    GatewayUnreachable,
    KernelDied,
    NotFound,
    api,
)
from kernel_gateway_stream.client.callbacks import (
    ExecutionCallbacks,
    Invocation,
    died,
    plan,
    result,
)


def body(reason: str | None, message: str) -> bytes:
    return json.dumps({"reason": reason, "message": message}).encode()


@pytest.mark.parametrize(
    ("status", "kind", "reason"),
    [
        (401, AuthenticationError, "error"),
        (403, AuthenticationError, "error"),
        (404, NotFound, "unknown_execution"),
        (409, GatewayHTTPError, "execution_not_running"),
        (413, GatewayHTTPError, "payload_too_large"),
        (500, GatewayHTTPError, "error"),
    ],
)
def test_error_answers_map_to_the_clients_exceptions(
    status: int, kind: type[GatewayHTTPError], reason: str
) -> None:
    sent = None if reason == "error" else reason
    error = api.error_for(status, body(sent, "what\nhappened"))
    assert type(error) is kind
    assert (error.status, error.reason, error.message) == (status, reason, "what happened")


def test_an_error_body_that_is_not_json_is_quoted_short() -> None:
    error = api.error_for(502, b"<html>" + b"x" * 500)
    assert (error.reason, error.message) == ("error", "<html>" + "x" * 194)


def test_calls_answer_or_raise() -> None:
    call = api.start_kernel(None)
    assert (call.method, call.path, json.loads(call.body or b"")) == ("POST", "/api/kernels", {})
    assert call.answer(201, b'{"id": "k1"}') == "k1"
    with pytest.raises(AuthenticationError):
        call.answer(403, b"{}")


def test_paths_quote_ids_and_queries_drop_nones_and_repeat_lists() -> None:
    call = api.transcript("a/b", {"since": 3, "parent": None, "msg_type": ["stream", "error"]})
    assert call.path == "/api/kernels/a%2Fb/transcript"
    assert call.query == (("since", "3"), ("msg_type", "stream"), ("msg_type", "error"))
    text = api.transcript_text("k", {"since": 5})
    assert text.query == (("since", "5"), ("format", "text"))
    assert text.answer(200, "é\n".encode()) == "é\n"
    assert api.stream_path("k", {"msg_types": ["stream", "error"]}) == (
        "/api/kernels/k/stream?msg_type=stream%2Cerror"
    )
    assert api.stream_path("k", {}) == "/api/kernels/k/stream"


def test_execution_calls() -> None:
    start = api.start_execution("k", "1", timeout=2.5)
    assert json.loads(start.body or b"") == {
        "code": "1",
        "allow_stdin": False,
        "stop_on_error": True,
        "timeout": 2.5,
    }
    assert start.answer(201, b'{"msg_id": "m", "kernel_id": "k"}') == "m"
    interrupt = api.interrupt_execution("k", "m")
    assert interrupt.path == "/api/kernels/k/executions/m/interrupt"
    with pytest.raises(GatewayHTTPError) as not_running:
        interrupt.answer(409, body("execution_not_running", "it is done"))
    assert not_running.value.reason == "execution_not_running"
    summary = {"msg_id": "m", "status": "died", "reason": "kernel restarted"}
    assert api.execution("k", "m").answer(200, json.dumps(summary).encode()).reason == (
        "kernel restarted"
    )


def test_transport_errors() -> None:
    refused = httpx.ConnectError("All connection attempts failed")
    refused.__cause__ = ConnectionRefusedError(111, "Connection refused")
    unreachable = api.transport_error("http://g", refused)
    assert isinstance(unreachable, GatewayUnreachable)
    assert str(unreachable) == (
        "cannot reach the gateway at http://g: "
        "ConnectionRefusedError: [Errno 111] Connection refused"
    )
    timed_out = api.transport_error("http://g", httpx.ReadTimeout(""))
    assert type(timed_out) is ClientError
    assert "ReadTimeout" in str(timed_out)


def test_callbacks_for_each_event() -> None:
    def seen(*args: object) -> None:
        return None

    callbacks = ExecutionCallbacks(
        on_stdout=print, on_stderr=repr, on_output=str, on_event=seen, input=input
    )
    stdout = Event("stdout", {"text": "hi"}, 3)
    assert callbacks.invocations(stdout) == [
        Invocation(seen, (stdout,)),
        Invocation(print, ("hi",)),
    ]
    assert callbacks.invocations(Event("stderr", {"text": "e"}))[1] == Invocation(repr, ("e",))
    for name in ("display", "result", "error"):
        output = Event(name, {})
        assert callbacks.invocations(output)[1] == Invocation(str, (output,))
    asking = Event("input_request", {"prompt": "who? ", "password": True})
    assert callbacks.invocations(asking)[1] == Invocation(input, ("who? ", True), True)
    assert ExecutionCallbacks().invocations(stdout) == []


def test_plan_checks_the_options() -> None:
    callbacks, start = plan("k", "1", {"input": input, "stop_on_error": False})
    assert callbacks.input is input
    assert json.loads(start.body or b"")["allow_stdin"] is True
    assert json.loads(start.body or b"")["stop_on_error"] is False
    with pytest.raises(TypeError, match="on_stdot"):
        plan("k", "1", {"on_stdot": print})  # type: ignore[typeddict-unknown-key]


def test_done_and_died() -> None:
    ok = result("k", Event("done", {"msg_id": "m", "status": "ok", "stdout": "x"}))
    assert (ok.ok, ok.kernel_id, ok.stdout) == (True, "k", "x")
    with pytest.raises(KernelDied) as dead:
        result("k", Event("done", {"msg_id": "m", "status": "died", "stdout": "up\n"}))
    assert dead.value.result.stdout == "up\n"
    assert died("k", "m", None).result.status == "died"
