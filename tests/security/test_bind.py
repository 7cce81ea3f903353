"""Item 6: ``--ip`` is honoured, and a daemon that would serve kernels on a non-loopback
address without authentication refuses to start unless the operator says so."""

from __future__ import annotations

import asyncio
import socket
import subprocess

from ..integration.daemon import Daemon
from ..timing import seconds


def listening(port: int) -> str:
    return subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout


async def test_ip_is_honoured(daemon: Daemon) -> None:
    daemon.start("--ip=0.0.0.0")
    await daemon.wait_ready()
    assert f"0.0.0.0:{daemon.port}" in listening(daemon.port)


async def exit_code(daemon: Daemon) -> int:
    assert daemon.process is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(60)
    while daemon.process.poll() is None and loop.time() < deadline:
        await asyncio.sleep(0.1)
    code = daemon.process.poll()
    assert code is not None, "the daemon kept running"
    return code


async def test_no_authentication_on_a_public_address_refuses_to_start(daemon: Daemon) -> None:
    """Without a token or password, on 0.0.0.0, the daemon exits with one clear line; on
    loopback, or with GatewayStreamApp.allow_unauthenticated_remote_access, it starts."""
    no_auth = ("--IdentityProvider.token=", "--ServerApp.password=")
    daemon.start("--ip=0.0.0.0", *no_auth, env={"JUPYTER_TOKEN": ""})
    assert await exit_code(daemon) != 0
    errors = [line for line in daemon.log_text().splitlines() if "unauthenticated" in line]
    assert len(errors) == 1
    assert "allow_unauthenticated_remote_access" in errors[0]
    assert "Traceback" not in daemon.log_text()

    daemon.start(
        "--ip=0.0.0.0",
        *no_auth,
        "--GatewayStreamApp.allow_unauthenticated_remote_access=True",
        env={"JUPYTER_TOKEN": ""},
    )
    await daemon.wait_ready(headers={})
    assert f"0.0.0.0:{daemon.port}" in listening(daemon.port)


async def test_a_busy_port_stops_the_start_instead_of_moving_on(daemon: Daemon) -> None:
    """An operator's daemon must be on the port it was given (jupyter_server would move to
    the next free one, silently): a busy port stops it, with a clear line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", daemon.port))
        taken.listen()
        daemon.start()
        assert daemon.process is not None
        code = await asyncio.get_running_loop().run_in_executor(
            None, daemon.process.wait, seconds(60)
        )
    assert code != 0
    log = daemon.log_text()
    assert f"port {daemon.port} is not available" in log
    assert "Traceback" not in log
