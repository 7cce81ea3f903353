"""Authorization (item 2): every surface that sends to a kernel or reads its output
requires what jupyter_server's own kernel WebSocket requires: ``execute`` on ``kernels``.

An Authorizer that denies one action at a time, against a real server and kernel. With
``execute`` denied, every such endpoint answers 403 (and says nothing about the kernel);
with ``read`` and ``write`` denied but ``execute`` allowed, they all work, as the
channels socket does.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

import pytest
from jupyter_server.auth.authorizer import Authorizer
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets.config import Config

from ..timing import seconds


class DenyingAuthorizer(Authorizer):
    """Denies the (action, resource) pairs in :attr:`denied`; allows the rest."""

    denied: ClassVar[set[tuple[str, str]]] = set()

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return (action, resource) not in self.denied


@pytest.fixture
def jp_server_config(transcript_path: str) -> Config:
    return Config(
        {
            "ServerApp": {
                "jpserver_extensions": {"kernel_gateway_stream": True},
                "authorizer_class": DenyingAuthorizer,
            },
            "SQLiteTranscriptStore": {"path": transcript_path},
        }
    )


#: (method, path under /api/kernels/{kernel_id}, body) of every endpoint that sends to the
#: kernel or reads its output. ``{msg_id}`` is a finished execution's.
ENDPOINTS = [
    ("GET", "/stream", None),
    ("GET", "/transcript", None),
    ("GET", "/cells", None),
    ("GET", "/executions/{msg_id}", None),
    ("GET", "/executions/{msg_id}/events", None),
    ("POST", "/execute", {"code": "1"}),
    ("POST", "/executions/{msg_id}/input", {"value": "x"}),
    ("POST", "/executions/{msg_id}/interrupt", {}),
]


async def _status(url: str, method: str, body: Any, headers: dict[str, str]) -> int:
    """The response's status code, read from its status line (streams stay open: hang up
    as soon as it arrives)."""
    status: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def on_header(line: str) -> None:
        if line.startswith("HTTP/") and not status.done():
            status.set_result(int(line.split()[1]))

    request = HTTPRequest(
        url,
        method=method,
        body=None if body is None else json.dumps(body),
        headers=headers,
        request_timeout=seconds(30),
        header_callback=on_header,
        streaming_callback=lambda chunk: None,
    )
    client = AsyncHTTPClient(force_instance=True)
    fetching = asyncio.ensure_future(client.fetch(request, raise_error=False))
    try:
        await asyncio.wait([status, fetching], return_when=asyncio.FIRST_COMPLETED)
        return status.result() if status.done() else fetching.result().code
    finally:
        client.close()
        fetching.cancel()


async def kernel_and_execution(start_kernel: Any, jp_fetch: Any) -> tuple[str, str]:
    """A kernel and the msg_id of a finished execution on it."""
    DenyingAuthorizer.denied = set()
    kernel_id = await start_kernel()
    response = await jp_fetch(
        "api", "kernels", kernel_id, "execute", method="POST", body=json.dumps({"code": "1"})
    )
    msg_id = json.loads(response.body)["msg_id"]
    events = await jp_fetch("api", "kernels", kernel_id, "executions", msg_id, "events")
    assert b"event: done" in events.body
    return kernel_id, msg_id


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
async def test_reading_output_or_sending_needs_execute(
    start_kernel: Any,
    jp_fetch: Any,
    jp_base_url: str,
    jp_http_port: int,
    jp_auth_header: dict[str, str],
    method: str,
    path: str,
    body: Any,
) -> None:
    kernel_id, msg_id = await kernel_and_execution(start_kernel, jp_fetch)
    base = f"http://127.0.0.1:{jp_http_port}{jp_base_url.rstrip('/')}/api/kernels/{kernel_id}"
    url = base + path.format(msg_id=msg_id)
    if path.endswith(("/stream", "/events")):
        url += "?since=0" if path.endswith("/stream") else ""
    DenyingAuthorizer.denied = {("execute", "kernels")}
    try:
        assert await _status(url, method, body, jp_auth_header) == 403
        DenyingAuthorizer.denied = {("read", "kernels"), ("write", "kernels")}
        status = await _status(url, method, body, jp_auth_header)
    finally:
        DenyingAuthorizer.denied = set()
    assert status != 403
    assert status < 500


async def test_the_channels_socket_needs_execute_and_nothing_else(
    start_kernel: Any, jp_fetch: Any, connect: Any
) -> None:
    """The reference the rest follows: jupyter_server's rule for the kernel WebSocket."""
    kernel_id, _ = await kernel_and_execution(start_kernel, jp_fetch)
    DenyingAuthorizer.denied = {("execute", "kernels")}
    try:
        with pytest.raises(HTTPClientError) as denied:
            await connect(kernel_id)
        assert denied.value.code == 403
        DenyingAuthorizer.denied = {("read", "kernels"), ("write", "kernels")}
        ws = await connect(kernel_id)
        received = await ws.until_idle(ws.execute("print('allowed')"))
        assert received.text() == "allowed\n"
    finally:
        DenyingAuthorizer.denied = set()
