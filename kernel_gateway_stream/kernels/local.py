"""The kernel managers the gateway uses for local kernels.

* :class:`StreamKernelManager`, per kernel: starts ipykernel with lossless IOPub, without
  the gateway's secrets in its environment, and says when a restart is asked for.
* :class:`StreamMappingKernelManager`, for all of them: shutdowns that wait out a restart.

With ``--KernelManager.transport=ipc`` a kernel's five sockets are Unix sockets in a
directory only the gateway's user can enter (:func:`private_ipc_directory`), so that
another local user cannot subscribe to its IOPub as it can to a TCP port on 127.0.0.1.

Why the second one. jupyter_client's ``KernelManager`` marks a start, restart or shutdown in
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
import atexit
import contextlib
import functools
import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Collection
from typing import Any

from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from jupyter_core.utils import ensure_async
from jupyter_server._tz import utcnow
from jupyter_server.services.kernels.kernelmanager import (
    AsyncMappingKernelManager,
    ServerKernelManager,
)
from tornado import web
from traitlets import default

__all__ = [
    "LAUNCHER_MODULE",
    "StreamKernelManager",
    "StreamMappingKernelManager",
    "lossless_ipykernel_command",
    "private_ipc_directory",
    "until_settled",
    "without_secrets",
]

LAUNCHER_MODULE = "kernel_gateway_stream.kernel_launcher"
_IPYKERNEL_MODULES = ("ipykernel_launcher", "ipykernel")


def lossless_ipykernel_command(command: list[str], executable: str) -> list[str]:
    """``command`` with ipykernel started through :mod:`kernel_gateway_stream.kernel_launcher`.

    Only a command that runs ipykernel as a module (``python -m ipykernel_launcher ...``)
    on ``executable`` itself (the interpreter the gateway runs on, which has this package)
    is changed; any other command comes back as it is.
    """
    if len(command) < 3 or command[1] != "-m" or command[2] not in _IPYKERNEL_MODULES:
        return command
    if os.path.realpath(command[0]) != os.path.realpath(executable):
        return command
    return [command[0], "-m", LAUNCHER_MODULE, *command[3:]]


@functools.cache
def private_ipc_directory() -> str:
    """A directory of this process's own (0700, made afresh, not a name another user
    could have taken first) for kernels' IPC sockets, with a short path: a Unix socket's
    path holds 107 bytes (``sun_path``), which jupyter_client's default (beside the
    connection file, in the runtime directory) easily passes. Under ``$XDG_RUNTIME_DIR``
    where there is one (never cleaned while the user is logged in), else the temporary
    directory. It outlives the gateway, as the kernels whose sockets it holds do."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    if not (base and os.path.isdir(base) and os.access(base, os.W_OK)):
        base = tempfile.gettempdir()
    directory = tempfile.mkdtemp(prefix="kgs-ipc-", dir=base)
    atexit.register(_remove_if_empty, directory)
    return directory


def _remove_if_empty(directory: str) -> None:
    with contextlib.suppress(OSError):  # kernels that outlive the gateway still use it
        os.rmdir(directory)


def without_secrets(
    env: dict[str, str], names: Collection[str], values: Collection[str]
) -> dict[str, str]:
    """``env`` without the variables ``names`` and without any variable whose value holds
    one of ``values`` (a copy of the token under another name)."""
    secrets = [value for value in values if value]
    return {
        name: value
        for name, value in env.items()
        if name not in names and not any(secret in value for secret in secrets)
    }


class StreamKernelManager(ServerKernelManager):
    """jupyter_server's kernel manager, for the gateway's local kernels:

    * ipykernel launched with an IOPub socket that queues instead of dropping (when
      :attr:`lossless_iopub` is on);
    * a kernel's environment without the gateway's secrets (:attr:`secret_names`,
      :attr:`secret_values`), whatever the kernelspec or the caller put in it;
    * :attr:`lifecycle_hooks`, called with ``"restart_requested"`` or ``"shutdown"`` when a
      restart or a shutdown is asked for, before the kernel goes (the Tap records it there:
      what the kernel does then, such as interrupting the running cell, comes after it);
    * the kernel process's own stdout and stderr (ipykernel's banner, a crash's traceback)
      appended to ``<output_directory>/<kernel id>.log`` (0600), not to the gateway's log,
      when :attr:`output_directory` is set and the kernel is a local process.
    """

    #: Set by the gateway on the class before any kernel starts.
    lossless_iopub: bool = True
    #: Kernels run on when the gateway dies (no parent poller), to be re-attached.
    outlive_gateway: bool = True
    secret_names: frozenset[str] = frozenset()
    secret_values: frozenset[str] = frozenset()
    #: Where kernels' own stdout and stderr go, one file each; empty: inherited.
    output_directory: str = ""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lifecycle_hooks: list[Callable[[str], None]] = []

    @default("ip")
    def _default_ip(self) -> str:
        if self.transport == "ipc":
            name = (self.kernel_id or uuid.uuid4().hex).replace("-", "")
            return os.path.join(private_ipc_directory(), name)
        return str(super()._ip_default())

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        command: list[str] = super().format_kernel_cmd(extra_arguments)
        if not self.lossless_iopub:
            return command
        return lossless_ipykernel_command(command, sys.executable)

    async def _async_pre_start_kernel(self, **kw: Any) -> tuple[list[str], dict[str, Any]]:
        command, kw = await super()._async_pre_start_kernel(**kw)
        env = kw.get("env")
        if isinstance(env, dict):
            env = without_secrets(env, self.secret_names, self.secret_values)
            # debugpy (imported by ipykernel) prints a "frozen modules" warning to the
            # kernel's stdout at start on Python 3.11+, now and then: it would open the
            # transcript of every such kernel. This is the switch its warning names.
            env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
            if self.outlive_gateway:
                # ipykernel exits when the process named here goes: a gateway that is
                # killed would take every kernel's state with it.
                env.pop("JPY_PARENT_PID", None)
            kw["env"] = env
        if self.outlive_gateway:
            kw["independent"] = True
        return command, kw

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        output = self._open_output_log()
        if output is not None:
            kw.setdefault("stdout", output)
            kw.setdefault("stderr", output)
        try:
            await super()._async_launch_kernel(kernel_cmd, **kw)
        finally:
            if output is not None:
                os.close(output)  # the kernel holds its own copy

    def _open_output_log(self) -> int | None:
        """A descriptor of the kernel's output log, appended to (a restart adds to it), or
        None: no directory set, a provisioner that launches otherwise, or the file cannot
        be opened (the kernel then inherits the gateway's, as jupyter_server's do)."""
        if not self.output_directory or type(self.provisioner) is not LocalProvisioner:
            return None
        name = f"{self.kernel_id or uuid.uuid4()}.log"
        try:
            os.makedirs(self.output_directory, mode=0o700, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
            return os.open(os.path.join(self.output_directory, name), flags, 0o600)
        except OSError as error:
            self.log.warning("Cannot open %s for the kernel's output: %s", name, error)
            return None

    async def restart_kernel(  # type: ignore[override]
        self, now: bool = False, newports: bool = False, **kw: Any
    ) -> None:
        self._announce("restart_requested")
        await super().restart_kernel(now=now, newports=newports, **kw)

    async def shutdown_kernel(  # type: ignore[override]
        self, now: bool = False, restart: bool = False
    ) -> None:
        if not restart:  # a restart shuts the kernel down too, and said so already
            self._announce(self.leaving)
        await super().shutdown_kernel(now=now, restart=restart)

    @property
    def leaving(self) -> str:
        """What a shutdown of this kernel does: ``shutdown`` (``detach`` for a kernel the
        gateway lets run on: see :mod:`.attached`)."""
        return "shutdown"

    def _announce(self, what: str) -> None:
        for hook in list(self.lifecycle_hooks):
            hook(what)


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

    The standalone daemon uses it by default (``StreamServerApp.kernel_manager_class``).
    Under ``jupyter server`` it is opted into with ``--ServerApp.kernel_manager_class=
    kernel_gateway_stream.kernels.StreamMappingKernelManager``.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._shutdowns: dict[str, asyncio.Task[None]] = {}
        self._releases: set[asyncio.Task[None]] = set()

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
            return super().pre_start_kernel(kernel_name, kwargs)
        from .attached import AttachedKernelManager  # it builds on this module

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
