"""Bad input from clients (items 8 and 9): a clear error, nothing else disturbed.

Invariant 8: a WebSocket close code with a JSON reason, or an HTTP 4xx with
``{"reason", "message"}``; other clients and the transcript untouched.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from jupyter_server.services.kernels.connection.base import serialize_msg_to_ws_v1
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from traitlets.config import Config

from ..integration.wsclient import KernelWS
from ..timing import seconds

HEADER = {
    "msg_id": "m-1",
    "msg_type": "execute_request",
    "session": "s",
    "username": "u",
    "version": "5.3",
    "date": "2026-01-01T00:00:00Z",
}


@pytest.fixture
def jp_server_config(transcript_path: str) -> Config:
    return Config(
        {
            "ServerApp": {"jpserver_extensions": {"kernel_gateway_stream": True}},
            "SQLiteTranscriptStore": {"path": transcript_path},
            "GatewayStreamApp": {"max_request_bytes": 1024 * 1024},
        }
    )


async def closed_with(ws: KernelWS, payload: str | bytes) -> tuple[int | None, Any]:
    await ws.ws.write_message(payload, binary=isinstance(payload, bytes))
    await ws.drain_until_closed()
    reason = ws.ws.close_reason
    assert reason is not None
    assert len(reason.encode()) <= 123
    return ws.ws.close_code, json.loads(reason)


async def test_bad_frames_close_their_socket_with_1007_and_a_json_reason(
    start_kernel: Any, connect: Any, transcript: Any
) -> None:
    """Item 8: JSON nested too deeply for the parser, and a parent header, metadata or
    content that is not an object (legacy and v1) close that socket with 1007 and a JSON
    reason that fits the WebSocket limit, however long the message that explains it; a
    client running output meanwhile gets all of it."""
    kernel_id = await start_kernel()
    good = await connect(kernel_id, protocol="v1")
    msg_id = good.execute(
        "import time\nfor i in range(300):\n    print(i, flush=True)\n    time.sleep(0.002)"
    )
    deep = '{"header": ' + "[" * 200_000 + "]" * 200_000 + "}"
    payloads: list[tuple[str | bytes, str]] = [(deep, "legacy")]
    for field in ("parent_header", "metadata", "content"):
        message = {"header": HEADER, "channel": "shell", field: [1, 2]}
        payloads.append((json.dumps(message), "legacy"))
    for index in (1, 2, 3):
        parts = [json.dumps(HEADER).encode(), b"{}", b"{}", b"{}"]
        parts[index] = b'"not an object"'
        payloads.append((serialize_msg_to_ws_v1(parts, "shell"), "v1"))
    long_channel = {"header": HEADER, "channel": "x" * 5000}
    payloads.append((json.dumps(long_channel), "legacy"))
    for payload, protocol in payloads:
        bad = await connect(kernel_id, protocol=protocol)
        code, reason = await closed_with(bad, payload)
        assert code == 1007
        assert reason["reason"] == "malformed_message"
    received = await good.until_idle(msg_id)
    assert received.text() == "".join(f"{i}\n" for i in range(300))
    assert await transcript(kernel_id, format="text", parent=msg_id) == received.text()


async def _answer(
    url: str, method: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, Any]:
    client = AsyncHTTPClient(force_instance=True)
    try:
        response = await client.fetch(
            HTTPRequest(
                url,
                method=method,
                body=body,
                headers=headers,
                allow_nonstandard_methods=True,
                request_timeout=seconds(60),
            ),
            raise_error=False,
        )
    finally:
        client.close()
    try:
        return response.code, json.loads(response.body or b"null")
    except ValueError:
        return response.code, response.body


@pytest.fixture
def api(jp_http_port: int, jp_auth_header: dict[str, str], jp_base_url: str) -> Any:
    async def call(
        path: str, method: str = "GET", body: Any = None, raw: bytes | None = None
    ) -> tuple[int, Any]:
        base = f"http://127.0.0.1:{jp_http_port}{jp_base_url.rstrip('/')}"
        payload = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        return await _answer(base + path, method, payload, jp_auth_header)

    return call


async def test_every_wrong_method_gets_405_with_a_json_reason(start_kernel: Any, api: Any) -> None:
    """Item 9: GET on the execute endpoint answered 500 (a TypeError); every endpoint
    answers a method it does not serve with 405 and a JSON reason."""
    kernel_id = await start_kernel()
    k = f"/api/kernels/{kernel_id}"
    wrong = [
        ("GET", f"{k}/execute"),
        ("PUT", f"{k}/execute"),
        ("DELETE", f"{k}/execute"),
        ("POST", f"{k}/stream"),
        ("POST", f"{k}/transcript"),
        ("DELETE", f"{k}/transcript"),
        ("POST", f"{k}/cells"),
        ("POST", f"{k}/executions/x"),
        ("POST", f"{k}/executions/x/events"),
        ("GET", f"{k}/executions/x/input"),
        ("GET", f"{k}/executions/x/interrupt"),
        ("PATCH", f"{k}/executions/x/interrupt"),
        ("POST", "/api/gateway/health"),
    ]
    for method, path in wrong:
        status, body = await api(path, method, raw=b"{}" if method != "GET" else None)
        assert status == 405, (method, path, status, body)
        assert body["reason"] == "method_not_allowed", (method, path)


async def test_request_bodies_over_the_limit_get_413(start_kernel: Any, api: Any) -> None:
    """Item 9: a body over GatewayStreamApp.max_request_bytes (1 MiB here) is refused
    with 413 before the gateway holds it (a 150 MiB execute body took the daemon to 828
    MiB); one under it works."""
    kernel_id = await start_kernel()
    big = json.dumps({"code": "#" + "x" * (2 * 1024 * 1024)}).encode()
    for path in ("execute", "executions/x/input"):
        status, body = await api(f"/api/kernels/{kernel_id}/{path}", "POST", raw=big)
        assert status == 413, path
        assert body["reason"] == "payload_too_large"
    status, body = await api(
        f"/api/kernels/{kernel_id}/execute", "POST", body={"code": "#" + "x" * 500_000}
    )
    assert status == 201


@pytest.mark.parametrize("timeout", [b"NaN", b"Infinity", b"-Infinity", b"-1", b"0", b'"10"'])
async def test_a_timeout_that_is_not_a_positive_number_is_400(
    start_kernel: Any, api: Any, timeout: bytes
) -> None:
    """Item 9: NaN, Infinity (which Python's json accepts), zero, negative or a string."""
    kernel_id = await start_kernel()
    raw = b'{"code": "1", "timeout": ' + timeout + b"}"
    status, body = await api(f"/api/kernels/{kernel_id}/execute", "POST", raw=raw)
    assert status == 400
    assert body["reason"] == "bad_request"


async def test_interrupting_an_execution_that_is_not_running_interrupts_nothing(
    start_kernel: Any, api: Any
) -> None:
    """Item 9: an interrupt names an execution; for an unknown one (404), a queued one or a
    finished one (409) the kernel is not interrupted, so the execution that is running
    goes on to the end."""
    kernel_id = await start_kernel()
    k = f"/api/kernels/{kernel_id}"
    status, done = await api(f"{k}/execute", "POST", body={"code": "print('first')"})
    assert status == 201
    await api(f"{k}/executions/{done['msg_id']}/events")
    status, running = await api(
        f"{k}/execute",
        "POST",
        body={"code": "import time\nfor i in range(30):\n    time.sleep(0.1)\nprint('finished')"},
    )
    status, queued = await api(f"{k}/execute", "POST", body={"code": "print('queued')"})
    await asyncio.sleep(0.5)
    for msg_id, expected in (("nope", 404), (queued["msg_id"], 409), (done["msg_id"], 409)):
        status, body = await api(f"{k}/executions/{msg_id}/interrupt", "POST", body={})
        assert status == expected, (msg_id, body)
    await api(f"{k}/executions/{running['msg_id']}/events")
    status, summary = await api(f"{k}/executions/{running['msg_id']}")
    assert (summary["status"], summary["stdout"]) == ("ok", "finished\n")
    await api(f"{k}/executions/{queued['msg_id']}/events")
    status, summary = await api(f"{k}/executions/{queued['msg_id']}")
    assert (summary["status"], summary["stdout"]) == ("ok", "queued\n")
