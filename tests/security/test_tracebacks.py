"""Item 3: ``MappingKernelManager.allow_tracebacks=False`` is honoured on every surface."""

from __future__ import annotations

import json
from typing import Any

import pytest
from traitlets.config import Config


@pytest.fixture
def jp_server_config(transcript_path: str) -> Config:
    return Config(
        {
            "ServerApp": {"jpserver_extensions": {"kernel_gateway_stream": True}},
            "SQLiteTranscriptStore": {"path": transcript_path},
            "MappingKernelManager": {
                "allow_tracebacks": False,
                "traceback_replacement_message": "An error occurred (details withheld).",
            },
        }
    )


async def test_tracebacks_are_withheld_on_every_surface_when_not_allowed(
    start_kernel: Any, connect: Any, sse: Any, transcript: Any, jp_fetch: Any
) -> None:
    """Item 3: with MappingKernelManager.allow_tracebacks=False, no surface shows a
    traceback (nor the error's name and value, as jupyter_server replaces them): the
    channels socket (IOPub and the execute_reply), SSE, the transcript and the execute
    API's events and summary all carry the replacement message."""
    kernel_id = await start_kernel()
    reader = sse(kernel_id, "?since=0")
    ws = await connect(kernel_id, protocol="v1")
    code = "def leak():\n    return 1 / 0\nleak()"
    msg_id = ws.execute(code)
    received = await ws.until_idle(msg_id)
    # The reply comes on shell, the output on IOPub: in either order.
    replies = [m for m in received.messages if m["msg_type"] == "execute_reply"]
    reply = replies[0] if replies else await ws.receive()
    while reply is not None and reply["msg_type"] != "execute_reply":
        reply = await ws.receive()
    assert reply is not None
    events = await reader.until_idle(msg_id)
    page = await transcript(kernel_id, limit=10000)
    answer = await jp_fetch(
        "api", "kernels", kernel_id, "execute", method="POST", body=json.dumps({"code": code})
    )
    api_msg_id = json.loads(answer.body)["msg_id"]
    api_events = await jp_fetch("api", "kernels", kernel_id, "executions", api_msg_id, "events")
    summary = await jp_fetch("api", "kernels", kernel_id, "executions", api_msg_id)
    surfaces = {
        "channels": json.dumps(received.messages),
        "execute_reply": json.dumps(reply),
        "sse": json.dumps([event.data for event in events]),
        "transcript": json.dumps(page),
        "events": api_events.body.decode(),
        "summary": summary.body.decode(),
    }
    for name, text in surfaces.items():
        # What only the error and its traceback carry (IPython marks the failing line ---->).
        for revealing in ("ZeroDivisionError", "division by zero", "---->"):
            assert revealing not in text, (name, revealing)
    assert "An error occurred (details withheld)." in surfaces["channels"]
    assert json.loads(summary.body)["error"]["traceback"] == [
        "An error occurred (details withheld)."
    ]
