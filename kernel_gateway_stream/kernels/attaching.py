"""Attaching kernels by connection info: through the API, and from a watched directory.

:class:`KernelAttacher` checks a kernel's connection info, makes sure the kernel answers
(a ``kernel_info_request`` signed with its key: a wrong address, port or key fails here,
with a clear error, not later as a silent socket), and starts it in the server's kernel
manager as an attached kernel (:mod:`.attached`). With ``connection_dir`` set it watches a
directory of connection files: a file that appears is attached, one that goes is
detached, one that changes (its kernel restarted by its owner on new ports) is attached
again. A kernel attached from a file keeps its id across detach and attach (the file's
``kernel_id``, else the id in its name ``kernel-<id>.json``, else one derived from its
key), so its transcript numbers on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
import uuid
from typing import Any

from tornado.ioloop import PeriodicCallback
from traitlets import Float, Unicode
from traitlets.config import LoggingConfigurable

from ..core.connection import check_connection_info
from ..core.errors import InvalidConnectionInfo, KernelExists, KernelNotAnswering, LocalError
from .attached import Attachment, delete_owned_network, process_is
from .mapping import StreamMappingKernelManager
from .zmq_kernel import KernelSockets

__all__ = ["KernelAttacher", "kernel_id_of_file"]

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NAMESPACE = uuid.UUID("6f1c1f8e-0b7e-4a53-9a55-6b3c9d2f0e11")
#: Seconds the heartbeat of a kernel of the previous run is asked for when the process the
#: gateway started for it is no longer on this host (it died with the gateway: a kill of
#: the service's whole control group, an out-of-memory kill): it is asked at all only in
#: case it is reachable after all, and is not waited for ``attach_timeout`` while every
#: surface waits for the recovery to end.
GONE_PROCESS_PING = 1.0


def process_exists(pid: int) -> bool:
    """True if this host has a live process ``pid`` (whoever owns it): not one that has
    ended and waits to be reaped (a zombie, where the init system does not reap)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            # "pid (command) state ...": the command may hold spaces and parentheses.
            state = file.read().rpartition(b")")[2].split()[:1]
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: ask the kernel the plain way
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:  # EPERM: it exists, and is another user's
            return True
        return True
    return state not in ([b"Z"], [b"X"])


def kernel_id_of_file(path: str, data: dict[str, Any]) -> str:
    """The id a kernel attached from connection file ``path`` gets, stable across detach
    and attach."""
    named = data.get("kernel_id")
    if isinstance(named, str) and _UUID.fullmatch(named):
        return named
    found = _UUID.search(os.path.basename(path))
    if found:
        return found.group(0)
    return str(uuid.uuid5(_NAMESPACE, f"{data.get('key', '')}:{os.path.realpath(path)}"))


class KernelAttacher(LoggingConfigurable):
    """Attaches kernels by connection info (see the module docstring)."""

    connection_dir = Unicode(
        "",
        config=True,
        help="A directory of kernel connection files to watch: each file that appears is "
        "attached (its kernel runs on when the file goes: it is detached). Empty: none.",
    )
    connection_dir_interval = Float(
        2.0, config=True, help="Seconds between two scans of connection_dir."
    )
    attach_timeout = Float(
        10.0,
        config=True,
        help="Seconds a kernel to attach has to answer a kernel_info_request before the "
        "attach fails (400 kernel_not_answering; a watched file is tried again later).",
    )

    def __init__(self, kernel_manager: Any, sockets: KernelSockets, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kernel_manager = kernel_manager
        self.sockets = sockets
        #: Watched files: path -> (mtime_ns, size, kernel_id or None if not attached).
        self._files: dict[str, tuple[int, int, str | None]] = {}
        self._refused_links: set[str] = set()
        self._scanner: PeriodicCallback | None = None
        self._scanning: asyncio.Task[None] | None = None

    async def attach(
        self,
        info: Any,
        *,
        kernel_id: str | None = None,
        kernel_name: str | None = None,
        display_name: str = "",
        source: str = "api",
        owned: bool = False,
        pid: int | None = None,
        language: str | None = None,
        network: dict[str, str] | None = None,
    ) -> str:
        """Attach the kernel at ``info``; its kernel id. ``language`` given: the kernel is
        known (re-attached after a restart of the gateway) and is not asked for its info.

        Raises:
            InvalidConnectionInfo: a field is missing or bad.
            KernelExists: ``kernel_id`` is a kernel the gateway has.
            KernelNotAnswering: no signed kernel_info_reply in ``attach_timeout``.
        """
        checked = check_connection_info(info)
        policy = getattr(self.kernel_manager, "transport_encryption", "disabled")
        if str(policy).lower() == "required" and "curve_publickey" not in checked:
            raise InvalidConnectionInfo(
                "this gateway requires encrypted kernel transports "
                "(MappingKernelManager.transport_encryption=required): the connection info "
                "has no CurveZMQ key pair"
            )
        if kernel_id is not None:
            if not _UUID.fullmatch(kernel_id):
                raise InvalidConnectionInfo("id must be a UUID in its canonical form")
            if kernel_id in self.kernel_manager:
                raise KernelExists(f"kernel {kernel_id} is running already")
        if language is None:
            reply = await self.sockets.probe(checked, self.attach_timeout)
            if reply is None:
                raise KernelNotAnswering(
                    f"no answer to a kernel_info_request at {checked['ip']} in "
                    f"{self.attach_timeout:.0f} s (is it running, are the ports and key right?)"
                )
            language_info = reply.get("language_info")
            name = language_info.get("name") if isinstance(language_info, dict) else None
            language = name if isinstance(name, str) else ""
        else:
            reply = {}
        attachment = Attachment(
            checked,
            display_name=display_name or f"{reply.get('implementation', 'kernel')} (attached)",
            language=language,
            owned=owned,
            pid=pid,
            source=source,
            network=network,
        )
        attached: str = await self.kernel_manager.start_kernel(
            kernel_name=kernel_name or "attached", kernel_id=kernel_id, attachment=attachment
        )
        self.log.info(
            "Attached kernel %s at %s (%s)",
            attached,
            checked["ip"],
            source,
            extra={"kernel_id": attached},
        )
        return attached

    async def recover(self, links: dict[str, dict[str, Any]], taps: Any, store: Any) -> None:
        """Re-attach the kernels an earlier run of the gateway left running (``links``, from
        the store): each that still answers gets its id back, its transcript numbered on
        above every seq given out before (with a gap record for what it printed unseen),
        and each that does not is reported and forgotten (a process of its that still
        runs on this host is killed: it no longer answers, and nobody else knows it)."""
        if not links:
            return
        if not isinstance(self.kernel_manager, StreamMappingKernelManager):
            # jupyter_server's own kernel manager cannot re-attach a kernel (and its kernels
            # die with the server): leave them be, and forget them.
            self.log.info(
                "Not re-attaching %d kernels of an earlier run: the kernel manager is not "
                "kernel_gateway_stream.kernels.StreamMappingKernelManager",
                len(links),
            )
            for kernel_id in links:
                store.save_link(kernel_id, None)
            return
        answers = await asyncio.gather(
            *(self._recover_one(kernel_id, link, taps) for kernel_id, link in links.items())
        )
        back = sum(1 for answered in answers if answered)
        self.log.warning(
            "Kernels left by the previous run: %d re-attached, %d no longer answer",
            back,
            len(answers) - back,
        )
        for (kernel_id, link), answered in zip(links.items(), answers, strict=True):
            if not answered:
                store.save_link(kernel_id, None)
                store.kernel_ended(kernel_id, time.time())
                self._reap(kernel_id, link)
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    attachment = Attachment.from_json(link["attachment"])
                    await delete_owned_network(attachment, self.log)

    async def _recover_one(self, kernel_id: str, link: dict[str, Any], taps: Any) -> bool:
        try:
            attachment = Attachment.from_json(link["attachment"])
            info = check_connection_info(attachment.connection_info)
            # Its heartbeat, not a kernel_info_request: a kernel busy with a long cell
            # may not answer that in time, and one that does not answer is killed below.
            timeout = self.attach_timeout
            if attachment.owned and attachment.pid and not process_exists(attachment.pid):
                timeout = min(timeout, GONE_PROCESS_PING)
            if not await self.sockets.ping(info, timeout):
                raise KernelNotAnswering(f"its heartbeat at {info['ip']} does not answer")
            taps.pending_gaps[kernel_id] = "gateway_restart"
            await self.attach(
                attachment.connection_info,
                kernel_id=kernel_id,
                kernel_name=link.get("kernel_name"),
                display_name=attachment.display_name,
                source="recovered",
                owned=attachment.owned,
                pid=attachment.pid,
                language=attachment.language,
                network=attachment.network,
            )
        except (KeyError, TypeError, LocalError) as error:
            taps.pending_gaps.pop(kernel_id, None)
            self.log.warning(
                "Kernel %s of the previous run is gone: %s", kernel_id, error,
                extra={"kernel_id": kernel_id},
            )  # fmt: skip
            return False
        return True

    def _reap(self, kernel_id: str, link: dict[str, Any]) -> None:
        attachment = link.get("attachment") or {}
        pid = attachment.get("pid")
        if attachment.get("owned") and isinstance(pid, int) and process_is(pid, kernel_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.log.warning("Killed process %d of kernel %s, which no longer answers",
                             pid, kernel_id)  # fmt: skip

    def start(self) -> None:
        """Begin watching :attr:`connection_dir` (if set)."""
        if not self.connection_dir:
            return
        self._scanner = PeriodicCallback(self._scan_soon, self.connection_dir_interval * 1000)
        self._scanner.start()
        self._scan_soon()

    def stop(self) -> None:
        if self._scanner is not None:
            self._scanner.stop()
            self._scanner = None
        if self._scanning is not None:
            self._scanning.cancel()

    def _scan_soon(self) -> None:
        if self._scanning is None or self._scanning.done():
            self._scanning = asyncio.ensure_future(self.scan())

    async def scan(self) -> None:
        """Attach what appeared or changed in :attr:`connection_dir`, detach what went."""
        try:
            names = [n for n in os.listdir(self.connection_dir) if n.endswith(".json")]
        except OSError as error:
            self.log.warning("Cannot read connection_dir %s: %s", self.connection_dir, error)
            return
        present: dict[str, tuple[int, int]] = {}
        for name in names:
            path = os.path.join(self.connection_dir, name)
            if self._leads_out(path):
                continue
            try:
                stat = os.stat(path)
            except OSError:
                continue
            present[path] = (stat.st_mtime_ns, stat.st_size)
        for path, (_, _, kernel_id) in list(self._files.items()):
            if path not in present:
                del self._files[path]
                await self._detach(kernel_id, f"{path} is gone")
        for path, (mtime, size) in present.items():
            known = self._files.get(path)
            if known is not None and known[:2] == (mtime, size) and known[2] is not None:
                continue
            if known is not None and known[:2] == (mtime, size):
                continue  # failed before, unchanged: not retried until it changes
            if known is not None and known[2] is not None:
                await self._detach(known[2], f"{path} changed")
            self._files[path] = (mtime, size, await self._attach_file(path))

    def _leads_out(self, path: str) -> bool:
        """True for a symbolic link out of the directory (logged once): a link to a
        running kernel's connection file elsewhere (the runtime directory) would attach
        that kernel a second time. Links within the directory are followed."""
        root = os.path.realpath(self.connection_dir)
        target = os.path.realpath(path)
        if not os.path.islink(path) or os.path.commonpath([root, target]) == root:
            self._refused_links.discard(path)
            return False
        if path not in self._refused_links:
            self._refused_links.add(path)
            self.log.warning("Did not attach %s: a symbolic link out of the directory", path)
        return True

    async def _attach_file(self, path: str) -> str | None:
        if self._leads_out(path):  # replaced by a link since the scan
            return None
        try:
            with open(path, encoding="utf-8") as file:
                data = json.load(file)
            if not isinstance(data, dict):
                raise InvalidConnectionInfo("not a JSON object")
            kernel_id = kernel_id_of_file(path, data)
            if kernel_id in self.kernel_manager:
                return kernel_id
            return await self.attach(
                data,
                kernel_id=kernel_id,
                kernel_name=data.get("kernel_name") or None,
                display_name=f"{os.path.basename(path)} (attached)",
                source="directory",
            )
        except (OSError, ValueError, LocalError) as error:
            self.log.warning("Did not attach the kernel of %s: %s", path, error)
            return None

    async def _detach(self, kernel_id: str | None, why: str) -> None:
        if kernel_id is None or kernel_id not in self.kernel_manager:
            return
        self.log.info("Detaching kernel %s: %s", kernel_id, why, extra={"kernel_id": kernel_id})
        try:
            await self.kernel_manager.shutdown_kernel(kernel_id)
        except Exception:  # a background scan's outermost frame: log it
            self.log.exception("Could not detach kernel %s", kernel_id)
