"""The kernel managers the gateway uses for local kernels.

* :class:`StreamKernelManager`, per kernel: starts ipykernel with lossless IOPub, without
  the gateway's secrets in its environment, and says when a restart is asked for.
* the kernel manager for all of them is in :mod:`.mapping`.

With ``--KernelManager.transport=ipc`` a kernel's five sockets are Unix sockets in a
directory only the gateway's user can enter (:func:`private_ipc_directory`), so that
another local user cannot subscribe to its IOPub as it can to a TCP port on 127.0.0.1.
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
from jupyter_server.services.kernels.kernelmanager import ServerKernelManager
from traitlets import default

from ..core.forking import LAUNCHER_MODULE
from . import forkserver

__all__ = [
    "LAUNCHER_MODULE",
    "StreamKernelManager",
    "lossless_ipykernel_command",
    "private_ipc_directory",
    "without_secrets",
]

KERNEL_ACTIONS_SCHEMA = "https://events.jupyter.org/jupyter_server/kernel_actions/v1"
_IPYKERNEL_MODULES = ("ipykernel_launcher", "ipykernel")
#: The launch arguments a forked start honours (jupyter_client's launcher takes any of
#: Popen's): a start with another one execs.
_FORKABLE_ARGUMENTS = frozenset(
    {"env", "cwd", "independent", "stdin", "stdout", "stderr", "kernel_id", "extra_arguments"}
)


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
    #: Fork kernels from a process that has imported ipykernel (:mod:`.forkserver`) where
    #: that starts what an exec would.
    use_forkserver: bool = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lifecycle_hooks: list[Callable[[str], None]] = []
        #: Set by the warm pool (:mod:`.pool`) on a kernel it started ahead and answered:
        #: the next start is its hand-out, which starts nothing.
        self.from_pool = False

    async def start_kernel(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """jupyter_server's; for a kernel the pool hands out, only the start event (its
        listeners, the gateway's recorders among them, see the kernel start now)."""
        if not self.from_pool:
            await super().start_kernel(*args, **kwargs)
            return
        self.from_pool = False
        self.emit(
            schema_id=KERNEL_ACTIONS_SCHEMA,
            data={
                "kernel_id": self.kernel_id,
                "kernel_name": self.kernel_name,
                "action": "start",
                "status": "success",
                "msg": f"Kernel {self.kernel_id} was started (from the pool).",
            },
        )

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
            if not await self._forked_launch(kernel_cmd, kw):
                await super()._async_launch_kernel(kernel_cmd, **kw)
        finally:
            if output is not None:
                os.close(output)  # the kernel holds its own copy

    async def _forked_launch(self, kernel_cmd: list[str], kw: dict[str, Any]) -> bool:
        """Start the kernel as a fork of the forkserver (see :mod:`.forkserver`) where that
        starts what an exec would; False where it does not, or the forkserver failed."""
        provisioner = self.provisioner
        if not self.use_forkserver or type(provisioner) is not LocalProvisioner:
            return False
        if set(kw) - _FORKABLE_ARGUMENTS:
            return False
        env = kw.get("env")
        if not isinstance(env, dict):
            return False
        key = forkserver.fork_key(kernel_cmd, env, bool(kw.get("independent")))
        if key is None:
            return False
        cwd = str(kw.get("cwd") or os.getcwd())
        if not os.path.isdir(cwd):
            return False  # an exec fails at once, and says why
        # The start runs in a thread on copies of the descriptors that the thread closes:
        # a start cancelled here cannot have the caller's descriptors closed under it.
        with contextlib.ExitStack() as opened:
            owned = []
            for name, fallback in (("stdin", None), ("stdout", 1), ("stderr", 2)):
                fd = kw.get(name)
                if fd is None:
                    fd = fallback
                if fd is None:
                    copy = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                elif isinstance(fd, int) and fd >= 0:
                    copy = os.dup(fd)
                else:
                    return False  # PIPE, DEVNULL, a file object: Popen's to make
                opened.callback(os.close, copy)
                owned.append(copy)
            handed = opened.pop_all()
        try:
            process = await asyncio.to_thread(
                _launch_and_close, handed, key, kernel_cmd, env, cwd, (owned[0], owned[1], owned[2])
            )
        except forkserver.ForkServerUnavailable as error:
            self.log.warning("Kernel started with exec: %s", error)
            return False
        provisioner.process = process  # type: ignore[assignment]  # Popen's interface
        provisioner.pid = process.pid
        provisioner.pgid = process.pid  # its own session, as jupyter_client's launcher makes
        provisioner.cwd = cwd
        self._reconcile_connection_info(provisioner.connection_info)
        return True

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


def _launch_and_close(
    owned: contextlib.ExitStack,
    key: tuple[Any, ...],
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    stdio: tuple[int, int, int],
) -> forkserver.ForkedProcess:
    """:func:`.forkserver.launch` on descriptors this call owns, closed once it returns."""
    with owned:
        return forkserver.launch(key, argv, env, cwd, stdio)
