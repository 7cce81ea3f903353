"""A warm pool: kernels started ahead, per kernelspec, for the next starts of that kernelspec.

``GatewayStreamApp.kernel_pool`` names how many kernels of each kernelspec to keep ready
(``{"python3-sandbox": 2}``). The :class:`KernelPool` starts them in the background, as
the kernel manager would (same kernel manager class, provisioner, transport and
environment policy), and counts one ready once it has answered a ``kernel_info_request``.
The kernel manager (:class:`~.mapping.StreamMappingKernelManager`) hands the oldest ready
one out at its next start of that kernelspec, and the pool starts another in its place.

What a client sees of a pooled kernel is what it sees of a cold one: an id no client has
seen before (a pooled kernel is listed nowhere, and the gateway records nothing of it,
until it is handed out; its transcript begins then), a kernel that has run no code, the
same ``kernel_actions`` start event. Each is handed out once: :meth:`KernelPool.take`
removes it from the pool.

A start that asks for something a pooled kernel was not started with (its own kernel id,
a working directory other than the server's root, a kernel reached by connection info) is
a cold start. A pooled kernel has the server's environment policy but not the start's own
``env`` (jupyter_server's sessions add ``JPY_SESSION_NAME``).

The pool's kernels are shut down with the server. Those a SIGKILL of the gateway left
running (the gateway's kernels outlive it, to be re-attached: pooled ones are not) are
listed in ``kernel-pool.json`` in the gateway's state directory, and are stopped and
cleaned up (their provisioner's cleanup: network namespaces, sandbox storage) when the
pool opens again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping
from typing import Any

from jupyter_client.multikernelmanager import MultiKernelManager
from jupyter_client.provisioning.factory import KernelProvisionerFactory

from ..core.health import ComponentHealth, State

__all__ = ["POOL_FILE", "KernelPool", "process_start_time"]

#: The file, in the gateway's state directory, that lists the pool's kernels.
POOL_FILE = "kernel-pool.json"


def process_start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot: ``/proc/<pid>/stat``'s 22nd
    field), or None if there is no such process. A pid and its start time name one
    process; a pid alone can be reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(fields[19])


class KernelPool:
    """Kernels started ahead, per kernelspec (see the module's docstring).

    Args:
        manager: the server's kernel manager (a ``MultiKernelManager``); the pool makes its
            kernel managers with it and starts them with its policy.
        sizes: how many ready kernels to keep, per kernelspec name.
        path: the file listing the pool's kernels (:data:`POOL_FILE`).
        ready_timeout: seconds a new kernel has to answer ``kernel_info_request``.
        retry_delay: seconds between a failed start and the next try.
    """

    def __init__(
        self,
        manager: Any,
        sizes: Mapping[str, int],
        path: str,
        *,
        log: Any,
        ready_timeout: float = 60.0,
        retry_delay: float = 5.0,
    ) -> None:
        self.manager = manager
        self.sizes = {name: size for name, size in sizes.items() if size > 0}
        self.path = path
        self.log = log
        self.ready_timeout = ready_timeout
        self.retry_delay = retry_delay
        self.ready: dict[str, collections.deque[Any]] = {
            name: collections.deque() for name in self.sizes
        }
        self._starting: dict[str, Any] = {}  # kernel id -> its manager, while it starts
        self._fillers: dict[str, asyncio.Task[None]] = {}
        self._closed = False
        #: Kernels handed out so far, per kernelspec (for the status and the tests).
        self.taken: collections.Counter[str] = collections.Counter()
        #: Why the last start of a kernelspec failed, until one succeeds.
        self.errors: dict[str, str] = {}

    # -- the kernel manager's side -------------------------------------------------------

    def take(self, kernel_name: str) -> Any | None:
        """A ready kernel's manager of ``kernel_name``, removed from the pool (never given
        out again), or None if none is ready; the pool starts another in its place."""
        ready = self.ready.get(kernel_name)
        if not ready or self._closed:
            return None
        km = ready.popleft()
        self.taken[kernel_name] += 1
        self._save()
        self._fill(kernel_name)
        self.log.info(
            "Kernel %s (%s) handed out from the pool; %d ready", km.kernel_id, kernel_name,
            len(ready),
        )  # fmt: skip
        return km

    def status(self) -> dict[str, dict[str, int]]:
        """Per kernelspec: the size asked for, ready kernels, kernels starting, handed out."""
        starting = collections.Counter(km.kernel_name for km in self._starting.values())
        return {
            name: {
                "size": size,
                "ready": len(self.ready[name]),
                "starting": starting[name],
                "taken": self.taken[name],
            }
            for name, size in self.sizes.items()
        }

    def health(self) -> ComponentHealth:
        """``degraded`` while a kernelspec's starts fail (its starts are cold meanwhile)."""
        details: dict[str, Any] = {"kernelspecs": self.status()}
        if self.errors:
            details["errors"] = dict(self.errors)
            return ComponentHealth("kernel_pool", State.DEGRADED, "start_failed", details)
        return ComponentHealth("kernel_pool", State.OK, None, details)

    # -- opening and closing ---------------------------------------------------------------

    async def open(self) -> None:
        """Stop what an earlier run's pool left running, then start filling."""
        await self._stop_leftovers()
        self._save()
        for name in self.sizes:
            self._fill(name)

    async def close(self, timeout: float = 30.0) -> None:
        """Stop filling and shut every pooled kernel down (the server is stopping)."""
        self._closed = True
        fillers = list(self._fillers.values())
        for task in fillers:
            task.cancel()
        if fillers:
            await asyncio.wait(fillers, timeout=timeout)
        kernels = [km for ready in self.ready.values() for km in ready]
        kernels += list(self._starting.values())
        for ready in self.ready.values():
            ready.clear()
        self._starting.clear()
        if kernels:
            await asyncio.wait(
                [asyncio.ensure_future(self._shut_down(km)) for km in kernels], timeout=timeout
            )
        self._save()

    # -- filling ---------------------------------------------------------------------------

    def _fill(self, kernel_name: str) -> None:
        if self._closed or kernel_name in self._fillers:
            return
        task = asyncio.ensure_future(self._filler(kernel_name))
        self._fillers[kernel_name] = task
        task.add_done_callback(lambda _: self._fillers.pop(kernel_name, None))

    async def _filler(self, kernel_name: str) -> None:
        """Start kernels of ``kernel_name`` one at a time until the pool holds its size."""
        while not self._closed and len(self.ready[kernel_name]) < self.sizes[kernel_name]:
            began = time.monotonic()
            try:
                km = await self._start_one(kernel_name)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                self.errors[kernel_name] = str(error) or type(error).__name__
                self.log.error(
                    "The pool could not start a %s kernel: %s (again in %.0f s)",
                    kernel_name, error, self.retry_delay,
                )  # fmt: skip
                await asyncio.sleep(self.retry_delay)
                continue
            self.errors.pop(kernel_name, None)
            self.ready[kernel_name].append(km)
            self._save()
            self.log.info(
                "Pooled kernel %s (%s) ready in %.2f s; %d ready", km.kernel_id, kernel_name,
                time.monotonic() - began, len(self.ready[kernel_name]),
            )  # fmt: skip

    async def _start_one(self, kernel_name: str) -> Any:
        """Start a kernel as the kernel manager would, and wait until it answers."""
        manager = self.manager
        kwargs: dict[str, Any] = {}
        # MultiKernelManager's own: a kernel manager of the configured class, named by a
        # fresh kernel id, with its connection file in the server's runtime directory.
        km: Any
        km, _, kernel_id = MultiKernelManager.pre_start_kernel(manager, kernel_name, kwargs)
        kwargs = manager._kernel_start_kwargs(**kwargs)
        kwargs["kernel_id"] = kernel_id
        kwargs["cwd"] = self.cwd
        self._starting[kernel_id] = km
        self._save()
        try:
            await km.start_kernel(**kwargs)
            await self._answers(km)
        except BaseException:
            self._starting.pop(kernel_id, None)
            with contextlib.suppress(Exception):
                await asyncio.shield(self._shut_down(km))
            self._save()
            raise
        self._starting.pop(kernel_id, None)
        km.from_pool = True
        return km

    @property
    def cwd(self) -> str:
        """Where pooled kernels start: the server's root directory."""
        return str(self.manager.cwd_for_path(""))

    async def _answers(self, km: Any) -> None:
        """Until the kernel answers a ``kernel_info_request`` on its shell channel."""
        client = km.client()
        client.start_channels(iopub=False, stdin=False, hb=False, control=False)
        deadline = time.monotonic() + self.ready_timeout
        try:
            while True:
                msg_id = client.kernel_info()
                with contextlib.suppress(Exception):
                    while True:
                        reply = await client.get_shell_msg(timeout=1)
                        if reply["parent_header"].get("msg_id") == msg_id:
                            return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no kernel_info_reply in {self.ready_timeout:.0f} s")
                if not km.has_kernel or not await km.is_alive():
                    raise RuntimeError("the kernel exited while it started")
        finally:
            client.stop_channels()

    async def _shut_down(self, km: Any) -> None:
        try:
            if km.has_kernel:
                await km.shutdown_kernel(now=True)
            else:
                await km.cleanup_resources()
        except Exception as error:
            self.log.warning("Shutting pooled kernel %s down failed: %s", km.kernel_id, error)

    # -- what an earlier run left ------------------------------------------------------------

    def _save(self) -> None:
        """List the pool's kernels (ready and starting) in :attr:`path`, with what stops
        one after a crash: its process group, its provisioner's state."""
        kernels = [km for ready in self.ready.values() for km in ready]
        kernels += list(self._starting.values())
        entries = [self._entry(km) for km in kernels]
        temporary = f"{self.path}.tmp"
        try:
            with open(temporary, "w") as file:
                json.dump({"kernels": entries}, file)
            os.replace(temporary, self.path)
        except OSError as error:
            self.log.warning("Cannot write %s: %s", self.path, error)

    @staticmethod
    def _entry(km: Any) -> dict[str, Any]:
        provisioner = km.provisioner
        pid = getattr(provisioner, "pid", None)
        entry: dict[str, Any] = {
            "kernel_id": km.kernel_id,
            "kernel_name": km.kernel_name,
            "connection_file": km.connection_file,
            "pid": pid,
            "pgid": getattr(provisioner, "pgid", None),
            "pid_start": process_start_time(pid) if pid else None,
        }
        network = getattr(provisioner, "network", None)
        if network is not None:
            entry["network"] = network.as_dict()
        return entry

    async def _stop_leftovers(self) -> None:
        try:
            with open(self.path) as file:
                entries = json.load(file).get("kernels", [])
        except FileNotFoundError:
            return
        except (OSError, ValueError) as error:
            self.log.warning("Cannot read %s: %s", self.path, error)
            return
        for entry in entries:
            try:
                await self._stop_leftover(entry)
            except Exception as error:
                self.log.warning(
                    "Could not stop pooled kernel %s of an earlier run: %s",
                    entry.get("kernel_id"), error,
                )  # fmt: skip

    async def _stop_leftover(self, entry: Mapping[str, Any]) -> None:
        pid, pgid, started = entry.get("pid"), entry.get("pgid"), entry.get("pid_start")
        if pid and started is not None and process_start_time(pid) == started:
            try:
                os.killpg(pgid or pid, signal.SIGKILL)
            except OSError:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        if entry.get("network") is not None:
            # A netns or sandbox kernel: its provisioner deletes what it made (the
            # namespace, the veth pair, the kernel user's processes and storage).
            spec = self.manager.kernel_spec_manager.get_kernel_spec(entry["kernel_name"])
            factory = KernelProvisionerFactory.instance(parent=self.manager)
            provisioner = factory.create_provisioner_instance(
                entry["kernel_id"], spec, parent=self.manager
            )
            await provisioner.load_provisioner_info({**entry, "connection_info": {}})
            await provisioner.cleanup(restart=False)
        with contextlib.suppress(OSError):
            os.unlink(entry["connection_file"])
        self.log.info("Stopped pooled kernel %s, left by an earlier run", entry.get("kernel_id"))
