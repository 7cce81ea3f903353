"""A kernel whose process cannot start answers at once, as jupyter_server's own kernels API
and WebSocket do: with pending kernels (``use_pending_kernels``) the start is accepted,
then the channels WebSocket, SSE and the execute API answer 500 ``kernel_start_failed``
with the start's error, and the kernel's model says ``dead`` with that reason; without,
the start itself answers 500 with the reason. The Tap's readiness wait is set far beyond
the requests' own timeouts here, so a surface that waited for it instead fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect
from traitlets.config import Config

from ..timing import seconds
from .daemon import Daemon
from .waits import wait_until

BROKEN = "broken-python"
NEVER_READY = "--RecorderRegistry.ready_timeout=3600"


def install_broken_kernelspec(daemon: Daemon) -> None:
    spec = daemon.home / "data" / "kernels" / BROKEN
    spec.mkdir(parents=True, exist_ok=True)
    argv = [
        str(daemon.home / "no-such-python"),
        "-m",
        "ipykernel_launcher",
        "-f",
        "{connection_file}",
    ]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Broken", "language": "python"})
    )


async def refused(daemon: Daemon, path: str, **kwargs: Any) -> dict[str, Any]:
    """The JSON body of the 500 that ``path`` answers."""
    with pytest.raises(HTTPClientError) as error:
        await daemon.fetch(path, request_timeout=seconds(30), **kwargs)
    assert error.value.code == 500, error.value
    assert error.value.response is not None
    body: dict[str, Any] = json.loads(error.value.response.body)
    return body


async def test_a_pending_kernel_whose_start_fails_is_dead_and_every_surface_says_why(
    daemon: Daemon, tmp_path: Path
) -> None:
    install_broken_kernelspec(daemon)
    daemon.start("--MappingKernelManager.use_pending_kernels=True", NEVER_READY)
    await daemon.wait_ready()
    model = await daemon.fetch("/api/kernels", method="POST", body=json.dumps({"name": BROKEN}))
    kernel_id = model["id"]

    async def dead() -> bool:
        state = await daemon.fetch(f"/api/kernels/{kernel_id}")
        return bool(state["execution_state"] == "dead")

    await wait_until(dead, "the model says dead")
    model = await daemon.fetch(f"/api/kernels/{kernel_id}")
    assert "no-such-python" in model["reason"], model
    # The channels WebSocket: refused with 500, not opened to a kernel that is not there.
    request = HTTPRequest(
        f"ws://127.0.0.1:{daemon.port}/api/kernels/{kernel_id}/channels",
        headers=daemon.headers,
        request_timeout=seconds(30),
    )
    with pytest.raises(HTTPClientError) as error:
        await websocket_connect(request)
    assert error.value.code == 500
    # SSE, the execute API and the transcript's head: the same answer, with the reason.
    for path, kwargs in (
        (f"/api/kernels/{kernel_id}/stream", {}),
        (f"/api/kernels/{kernel_id}/execute", {"method": "POST", "body": '{"code": "1"}'}),
    ):
        body = await refused(daemon, path, **kwargs)
        assert body["reason"] == "kernel_start_failed", body
        assert "no-such-python" in body["message"], body
    # Still listed, dead, until deleted (as jupyter_server keeps it).
    assert [k["execution_state"] for k in await daemon.fetch("/api/kernels")] == ["dead"]
    await daemon.fetch(f"/api/kernels/{kernel_id}", method="DELETE")
    assert await daemon.fetch("/api/kernels") == []


async def test_a_kernel_whose_start_fails_answers_the_start_with_the_reason(
    daemon: Daemon,
) -> None:
    install_broken_kernelspec(daemon)
    daemon.start(NEVER_READY)
    await daemon.wait_ready()
    body = await refused(daemon, "/api/kernels", method="POST", body=json.dumps({"name": BROKEN}))
    assert body["reason"] == "kernel_start_failed", body
    assert "no-such-python" in body["message"], body
    assert await daemon.fetch("/api/kernels") == []


@pytest.fixture
def jp_server_config(transcript_path: str) -> Config:
    """``jupyter server`` with the extension and jupyter_server's own kernel manager, pending
    kernels on (jupyter_server's ``test_create_bad_pending``)."""
    return Config(
        {
            "ServerApp": {"jpserver_extensions": {"kernel_gateway_stream": True}},
            "SQLiteTranscriptStore": {"path": transcript_path},
            "AsyncMappingKernelManager": {"use_pending_kernels": True},
        }
    )


async def test_under_jupyter_server_a_failed_pending_start_is_dead_once_a_client_asks(
    jp_fetch: Any,
    jp_data_dir: Path,
    jp_http_port: int,
    jp_auth_header: dict[str, str],
    jp_base_url: str,
) -> None:
    """jupyter_server's own kernel manager leaves a failed pending start's model as it was;
    its WebSocket marks it ``dead`` with the reason when it finds the failure. The gateway's
    channels WebSocket does the same (jupyter_server's ``test_create_bad_pending``, which
    failed with the extension: the model stayed ``starting``)."""
    spec = jp_data_dir / "kernels" / BROKEN
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps({"argv": ["no-such-python"], "display_name": "Broken", "language": "python"})
    )
    body = {"path": "nb.ipynb", "type": "notebook", "name": "nb.ipynb", "kernel": {"name": BROKEN}}
    session = json.loads(
        (await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))).body
    )
    kernel_id = session["kernel"]["id"]
    request = HTTPRequest(
        f"ws://127.0.0.1:{jp_http_port}{jp_base_url.rstrip('/')}/api/kernels/{kernel_id}/channels",
        headers=jp_auth_header,
        request_timeout=seconds(30),
    )
    with pytest.raises(HTTPClientError) as error:
        await websocket_connect(request)
    assert error.value.code == 500
    [listed] = json.loads((await jp_fetch("api", "sessions")).body)
    assert listed["kernel"]["execution_state"] == "dead"
    model = json.loads((await jp_fetch("api", "kernels", kernel_id)).body)
    assert model["execution_state"] == "dead"
    assert "no-such-python" in model["reason"], model


async def test_under_jupyter_server_a_failed_pending_start_is_dead_with_no_client(
    jp_fetch: Any, jp_data_dir: Path
) -> None:
    """With no client at all: the start's failure event (jupyter_server's kernel_actions,
    status ``error``) makes the model ``dead`` with the reason."""
    spec = jp_data_dir / "kernels" / BROKEN
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps({"argv": ["no-such-python"], "display_name": "Broken", "language": "python"})
    )
    body = json.dumps({"name": BROKEN})
    kernel_id = json.loads((await jp_fetch("api", "kernels", method="POST", body=body)).body)["id"]

    async def dead() -> bool:
        model = json.loads((await jp_fetch("api", "kernels", kernel_id)).body)
        return bool(model["execution_state"] == "dead")

    await wait_until(dead, "the model says dead", timeout=10)
    model = json.loads((await jp_fetch("api", "kernels", kernel_id)).body)
    assert "no-such-python" in model["reason"], model
