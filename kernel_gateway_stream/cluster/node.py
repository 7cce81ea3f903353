"""Several gateways, one set of kernels: the kernel directory, leases, takeover and the
record bus, over Redis (:mod:`..stores.redis` has the keys).

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
  token (``INCR``), renewed every ``sync_interval`` by a task of its own. The transcript's
  appends go through a script that checks the lease value, so a node that lost the lease
  cannot write, and a record reaches clients, the owner's own too, only once Redis wrote
  it (:mod:`..core.committed`). An owner that could not renew a lease for most of its TTL
  (Redis slow or away, the node paused) stops recording the kernel on its own clock
  (:func:`..core.ownership.step_down_at`): it forsakes what it numbered and did not write,
  ends its clients with ``lease_lost`` and their last seq (they resume on any node), and
  follows the kernel from the last record it published.
* **Record bus.** The other nodes *follow* the kernel: one ``XREAD BLOCK`` per node, on a
  connection of its own, reads the streams of every followed kernel and hands each record
  to the kernel's recorder in following mode
  (:meth:`..recording.recorder.KernelRecorder.deliver`), which feeds the node's own fan-out
  (coalescer, subscribers). The bus carries records, not frames (:mod:`.bus`).
* **Takeover.** When a lease expires (its owner died or was cut off for ``lease_ttl``),
  the first node to take it catches its follower up to what the old owner wrote, writes a
  gap record for the numbers the old owner may have given out unwritten and for what the
  kernel printed while nobody read its IOPub (``owner_lost``, an unknown count), and
  reads the kernel's IOPub itself from there (:meth:`..recording.recorder.KernelRecorder.promote`).
* **Redis forgetting.** Redis restarted empty, or failed over to a replica that lacked
  the last writes, is *state loss*, not the end of any kernel. Each pass checks Redis's
  incarnation key (``SET NX`` once; missing or changed: its data is gone) and its
  ``INFO`` run_id, and each owner checks that Redis still has its kernels' heads. The
  owner then writes back what it owns: the lease (a fencing token above every one it
  has seen), a gap record (``store_lost``) for the records Redis no longer has, and the
  directory entry; the node entry is written every pass. A follower never reads a
  kernel missing from the directory as gone unless its transcript says it ended (a
  tombstone); if no owner writes it back within ``lease_ttl``, it takes the kernel over.
  Nor does it take over a kernel whose lease is missing within ``lease_ttl`` of noticing
  the loss: its owner may be writing the lease back.
  Health says ``degraded`` while Redis is away, while this is rebuilt, and for
  ``store_loss_notice`` seconds after a loss.
* **Trust.** Code in a kernel may reach Redis. A node refuses to start without a cluster
  secret, or on a Redis that answers a client giving no password (unless
  ``allow_unauthenticated_redis``); it signs its URL and its kernels' directory entries
  with the secret, and acts on no entry that does not check: a request is forwarded, with
  the gateway's token, only to a URL a node signed (:mod:`..stores.redis_trust`).
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

from ..core.errors import (
    KernelOnAnotherNode,
    LocalError,
    MalformedMessage,
    NodeNotTrusted,
    UnsafeCluster,
    UntrustedEntry,
)
from ..core.health import ComponentHealth, State
from ..core.ownership import STEP_DOWN_MARGIN
from ..kernels.attached import Attachment
from ..kernels.attaching import KernelAttacher
from ..kernels.links import describe_link
from ..recording.recorder import KernelRecorder
from ..recording.registry import RecorderRegistry
from ..secrets import wipe_from_arguments
from ..stores.redis import RedisTranscriptStore, entry_id, record_of_entry, seq_of
from ..stores.redis_trust import (
    EntrySigner,
    answers_without_credentials,
    password_of,
    redact_url,
)
from .bus import RecordBus
from .leases import LeaseMap

__all__ = ["ClusterNode"]

#: The shortest cluster secret a node starts with (characters).
MIN_SECRET_LENGTH = 16
#: Seconds a stopping node waits for its sync loop and its bus reader to end.
STOP_TIMEOUT = 2.0

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
    stall_after = Float(
        1.0,
        config=True,
        help="Seconds a pass over the kernel directory may wait on Redis before health says "
        "the cluster is degraded (directory_stalled): a paused Redis, or one the network cut "
        "off, fails no request until the socket times out. A pass takes milliseconds; health "
        "may say ok for up to sync_interval + stall_after after Redis stops answering (after "
        "the last pass that ended well: a pass that a busy node starts late counts too).",
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
    store_loss_notice = Float(
        300.0,
        config=True,
        help="Seconds the node's health stays degraded (reason redis_data_lost) after it "
        "found that Redis lost its data (restarted empty, flushed, or failed over to a "
        "replica that lacked the last writes), once what it owns is written back.",
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
        taps: RecorderRegistry,
        attacher: KernelAttacher,
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
        #: The leases this node holds: the kernels it records.
        self.leases = LeaseMap(store, self.node, self.lease_ttl, self.log)
        #: The directory's entry of each kernel, as last read.
        self.links: dict[str, dict[str, Any]] = {}
        self.takeovers = 0
        self.last_error: str | None = None
        #: When the pass over the directory under way began (monotonic), else None.
        self._pass_started: float | None = None
        #: When the last pass over the directory ended well (None before the first).
        self._pass_ended: float | None = None
        #: This node's URL for the others (set by the application) and its token.
        self.url = self.advertise_url
        self.token = ""
        self._tasks: list[asyncio.Task[None]] = []
        #: The task renewing the leases (None until the node starts).
        self._renewing: asyncio.Task[None] | None = None
        self.bus = RecordBus(store, self.bus_block, self._follower, self.log)
        self.leases.on_fenced.append(self._fenced)
        self.leases.on_store_lost.append(lambda kernel_id: self._wake_all())
        #: Redis's incarnation id and run_id, as last read (None: not read yet).
        self.incarnation: str | None = None
        self.run_id: str | None = None
        #: How many times Redis was found to have lost data, why the last time, and when
        #: (monotonic).
        self.store_losses = 0
        self.store_loss: str | None = None
        self._store_lost_at: float | None = None
        #: Followed kernels missing from the directory: since when (monotonic).
        self._missing: dict[str, float] = {}
        #: Each kernel's directory entry as last read, kept while the kernel is here.
        self._known_links: dict[str, dict[str, Any]] = {}
        self._wake = asyncio.Event()
        self._renew_now = asyncio.Event()
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
        the RecorderRegistry before it starts a Tap, whether this node records the kernel or
        follows it. A kernel with a transcript already (its owner died before this node
        ever followed it) is numbered on after a gap record."""
        had = self.leases.holds(kernel_id)
        # Recorded here or followed, this node keeps the kernel's execution ends from now
        # (a kernel re-attached after a restart of this node, too): those Redis has first.
        await self.store.load_ends(kernel_id)
        value = await self.leases.acquire(kernel_id, self.node, self.lease_ttl)
        if value is None:
            return False
        self.leases.hold(kernel_id, value)
        if not had:
            gap = await self.leases.take_over(kernel_id, value, "owner_lost")
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
        if kernel_id in self.leases.handed_over:
            self.leases.handed_over.discard(kernel_id)
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
        for kernel_id in self.leases.held():
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
            clean = quiet and written and not self.leases.is_fenced(kernel_id)
            value = self.leases.drop(kernel_id)
            if value is None:
                continue  # lost meanwhile: another node records it
            try:
                if await self.leases.hand_over(kernel_id, value, clean):
                    handed.append(kernel_id)
            except Exception as error:  # Redis gone: the lease expires, a survivor takes over
                self.log.error("Could not hand kernel %s over: %s", kernel_id, error)
                handed.append(kernel_id)
            self.log.info(
                "Handed kernel %s over%s", kernel_id, "" if clean else " (with a gap)",
                extra={"kernel_id": kernel_id},
            )  # fmt: skip
        return handed

    def follow(self, tap: KernelRecorder) -> None:
        """Read ``tap``'s kernel off the bus from the tap's head on."""
        self.bus.follow(tap.kernel_id, tap.head)

    def _follower(self, kernel_id: str) -> KernelRecorder | None:
        """The recorder the bus hands ``kernel_id``'s records to (None: none here now)."""
        return self.taps.taps.get(kernel_id)

    def owner_here(self, kernel_id: str) -> bool:
        return self.leases.holds(kernel_id)

    # -- life ------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._renewing = loop.create_task(self._renew_loop())
        self._tasks = [
            loop.create_task(self._sync_loop()),
            self._renewing,
            loop.create_task(self.bus.run()),
            loop.create_task(self._watch_leases()),
        ]

    async def stop(self) -> None:
        """Stop syncing and reading (the node is stopping). Leases are not released: the
        node's own kernels are shut down by the server after this, and a crash would not
        release them either."""
        for task in self._tasks:
            task.cancel()
        # Bounded: a task may miss its cancellation (asyncio.wait_for in CPython 3.11 can
        # swallow one that comes as the awaited event is set, and a blocking Redis read can
        # hold on to it): the stop goes on without it. Seen: a graceful stop that never
        # ended, under load, until it was killed.
        tasks, self._tasks = self._tasks, []
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=STOP_TIMEOUT)
            if pending:
                self.log.warning(
                    "%d of the node's tasks did not stop within %.0f s", len(pending), STOP_TIMEOUT
                )
        await self.bus.close()

    def followers(self) -> list[KernelRecorder]:
        return [tap for tap in self.taps.taps.values() if tap.following]

    async def _sync_loop(self) -> None:
        while True:
            started = self._pass_started = time.monotonic()
            try:
                await self.sync()
                took = time.monotonic() - started
                if took > self.lease_ttl / 3:
                    self.log.warning("A pass over the kernel directory took %.1f s", took)
                if self.last_error is not None:
                    self.log.info("The kernel directory in Redis is reachable again")
                self.last_error = None
                self._pass_ended = time.monotonic()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # Redis unreachable: try again next time
                if self.last_error is None:
                    self.log.error("Syncing with the kernel directory failed: %s", error)
                self.last_error = str(error)
            finally:
                self._pass_started = None
            # The next pass: after sync_interval, or at once when an append found that
            # Redis lost records.
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.sync_interval)

    async def sync(self) -> None:
        """One pass: check that Redis kept its data, follow new kernels, take over kernels
        whose owner is gone, let go of kernels whose end is recorded (and, before the node
        starts its own renewals, renew its leases)."""
        await self._check_store()
        if self.url:
            await self.store.save_node(self.node, self.url)
        if self._renewing is None:  # not started (the application's first pass)
            await self.renew_leases()
        links = await self.store.load_links()
        self.links = links
        for kernel_id in self.leases.held():
            if kernel_id not in links:
                await self._put_link(kernel_id)
        for kernel_id, link in links.items():
            self._known_links[kernel_id] = link
            self._missing.pop(kernel_id, None)
            if self.leases.holds(kernel_id):
                continue
            tap = self.taps.taps.get(kernel_id)
            try:
                if tap is None:
                    await self._join(kernel_id, link)
                elif (
                    tap.following
                    and not self._owners_writing_back()
                    and await self.leases.holder(kernel_id) is None
                ):
                    await self._take_over(tap, link)
            except (LocalError, KeyError, TypeError, ValueError) as error:
                self.log.warning(
                    "Kernel %s of the directory: %s", kernel_id, error,
                    extra={"kernel_id": kernel_id},
                )  # fmt: skip
        for tap in self.followers():
            if tap.kernel_id not in links:
                await self._absent(tap)

    async def _check_store(self) -> None:
        """Redis's incarnation id (written once: missing or changed, Redis lost its data)
        and run_id (changed: Redis restarted or failed over; its owners check their
        heads)."""
        incarnation = await self.store.incarnation()
        run_id = await self.store.run_id()
        if self.run_id is not None and run_id != self.run_id:
            self.log.warning("Redis restarted or failed over (its run_id changed)")
        self.run_id = run_id
        before, self.incarnation = self.incarnation, incarnation
        if before is not None and incarnation != before:
            self._store_lost("its incarnation key was gone (restarted empty, or flushed)")
            for kernel_id in self.leases.held():
                self.leases.lost.setdefault(kernel_id, 0)
            for tap in self.followers():
                await self._hand_ends(tap.kernel_id)

    async def _hand_ends(self, kernel_id: str) -> None:
        """Redis lost its data and this node does not record ``kernel_id``: the execution
        ends it keeps go where the node that covers the loss finds them."""
        handed = await self.store.hand_ends(kernel_id)
        if handed:
            self.log.warning(
                "Kernel %s: handed %d execution ends this node kept to its next owner",
                kernel_id, handed, extra={"kernel_id": kernel_id},
            )  # fmt: skip

    def _owners_writing_back(self) -> bool:
        """Redis lost its data less than ``lease_ttl`` ago: a kernel with no lease now
        may have a live owner that is writing its lease back (:meth:`_restore`), with the
        execution ends it kept. A follower that took such a kernel over at once wrote
        its gap before that owner handed those ends over, and the executions they ended
        never ended in the transcript (the fault schedule, two empty restarts of Redis in
        a row). An owner that died too is taken over a lease later, as if its lease had
        expired."""
        lost_at = self._store_lost_at
        return lost_at is not None and time.monotonic() - lost_at < self.lease_ttl

    def _store_lost(self, why: str) -> None:
        """Redis lost data: health says so for :attr:`store_loss_notice` seconds."""
        self.store_losses += 1
        self.log.error("Redis lost data (%s): writing back what this node records", why)
        self.store_loss = why
        self._store_lost_at = time.monotonic()

    async def _restore(self, kernel_id: str, known: int) -> None:
        """Redis lost what this node holds of ``kernel_id`` (or all its data): take the
        lease again (a token above every one seen), cover the records it lost (this node
        wrote them up to ``known``) with a gap record, and write the directory entry
        back. Another node holding the lease now (it took the kernel over meanwhile):
        this node follows."""
        value = await self.leases.acquire(kernel_id, self.node, self.lease_ttl)
        if value is None:
            self.leases.lost.pop(kernel_id, None)
            self._lost(kernel_id, "another node took its lease after Redis lost it")
            await self._hand_ends(kernel_id)
            return
        self.leases.hold(kernel_id, value)
        # With those another node handed over (it wrote or read some this node did not).
        await self.store.load_ends(kernel_id)
        gaps = await self.leases.cover_loss(kernel_id, value, known)
        if gaps:
            self._store_lost(f"it no longer had records this node wrote (kernel {kernel_id})")
        await self._put_link(kernel_id)
        self.leases.lost.pop(kernel_id, None)
        self.log.warning(
            "Kernel %s: wrote back its lease and directory entry%s", kernel_id,
            f", the execution ends it kept and {len(gaps)} gap records for seqs "
            f"{gaps[0].first_seq}-{gaps[-1].seq}, which Redis lost" if gaps else "",
            extra={"kernel_id": kernel_id},
        )  # fmt: skip

    async def _put_link(self, kernel_id: str) -> None:
        """Write the directory entry of a kernel this node records (it was missing)."""
        tap = self.taps.taps.get(kernel_id)
        link = describe_link(tap.kernel_manager) if tap is not None else None
        if link is not None:
            await self.store.put_link(kernel_id, link)

    async def _absent(self, tap: KernelRecorder) -> None:
        """A followed kernel is missing from the directory. Gone only if its transcript
        says it ended (its tombstone); otherwise Redis forgot it, and its owner writes it
        back. If none does within ``lease_ttl`` and no node holds its lease (its owner
        died too), this node takes it over."""
        kernel_id = tap.kernel_id
        last = tap.last_message
        if (last is not None and last.execution_state == "dead") or await self.store.ended(
            kernel_id
        ):
            self._missing.pop(kernel_id, None)
            await self._let_go(tap)
            return
        now = time.monotonic()
        since = self._missing.setdefault(kernel_id, now)
        link = self._known_links.get(kernel_id)
        if (
            link is not None
            and now - since > self.lease_ttl
            and await self.leases.holder(kernel_id) is None
        ):
            await self._take_over(tap, link)

    def _rebuilding(self) -> list[str]:
        """Kernels whose state in Redis is not back yet: held ones whose records Redis
        lost, and followed ones missing from the directory for more than a pass (a kernel
        that ends leaves it a moment before its end is recorded)."""
        now = time.monotonic()
        missing = [k for k, since in self._missing.items() if now - since > self.sync_interval]
        return sorted({*self.leases.lost, *missing})

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

    async def _take_over(self, tap: KernelRecorder, link: dict[str, Any]) -> None:
        kernel_id = tap.kernel_id
        value = await self.leases.acquire(kernel_id, self.node, self.lease_ttl)
        if value is None:
            return  # another node was first
        started = time.monotonic()
        self.leases.hold(kernel_id, value)
        self.bus.forget(kernel_id)
        self._missing.pop(kernel_id, None)
        seen = tap.head
        await self.catch_up(tap)
        # The ends the last owner, or another follower, handed over when Redis lost its
        # data: written back with the gap, their executions end.
        await self.store.load_ends(kernel_id)
        gap = await self.leases.take_over(kernel_id, value, "owner_lost", seen)
        self._after_hand_over(kernel_id)
        if gap is not None:
            tap.deliver(gap)
        # This node now answers for the kernel as its first owner did: a kernel the
        # gateway started is shut down (not detached) when asked to.
        kernel = self.kernel_manager.get_kernel(kernel_id)
        attachment = getattr(kernel, "attachment", None)
        # (None: a kernel this node started itself, taken back after it lost the lease.)
        with contextlib.suppress(KeyError, TypeError, ValueError):
            if attachment is not None:
                original = Attachment.from_json(link["attachment"])
                attachment.owned = original.owned
                attachment.pid = original.pid
                kernel.stop_on_shutdown = original.owned
        tap.promote()
        self.taps.remember(kernel_id)
        self.takeovers += 1
        self.log.warning(
            "Took kernel %s over (its owner's lease expired) at seq %d in %.3f s",
            kernel_id, tap.head + 1, time.monotonic() - started,
            extra={"kernel_id": kernel_id},
        )  # fmt: skip

    async def catch_up(self, tap: KernelRecorder) -> None:
        """Deliver to a follower what its kernel's stream holds past the follower's head."""
        key = self.store.keys.of(tap.kernel_id, "log")
        while True:
            entries = await self.store.redis.xrange(key, entry_id(tap.head + 1), "+", count=1000)
            for entry, fields in entries:
                with contextlib.suppress(MalformedMessage):
                    record = record_of_entry(tap.kernel_id, fields)
                    tap.deliver(record)
                    self.store.keep_ends(tap.kernel_id, [record])
                tap.sequencer.head = max(tap.sequencer.head, seq_of(entry))
            if len(entries) < 1000:
                return

    async def _let_go(self, tap: KernelRecorder) -> None:
        """A followed kernel left the directory (its owner recorded its end): deliver what
        is left, and forget it here (its kernel manager detaches; the kernel is not
        touched)."""
        kernel_id = tap.kernel_id
        with contextlib.suppress(Exception):
            await self.catch_up(tap)
        self.bus.forget(kernel_id)
        if kernel_id in self.kernel_manager:
            kernel = self.kernel_manager.get_kernel(kernel_id)
            kernel.stop_on_shutdown = False
            with contextlib.suppress(Exception):
                await self.kernel_manager.shutdown_kernel(kernel_id)
        self.taps.close_tap(kernel_id)
        self._known_links.pop(kernel_id, None)
        self.store.forget_ends(kernel_id)

    def _lost(self, kernel_id: str, why: str) -> None:
        """This node no longer holds the kernel's lease, or can no longer count on it: it
        stops recording, forsakes what it numbered and did not write, ends its clients
        (``lease_lost``, with their last seq) and follows the kernel again. The lease is
        released if it is still this node's, so that another node takes the kernel at
        once."""
        value = self.leases.drop(kernel_id)
        if value is None:
            return
        self.store.forsake(kernel_id)
        tap = self.taps.taps.get(kernel_id)
        self.log.error(
            "Lost the lease of kernel %s (%s): following it from now on", kernel_id, why,
            extra={"kernel_id": kernel_id},
        )  # fmt: skip
        if tap is not None and not tap.closed:
            self.taps.lease_lost(kernel_id)
            self.follow(tap)
        task = asyncio.ensure_future(self.leases.release(kernel_id, value))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _step_down_overdue(self) -> None:
        """Stop recording every kernel whose lease this node could not renew in time
        (Redis slow or away, this node paused): another node may hold it by now. Each
        is asked once more first, within the margin: one still this node's, or free and
        written by nobody since (a node only slow to renew it), is kept."""
        for kernel_id in self.leases.overdue(time.monotonic()):
            value = self.leases.value(kernel_id)
            try:
                kept = await asyncio.wait_for(
                    self._still_held(kernel_id, value), self.lease_ttl * STEP_DOWN_MARGIN
                )
            except asyncio.CancelledError:
                raise
            except Exception:  # no answer in time (asyncio.TimeoutError), or Redis away
                kept = False
            if not kept and self.leases.value(kernel_id) == value:
                self._lost(kernel_id, "its lease could not be renewed in time")

    async def _still_held(self, kernel_id: str, value: str) -> bool:
        renewed, _ = await self.leases.renew(kernel_id, value, self.lease_ttl)
        return renewed or await self.leases.reacquire(kernel_id, value)

    async def renew_leases(self) -> None:
        """Renew every lease this node holds (writing back what Redis lost); one that is
        not this node's any more and cannot be taken again is lost."""
        for kernel_id, value in self.leases.held().items():
            known = self.store.confirmed.get(kernel_id, 0)
            renewed, head = await self.leases.renew(kernel_id, value, self.lease_ttl)
            if head < known or kernel_id in self.leases.lost:
                await self._restore(kernel_id, known)
            elif not renewed and not await self.leases.reacquire(kernel_id, value):
                self._lost(kernel_id, "lease expired")

    async def _renew_loop(self) -> None:
        """Renew the leases every ``sync_interval``, apart from the pass over the directory
        (a takeover's catch-up can take longer than a lease lasts)."""
        failing = False
        while True:
            try:
                await self.renew_leases()
                if failing:
                    self.log.info("Renewing the leases works again")
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as error:  # Redis unreachable: try again next time
                if not failing:
                    self.log.error("Renewing the leases failed: %s", error)
                failing = True
            # The next: after sync_interval, or at once when an append found that Redis
            # lost records.
            self._renew_now.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._renew_now.wait(), self.sync_interval)

    def _wake_all(self) -> None:
        self._wake.set()
        self._renew_now.set()

    async def _watch_leases(self) -> None:
        """Check the leases' renewals on this node's own clock, apart from the renewals
        (which may wait on a Redis that does not answer): see :meth:`_step_down_overdue`."""
        interval = self.lease_ttl * STEP_DOWN_MARGIN / 2
        while True:
            await self._step_down_overdue()
            await asyncio.sleep(interval)

    def _fenced(self, kernel_id: str) -> None:
        self._lost(kernel_id, "another node appends to its transcript")

    def _tap_closed(self, kernel_id: str, head: int) -> None:
        self.bus.forget(kernel_id)
        self._missing.pop(kernel_id, None)
        self._known_links.pop(kernel_id, None)
        value = self.leases.closing(kernel_id)
        if value is not None:
            # Once its last records (the kernel's end) are written: released before, the
            # lease would no longer be this node's when the writer gets to them.
            task = asyncio.ensure_future(self._release_when_written(kernel_id, value))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _release_when_written(self, kernel_id: str, value: str) -> None:
        try:
            await self.store.flush(self.lease_ttl)
            await self.leases.release(kernel_id, value)
        finally:
            self.leases.forget(kernel_id, value)

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

        holder = await self.leases.holder(kernel_id)
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

    def health(self) -> ComponentHealth:
        details = {
            "node": self.node,
            "recording": sorted(self.leases.held()),
            "following": sorted(self.bus.followed),
            "takeovers": self.takeovers,
            "records_from_bus": self.bus.delivered,
            "bus_errors": self.bus.errors,
            "last_error": self.last_error,
            "redis_run_id": self.run_id,
            "store_losses": self.store_losses,
            "last_store_loss": self.store_loss,
            "rebuilding": self._rebuilding(),
        }
        if self.last_error is not None:
            return ComponentHealth("cluster", State.DEGRADED, "directory_unreachable", details)
        now = time.monotonic()
        started = self._pass_started
        waiting = 0.0 if started is None else now - started
        # Also by the last pass that ended well: passes follow each other sync_interval
        # apart, so none for longer than that and stall_after means one is stuck, or never
        # began because this node's loop was busy (then a pass that starts late has waited
        # no time yet when health is asked, and health said ok 2 s into a Redis pause).
        ended = self._pass_ended
        if ended is not None and now - ended > self.sync_interval + self.stall_after:
            waiting = max(waiting, now - ended - self.sync_interval)
        if waiting > self.stall_after:
            details["pass_waiting_seconds"] = round(waiting, 1)
            return ComponentHealth("cluster", State.DEGRADED, "directory_stalled", details)
        if details["rebuilding"]:
            return ComponentHealth("cluster", State.DEGRADED, "redis_data_lost_rebuilding", details)
        lost_at = self._store_lost_at
        if lost_at is not None and time.monotonic() - lost_at < self.store_loss_notice:
            return ComponentHealth("cluster", State.DEGRADED, "redis_data_lost", details)
        return ComponentHealth("cluster", State.OK, None, details)
