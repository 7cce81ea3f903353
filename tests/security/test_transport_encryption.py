"""Encrypted kernel transports: jupyter_server's ``MappingKernelManager.transport_encryption``
(``auto``, ``required``) gives each kernel a CurveZMQ key pair in its connection file, and
ipykernel's sockets become CurveZMQ servers. The gateway's own sockets (IOPub, each
client's shell, control and stdin, the heartbeat, the probes) speak CurveZMQ with those
keys: a 20,000-line flood arrives whole on the channels WebSocket and on SSE, and a local
process that has the ports but not the keys reads nothing from the kernel's IOPub, where
the same process with the keys reads its output (the control)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio
from jupyter_client.connect import write_connection_file
from tornado.httpclient import HTTPClientError

from kernel_gateway_stream.client import GatewayClient

from ..integration.daemon import TOKEN, Daemon
from ..integration.floods import flood_code, flood_text
from ..integration.sseclient import SSEReader, stream_text
from ..timing import seconds

#: Lines of the flood under each policy: "auto" gives this machine's kernels the same
#: keys "required" does, so a short run shows it encrypts; the 20,000-line flood runs once.
LINES = {"auto": 500, "required": 20_000}


def connection_file(daemon: Daemon, kernel_id: str) -> dict[str, Any]:
    info: dict[str, Any] = json.loads(
        (daemon.home / "runtime" / f"kernel-{kernel_id}.json").read_text()
    )
    return info


async def iopub_text(info: dict[str, Any], with_keys: bool, daemon: Daemon, kernel_id: str) -> str:
    """What a SUB socket of this process (with or without the kernel's keys) reads from the
    kernel's IOPub while the kernel prints, until the gateway has recorded the print."""
    context = zmq.asyncio.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.LINGER, 0)
    if with_keys:
        public = info["curve_publickey"].encode()
        socket.curve_secretkey = info["curve_secretkey"].encode()
        socket.curve_publickey = public
        socket.curve_serverkey = public
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(f"tcp://{info['ip']}:{info['iopub_port']}")
    seen = b""
    try:
        async with GatewayClient(daemon.url, TOKEN) as client:
            # Several prints a while apart: a subscriber that can connect has joined by
            # the later ones.
            for _ in range(5):
                result = await client.execute(
                    kernel_id, "import time; print('marker-for-sub', flush=True); time.sleep(0.2)"
                )
                assert result.stdout == "marker-for-sub\n"
                while await socket.poll(100):
                    seen += b"".join(await socket.recv_multipart())
    finally:
        socket.close(linger=0)
        context.term()
    return seen.decode(errors="replace")


@pytest.mark.parametrize("policy", ["auto", "required"])
async def test_a_flood_arrives_whole_over_curve_and_without_the_keys_nothing_is_read(
    daemon: Daemon, policy: str
) -> None:
    daemon.start(f"--MappingKernelManager.transport_encryption={policy}")
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN) as client:
        kernel_id = await client.start_kernel()
    info = connection_file(daemon, kernel_id)
    assert len(info.get("curve_publickey", "")) == 40, "the kernel has no CurveZMQ keys"
    ws = await daemon.channels(kernel_id)
    sse = SSEReader(f"{daemon.url}/api/kernels/{kernel_id}/stream?since=0", daemon.headers)
    try:
        lines = LINES[policy]
        expected = flood_text(lines)
        msg_id = ws.execute(flood_code(lines))
        assert (await ws.until_idle(msg_id, timeout=80)).text() == expected
        events = await sse.until_idle(msg_id, timeout=80)
        mine = [e for e in events if e.data["parent_header"].get("msg_id") == msg_id]
        assert stream_text(mine) == expected
    finally:
        ws.close()
        sse.close()
    # Ports without the keys: nothing. With them (the control): the kernel's output.
    assert "marker-for-sub" not in await iopub_text(info, False, daemon, kernel_id)
    assert "marker-for-sub" in await iopub_text(info, True, daemon, kernel_id)
    # Interrupt (control channel) and the heartbeat work over CurveZMQ too.
    async with GatewayClient(daemon.url, TOKEN) as client:
        ws = await daemon.channels(kernel_id)
        try:
            sleeping = ws.execute("import time; time.sleep(600)")
            # Interrupted once it runs: an idle ipykernel ignores SIGINT, and a request
            # still on its way would then sleep its ten minutes.
            while not any(
                m["msg_type"] == "execute_input" and m["parent_header"].get("msg_id") == sleeping
                for m in ws.history
            ):
                assert await ws.receive() is not None, "the connection closed"
            await client.interrupt(kernel_id)
            received = await ws.until_idle(sleeping, timeout=60)
            errors = [m for m in received.messages if m["msg_type"] == "error"]
            assert errors
            assert errors[0]["content"]["ename"] == "KeyboardInterrupt"
        finally:
            ws.close()
        model = await daemon.fetch(f"/api/kernels/{kernel_id}")
        assert model["execution_state"] == "idle"
        await client.shutdown(kernel_id)
    assert "unreachable" not in daemon.log_text()


async def test_attaching_by_connection_info_with_curve_keys(daemon: Daemon, tmp_path: Path) -> None:
    """An ipykernel the test started with a CurveZMQ key pair in its connection file,
    attached by that connection info: it runs code. Without the keys it does not answer
    (the attach is refused), and half a pair is refused as invalid."""
    public, secret = zmq.curve_keypair()
    path = tmp_path / "kernel-curve.json"
    write_connection_file(
        str(path), ip="127.0.0.1", key=b"a-key", curve_publickey=public, curve_secretkey=secret
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "ipykernel_launcher", "-f", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYDEVD_DISABLE_FILE_VALIDATION": "1"},
    )
    try:
        info = json.loads(path.read_text())
        # The attach without the keys is refused once attach_timeout has passed: 1 s (scaled),
        # not the default 10. The kernel, started before the daemon, has had seconds to be up
        # by the time the attach with the keys asks it.
        daemon.start(f"--KernelAttacher.attach_timeout={seconds(1)}")
        await daemon.wait_ready()
        plain = {k: v for k, v in info.items() if not k.startswith("curve_")}
        for refused_info, reason in (
            (dict(info, curve_secretkey=""), "invalid_connection_info"),
            (dict(info, curve_publickey="short"), "invalid_connection_info"),
            (plain, "kernel_not_answering"),
        ):
            with pytest.raises(HTTPClientError) as refused:
                await daemon.fetch(
                    "/api/kernels",
                    method="POST",
                    body=json.dumps({"connection_info": refused_info}),
                    request_timeout=seconds(60),
                )
            assert refused.value.code == 400
            assert refused.value.response is not None
            assert json.loads(refused.value.response.body)["reason"] == reason
        model = await daemon.fetch(
            "/api/kernels",
            method="POST",
            body=json.dumps({"connection_info": info}),
            request_timeout=seconds(60),
        )
        async with GatewayClient(daemon.url, TOKEN) as client:
            result = await client.execute(model["id"], "print(6 * 7)")
        assert result.stdout == "42\n"
        # A gateway that requires encryption refuses a kernel without it, saying why.
        daemon.stop()
        daemon.start("--MappingKernelManager.transport_encryption=required")
        await daemon.wait_ready()
        with pytest.raises(HTTPClientError) as refused:
            await daemon.fetch(
                "/api/kernels", method="POST", body=json.dumps({"connection_info": plain})
            )
        assert refused.value.code == 400
        assert refused.value.response is not None
        body = json.loads(refused.value.response.body)
        assert body["reason"] == "invalid_connection_info"
        assert "requires encrypted kernel transports" in body["message"], body
    finally:
        process.kill()
        process.wait()


async def test_an_encrypted_kernel_is_re_attached_after_a_gateway_crash(daemon: Daemon) -> None:
    """The kernel's key pair is kept with its link: after a SIGKILL of the gateway, the
    gateway started again re-attaches it over CurveZMQ, and it runs code."""
    daemon.start("--MappingKernelManager.transport_encryption=required")
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN) as client:
        kernel_id = await client.start_kernel()
        assert (await client.execute(kernel_id, "x = 6")).stdout == ""
    # The gateway alone (its kernels outlive it).
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait()
    daemon.start("--MappingKernelManager.transport_encryption=required")
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN) as client:
        result = await client.execute(kernel_id, "print(x * 7)")
        assert result.stdout == "42\n"
        await client.shutdown(kernel_id)
