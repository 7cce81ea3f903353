"""Kernels the gateway did not start, reached by their connection info.

A kernel in a container, on another host, started by another program, or started by an
earlier run of the gateway that was killed: the gateway knows its connection info and
nothing else. It is attached as a kernel of the gateway's kernel manager
(:class:`AttachedKernelManager`, with :class:`AttachedProvisioner` in place of a process),
so it is listed in ``/api/kernels`` and works on every surface, tapped like any other.

What differs from a kernel the gateway started:

* **Interrupt** is an ``interrupt_request`` on control (there is no process to signal),
  unless the gateway started the kernel itself and its process still runs on this host,
  known by its command line (a kernel re-attached from a network namespace or a sandbox is
  interrupted by message too).
* **Restart** is refused (409 ``kernel_not_owned``): only the kernel's owner can start it
  again.
* **DELETE detaches**: the kernel runs on and can be attached again, its transcript
  numbered on. Shutting it down is explicit (``DELETE /api/kernels/{id}?shutdown=true``),
  and is the default for a kernel the gateway started itself and re-attached after a
  restart of its own.
* **A heartbeat** tells when it stops answering: its status shows ``unreachable``, the
  transcript records it (executions running meanwhile keep the reason), and recording goes
  on when it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase

from .local import StreamKernelManager

__all__ = [
    "AttachedKernelManager",
    "AttachedProvisioner",
    "Attachment",
    "delete_owned_network",
    "process_is",
]


class Attachment:
    """What the gateway knows of a kernel it attaches to."""

    def __init__(
        self,
        connection_info: dict[str, Any],
        *,
        display_name: str = "",
        language: str = "",
        owned: bool = False,
        pid: int | None = None,
        source: str = "api",
        network: dict[str, str] | None = None,
    ) -> None:
        #: Checked connection info (:func:`..core.connection.check_connection_info`).
        self.connection_info = connection_info
        self.display_name = display_name or "Attached kernel"
        self.language = language
        #: True for a kernel the gateway started itself (re-attached after a restart).
        self.owned = owned
        #: Its process, when it runs on this host and the gateway started it.
        self.pid = pid
        #: ``api``, ``directory`` or ``recovered``: where the attachment came from.
        self.source = source
        #: The network namespace the gateway made for the kernel (netns-provisioner), to
        #: delete when the kernel is shut down.
        self.network = network

    def to_json(self) -> dict[str, Any]:
        return {
            "connection_info": self.connection_info,
            "display_name": self.display_name,
            "language": self.language,
            "owned": self.owned,
            "pid": self.pid,
            "source": self.source,
            "network": self.network,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Attachment:
        return cls(
            data["connection_info"],
            display_name=data.get("display_name", ""),
            language=data.get("language", ""),
            owned=bool(data.get("owned")),
            pid=data.get("pid"),
            source=data.get("source", "api"),
            network=data.get("network"),
        )


async def delete_owned_network(attachment: Attachment, log: Any) -> None:
    """Delete the network namespace the gateway made for a kernel it started (in an earlier
    run), once that kernel is gone."""
    if not attachment.owned or not attachment.network:
        return
    from .netns import KernelNetwork, delete_network

    network = KernelNetwork.from_dict(attachment.network)
    try:
        await asyncio.to_thread(delete_network, network)
    except Exception as error:  # the host's ip command failed: said, not raised
        log.warning("Could not delete network namespace %s: %s", network.namespace, error)
        return
    attachment.network = None
    log.info("Deleted network namespace %s", network.namespace)


def process_is(pid: int, kernel_id: str) -> bool:
    """True if ``pid`` is this host's process of kernel ``kernel_id`` (its command line
    names the kernel's connection file), so a reused pid is never signalled."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return kernel_id.encode() in file.read()
    except OSError:
        return False


class AttachedProvisioner(KernelProvisionerBase):
    """Stands in for a kernel process the gateway does not have: "launching" hands the
    kernel manager the attachment's connection info; signals reach the kernel only when
    the gateway started it on this host."""

    attachment: Attachment
    _attached = False
    _gone = False

    @property
    def has_process(self) -> bool:
        return self._attached

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)
        kwargs["cmd"] = []
        # The kernel manager holds the kernel's connection info from here on (jupyter_client
        # loads it only when no connection file of the same content exists already).
        assert self.parent is not None  # made by its kernel manager
        self.parent.load_connection_info(self._connection_info())
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        self._attached = True
        self._gone = False
        return self._connection_info()

    def _connection_info(self) -> KernelConnectionInfo:
        info: KernelConnectionInfo = dict(self.attachment.connection_info)  # type: ignore[assignment]
        info["key"] = info["key"].encode()  # type: ignore[typeddict-item]
        return info

    @property
    def signals_reach(self) -> bool:
        """True if signals reach the kernel: the gateway started it on this host and its
        process still runs, known by its command line naming the kernel's id. A kernel
        started in a network namespace or a sandbox is not (its command line names a copy
        of its connection file): it is interrupted by message, as an attached one."""
        return self._local_pid() is not None

    def _local_pid(self) -> int | None:
        pid = self.attachment.pid
        if pid and self.kernel_id and process_is(pid, self.kernel_id):
            return pid
        return None

    async def poll(self) -> int | None:
        if not self._attached or self._gone:
            return 0
        if self.attachment.pid is not None:
            return None if self._local_pid() is not None else 0
        return None

    async def wait(self) -> int | None:
        while await self.poll() is None:
            await asyncio.sleep(0.1)
        return 0

    async def send_signal(self, signum: int) -> None:
        pid = self._local_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    async def kill(self, restart: bool = False) -> None:
        await self.send_signal(9)
        self._gone = True

    async def terminate(self, restart: bool = False) -> None:
        await self.send_signal(15)
        if self.attachment.pid is None:
            # Nothing to wait for: a shutdown_request is all a remote kernel gets.
            self._gone = True

    async def cleanup(self, restart: bool = False) -> None:
        self._attached = False

    def detach(self) -> None:
        self._attached = False

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        # A kernel the gateway cannot watch is given the time to shut down, then let go.
        return recommended if self.attachment.pid is not None else 2.0


class AttachedKernelManager(StreamKernelManager):
    """A kernel manager for a kernel reached by connection info (see the module docstring).

    Made by :meth:`.mapping.StreamMappingKernelManager.pre_start_kernel` when a start names
    an ``attachment``.
    """

    #: The gateway pings its heartbeat: nothing else tells it that the kernel went.
    watch_heartbeat = True

    def __init__(self, *, attachment: Attachment, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.attachment = attachment
        self.autorestart = False
        self.cache_ports = False
        #: DELETE shuts the kernel down (True) or lets it run on, detached (False).
        self.stop_on_shutdown = attachment.owned

    @property
    def kernel_spec(self) -> KernelSpec:
        return KernelSpec(
            argv=[],
            display_name=self.attachment.display_name,
            language=self.attachment.language,
            # Asked at each interrupt (jupyter_client reads the spec then).
            interrupt_mode="signal" if self._signals_reach() else "message",
            metadata={"kernel_gateway_stream": {"attached": self.attachment.source}},
        )

    def _signals_reach(self) -> bool:
        provisioner = self.provisioner
        if isinstance(provisioner, AttachedProvisioner):
            return provisioner.signals_reach
        return bool(self.attachment.pid)

    @property
    def leaving(self) -> str:
        return "shutdown" if self.stop_on_shutdown else "detach"

    async def _async_pre_start_kernel(self, **kw: Any) -> tuple[list[str], dict[str, Any]]:
        self.kernel_id = self.kernel_id or kw.pop("kernel_id", None)
        if self.provisioner is None:
            provisioner = AttachedProvisioner(
                kernel_id=self.kernel_id, kernel_spec=self.kernel_spec, parent=self
            )
            provisioner.attachment = self.attachment
            self.provisioner = provisioner
        return await super()._async_pre_start_kernel(**kw)

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        return []

    def _kernel_supports_curve_encryption(self) -> bool:
        # jupyter_client asks the kernelspec before it provisions keys; an attached kernel
        # runs already, its transport encrypted if its connection info holds a key pair
        # (the attacher refuses one without under transport_encryption=required).
        info = self.attachment.connection_info
        return bool(info.get("curve_publickey") and info.get("curve_secretkey"))

    async def shutdown_kernel(  # type: ignore[override]
        self, now: bool = False, restart: bool = False
    ) -> None:
        if not self.stop_on_shutdown and isinstance(self.provisioner, AttachedProvisioner):
            # Detach: no process to wait for, nothing sent to the kernel (jupyter_client
            # would interrupt it first), none of its files removed.
            self.provisioner.detach()
        await super().shutdown_kernel(now=now, restart=restart)
        if self.stop_on_shutdown and self.attachment.owned:
            # The file the gateway wrote when it started the kernel, in an earlier run.
            with contextlib.suppress(OSError):
                os.remove(self.connection_file)
            await delete_owned_network(self.attachment, self.log)

    async def _async_request_shutdown(self, restart: bool = False) -> None:
        if self.stop_on_shutdown:
            await super()._async_request_shutdown(restart=restart)

    def cleanup_ipc_files(self) -> None:
        if self.stop_on_shutdown:  # an ipc kernel's sockets are its own while it runs on
            super().cleanup_ipc_files()
