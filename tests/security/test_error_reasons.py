"""Every refusal says why, in JSON: a wrong token is ``invalid_token`` (it was
``'_xsrf' argument missing from POST`` with ``reason: null``), every 403 has a reason, and
the daemon's ``/metrics`` and unknown paths answer JSON, not jupyter_server's HTML."""

from __future__ import annotations

import json
from typing import Any

from tornado.httpclient import AsyncHTTPClient

from ..integration.daemon import TOKEN, Daemon
from ..timing import seconds

WRONG = "not-the-token-0123456789"


async def _answer(daemon: Daemon, path: str, method: str = "GET", **headers: str) -> Any:
    response = await AsyncHTTPClient().fetch(
        daemon.url + path,
        method=method,
        body=b"{}" if method == "POST" else None,
        headers=headers,
        raise_error=False,
        request_timeout=seconds(60),
    )
    assert response.headers["Content-Type"].startswith("application/json"), (
        path,
        response.code,
        response.body[:200],
    )
    return response.code, json.loads(response.body), response.body


async def test_refusals_say_why_in_json(daemon: Daemon) -> None:
    daemon.start()
    await daemon.wait_ready()
    wrong = {"Authorization": f"token {WRONG}"}
    for method, path, headers in (
        ("POST", "/api/kernels", wrong),
        ("GET", "/api/kernels", wrong),
        ("GET", f"/api/kernels?token={WRONG}", {}),
        ("GET", "/api/kernelspecs", {"Authorization": f"Bearer {WRONG}"}),
    ):
        code, body, raw = await _answer(daemon, path, method, **headers)
        assert code == 403, (method, path, body)
        assert body["reason"] == "invalid_token", (method, path, body)
        assert TOKEN.encode() not in raw
        assert WRONG.encode() not in raw
    # No token at all: refused too, with a reason that is not about a token.
    for method, path in (("POST", "/api/kernels"), ("GET", "/api/kernels")):
        code, body, _ = await _answer(daemon, path, method)
        assert code == 403, (method, path, body)
        assert body["reason"] == "forbidden", (method, path, body)
    code, body, _ = await _answer(daemon, "/metrics", **wrong)
    assert code == 403
    assert body["reason"] == "invalid_token"
    for path in ("/no/such/path", "/api/nothing-here", "/tree"):
        code, body, _ = await _answer(daemon, path, **daemon.headers)
        assert code == 404, (path, body)
        assert body["reason"] == "not_found", (path, body)
    # Control: the token works.
    code, body, _ = await _answer(daemon, "/api/kernels", **daemon.headers)
    assert code == 200
    assert body == []
