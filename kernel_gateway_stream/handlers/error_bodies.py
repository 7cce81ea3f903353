"""Error answers with a reason, on every path (a tornado output transform).

jupyter_server answers a refused request with ``{"message": ..., "reason": null}``: a
wrong token on a POST reads ``'_xsrf' argument missing from POST``, which sends the user
the wrong way. Its HTML error pages (``/metrics``, a path nothing serves) are not the
JSON docs/endpoints.md promises. This transform, applied to every response the server sends,
rewrites only error answers whose reason is missing:

* a 403 to a request that presented a token that is not the server's gets
  ``{"reason": "invalid_token"}`` (nothing about the token: not whether it was close,
  not what was expected); any other 403 ``{"reason": "forbidden"}``, its message kept;
* in the daemon (``html_to_json``), an HTML error page becomes
  ``{"reason", "message"}`` with the status's phrase (``not_found`` for 404).

Handlers that answer with a reason of their own (the gateway's) are left as they are.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from tornado import httputil
from tornado.web import OutputTransform

__all__ = ["error_reasons", "presented_token"]

_REASONS = {
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    500: "internal_error",
}


def presented_token(request: httputil.HTTPServerRequest) -> str | None:
    """The token a request carries (``Authorization: token|bearer X`` or ``?token=``)."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() in ("token", "bearer") and value.strip():
        return value.strip()
    values = request.query_arguments.get("token")
    if values:
        return values[-1].decode("utf-8", "replace")
    return None


def error_reasons(token: Callable[[], str], *, html_to_json: bool) -> type[OutputTransform]:
    """The transform class for one server. ``token()`` is the server's token now (empty:
    none); ``html_to_json`` for the daemon, whose every path is an API."""

    class ErrorReasons(OutputTransform):
        def __init__(self, request: httputil.HTTPServerRequest) -> None:
            super().__init__(request)
            self.request = request

        def transform_first_chunk(
            self, status_code: int, headers: httputil.HTTPHeaders, chunk: bytes, finishing: bool
        ) -> tuple[int, httputil.HTTPHeaders, bytes]:
            if status_code < 400 or not finishing:
                return status_code, headers, chunk
            content_type = headers.get("Content-Type", "")
            body: Any = None
            if content_type.startswith("application/json"):
                try:
                    body = json.loads(chunk or b"null")
                except ValueError:
                    return status_code, headers, chunk
                if not isinstance(body, dict) or body.get("reason") is not None:
                    return status_code, headers, chunk
            elif not (html_to_json and content_type.startswith("text/html")):
                return status_code, headers, chunk
            body = self._fill(status_code, body)
            chunk = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
            headers["Content-Length"] = str(len(chunk))
            return status_code, headers, chunk

        def _fill(self, status_code: int, body: dict[str, Any] | None) -> dict[str, Any]:
            try:
                phrase = HTTPStatus(status_code).phrase
            except ValueError:
                phrase = "Error"
            filled: dict[str, Any] = {"message": phrase, **(body or {})}
            filled["reason"] = _REASONS.get(status_code, f"http_{status_code}")
            if status_code == 403 and self._token_refused():
                filled["reason"] = "invalid_token"
                filled["message"] = "the token is not valid"
            return filled

        def _token_refused(self) -> bool:
            given = presented_token(self.request)
            if given is None:
                return False
            expected = token()
            return not (expected and hmac.compare_digest(given.encode(), expected.encode()))

    return ErrorReasons
