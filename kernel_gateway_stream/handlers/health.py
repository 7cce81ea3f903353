"""``GET /api/gateway/health``: the gateway's state, for operators and load balancers."""

from __future__ import annotations

import json

from jupyter_server.base.handlers import APIHandler
from tornado import web

from ..core.health import to_json
from .common import ServicesMixin, requires

__all__ = ["HealthHandler"]


class HealthHandler(ServicesMixin, APIHandler):
    """``GET /api/gateway/health``: ``{"status", "components"}``; 200 while ok or degraded,
    503 when failing (see :mod:`..core.health`). Authorized as ``/api/status`` is: ``read``
    on ``api``."""

    auth_resource = "api"

    @web.authenticated
    @requires("read")
    async def get(self) -> None:  # type: ignore[override]
        body = to_json(self.services.health())
        self.set_status(503 if body["status"] == "failing" else 200)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))
