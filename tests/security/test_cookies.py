"""Login cookies: kernel code cannot sign one, and a new token ends the old ones.

jupyter_server signs its login cookies with a secret kept in
``<runtime dir>/jupyter_cookie_secret``; with no password that file is the whole secret,
and a kernel running as the server's user reads it and signs itself a cookie that opens
every kernel (item 1 of the kernel-takeover issue). The daemon keeps its cookie secret in
memory, derived from the token. Against a real daemon and a real ipykernel.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from kernel_gateway_stream.secrets import login_cookie_key

from ..integration.daemon import TOKEN, Daemon
from .test_secrets import run_in_kernel

#: Signs a login cookie the way jupyter_server checks it: tornado's signed value, under
#: ``username-<host>``, of a user model in JSON.
FORGE = """
import hashlib, hmac, json
from tornado.web import create_signed_value

def forge(secret, port):
    name = "username-127-0-0-1-%d" % port
    user = {"username": "forger", "name": "forger", "display_name": "forger",
            "initials": None, "avatar_url": None, "color": None}
    return name, create_signed_value(secret, name, json.dumps(user)).decode()
"""

#: Kernel code: every file under the Jupyter directories and the home the daemon shares
#: with it is a candidate key, whole, stripped and line by line, and each is tried as
#: jupyter_server derives a cookie secret from its file (HMAC of the file's bytes and the
#: empty password) and as a secret itself, against the daemon's /api/kernels.
HUNT = """
import http.client, os
from jupyter_core.paths import jupyter_config_dir, jupyter_data_dir, jupyter_runtime_dir
port, extra = {port!r}, {extra!r}
roots = {{jupyter_runtime_dir(), jupyter_data_dir(), jupyter_config_dir()}}
roots |= {{os.path.dirname(root) for root in list(roots)}}
files, keys = [], set(key.encode() for key in extra)
for root in roots:
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                data = open(path, "rb").read(1 << 16)
            except OSError:
                continue
            files.append(os.path.relpath(path, os.path.dirname(jupyter_runtime_dir())))
            keys |= {{data, data.strip()}} | set(data.splitlines()[:200])
keys.discard(b"")
accepted = []
connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
for key in keys:
    derived = hmac.new(key, digestmod=hashlib.sha256)
    derived.update(b"")
    for secret in (derived.digest(), key):
        name, value = forge(secret, port)
        connection.request("GET", "/api/kernels", headers={{"Cookie": name + "=" + value}})
        response = connection.getresponse()
        response.read()
        if response.status == 200:
            accepted.append(key.decode(errors="replace")[:40])
print(json.dumps({{"files": sorted(files), "keys": len(keys), "accepted": accepted}}))
"""


def hunt(port: int, extra: list[str]) -> str:
    return FORGE + HUNT.format(port=port, extra=extra)


def daemon_cookie_secret(token: str) -> bytes:
    """What the daemon signs cookies with, computed from the token as an attacker who
    held the token could (the recipe in StreamServerApp._default_cookie_secret)."""
    digest = hmac.new(login_cookie_key(token), digestmod=hashlib.sha256)
    digest.update(b"")
    return digest.digest()


def forged_cookie(secret: bytes, port: int) -> str:
    namespace: dict[str, Any] = {}
    exec(FORGE, namespace)
    name, value = namespace["forge"](secret, port)
    return f"{name}={value}"


async def status_with_cookie(daemon: Daemon, cookie: str) -> int:
    try:
        response = await AsyncHTTPClient().fetch(
            f"{daemon.url}/api/kernels", headers={"Cookie": cookie}
        )
    except HTTPClientError as error:
        return error.code
    return response.code


async def login_cookie(daemon: Daemon, token: str) -> str:
    """The cookie jupyter_server sets on a request authenticated with ``?token=``."""
    response = await AsyncHTTPClient().fetch(f"{daemon.url}/api/kernels?token={token}")
    header = response.headers.get_list("Set-Cookie")
    assert header, "a token-authenticated request sets a login cookie"
    return header[0].split(";", 1)[0]


async def test_kernel_code_cannot_sign_a_login_cookie_from_any_file_it_can_read(
    daemon: Daemon,
) -> None:
    """The kernel tries every file of the runtime, data and config directories and the
    home they share (connection files, the transcript database, the server-info file) as
    a cookie key: the daemon refuses every forged cookie, and jupyter_server's cookie
    secret file is not written. Control: the cookie signed in the test with the
    daemon's real secret gets in (and the next test shows the hunt itself succeeds
    where the secret is in a file)."""
    daemon.start()
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    assert not (daemon.home / "runtime" / "jupyter_cookie_secret").exists()

    hunted = json.loads(await run_in_kernel(daemon, kernel_id, hunt(daemon.port, [])))
    assert hunted["accepted"] == []
    # The hunt did read what a kernel can read: its connection file and the transcripts.
    assert any(name.startswith("runtime/kernel-") for name in hunted["files"]), hunted
    assert any(name.endswith("transcripts.sqlite3") for name in hunted["files"]), hunted
    assert hunted["keys"] > 20

    # The daemon's real secret signs a cookie that opens it; another token's does not.
    real = forged_cookie(daemon_cookie_secret(TOKEN), daemon.port)
    assert await status_with_cookie(daemon, real) == 200
    wrong = forged_cookie(daemon_cookie_secret("another-token"), daemon.port)
    assert await status_with_cookie(daemon, wrong) == 403


async def test_control_the_same_hunt_gets_in_where_the_secret_is_in_a_file(
    daemon: Daemon, tmp_path: Any
) -> None:
    """Control: configured as stock jupyter_server is (its secret derived from
    ``jupyter_cookie_secret`` in the runtime directory), the daemon falls to the same
    kernel code, so the test above would fail without the secret held in memory."""
    key = uuid.uuid4().hex.encode()
    runtime = daemon.home / "runtime"
    runtime.mkdir(parents=True, exist_ok=True)
    (runtime / "jupyter_cookie_secret").write_bytes(key + b"\n")
    config = tmp_path / "stock_cookie_config.py"
    stock_secret = hmac.new(key, b"", hashlib.sha256).digest()
    config.write_text(f"c.ServerApp.cookie_secret = {stock_secret!r}\n")
    daemon.start(f"--config={config}")
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    hunted = json.loads(await run_in_kernel(daemon, kernel_id, hunt(daemon.port, [])))
    assert hunted["accepted"] == [key.decode()]


async def test_a_new_token_ends_the_cookies_signed_under_the_old_one(daemon: Daemon) -> None:
    """A cookie from a ``?token=`` login opens the daemon across a restart with the same
    token (control), and no longer once the daemon restarts with a new token."""
    daemon.start()
    await daemon.wait_ready()
    cookie = await login_cookie(daemon, TOKEN)
    assert await status_with_cookie(daemon, cookie) == 200
    daemon.stop()

    daemon.start()
    await daemon.wait_ready()
    assert await status_with_cookie(daemon, cookie) == 200
    daemon.stop()

    rotated = f"rotated-{uuid.uuid4().hex}"
    daemon.start(env={"JUPYTER_TOKEN": rotated})
    await daemon.wait_ready(headers={"Authorization": f"token {rotated}"})
    assert await status_with_cookie(daemon, cookie) == 403
    assert await status_with_cookie(daemon, await login_cookie(daemon, rotated)) == 200
