"""The kernel manager of the daemon in upstream mode: jupyter_server's gateway kernel
manager, with what Enterprise Gateway's defaults need.

* **Listing off.** Enterprise Gateway does not list its kernels unless
  ``--EnterpriseGatewayApp.list_kernels=True``: ``GET /api/kernels`` answers 403. Then the
  kernels this gateway started there are listed from its own knowledge (each model
  refreshed by ``GET /api/kernels/{id}``, which the upstream answers), and the list is not
  asked for again for ``listing_retry`` seconds (JupyterLab polls ``/api/kernels`` and
  ``/api/sessions`` every few seconds; each poll would otherwise be a refused request
  upstream and a warning in both logs).
* **The upstream's default kernelspec.** jupyter_server's gateway mode starts a kernel
  asked for without a name as ``python3`` until something lists the kernelspecs (only
  then does it learn the upstream's default): a program's first ``POST /api/kernels``
  would start another kernel than the upstream's own default. Here the default is asked of
  the upstream before such a start (:meth:`UpstreamMappingKernelManager.upstream_default`).
* **Errors that say what the upstream said.** jupyter_server raises the upstream's errors
  as ``HTTPError(code, "Error from Gateway: [%s] %s. …", message, reason)`` and its API
  handlers write that template unformatted. Here they are raised again as
  :class:`UpstreamRefused` with the upstream's status, message and reason in words
  (``The upstream gateway answered 403 Forbidden: User 'root' is not authorized to start
  kernel …``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from jupyter_server.gateway.managers import GatewayMappingKernelManager
from tornado import web
from traitlets import Float

__all__ = ["UpstreamMappingKernelManager", "UpstreamRefused", "upstream_error"]

T = TypeVar("T")
#: Statuses with which an upstream says it will not list its kernels.
LISTING_REFUSED = frozenset({403, 404, 405})


class UpstreamRefused(web.HTTPError):
    """The upstream gateway answered a request with an error: its status, message and
    reason, in words."""


def upstream_error(error: web.HTTPError) -> web.HTTPError:
    """``error`` as raised by jupyter_server's ``gateway_request``, with its message
    formatted (an error of any other form is returned as it is)."""
    if isinstance(error, UpstreamRefused) or not error.args:
        return error
    template = error.log_message or ""
    if not template.startswith("Error from Gateway"):
        return error
    message, reason = [*error.args, "", ""][:2]
    parts = [str(part) for part in (message, reason) if part]
    said = ": ".join(dict.fromkeys(parts))  # jupyter_server passes "Forbidden" twice
    text = f"The upstream gateway answered {error.status_code}" + (f" {said}" if said else "")
    # Written as it is by jupyter_server's API handlers, and used as a format by tornado's
    # log: no "%" in it.
    return UpstreamRefused(error.status_code, text.replace("%", " percent"))


async def _translated(call: Awaitable[T]) -> T:
    """The result of ``call``, an upstream's error raised as :class:`UpstreamRefused`."""
    try:
        return await call
    except web.HTTPError as error:
        translated = upstream_error(error)
        if translated is error:
            raise
        raise translated from error


class UpstreamMappingKernelManager(GatewayMappingKernelManager):
    """jupyter_server's ``GatewayMappingKernelManager`` (see the module docstring)."""

    listing_retry = Float(
        300.0,
        config=True,
        help="Seconds the gateway lists the upstream's kernels from its own knowledge after "
        "the upstream refused to list them (403, 404 or 405: Enterprise Gateway's default, "
        "--EnterpriseGatewayApp.list_kernels=False), before it asks again.",
    )

    #: Monotonic time until which the upstream's list is not asked for (0: ask).
    _listing_refused_until = 0.0
    #: Whether ``default_kernel_name`` is the upstream's own (asked for once).
    _default_known = False

    async def upstream_default(self) -> str:
        """The upstream's default kernelspec name, asked for once (jupyter_server also
        updates ``default_kernel_name`` whenever a client lists the kernelspecs)."""
        if not self._default_known:
            specs_manager: Any = self.kernel_spec_manager  # a GatewayKernelSpecManager
            specs: dict[str, Any] = await _translated(specs_manager.list_kernel_specs())
            default = specs.get("default")
            if isinstance(default, str) and default:
                self.default_kernel_name = default
            self._default_known = True
        return str(self.default_kernel_name)

    async def list_kernels(self, **kwargs: Any) -> list[dict[str, Any]]:
        """The upstream's kernels that this gateway manages; from its own knowledge while
        the upstream refuses to list them."""
        if time.monotonic() >= self._listing_refused_until:
            try:
                kernels: list[dict[str, Any]] = await super().list_kernels(**kwargs)
                return kernels
            except web.HTTPError as error:
                if error.status_code not in LISTING_REFUSED:
                    raise upstream_error(error) from error
                self._listing_refused_until = time.monotonic() + self.listing_retry
                self.log.warning(
                    "%s to the list of its kernels: listing the kernels started here from "
                    "the gateway's own knowledge (asking again in %ss)",
                    upstream_error(error).log_message,
                    self.listing_retry,
                )
        return await self._known_kernels()

    async def _known_kernels(self) -> list[dict[str, Any]]:
        models = []
        for kernel_id, kernel in list(self._kernels.items()):
            try:
                model = await kernel.refresh_model()
            except web.HTTPError as error:
                if error.status_code != 404:
                    raise upstream_error(error) from error
                model = None
            if model:
                models.append(model)
            else:
                self.log.warning("Kernel %s is no longer on the upstream gateway", kernel_id)
                self._kernels.pop(kernel_id, None)
        return models

    async def start_kernel(  # type: ignore[override]
        self, *, kernel_id: Any = None, path: Any = None, **kwargs: Any
    ) -> Any:
        return await _translated(super().start_kernel(kernel_id=kernel_id, path=path, **kwargs))

    async def kernel_model(self, kernel_id: Any) -> Any:
        return await _translated(super().kernel_model(kernel_id))

    async def interrupt_kernel(  # type: ignore[override]
        self, kernel_id: Any, **kwargs: Any
    ) -> Any:
        return await _translated(super().interrupt_kernel(kernel_id, **kwargs))

    async def restart_kernel(  # type: ignore[override]
        self, kernel_id: Any, now: Any = False, **kwargs: Any
    ) -> Any:
        return await _translated(super().restart_kernel(kernel_id, now=now, **kwargs))

    async def shutdown_kernel(  # type: ignore[override]
        self, kernel_id: Any, now: Any = False, restart: Any = False
    ) -> Any:
        return await _translated(super().shutdown_kernel(kernel_id, now=now, restart=restart))
