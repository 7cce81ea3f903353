"""The kernel manager of all the gateway's kernels: :class:`StreamMappingKernelManager`,
whose shutdowns wait out a restart. It starts a :class:`~.local.StreamKernelManager` per
kernel, or an :class:`~.attached.AttachedKernelManager` for a kernel reached by connection
info (which builds on the former); neither imports this module.

Why it is needed. jupyter_client's ``KernelManager`` marks a start, restart or shutdown in
progress by replacing its ``ready`` future with a pending one (``in_pending_state``), and
its ``MultiKernelManager._async_shutdown_kernel`` then reads ``km.ready.exception()``
without checking that the future is done. A DELETE that lands while a kernel restarts
therefore raises ``InvalidStateError`` (HTTP 500), and the restart carries on and leaves a
fresh kernel process running. The restart is either jupyter_client's restarter, which
restarts a kernel that died at its next poll (every ``KernelRestarter.time_to_dead``), or a
``POST /api/kernels/{id}/restart``. Nothing stops a restart requested during a shutdown
either: it relaunches the kernel the shutdown is about to forget. The check that raises is
in the multi-kernel manager, before any per-kernel code runs, and both kinds of restart
meet there, so this is where shutdowns and restarts are put in order.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server._tz import utcnow
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado import web
from traitlets import HasTraits

from ..core.errors import start_failure
from .attached import AttachedKernelManager
from .base import mark_start_failed, start_of
from .pool import KernelPool

__all__ = ["StreamMappingKernelManager", "until_settled"]


async def until_settled(kernel: Any) -> bool:
    """Wait until no start, restart or shutdown of ``kernel`` (a jupyter_client
    ``KernelManager``) is in progress; True if one was.

    A restart replaces ``kernel.ready`` with a pending future twice (its shutdown, then its
    start), so the future is read again after each wait. One that failed is settled too.
    """
    waited = False
    while not (ready := asyncio.wrap_future(kernel.ready)).done():
        waited = True
        await asyncio.wait([ready])
    return waited


class StreamMappingKernelManager(AsyncMappingKernelManager):
    """jupyter_server's kernel manager, whose shutdowns wait for a restart in progress.

    * ``shutdown_kernel`` stops the kernel's restarter, waits until a restart in progress
      (automatic or requested) has finished, then shuts down what that restart started.
      Concurrent shutdowns of one kernel share one; all of them answer once it is done.
    * ``restart_kernel`` waits for a restart already in progress, and refuses a kernel that
      is being shut down (:class:`tornado.web.HTTPError` 409), instead of relaunching it
      behind the shutdown.
    * A kernel whose restarts ran out is removed from the map, as jupyter_server does, and
      its resources (connection file, control socket, ports) are released.
    * An unknown kernel id is a 404 with ``reason`` ``unknown_kernel``, so that the API's
      JSON error has the same ``{"reason", "message"}`` as the gateway's own.

    * With a warm pool (:attr:`pool`, ``GatewayStreamApp.kernel_pool``), a start of a
      kernelspec the pool holds ready takes one of those (see :mod:`.pool`).

    The standalone daemon uses it by default (``StreamServerApp.kernel_manager_class``).
    Under ``jupyter server`` it is opted into with ``--ServerApp.kernel_manager_class=
    kernel_gateway_stream.kernels.StreamMappingKernelManager``.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._shutdowns: dict[str, asyncio.Task[None]] = {}
        self._releases: set[asyncio.Task[None]] = set()
        #: Kernels started ahead (set by the gateway when ``kernel_pool`` asks for some).
        self.pool: KernelPool | None = None

    def start_watching_activity(self, kernel_id: str) -> None:
        """What jupyter_server's does, without its IOPub socket: the kernel's Tap reads the
        one IOPub socket the gateway opens and keeps ``last_activity`` and
        ``execution_state`` from it. A second subscriber would also take what a kernel of
        the gateway's launcher held while nobody listened (see :mod:`..kernel_launcher`),
        and lose it when it closes."""
        kernel = self._kernels[kernel_id]
        kernel.reason = ""
        kernel.last_activity = utcnow()

    def pre_start_kernel(self, kernel_name: str | None, kwargs: Any) -> tuple[Any, str, str]:
        """jupyter_client's, and for a start that names an ``attachment`` (a kernel reached
        by connection info), an :class:`~.attached.AttachedKernelManager` in place of a
        process."""
        attachment = kwargs.pop("attachment", None)
        if attachment is None:
            pooled = self._from_pool(kernel_name or self.default_kernel_name, kwargs)
            if pooled is not None:
                return pooled, pooled.kernel_name, pooled.kernel_id
            return super().pre_start_kernel(kernel_name, kwargs)
        kernel_id = kwargs.pop("kernel_id", None) or self.new_kernel_id()
        if kernel_id in self:
            raise web.HTTPError(409, "Kernel %s exists" % kernel_id, reason="kernel_exists")
        name = kernel_name or "attached"
        kernel = AttachedKernelManager(
            attachment=attachment,
            connection_file=os.path.join(self.connection_dir, "kernel-%s.json" % kernel_id),
            parent=self,
            log=self.log,
            kernel_name=name,
            kernel_spec_manager=self.kernel_spec_manager,
        )
        return kernel, name, kernel_id

    def _from_pool(self, kernel_name: str, kwargs: Any) -> Any | None:
        """A ready kernel of the pool for this start, if it asks for nothing a pooled
        kernel was not started with (an id of its own, another working directory)."""
        if self.pool is None or kwargs.get("kernel_id"):
            return None
        cwd = kwargs.get("cwd")
        if cwd is not None and os.path.realpath(cwd) != os.path.realpath(self.pool.cwd):
            return None
        return self.pool.take(kernel_name)

    async def _async_shutdown_all(self, now: bool = False) -> None:
        """jupyter_client's, after the pool's kernels (the server is stopping)."""
        if self.pool is not None:
            await self.pool.close()
        await super()._async_shutdown_all(now=now)

    shutdown_all = _async_shutdown_all  # type: ignore[assignment]

    async def _finish_kernel_start(self, kernel_id: str) -> None:
        """A kernel whose start fails (a pending kernel: ``use_pending_kernels``) is
        ``dead`` with the start's error as its ``reason`` at once, whether or not a client
        asks (jupyter_server sets them only when a WebSocket finds the start failed; until
        then its model said ``starting``)."""
        kernel: Any = self.get_kernel(kernel_id)
        waited = start_of(kernel)
        if waited is not None:
            try:
                await asyncio.shield(waited)
            except Exception as error:
                mark_start_failed(kernel, start_failure(error))
                self.log.warning("Kernel %s failed to start: %s", kernel_id, kernel.reason)
                return
        await super()._finish_kernel_start(kernel_id)

    def _check_kernel_id(self, kernel_id: str) -> None:
        if kernel_id not in self:
            raise web.HTTPError(
                404, "Kernel does not exist: %s" % kernel_id, reason="unknown_kernel"
            )

    async def _async_shutdown_kernel(  # type: ignore[override]
        self, kernel_id: str, now: bool = False, restart: bool = False
    ) -> None:
        """Shut ``kernel_id`` down once no restart of it is in progress.

        Called by the DELETE and sessions handlers, the culler and ``shutdown_all``.

        Raises:
            tornado.web.HTTPError: 404 if no such kernel is running.
        """
        shutdown = self._shutdowns.get(kernel_id)
        if shutdown is None:
            if self._forget_failed_start(kernel_id):
                return
            self._check_kernel_id(kernel_id)
            shutdown = asyncio.ensure_future(self._shutdown_settled(kernel_id, now, restart))
            self._shutdowns[kernel_id] = shutdown
            shutdown.add_done_callback(lambda done: self._forget_shutdown(kernel_id, done))
        # One caller giving up (cancelled) does not stop a shutdown the others wait for.
        await asyncio.shield(shutdown)

    shutdown_kernel = _async_shutdown_kernel  # type: ignore[assignment]

    def _forget_failed_start(self, kernel_id: str) -> bool:
        """True, and the id forgotten, for a kernel whose start failed: jupyter_client
        keeps its id among the pending kernels (``_add_kernel_when_ready`` logs the error),
        where ``shutdown_all`` finds it, and a shutdown of it raised a 404 that ended the
        server's stop half-way (the port closed, the process stayed)."""
        pending = self._pending_kernels.get(kernel_id)
        if kernel_id in self or pending is None or not pending.done():
            return False
        del self._pending_kernels[kernel_id]
        return True

    def _forget_shutdown(self, kernel_id: str, shutdown: asyncio.Task[None]) -> None:
        # A kernel started again under the same id may already have a shutdown of its own.
        if self._shutdowns.get(kernel_id) is shutdown:
            del self._shutdowns[kernel_id]

    async def _shutdown_settled(self, kernel_id: str, now: bool, restart: bool) -> None:
        kernel = self.get_kernel(kernel_id)
        # No new automatic restart from here on. One already under way goes on: wait for it.
        kernel.stop_restarter()
        if await until_settled(kernel):
            self.log.info("Kernel %s restarted before its shutdown; shutting that down", kernel_id)
            # The restart that just ended started its restarter again.
            kernel.stop_restarter()
        await super()._async_shutdown_kernel(kernel_id, now=now, restart=restart)

    async def _async_restart_kernel(  # type: ignore[override]
        self, kernel_id: str, now: bool = False
    ) -> Any:
        """Restart ``kernel_id`` once no other restart of it is in progress.

        Raises:
            tornado.web.HTTPError: 404 if no such kernel is running, 409 if it is being
                shut down.
        """
        self._refuse_restart_during_shutdown(kernel_id)
        if getattr(self.get_kernel(kernel_id), "attachment", None) is not None:
            raise web.HTTPError(
                409,
                "Kernel %s was attached by connection info: only its owner can restart it"
                % kernel_id,
                reason="kernel_not_owned",
            )
        await until_settled(self.get_kernel(kernel_id))
        self._refuse_restart_during_shutdown(kernel_id)
        return await super()._async_restart_kernel(kernel_id, now=now)

    restart_kernel = _async_restart_kernel  # type: ignore[assignment]

    def kernel_model(self, kernel_id: str) -> dict[str, Any]:
        """jupyter_server's model of ``kernel_id``. A kernel listed before jupyter_server
        stamped its ``last_activity`` (it does so once the start returns; a kernel another
        node attached, or one re-attached, is in the list a moment before) is stamped now:
        jupyter_server's model would fail on it, and ``GET /api/kernels`` answer 500."""
        kernel = self._kernels.get(kernel_id)
        if kernel is not None and not _stamped(kernel):
            kernel.last_activity = utcnow()
        model: dict[str, Any] = super().kernel_model(kernel_id)
        return model

    async def interrupt_kernel(self, kernel_id: str) -> Any:  # type: ignore[override]
        """Interrupt ``kernel_id``; a clear 409 (not jupyter_client's RuntimeError, a 500)
        while it is being shut down, started or restarted.

        Raises:
            tornado.web.HTTPError: 404 if no such kernel is running, 409 as said.
        """
        self._refuse_restart_during_shutdown(kernel_id)
        if not self.get_kernel(kernel_id).ready.done():
            raise web.HTTPError(
                409, "Kernel %s is starting or restarting" % kernel_id, reason="kernel_not_ready"
            )
        return await ensure_async(super().interrupt_kernel(kernel_id))

    def _refuse_restart_during_shutdown(self, kernel_id: str) -> None:
        if kernel_id in self._shutdowns:
            raise web.HTTPError(
                409, "Kernel %s is shutting down" % kernel_id, reason="kernel_shutting_down"
            )
        self._check_kernel_id(kernel_id)

    def _handle_kernel_died(self, kernel_id: str) -> None:
        # Called by the restarter once its restarts ran out, the kernel's process dead.
        kernel = self._kernels.get(kernel_id)
        super()._handle_kernel_died(kernel_id)
        if kernel is not None:
            release = asyncio.ensure_future(self._release_dead(kernel_id, kernel))
            self._releases.add(release)
            release.add_done_callback(self._releases.discard)

    async def _release_dead(self, kernel_id: str, kernel: Any) -> None:
        """What jupyter_server leaves of a dead kernel: its connection file, which holds the
        session key, its control socket and its ports. Not a shutdown: that would signal the
        process group of a process already reaped, whose id may be in use again."""
        try:
            await kernel.cleanup_resources()
        except Exception:  # a background task's outermost frame: log it
            self.log.exception("Could not release the resources of dead kernel %s", kernel_id)


def _stamped(kernel: Any) -> bool:
    """Whether jupyter_server stamped ``kernel``'s ``last_activity``. Reading the trait
    before that raises TraitError (a datetime trait with no default), not AttributeError,
    so the value is looked up where traitlets keeps what was set."""
    if isinstance(kernel, HasTraits) and kernel.has_trait("last_activity"):
        return kernel._trait_values.get("last_activity") is not None
    return getattr(kernel, "last_activity", None) is not None
