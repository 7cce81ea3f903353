"""The live output page, ``/kernel_gateway_stream/`` (the daemon's ``/`` leads there).

Three static files from ``kernel_gateway_stream/page/`` (no front-end build): the page
lists the kernels and follows one kernel's SSE stream. Same authentication as the API
(jupyter_server's token or login cookie; a visit without either goes to the login page)
and ``read`` on ``kernels``; the data it shows comes from the API, which applies its own
authorization (``execute`` to read a kernel's output). A Content-Security-Policy keeps
the page to its own scripts: nothing a kernel prints can run in it.
"""

from __future__ import annotations

from pathlib import Path

from jupyter_server.base.handlers import JupyterHandler
from tornado import web

from .common import requires

__all__ = ["PAGE_PATH", "PageAssetHandler", "PageHandler"]

PAGE_PATH = "/kernel_gateway_stream/"
_FILES = Path(__file__).resolve().parent.parent / "page"
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
#: The page's own scripts and styles only; images may be data: URLs (kernel plots);
#: HTML outputs render in iframes sandboxed without scripts.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'self'"
)


class _PageFile(JupyterHandler):
    auth_resource = "kernels"

    @property
    def content_security_policy(self) -> str:
        return CONTENT_SECURITY_POLICY

    def _send(self, name: str) -> None:
        path = _FILES / name
        self.set_header("Content-Type", f"{_TYPES[path.suffix]}; charset=utf-8")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.finish(path.read_bytes())


class PageHandler(_PageFile):
    """``GET /kernel_gateway_stream/``: the page."""

    @web.authenticated
    @requires("read")
    def get(self) -> None:
        self._send("live.html")


class PageAssetHandler(_PageFile):
    """``GET /kernel_gateway_stream/static/(live.js|live.css)``."""

    @web.authenticated
    @requires("read")
    def get(self, name: str) -> None:
        self._send(name)
