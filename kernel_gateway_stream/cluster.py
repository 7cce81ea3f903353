"""Several gateways, one set of kernels: the kernel directory, leases, takeover and the
record bus, over Redis (:mod:`.stores.redis` has the keys).

Every node runs a :class:`ClusterNode` when ``GatewayStreamApp.redis_url`` is set.

* **Directory.** The kernels of every node are in one Redis hash (how to reach each: its
  connection info). Each node attaches every kernel of the directory by that connection
  info, so ``/api/kernels`` on any node lists every kernel and every surface works on
  every node. A client's shell, control and stdin on node B go from B's own sockets
  straight to the kernel (ZMQ DEALERs, as for any attached kernel): replies are routed by
  socket identity, so no other node is on their path and none has to forward them. The
  cost: every node must reach every kernel's ports (as a takeover needs anyway).
* **Ownership.** One node records each kernel (reads its IOPub and numbers the records):
  the node holding the kernel's lease, a Redis key taken with ``SET NX PX`` and a fencing
  token (``INCR``), renewed every ``sync_interval``. The transcript's appends go through
  a script that checks the lease value, so a node that lost the lease cannot write.
* **Record bus.** The other nodes *follow* the kernel: one ``XREAD BLOCK`` per node, on a
  connection of its own, reads the streams of every followed kernel and hands each record
  to the kernel's Tap in following mode (:meth:`.tap.KernelTap.deliver`), which feeds the
  node's own fan-out (coalescer, subscribers). The bus carries records, not frames.
* **Takeover.** When a lease expires (its owner died or was cut off for ``lease_ttl``),
  the first node to take it catches its follower up to what the old owner wrote, writes a
  gap record for the numbers the old owner may have given out unwritten and for what the
  kernel printed while nobody read its IOPub (``owner_lost``, an unknown count), and
  reads the kernel's IOPub itself from there (:meth:`.tap.KernelTap.promote`).
* **Trust.** Code in a kernel may reach Redis. A node refuses to start without a cluster
  secret, or on a Redis that answers a client giving no password (unless
  ``allow_unauthenticated_redis``); it signs its URL and its kernels' directory entries
  with the secret, and acts on no entry that does not check: a request is forwarded, with
  the gateway's token, only to a URL a node signed (:mod:`.stores.redis_trust`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import sys
import time
import uuid
from typing import Any

from traitlets import Bool, Float, Unicode
from traitlets.config import LoggingConfigurable

from .core.errors import (
    KernelOnAnotherNode,
    LocalError,
    MalformedMessage,
    NodeNotTrusted,
    UnsafeCluster,
    UntrustedEntry,
)
from .core.health import ComponentHealth, State
from .kernels.attached import Attachment
from .secrets import wipe_from_arguments
from .stores.redis import RedisTranscriptStore, connect, entry_id, record_of_entry, seq_of
from .stores.redis_trust import (
    EntrySigner,
    answers_without_credentials,
    password_of,
    redact_url,
)

__all__ = ["ClusterNode"]

#: The shortest cluster secret a node starts with (characters).
MIN_SECRET_LENGTH = 16

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class ClusterNode(LoggingConfigurable):
    """This node's part in a cluster of gateways sharing Redis (see the module docstring)."""

    node_name = Unicode(
        "",
        config=True,
        help="This node's name in leases and logs. Empty: host name, process id and a random "
        "suffix (a restarted node is a new node: it takes its kernels back like any other).",
    )
    lease_ttl = Float(
        10.0,
        config=True,
        help="Seconds a kernel's lease lasts without renewal: how long after its owner dies "
        "another node takes the kernel over (plus up to sync_interval).",
    )
    sync_interval = Float(
        1.0,
        config=True,
        help="Seconds between two passes over the kernel directory: leases renewed, new kernels "
        "followed, expired leases taken over, kernels gone let go. At most lease_ttl / 3.",
    )
    advertise_url = Unicode(
        "",
        config=True,
        help="The URL other nodes reach this node at, for the requests they forward to the "
        "node recording a kernel (shutdown, restart). Empty: http://<ServerApp.ip, or this "
        "host's name when it listens on every address>:<port><base_url>. Every node must "
        "accept the others' token: give all nodes the same one.",
    )
    allow_unauthenticated_redis = Bool(
        False,
        config=True,
        help="Start even though Redis answers a client that gives no password (no "
        "requirepass, or an ACL whose default user needs none). Code in a kernel that reaches "
        "Redis can then delete and rewrite transcripts, take kernels' leases and stop nodes "
        "recording them, and read every kernel's output: only for a Redis no kernel can reach "
        "(another network, a firewall). Node and directory entries are signed with the "
        "cluster secret either way, so such code cannot redirect a node's requests.",
    )
    bus_block = Float(
        0.5,
        config=True,
        help="Seconds one XREAD of the record bus blocks waiting for records (a kernel followed "
        "anew waits at most this long to be read).",
    )

    def __init__(
        self,
        store: RedisTranscriptStore,
        taps: Any,
        attacher: Any,
        kernel_manager: Any,
        secret: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.store = store
        self._secret_length = len(secret)
        self.signer = EntrySigner(secret.encode())
        store.signer = self.signer
        self.taps = taps
        self.attacher = attacher
        self.kernel_manager = kernel_manager
        self.node = self.node_name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        #: Kernels this node records: kernel id -> lease value.
        self.leases: dict[str, str] = {}
        #: Kernels this node follows: kernel id -> the last seq read off the bus.
        self.followed: dict[str, int] = {}
        #: The directory's entry of each kernel, as last read.
        self.links: dict[str, dict[str, Any]] = {}
        self.takeovers = 0
        self.delivered = 0
        self.bus_errors = 0
        self.last_error: str | None = None
        #: This node's URL for the others (set by the application) and its token.
        self.url = self.advertise_url
        self.token = ""
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._bus: Any = None
        store.on_fenced.append(self._fenced)
        store.reacquire = self._reacquire
        taps.on_close(self._tap_closed)

    # -- trust -----------------------------------------------------------------------

    def refuse_unsafe_start(self) -> None:
        """Called by the application before the node starts: the start is refused without
        a cluster secret, and on a Redis that answers a client giving no password unless
        :attr:`allow_unauthenticated_redis`.

        Raises:
            UnsafeCluster: the start is refused (the message says why, in one line).
        """
        if self._secret_length < MIN_SECRET_LENGTH:
            raise UnsafeCluster(
                "several nodes need a cluster secret of at least "
                f"{MIN_SECRET_LENGTH} characters, the same on every node: set the "
                "KGS_CLUSTER_SECRET environment variable (or GatewayStreamApp.cluster_secret)"
            )
        where = redact_url(self.store.url)
        open_to_all = answers_without_credentials(self.store.url, self.store.keys.nodes)
        if open_to_all is False:
            return
        what = "answers" if open_to_all else "could not be asked whether it answers"
        if not self.allow_unauthenticated_redis:
            raise UnsafeCluster(
                f"refusing to run as one node of several: Redis at {where} {what} a client "
                "that gives no password, so code in a kernel could rewrite the cluster's "
                "state: give Redis a password (requirepass or an ACL) and put it in "
                "KGS_REDIS_URL, or set --ClusterNode.allow_unauthenticated_redis=True"
            )
        self.log.warning(
            "Redis at %s %s a client that gives no password (allow_unauthenticated_redis): "
            "code in a kernel that reaches it can rewrite transcripts and leases",
            where, what,
        )  # fmt: skip

    def hide_password_from_arguments(self) -> None:
        """Redis's password given on the command line (``--GatewayStreamApp.redis_url``) is
        readable by every local user (``/proc/<pid>/cmdline``, ``ps``): overwrite it there
        (Linux) and say to use the environment instead. Called by the application."""
        password = password_of(self.store.url)
        if not password or not any(password in argument for argument in sys.argv):
            return
        wiped = wipe_from_arguments([password])
        self.log.warning(
            "Redis's password was given on the command line, where every local user can "
            "read it%s: give the URL in the KGS_REDIS_URL environment variable instead",
            " (overwritten in this process's arguments now, visible until then)" if wiped else "",
        )  # fmt: skip

    # -- ownership -------------------------------------------------------------------

    async def claim(self, kernel_id: str) -> bool:
        """Take the kernel's lease (or keep it); False if another node holds it. Called by
        the TapManager before it starts a Tap. A kernel with a transcript already (its owner
        died before this node ever followed it) is numbered on after a gap record."""
        had = kernel_id in self.leases
        value = await self.store.acquire(kernel_id, self.node, self.lease_ttl)
        if value is None:
            return False
        self._hold(kernel_id, value)
        if not had:
            gap = await self.store.take_over(kernel_id, value, "owner_lost")
            self._after_hand_over(kernel_id)
            if gap is not None:
                self.takeovers += 1
                self.log.warning(
                    "Took kernel %s over at seq %d (gap %d-%d)",
                    kernel_id, gap.seq + 1, gap.first_seq, gap.seq,
                    extra={"kernel_id": kernel_id},
                )  # fmt: skip
        return True

    def _after_hand_over(self, kernel_id: str) -> None:
        """Handed over cleanly: no gap, unless the kernel, which held its output meanwhile,
        says it had to drop some (its hold notice; as after a restart of one gateway)."""
        if kernel_id in self.store.handed_over:
            self.store.handed_over.discard(kernel_id)
            self.taps.pending_gaps[kernel_id] = "owner_stopped"
            self.log.info("Kernel %s was handed over cleanly", kernel_id)

    async def hand_over(self, timeout: float) -> list[str]:
        """A graceful stop: every kernel this node records is handed to the others. Each is
        told to hold its output, what it sent before is recorded and written, and its lease
        is released for a survivor to take at once (instead of after ``lease_ttl``). The
        kernels keep running: the caller lets go of them without shutting them down.
        Returns the kernels handed over."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        released: dict[str, bool] = {}
        for kernel_id in list(self.leases):
            tap = self.taps.taps.get(kernel_id)
            if tap is None or tap.closed or tap.following or not tap.ready.done():
                # A kernel still starting dies with the server's shutdown: not handed over
                # (the stop forgets it, and it leaves the directory).
                continue
            left = max(0.1, deadline - loop.time())
            released[kernel_id] = await tap.release(quiet=0.2, timeout=min(5.0, left))
        written = await self.store.flush(max(0.1, deadline - loop.time()))
        handed = []
        for kernel_id, quiet in released.items():
            value = self.leases.pop(kernel_id)
            self.store.leases.pop(kernel_id, None)
            clean = quiet and written and kernel_id not in self.store.fenced
            try:
                if await self.store.hand_over(kernel_id, value, clean):
                    handed.append(kernel_id)
            except Exception as error:  # Redis gone: the lease expires, a survivor takes over
                self.log.error("Could not hand kernel %s over: %s", kernel_id, error)
                handed.append(kernel_id)
            self.log.info(
                "Handed kernel %s over%s", kernel_id, "" if clean else " (with a gap)",
                extra={"kernel_id": kernel_id},
            )  # fmt: skip
        return handed

    def _hold(self, kernel_id: str, value: str) -> None:
        self.leases[kernel_id] = value
        self.store.leases[kernel_id] = value
        self.store.fenced.discard(kernel_id)

    def follow(self, tap: Any) -> None:
        """Read ``tap``'s kernel off the bus from the tap's head on."""
        self.followed[tap.kernel_id] = tap.head
        self._wake.set()

    def owner_here(self, kernel_id: str) -> bool:
        return kernel_id in self.leases

    # -- life ------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._sync_loop()), loop.create_task(self._bus_loop())]

    async def stop(self) -> None:
        """Stop syncing and reading (the node is stopping). Leases are not released: the
        node's own kernels are shut down by the server after this, and a crash would not
        release them either."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self._bus is not None:
            with contextlib.suppress(Exception):
                await self._bus.aclose()

    def followers(self) -> list[Any]:
        return [tap for tap in self.taps.taps.values() if tap.following]

    async def _sync_loop(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.sync()
                took = time.monotonic() - started
                if took > self.lease_ttl / 3:
                    self.log.warning("A pass over the kernel directory took %.1f s", took)
                if self.last_error is not None:
                    self.log.info("The kernel directory in Redis is reachable again")
                self.last_error = None
            except asyncio.CancelledError:
                raise
            except Exception as error:  # Redis unreachable: try again next time
                if self.last_error is None:
                    self.log.error("Syncing with the kernel directory failed: %s", error)
                self.last_error = str(error)
            await asyncio.sleep(self.sync_interval)

    async def sync(self) -> None:
        """One pass: renew this node's leases, follow new kernels, take over kernels whose
        owner is gone, let go of kernels that left the directory."""
        if self.url:
            await self.store.save_node(self.node, self.url)
        for kernel_id, value in list(self.leases.items()):
            renewed = await self.store.renew(kernel_id, value, self.lease_ttl)
            if not renewed and not await self._reacquire(kernel_id):
                self._lost(kernel_id, "lease expired")
        links = await self.store.load_links()
        self.links = links
        for kernel_id, link in links.items():
            if kernel_id in self.leases:
                continue
            tap = self.taps.taps.get(kernel_id)
            try:
                if tap is None:
                    await self._join(kernel_id, link)
                elif tap.following and await self.store.holder(kernel_id) is None:
                    await self._take_over(tap, link)
            except (LocalError, KeyError, TypeError, ValueError) as error:
                self.log.warning(
                    "Kernel %s of the directory: %s", kernel_id, error,
                    extra={"kernel_id": kernel_id},
                )  # fmt: skip
        for tap in self.followers():
            if tap.kernel_id not in links:
                await self._let_go(tap)

    async def join_now(self, kernel_id: str) -> None:
        """Join ``kernel_id`` at once if the directory has it (a request for a kernel
        started on another node since the last sync)."""
        if not _UUID.fullmatch(kernel_id):
            return
        try:
            link = await self.store.load_link(kernel_id)
            if link is not None:
                await self._join(kernel_id, link)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # unreachable, or not joinable now: 404 as unknown
            self.log.warning("Could not join kernel %s: %s", kernel_id, error)

    async def _join(self, kernel_id: str, link: dict[str, Any]) -> None:
        """A kernel of the directory this node does not know yet: attach it by its
        connection info (no process of its to watch: the owner watches it) and start its
        Tap, which follows it (or records it, if its lease is free)."""
        if kernel_id not in self.kernel_manager:
            attachment = Attachment.from_json(link["attachment"])
            await self.attacher.attach(
                attachment.connection_info,
                kernel_id=kernel_id,
                kernel_name=link.get("kernel_name"),
                display_name=attachment.display_name,
                source="cluster",
                owned=False,
                language=attachment.language,
            )
        await self.taps.ensure(kernel_id)

    async def _take_over(self, tap: Any, link: dict[str, Any]) -> None:
        kernel_id = tap.kernel_id
        value = await self.store.acquire(kernel_id, self.node, self.lease_ttl)
        if value is None:
            return  # another node was first
        started = time.monotonic()
        self._hold(kernel_id, value)
        self.followed.pop(kernel_id, None)
        await self.catch_up(tap)
        gap = await self.store.take_over(kernel_id, value, "owner_lost")
        self._after_hand_over(kernel_id)
        if gap is not None:
            tap.deliver(gap)
        # This node now answers for the kernel as its first owner did: a kernel the
        # gateway started is shut down (not detached) when asked to.
        kernel = self.kernel_manager.get_kernel(kernel_id)
        with contextlib.suppress(KeyError, TypeError, ValueError):
            original = Attachment.from_json(link["attachment"])
            kernel.attachment.owned = original.owned
            kernel.attachment.pid = original.pid
            kernel.stop_on_shutdown = original.owned
        tap.promote()
        self.taps.remember(kernel_id)
        self.takeovers += 1
        self.log.warning(
            "Took kernel %s over (its owner's lease expired) at seq %d in %.3f s",
            kernel_id, tap.head + 1, time.monotonic() - started,
            extra={"kernel_id": kernel_id},
        )  # fmt: skip

    async def catch_up(self, tap: Any) -> None:
        """Deliver to a follower what its kernel's stream holds past the follower's head."""
        key = self.store.keys.of(tap.kernel_id, "log")
        while True:
            entries = await self.store.redis.xrange(key, entry_id(tap.head + 1), "+", count=1000)
            for entry, fields in entries:
                with contextlib.suppress(MalformedMessage):
                    tap.deliver(record_of_entry(tap.kernel_id, fields))
                tap.sequencer.head = max(tap.sequencer.head, seq_of(entry))
            if len(entries) < 1000:
                return

    async def _let_go(self, tap: Any) -> None:
        """A followed kernel left the directory (its owner recorded its end): deliver what
        is left, and forget it here (its kernel manager detaches; the kernel is not
        touched)."""
        kernel_id = tap.kernel_id
        with contextlib.suppress(Exception):
            await self.catch_up(tap)
        self.followed.pop(kernel_id, None)
        if kernel_id in self.kernel_manager:
            kernel = self.kernel_manager.get_kernel(kernel_id)
            kernel.stop_on_shutdown = False
            with contextlib.suppress(Exception):
                await self.kernel_manager.shutdown_kernel(kernel_id)
        self.taps.close_tap(kernel_id)

    def _lost(self, kernel_id: str, why: str) -> None:
        """This node no longer holds the kernel's lease: it follows the kernel again."""
        if self.leases.pop(kernel_id, None) is None:
            return
        self.store.leases.pop(kernel_id, None)
        tap = self.taps.taps.get(kernel_id)
        self.log.error(
            "Lost the lease of kernel %s (%s): following it from now on", kernel_id, why,
            extra={"kernel_id": kernel_id},
        )  # fmt: skip
        if tap is not None and not tap.closed:
            tap.demote()
            self.follow(tap)

    async def _reacquire(self, kernel_id: str) -> bool:
        """The store's append found this node's lease gone: take it again if nobody else
        took it or wrote since (this node was only late renewing it)."""
        if kernel_id not in self.leases:
            return False
        value = await self.store.acquire_again(kernel_id, self.node, self.lease_ttl)
        if value is None:
            return False
        self._hold(kernel_id, value)
        self.log.warning(
            "Kernel %s: this node's lease ran out before it was renewed; taken again",
            kernel_id, extra={"kernel_id": kernel_id},
        )  # fmt: skip
        return True

    def _fenced(self, kernel_id: str) -> None:
        self._lost(kernel_id, "another node appends to its transcript")

    def _tap_closed(self, kernel_id: str, head: int) -> None:
        self.followed.pop(kernel_id, None)
        value = self.leases.pop(kernel_id, None)
        if value is not None:
            # Once its last records (the kernel's end) are written: released before, the
            # lease would no longer be this node's when the writer gets to them.
            task = asyncio.ensure_future(self._release_when_written(kernel_id, value))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _release_when_written(self, kernel_id: str, value: str) -> None:
        try:
            await self.store.flush(self.lease_ttl)
            await self.store.release(kernel_id, value)
        finally:
            if self.store.leases.get(kernel_id) == value:
                del self.store.leases[kernel_id]

    # -- requests only the owner can serve ---------------------------------------------

    async def forward(
        self, kernel_id: str, method: str, path: str, body: bytes | None = None
    ) -> tuple[int, bytes, str]:
        """Send ``method path`` to the node recording ``kernel_id`` (with this node's token:
        the request was authenticated and authorized here); its status, body and type. The
        node's URL is read from Redis and used only if its entry is signed with the
        cluster secret.

        Raises:
            KernelOnAnotherNode: no node records it right now (a takeover is under way),
                or that node does not answer.
            NodeNotTrusted: that node's entry is not signed with the cluster secret:
                nothing was sent.
        """
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError

        holder = await self.store.holder(kernel_id)
        node = holder.rpartition(":")[0] if holder else None
        try:
            url = await self.store.node_url(node) if node and node != self.node else None
        except UntrustedEntry as error:
            self.log.error(
                "Kernel %s: not forwarding %s %s to node %r: %s",
                kernel_id, method, path, node, error, extra={"kernel_id": kernel_id},
            )  # fmt: skip
            raise NodeNotTrusted(
                f"the entry in Redis of the node recording kernel {kernel_id} is not signed "
                "with the cluster secret: the request was not forwarded"
            ) from error
        if node is None or url is None:
            raise KernelOnAnotherNode(
                f"no node records kernel {kernel_id} right now (a takeover is under way): "
                "try again in a few seconds"
            )
        headers = {"Authorization": f"token {self.token}"} if self.token else {}
        if body is not None:
            headers["Content-Type"] = "application/json"
        target = url.rstrip("/") + path
        try:
            response = await AsyncHTTPClient().fetch(
                target,
                method=method,
                headers=headers,
                body=body,
                allow_nonstandard_methods=True,
                raise_error=False,
                request_timeout=60,
            )
        except (OSError, HTTPClientError) as error:
            raise KernelOnAnotherNode(
                f"node {node}, which records kernel {kernel_id}, does not answer ({error})"
            ) from error
        if response.code == 599:
            raise KernelOnAnotherNode(
                f"node {node}, which records kernel {kernel_id}, does not answer ({response.error})"
            )
        return response.code, response.body or b"", response.headers.get("Content-Type", "")

    # -- the record bus --------------------------------------------------------------

    async def _bus_loop(self) -> None:
        # A connection of its own: a blocking read must not share one with requests, and
        # the socket timeout must outlast the block (redis-py 8 defaults to 5 s).
        self._bus = connect(
            self.store.url,
            socket_timeout=self.bus_block + 30,
            socket_connect_timeout=5,
            single_connection_client=True,
        )
        keys = self.store.keys
        failing = False
        while True:
            if not self.followed:
                self._wake.clear()
                await self._wake.wait()
                continue
            streams = {keys.of(k, "log"): entry_id(last) for k, last in self.followed.items()}
            try:
                reply = await self._bus.xread(streams, count=1000, block=int(self.bus_block * 1000))
            except asyncio.CancelledError:
                raise
            except Exception as error:
                self.bus_errors += 1
                if not failing:
                    self.log.error("Reading the record bus failed: %s", error)
                failing = True
                await asyncio.sleep(0.5)
                continue
            if failing:
                self.log.info("Reading the record bus works again")
            failing = False
            for key, entries in _streams(reply):
                kernel_id = _kernel_of(key)
                if kernel_id not in self.followed:
                    continue
                tap = self.taps.taps.get(kernel_id)
                for entry, fields in entries:
                    self.followed[kernel_id] = seq_of(entry)
                    if tap is None:
                        continue
                    try:
                        record = record_of_entry(kernel_id, fields)
                    except MalformedMessage:
                        self.log.warning("Kernel %s: entry %s is not a record", kernel_id, entry)
                        continue
                    tap.deliver(record)
                    self.delivered += 1

    def health(self) -> ComponentHealth:
        details = {
            "node": self.node,
            "recording": sorted(self.leases),
            "following": sorted(self.followed),
            "takeovers": self.takeovers,
            "records_from_bus": self.delivered,
            "bus_errors": self.bus_errors,
            "last_error": self.last_error,
        }
        if self.last_error is not None:
            return ComponentHealth("cluster", State.DEGRADED, "directory_unreachable", details)
        return ComponentHealth("cluster", State.OK, None, details)


def _streams(reply: Any) -> list[tuple[Any, list[Any]]]:
    """XREAD's reply as ``[(key, entries)]``, in RESP2's shape or RESP3's."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [(key, value[0] if value and isinstance(value[0], list) else value)
                for key, value in reply.items()]  # fmt: skip
    return [(key, entries) for key, entries in reply]


def _kernel_of(key: Any) -> str:
    text = key.decode() if isinstance(key, bytes) else str(key)
    return text[text.index("{") + 1 : text.index("}")]
