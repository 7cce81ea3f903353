"""``POST /api/kernels`` and ``DELETE /api/kernels/{id}``: jupyter_server's, plus attach.

* ``POST /api/kernels`` with ``connection_info`` attaches a running kernel (see
  :mod:`..kernels.attaching`) instead of starting one: ``{"connection_info": {...},
  "name": kernel name, "display_name": ..., "id": optional kernel id}``. Any other body
  starts a kernel as jupyter_server does. Both need ``write`` on ``kernels`` (the same
  permission: attaching makes the gateway connect where the caller says).
* ``POST /api/kernels/{id}/restart`` and ``/interrupt`` answer the kernel manager's own
  errors (409 ``kernel_not_owned`` for an attached kernel, ``kernel_shutting_down``...)
  where jupyter_server turns every restart error into a 500.
* ``DELETE /api/kernels/{id}`` detaches an attached kernel (it runs on), unless
  ``?shutdown=true``; it shuts down every other kernel, as jupyter_server does.
* With several nodes, ``DELETE`` and ``restart`` of a kernel another node records are
  forwarded to that node (:meth:`..cluster.ClusterNode.forward`) and its answer relayed.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from jupyter_client.jsonutil import json_default
from jupyter_client.kernelspec import NoSuchKernel
from jupyter_core.utils import ensure_async
from jupyter_server._tz import isoformat
from jupyter_server.services.kernels.handlers import (
    KernelActionHandler,
    KernelHandler,
    MainKernelHandler,
)
from jupyter_server.utils import ApiPath, to_os_path, url_escape, url_path_join
from tornado import web

from ..core.errors import (
    BadRequest,
    InvalidKernelId,
    KernelExists,
    KernelOnAnotherNode,
    KernelStartFailed,
    LocalError,
    PathOutsideRoot,
    UnknownKernelSpec,
    start_failure,
)
from .common import LimitedBodyMixin, ServicesMixin, json_body, requires

__all__ = ["AttachingKernelsHandler", "DetachingKernelHandler", "KernelActionsHandler"]

#: A kernelspec's name, as jupyter_client allows it (its _kernel_name_pat).
_KERNEL_NAME = re.compile(r"[a-z0-9._\-]+", re.IGNORECASE)
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@web.stream_request_body
class AttachingKernelsHandler(LimitedBodyMixin, ServicesMixin, MainKernelHandler):  # type: ignore[misc]
    """``/api/kernels``: list, start, or attach by connection info."""

    @web.authenticated
    @requires("read")
    async def get(self) -> None:  # type: ignore[override]
        """The kernels, those the gateway cannot reach with ``execution_state``
        ``unreachable`` (the list of an upstream that is down is the gateway's own)."""
        km = self.kernel_manager
        taps = self.services.taps.taps
        if any(not tap.reachable for tap in taps.values()):
            kernels = []
            for kernel_id in list(km.list_kernel_ids()):
                model = tap_model(self, kernel_id)
                if model is None:
                    try:
                        model = await ensure_async(km.kernel_model(kernel_id))
                    except web.HTTPError:
                        continue
                kernels.append(model)
        else:
            kernels = await ensure_async(km.list_kernels())
        self.finish(json.dumps(kernels, default=json_default))

    @web.authenticated
    @requires("write")
    async def post(self) -> None:  # type: ignore[override]
        try:
            body = json_body(self)
            km = self.kernel_manager
            name = body.get("name")
            if name is not None and not isinstance(name, str):
                raise BadRequest("'name' must be a string")
            kernel_id: str
            if "connection_info" in body:
                display_name = body.get("display_name", "")
                wanted = body.get("id")
                if not isinstance(display_name, str):
                    raise BadRequest("'display_name' must be a string")
                if wanted is not None and not isinstance(wanted, str):
                    raise BadRequest("'id' must be a string")
                kernel_id = await self.services.attacher.attach(
                    body["connection_info"],
                    kernel_id=wanted,
                    kernel_name=name,
                    display_name=display_name[:200],
                )
            else:
                if not name:
                    # In front of an upstream gateway, its own default.
                    upstream_default = getattr(km, "upstream_default", None)
                    name = await upstream_default() if upstream_default else None
                name = name or km.default_kernel_name
                if not _KERNEL_NAME.fullmatch(name) or name in (".", ".."):
                    # jupyter_client looks the name up as a directory under each kernel
                    # directory: "../../etc" would be one.
                    raise UnknownKernelSpec(f"no kernelspec named {name[:100]!r}")
                wanted, path = checked_start(body, km)
                try:
                    kernel_id = await ensure_async(
                        km.start_kernel(kernel_name=name, path=path, kernel_id=wanted)
                    )
                except NoSuchKernel as error:
                    raise UnknownKernelSpec(f"no kernelspec named {name[:100]!r}") from error
                except (web.HTTPError, LocalError):
                    raise
                except Exception as error:  # its process could not start: say why
                    raise KernelStartFailed(start_failure(error)) from error
        except LocalError as error:
            self.write_error_json(error)
            return
        model = await ensure_async(km.kernel_model(kernel_id))
        location = url_path_join(self.base_url, "api", "kernels", url_escape(kernel_id))
        self.set_header("Location", location)
        self.set_status(201)
        self.finish(json.dumps(model, default=json_default))


def checked_start(body: dict[str, Any], km: Any) -> tuple[str | None, ApiPath | None]:
    """A start's ``kernel_id`` and ``path``, checked: the id a canonical UUID of no kernel
    the gateway has (it names the connection file), the path under the server's root
    (it is the kernel's working directory). Returns them.

    Raises:
        InvalidKernelId: an id that is not a canonical UUID (400).
        KernelExists: an id of a kernel the gateway has (409).
        PathOutsideRoot: a path that leads out of the root (400); BadRequest: not a string.
    """
    wanted = body.get("kernel_id")
    if wanted is not None:
        if not isinstance(wanted, str) or not _UUID.fullmatch(wanted):
            raise InvalidKernelId("'kernel_id' must be a UUID in its canonical form")
        if wanted in km:
            raise KernelExists(f"kernel {wanted} is running already")
    path = body.get("path")
    if path is not None:
        if not isinstance(path, str) or "\0" in path:
            raise BadRequest("'path' must be a string")
        root = os.path.abspath(km.root_dir)
        directory = os.path.abspath(to_os_path(ApiPath(path), root))
        if os.path.commonpath([root, directory]) != root:
            raise PathOutsideRoot("'path' must stay under the server's root directory")
        return wanted, ApiPath(path)
    return wanted, None


def tap_model(handler: Any, kernel_id: str) -> dict[str, Any] | None:
    """The model of a kernel the gateway cannot reach (an upstream that is down answers no
    model): ``execution_state`` ``unreachable``; None if it is reachable or not tapped."""
    tap = handler.services.taps.taps.get(kernel_id)
    if tap is None or tap.reachable:
        return None
    kernel = tap.kernel_manager
    return {
        "id": kernel_id,
        "name": getattr(kernel, "kernel_name", ""),
        "last_activity": isoformat(kernel.last_activity) if kernel.last_activity else None,
        "execution_state": "unreachable",
        "connections": handler.kernel_manager._kernel_connections.get(kernel_id, 0),
    }


class DetachingKernelHandler(ServicesMixin, KernelHandler):  # type: ignore[misc]
    """``/api/kernels/{id}``: the model says ``unreachable`` while the kernel does not
    answer; DELETE detaches an attached kernel unless ``?shutdown=true``."""

    @web.authenticated
    @requires("read")
    async def get(self, kernel_id: str) -> None:  # type: ignore[override]
        await self.services.known(kernel_id)
        model = tap_model(self, kernel_id)
        if model is None:
            model = await ensure_async(self.kernel_manager.kernel_model(kernel_id))
        self.finish(json.dumps(model, default=json_default))

    @web.authenticated
    @requires("write")
    async def delete(self, kernel_id: str) -> None:  # type: ignore[override]
        shutdown = self.get_argument("shutdown", None)
        if shutdown not in (None, "true", "false"):
            self.write_error_json(BadRequest("shutdown must be 'true' or 'false'"))
            return
        km = self.kernel_manager
        query = self.request.query
        if await forwarded(
            self, kernel_id, f"/api/kernels/{kernel_id}" + ("?" + query if query else "")
        ):
            return
        kernel: Any = km.get_kernel(kernel_id) if kernel_id in km else None
        attached = kernel is not None and getattr(kernel, "attachment", None) is not None
        if attached and shutdown is not None:
            kernel.stop_on_shutdown = shutdown == "true"
        await ensure_async(km.shutdown_kernel(kernel_id))
        self.set_status(204)
        self.finish()


async def forwarded(handler: Any, kernel_id: str, path: str, body: bytes | None = None) -> bool:
    """Several nodes: a request only the kernel's recording node can serve (shutdown,
    restart), for a kernel another node records, is sent there and its answer relayed.
    False if this node records the kernel (or there is one node): serve it here."""
    services = handler.services
    tap = services.taps.taps.get(kernel_id)
    if services.cluster is None or tap is None or not tap.following:
        return False
    try:
        status, payload, content_type = await services.cluster.forward(
            kernel_id, handler.request.method, path, body
        )
    except KernelOnAnotherNode as error:
        handler.write_error_json(error)
        return True
    handler.set_status(status)
    if content_type and payload:
        handler.set_header("Content-Type", content_type)
    handler.finish(payload or None)
    return True


class KernelActionsHandler(ServicesMixin, KernelActionHandler):  # type: ignore[misc]
    """``/api/kernels/{id}/(restart|interrupt)``, with the kernel manager's HTTP errors."""

    @web.authenticated
    @requires("write")
    async def post(self, kernel_id: str, action: str) -> None:  # type: ignore[override]
        km = self.kernel_manager
        if action == "interrupt":
            await ensure_async(km.interrupt_kernel(kernel_id))  # type: ignore[func-returns-value]
            self.set_status(204)
            self.finish()
            return
        if await forwarded(self, kernel_id, f"/api/kernels/{kernel_id}/restart", b"{}"):
            return
        try:
            await km.restart_kernel(kernel_id)
        except web.HTTPError:
            raise
        except Exception as error:
            raise web.HTTPError(500, "Exception restarting kernel") from error
        model = await ensure_async(km.kernel_model(kernel_id))
        self.finish(json.dumps(model, default=json_default))
