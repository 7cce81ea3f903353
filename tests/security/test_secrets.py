"""Secrets: what code in a kernel can learn of the gateway's, and what the gateway writes.

Code in a kernel is untrusted (agents run model-written code on kernels). With the
gateway's token it could read, run code in and delete every other kernel. Items 1 and 5
of the hardening issue, against a real daemon and a real ipykernel.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.websocket import websocket_connect

from ..integration.daemon import TOKEN, Daemon
from ..integration.waits import wait_until

#: What a kernel does to find secrets: its environment, its own and its parent's initial
#: environment blocks (/proc), and every file in the Jupyter runtime directory (where
#: jupyter_server writes its server-info file, token included).
HUNT = """
import glob, json, os
from jupyter_core.paths import jupyter_runtime_dir
secrets = {secrets!r}
found = []
for name, value in os.environ.items():
    found += [["env", name] for secret in secrets if secret in value]
for path in ["/proc/self/environ", "/proc/%d/environ" % os.getppid(),
             "/proc/self/cmdline", "/proc/%d/cmdline" % os.getppid()]:
    try:
        data = open(path, "rb").read()
    except OSError:
        continue
    found += [[path] for secret in secrets if secret.encode() in data]
for path in glob.glob(os.path.join(jupyter_runtime_dir(), "*")):
    try:
        data = open(path, "rb").read()
    except OSError:
        continue
    found += [[os.path.basename(path)] for secret in secrets if secret.encode() in data]
print(json.dumps(found))
"""


async def run_in_kernel(daemon: Daemon, kernel_id: str, code: str) -> str:
    ws = await daemon.channels(kernel_id)
    try:
        received = await ws.until_idle(ws.execute(code))
    finally:
        ws.close()
    return received.text()


async def test_a_kernel_cannot_find_the_gateways_token_or_listed_secrets(daemon: Daemon) -> None:
    """Item 1: neither the token (from JUPYTER_TOKEN, under any variable name that holds
    it) nor a variable the operator lists reaches a kernel: not in its environment, not in
    the gateway's environment block under /proc, not in the runtime directory's files."""
    listed = f"listed-{uuid.uuid4().hex}"
    daemon.start(
        "--GatewayStreamApp.secret_env_vars=KGS_DEPLOY_KEY",
        env={"KGS_DEPLOY_KEY": listed, "SOME_COPY_OF_THE_TOKEN": TOKEN},
    )
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    output = await run_in_kernel(daemon, kernel_id, HUNT.format(secrets=[TOKEN, listed]))
    assert json.loads(output) == []


async def test_a_token_from_a_config_file_does_not_reach_the_kernel(
    daemon: Daemon, tmp_path: Any
) -> None:
    """Item 1: the configured token (a config file, not the environment) is found nowhere a
    kernel looks either."""
    token = f"configured-{uuid.uuid4().hex}"
    config = tmp_path / "kgs_config.py"
    config.write_text(f"c.IdentityProvider.token = {token!r}\n")
    daemon.start(f"--config={config}", env={"JUPYTER_TOKEN": ""})
    daemon_headers = {"Authorization": f"token {token}"}
    await daemon.wait_ready(headers=daemon_headers)
    kernel = await daemon.fetch("/api/kernels", method="POST", body="{}", headers=daemon_headers)
    ws = await daemon.channels(kernel["id"], headers=daemon_headers)
    received = await ws.until_idle(ws.execute(HUNT.format(secrets=[token])))
    ws.close()
    assert json.loads(received.text()) == []


async def test_a_token_on_the_command_line_is_overwritten_there(daemon: Daemon) -> None:
    """Item 1: a token given as ``--IdentityProvider.token=...`` is in the daemon's
    argument block, which ``/proc/<pid>/cmdline`` shows every local user: the daemon
    overwrites it there and says to use the environment; a kernel then finds it nowhere
    it looks (its parent's command line included)."""
    token = f"argv-{uuid.uuid4().hex}"
    daemon.start(f"--IdentityProvider.token={token}", env={"JUPYTER_TOKEN": ""})
    headers = {"Authorization": f"token {token}"}
    await daemon.wait_ready(headers=headers)
    assert daemon.process is not None
    cmdline = Path(f"/proc/{daemon.process.pid}/cmdline").read_bytes()
    assert b"--IdentityProvider.token=" in cmdline  # control: the argument is there
    assert token.encode() not in cmdline
    kernel = await daemon.fetch("/api/kernels", method="POST", body="{}", headers=headers)
    ws = await daemon.channels(kernel["id"], headers=headers)
    received = await ws.until_idle(ws.execute(HUNT.format(secrets=[token])))
    ws.close()
    assert json.loads(received.text()) == []
    assert "JUPYTER_TOKEN environment variable" in daemon.log_text()


async def test_the_token_is_in_no_log_error_body_or_transcript(daemon: Daemon) -> None:
    """Item 5: requests authenticated with ?token= that fail (404, 400, 405, a refused
    WebSocket) leave the token in neither the log nor the error bodies; the transcript of
    a kernel that printed its environment does not hold it; the transcript files are 0600
    in a 0700 directory."""
    daemon.start("--log-level=DEBUG")
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    client = AsyncHTTPClient()
    bodies: list[bytes] = []
    base = f"{daemon.url}/api/kernels"
    for method, path in (
        ("GET", "/nope/transcript"),
        ("GET", f"/{kernel_id}/stream?since=abc"),
        ("GET", f"/{kernel_id}/execute"),
        ("POST", f"/{kernel_id}/execute"),
        ("GET", f"/{kernel_id}/executions/nope"),
        ("DELETE", f"/{kernel_id}/transcript"),
    ):
        separator = "&" if "?" in path else "?"
        url = f"{base}{path}{separator}token={TOKEN}"
        body = "{" if method == "POST" else None
        with pytest.raises(HTTPClientError) as failed:
            await client.fetch(url, method=method, body=body, allow_nonstandard_methods=True)
        assert failed.value.code >= 400
        assert failed.value.response is not None
        bodies.append(failed.value.response.body)
    with pytest.raises(HTTPClientError):
        await websocket_connect(
            f"ws://127.0.0.1:{daemon.port}/api/kernels/nope/channels?token={TOKEN}"
        )
    await run_in_kernel(daemon, kernel_id, "import os; print(dict(os.environ))")
    daemon.stop()
    for body in bodies:
        assert TOKEN.encode() not in body
    assert TOKEN not in daemon.log_text()
    path = daemon.transcript_path
    for name in (path, path.with_name(path.name + "-wal")):
        if name.exists():
            assert TOKEN.encode() not in name.read_bytes()
            assert stat.S_IMODE(name.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


#: jupyter_server's own error paths, each logged by jupyter_server with the request's URI.
SERVER_ERROR_PATHS = (
    ("POST", "/api/sessions", "{"),
    ("GET", "/api/kernelspecs/nope", None),
    ("GET", "/api/sessions/nope", None),
    ("DELETE", "/api/sessions/nope", None),
    ("PATCH", "/api/sessions/nope", "{}"),
)


@pytest.mark.parametrize(
    ("log_json", "to_file"),
    [(False, False), (True, False), (True, True)],
    ids=["text-stderr", "json-stderr", "json-file"],
)
async def test_jupyter_servers_own_error_lines_carry_no_token_and_the_log_file_is_private(
    daemon: Daemon, log_json: bool, to_file: bool
) -> None:
    """Item 6: jupyter_server logs a failing request as ``400 POST /api/sessions?token=…``
    through its own logger; no line of the log, text or JSON, on standard error or in the
    log file, holds the token. The log file is created 0600 even under a umask of 000, a
    log file made wider before is narrowed when the daemon opens it, and so is the file
    SIGHUP reopens after a rotation."""
    log_file = daemon.home / "gateway.log"
    log_file.write_text("")
    log_file.chmod(0o644)
    args = [f"--GatewayStreamApp.log_json={log_json}"]
    if to_file:
        args.append(f"--GatewayStreamApp.log_file={log_file}")
    previous = os.umask(0)
    try:
        daemon.start(*args)
    finally:
        os.umask(previous)
    await daemon.wait_ready()
    client = AsyncHTTPClient()
    codes = []
    for method, path, body in SERVER_ERROR_PATHS:
        with pytest.raises(HTTPClientError) as failed:
            await client.fetch(
                f"{daemon.url}{path}?token={TOKEN}",
                method=method,
                body=body,
                allow_nonstandard_methods=True,
            )
        codes.append(failed.value.code)
    rotated = daemon.home / "gateway.log.1"
    if to_file:
        log_file.rename(rotated)
        assert daemon.process is not None
        daemon.process.send_signal(signal.SIGHUP)
        await wait_until(log_file.exists, "the log file reopened after SIGHUP")
    daemon.stop()
    assert all(400 <= code < 500 for code in codes), codes
    text = daemon.log_text()
    if to_file:
        text += rotated.read_text() + log_file.read_text()
        assert stat.S_IMODE(rotated.stat().st_mode) == 0o600
        assert stat.S_IMODE(log_file.stat().st_mode) == 0o600
    # Control: the failing requests were logged, with their paths.
    for _, path, _ in SERVER_ERROR_PATHS:
        assert path in text, path
    assert TOKEN not in text
