"""Bad input from clients that answered 500 or did what it should not: Unicode digits in
``since``/``limit``, unknown kernelspec names, client-chosen kernel ids and paths; a stop
after a failed kernel start; a watched connection-file directory holding a link out of it.

Invariant 8: an HTTP 4xx with ``{"reason", "message"}``, and nothing else disturbed.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient

from ..integration.daemon import Daemon
from ..integration.test_attach import OutsideKernel
from ..integration.waits import wait_until
from ..timing import seconds
from .test_client_input import _answer


@pytest.fixture
def api(jp_http_port: int, jp_auth_header: dict[str, str], jp_base_url: str) -> Any:
    """``await api(path, method, body)`` -> (status, JSON body), on the test's server."""

    async def call(path: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
        base = f"http://127.0.0.1:{jp_http_port}{jp_base_url.rstrip('/')}"
        payload = None if body is None else json.dumps(body).encode()
        return await _answer(base + path, method, payload, jp_auth_header)

    return call


UNICODE_DIGITS = ["²", "¹²³", "٣", "\uff11"]  # the last: a fullwidth one


@pytest.mark.parametrize("value", UNICODE_DIGITS)
async def test_unicode_digits_in_since_and_limit_are_400(
    start_kernel: Any, api: Any, value: str
) -> None:
    """``str.isdigit()`` is true of "²" (int() refuses it: 500) and of "٣" (int() takes
    it): since and limit are ASCII digits or refused, on every endpoint that takes them."""
    kernel_id = await start_kernel()
    k = f"/api/kernels/{kernel_id}"
    for path in (
        f"{k}/transcript?since={value}",
        f"{k}/transcript?limit={value}",
        f"{k}/cells?since={value}",
        f"{k}/stream?since={value}",
    ):
        status, body = await api(path)
        assert status == 400, (path, status, body)
        assert body["reason"] == "bad_request", path
    status, body = await api(f"{k}/transcript?since=0&limit=1")
    assert status == 200


@pytest.mark.parametrize("name", ["nope", "../../../etc", "..", "a b", ""])
async def test_an_unknown_kernelspec_is_404(jp_fetch: Any, api: Any, name: str) -> None:
    """jupyter_client raised NoSuchKernel (or read a directory out of the kernel
    directories, for "../../../etc"): 500 "Unhandled error". An empty name is the
    default kernel's (control: it starts)."""
    status, body = await api("/api/kernels", "POST", body={"name": name})
    if name == "":
        assert status == 201, body
        return
    assert status == 404, (status, body)
    assert body["reason"] == "unknown_kernelspec"


async def test_a_client_chosen_kernel_id_is_a_new_uuid(jp_fetch: Any, api: Any) -> None:
    """An id that is not a UUID named a connection file ("kernel-x y <z>.json"); one of a
    running kernel silently answered that kernel. Control: a new UUID is taken."""
    for wanted in ("x y <z>", "../k", 12, "0B5B7A6E-3F1C-4D5E-9A8B-7C6D5E4F3A2B"):
        status, body = await api("/api/kernels", "POST", body={"kernel_id": wanted})
        assert status == 400, (wanted, status, body)
        assert body["reason"] == "invalid_kernel_id"
    wanted = str(uuid.uuid4())
    status, body = await api("/api/kernels", "POST", body={"kernel_id": wanted})
    assert status == 201, body
    assert body["id"] == wanted
    status, body = await api("/api/kernels", "POST", body={"kernel_id": wanted})
    assert status == 409, body
    assert body["reason"] == "kernel_exists"


async def test_a_kernel_path_stays_under_the_root(
    jp_fetch: Any, api: Any, jp_root_dir: Path
) -> None:
    """``path`` is the kernel's working directory: "../.." led out of the server's root.
    Control: a directory under the root is the kernel's."""
    for path in ("../..", "a/../../..", 7):
        status, body = await api("/api/kernels", "POST", body={"path": path})
        assert status == 400, (path, status, body)
        assert body["reason"] == ("path_outside_root" if isinstance(path, str) else "bad_request")
    (jp_root_dir / "work").mkdir()
    status, body = await api("/api/kernels", "POST", body={"path": "work"})
    assert status == 201, body


async def test_sigterm_ends_the_daemon_after_a_failed_kernel_start(
    daemon: Daemon, tmp_path: Path
) -> None:
    """A start that failed left its id among jupyter_client's pending kernels, where the
    stop's shutdown of every kernel raised a 404: the port closed, the process stayed. A
    kernel that started is shut down too."""
    spec = tmp_path / "data" / "kernels" / "broken"
    spec.mkdir(parents=True)
    argv = ["/nonexistent/python", "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "broken"}))
    daemon.start()
    await daemon.wait_ready()
    response = await AsyncHTTPClient().fetch(
        f"{daemon.url}/api/kernels",
        method="POST",
        body=json.dumps({"name": "broken"}),
        headers=daemon.headers,
        raise_error=False,
        request_timeout=seconds(60),
    )
    assert response.code >= 400
    await daemon.start_kernel()
    kernels = daemon.kernel_pids()
    assert kernels
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(seconds(30)) == 0, daemon.log_text()[-3000:]
    for pid in kernels:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_a_watched_directory_refuses_links_out_of_it(daemon: Daemon, tmp_path: Path) -> None:
    """A link in the watched directory to a connection file elsewhere (a running kernel's,
    in the runtime directory) attached that kernel: refused, and logged once."""
    watched = tmp_path / "watched"
    watched.mkdir()
    kernel = OutsideKernel(tmp_path / "outside" / "kernel-outside.json")
    kernel_id = "0b5b7a6e-3f1c-4d5e-9a8b-7c6d5e4f3a2b"
    link = watched / f"kernel-{kernel_id}.json"
    try:
        daemon.start(
            f"--KernelAttacher.connection_dir={watched}",
            "--KernelAttacher.connection_dir_interval=0.2",
        )
        await daemon.wait_ready()
        link.symlink_to(kernel.path)
        refusal = f"Did not attach {link}: a symbolic link out of the directory"
        await wait_until(lambda: refusal in daemon.log_text(), "the link's refusal")
        assert await daemon.fetch("/api/kernels") == []
        assert daemon.log_text().count(refusal) == 1
    finally:
        kernel.stop()
