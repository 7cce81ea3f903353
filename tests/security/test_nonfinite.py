"""Item 5 of the hardening issue: numbers a kernel sends that JSON cannot write back.

``1e999`` is valid JSON syntax (RFC 8259 section 6 sets no range), but Python parses it to
``inf``, which no strict encoder writes (Python's own writes the token ``Infinity``, which
``JSON.parse`` refuses). ``NaN`` and ``Infinity`` themselves are not JSON at all. The
gateway reads every non-finite number a kernel sends as ``null`` when the message arrives
(the record is kept), so every surface writes strict JSON and the execution ends with
``done``. Real daemon, real ipykernel; the kernel's code signs the messages itself.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPResponse

from kernel_gateway_stream.client import GatewayClient, GatewayHTTPError, SyncGatewayClient

from ..integration.daemon import TOKEN, Daemon
from ..integration.scripted import ScriptedGateway, sse, sse_response
from ..integration.sseclient import SSEReader
from ..timing import seconds

#: Kernel code that publishes, parented to its own execution, messages whose JSON parts
#: hold 1e999, -1e999, NaN and Infinity (the raw bytes, signed with the kernel's key:
#: ``Session.send`` would clean them first), and prints one part as it sent it.
FORGE = r"""
k = get_ipython().kernel
s = k.session
parent = s.pack(k.get_parent()["header"])
def forge(msg_type, content, metadata=b"{}", extra=b""):
    header = s.pack(s.msg_header(msg_type))
    if extra:
        header = header[:-1] + b", " + extra + b"}"
    parts = [header, parent, metadata, content]
    k.iopub_socket.send_multipart([msg_type.encode(), b"<IDS|MSG>", s.sign(parts), *parts])
RESULT = (b'{"data": {"text/plain": "inf-result"}, "metadata": {"width": -1e999},'
          b' "execution_count": 1e999}')
forge("execute_input", b'{"code": "forged", "execution_count": 1e999}')
forge("execute_result", RESULT, b'{"m": 1e999, "n": [NaN, {"deep": -1e999}]}', b'"x": 1e999')
forge("display_data", b'{"data": {"text/plain": "inf-display", "application/json":'
      b' {"v": [1e999, -1e999, NaN, 1.5, 1E+400]}}, "metadata": {"h": Infinity},'
      b' "transient": {"display_id": "inf-d", "x": -1e999}}')
forge("update_display_data", b'{"data": {"text/plain": "inf-update", "application/json":'
      b' {"w": 1e999}}, "metadata": {}, "transient": {"display_id": "inf-d"}}')
print(RESULT.decode())
"""


def reject_constant(name: str) -> Any:
    raise AssertionError(f"{name} written as JSON")


def strict(raw: bytes | str) -> Any:
    """``raw`` parsed as RFC 8259 JSON: NaN / Infinity fail, and so does any number that
    only reads as infinite (a browser's JSON.parse would give Infinity, not the record)."""

    def finite(text: str) -> float:
        value = float(text)
        assert value not in (float("inf"), float("-inf")), f"{text} written as JSON"
        return value

    return json.loads(raw, parse_constant=reject_constant, parse_float=finite)


def strict_events(body: bytes) -> list[tuple[str, Any]]:
    """The complete events of an SSE body, each ``data`` parsed strictly."""
    events = []
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        fields: dict[str, list[str]] = {}
        for line in block.decode().split("\n"):
            if line and not line.startswith(":"):
                name, _, value = line.partition(":")
                fields.setdefault(name, []).append(value.removeprefix(" "))
        if "event" in fields:
            events.append((fields["event"][0], strict("\n".join(fields.get("data", [])))))
    return events


async def get(daemon: Daemon, path: str, **options: Any) -> HTTPResponse:
    options.setdefault("request_timeout", seconds(60))
    options.setdefault("headers", daemon.headers)
    return await AsyncHTTPClient().fetch(daemon.url + path, raise_error=False, **options)


#: The tests on the module's one daemon run on one worker, so that it starts once.
SHARED_DAEMON = pytest.mark.xdist_group("test_nonfinite-daemon")


async def forged_execution(daemon: Daemon) -> tuple[str, str]:
    """A kernel of its own on ``daemon``, and one execution (cell ``inf-cell``) that
    forged the messages."""
    kernel_id = await daemon.start_kernel()
    ws = await daemon.channels(kernel_id)
    try:
        msg_id = ws.execute(FORGE, cell_id="inf-cell")
        await ws.until_idle(msg_id)
    finally:
        ws.close()
    return kernel_id, msg_id


def check_result(
    outputs: list[dict[str, Any]], kind: str = "type", displays: tuple[str, ...] = ("inf-update",)
) -> None:
    """The forged execute_result is kept with null for its infinite numbers; the forged
    display shows ``displays`` (the update's data, once applied)."""
    results = [o for o in outputs if o[kind] in ("result", "execute_result")]
    assert [o["data"]["text/plain"] for o in results] == ["inf-result"]
    assert results[0]["execution_count"] is None
    assert results[0]["metadata"] == {"width": None}
    shown = [o for o in outputs if o[kind] in ("display", "display_data")]
    assert [o["data"]["text/plain"] for o in shown] == list(displays)
    assert shown[-1]["data"]["application/json"] == {"w": None}


@SHARED_DAEMON
async def test_the_records_are_kept_with_null_for_each_non_finite_number(
    module_daemon: Daemon,
) -> None:
    """Control: the kernel really sent 1e999 (it printed the part it sent), and the
    transcript keeps every forged message, each non-finite number read as null, finite
    ones as they were; the REST answer and the SSE stream are strict JSON."""
    daemon = module_daemon
    kernel_id, msg_id = await forged_execution(daemon)
    response = await get(daemon, f"/api/kernels/{kernel_id}/transcript?since=0&parent={msg_id}")
    assert response.code == 200
    records = strict(response.body)["records"]
    text = "".join(r["content"]["text"] for r in records if r["msg_type"] == "stream")
    assert '"execution_count": 1e999}' in text  # what the kernel sent
    by_type = {r["msg_type"]: r for r in records}  # the last of each type
    result = by_type["execute_result"]
    assert result["content"]["execution_count"] is None
    assert result["content"]["metadata"] == {"width": None}
    assert result["metadata"]["m"] is None
    assert result["metadata"]["n"] == [None, {"deep": None}]
    assert result["header"]["x"] is None
    display = by_type["display_data"]
    assert display["content"]["data"]["application/json"] == {"v": [None, None, None, 1.5, None]}
    assert display["content"]["metadata"] == {"h": None}
    assert display["content"]["transient"] == {"display_id": "inf-d", "x": None}
    inputs = [r for r in records if r["msg_type"] == "execute_input"]
    assert [r["content"]["execution_count"] for r in inputs][-1] is None

    reader = SSEReader(f"{daemon.url}/api/kernels/{kernel_id}/stream?since=0", daemon.headers)
    try:
        await reader.until_idle(msg_id)
        complete = reader.raw[: reader.raw.rfind(b"\n\n") + 2]
    finally:
        reader.close()
    events = strict_events(complete)
    forged_types = {data.get("msg_type") for _, data in events}
    assert {"execute_result", "display_data", "update_display_data"} <= forged_types
    (streamed,) = [data for name, data in events if name == "execute_result"]
    assert streamed["content"]["execution_count"] is None


@SHARED_DAEMON
async def test_the_execution_answers_200_and_its_events_end_with_done(
    module_daemon: Daemon,
) -> None:
    """GET /executions/{id} answers strict JSON; its events, replayed, end with ``done``;
    and a new execution's events, followed live (POST /execute as SSE), do too."""
    daemon = module_daemon
    kernel_id, msg_id = await forged_execution(daemon)
    response = await get(daemon, f"/api/kernels/{kernel_id}/executions/{msg_id}")
    assert response.code == 200, response.body
    summary = strict(response.body)
    assert summary["status"] == "ok"
    assert summary["execution_count"] is None  # the forged execute_input came last
    check_result(summary["outputs"])

    response = await get(daemon, f"/api/kernels/{kernel_id}/executions/{msg_id}/events")
    assert response.code == 200
    events = strict_events(response.body)
    assert events[-1][0] == "done"
    assert events[-1][1]["msg_id"] == msg_id
    outputs = [{"type": name, **data} for name, data in events if name in ("result", "display")]
    check_result(outputs, displays=("inf-display", "inf-update"))

    response = await get(
        daemon,
        f"/api/kernels/{kernel_id}/execute",
        method="POST",
        body=json.dumps({"code": FORGE}),
        headers={**daemon.headers, "Accept": "text/event-stream"},
    )
    assert response.code == 200
    events = strict_events(response.body)
    assert events[0][0] == "execution"
    assert events[-1][0] == "done"
    assert events[-1][1]["status"] == "ok"
    check_result(events[-1][1]["outputs"])


@SHARED_DAEMON
async def test_cells_restore_is_strict_json(module_daemon: Daemon) -> None:
    """The notebook's restore answer (JupyterLab's JSON.parse refuses Infinity)."""
    daemon = module_daemon
    kernel_id, msg_id = await forged_execution(daemon)
    response = await get(daemon, f"/api/kernels/{kernel_id}/cells")
    assert response.code == 200
    (cell,) = strict(response.body)["executions"]
    assert (cell["cell_id"], cell["msg_id"], cell["status"]) == ("inf-cell", msg_id, "ok")
    assert cell["execution_count"] is None
    check_result(cell["outputs"], kind="output_type")


@SHARED_DAEMON
async def test_the_python_client_returns_in_bounded_time(module_daemon: Daemon) -> None:
    """``execute()`` ends (it looped for ever when the gateway failed on the summary)."""
    daemon = module_daemon
    kernel_id, _ = await forged_execution(daemon)
    async with GatewayClient(daemon.url, TOKEN, reconnect_deadline=seconds(30)) as client:
        result = await asyncio.wait_for(client.execute(kernel_id, FORGE), seconds(60))
    assert result.ok
    assert '"execution_count": 1e999}' in result.stdout
    check_result(result.outputs)
    assert "Traceback" not in daemon.log_text()


def json_response(status: bytes, body: Any) -> bytes:
    data = json.dumps(body).encode()
    head = b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % (
        status,
        len(data),
    )
    return head + b"Connection: close\r\n\r\n" + data


@pytest.mark.parametrize("kind", [GatewayClient, SyncGatewayClient])
def test_execute_ends_with_a_clear_error_when_the_gateway_keeps_failing(kind: Any) -> None:
    """What the client did against a gateway that failed on the same record at each resume
    (as it did on a kernel's 1e999): it resumed for ever. Now the third ``server_error``
    at one place ends ``execute()`` with a 500, after four requests in all."""
    failure = sse("server_error", {"reason": "server_error", "last_seq": 1, "message": "boom"})
    server = ScriptedGateway(
        [
            json_response(b"201 Created", {"msg_id": "m-1", "kernel_id": "k1"}),
            sse_response(sse("stdout", {"text": "a"}, 1), failure),
            *[sse_response(failure) for _ in range(5)],
        ]
    )
    lines: list[str] = []
    client = kind(server.url, "token", reconnect_delay=0.01, reconnect_deadline=seconds(60))

    def execute() -> None:
        if isinstance(client, SyncGatewayClient):
            client.execute("k1", "1", on_stdout=lines.append)
        else:
            run = client.execute("k1", "1", on_stdout=lines.append)
            asyncio.run(asyncio.wait_for(run, seconds(60)))

    try:
        with pytest.raises(GatewayHTTPError) as raised:
            execute()
    finally:
        if isinstance(client, SyncGatewayClient):
            client.close()
        server.close()
    assert (raised.value.status, raised.value.reason) == (500, "server_error")
    assert "boom" in str(raised.value)
    assert lines == ["a"]
    assert len(server.requests) == 4
    assert [headers.get("last-event-id") for _, headers in server.requests[2:]] == ["1", "1"]
