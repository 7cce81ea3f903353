"""The record bus: how a node follows the kernels another node records.

One ``XREAD BLOCK`` per node, on a connection of its own, reads the Redis streams of every
kernel the node follows and hands each record to that kernel's follower on this node
(:meth:`..recording.recorder.KernelRecorder.deliver`), which feeds the node's own fan-out.
The bus carries records, not frames.

Imported by :mod:`.node` alone; builds on the Redis store's keys and record codec.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from ..core.errors import MalformedMessage
from ..core.messages import Record
from ..stores.redis import RedisTranscriptStore, connect, entry_id, record_of_entry, seq_of

__all__ = ["Follower", "RecordBus"]


class Follower(Protocol):
    """Where the bus puts one kernel's records: its recorder, following."""

    def deliver(self, record: Record) -> None:
        """``record``, numbered by the kernel's owner; one already had is ignored."""


class RecordBus:
    """Reads the records of every followed kernel off Redis (see the module docstring).

    ``follower_of(kernel_id)`` is the kernel's :class:`Follower` on this node, or None (its
    records are then skipped). Driven by the cluster node: :meth:`run` as a task,
    :meth:`follow` and :meth:`forget` as kernels come and go, :meth:`close` at the end.
    """

    def __init__(
        self,
        store: RedisTranscriptStore,
        block: float,
        follower_of: Callable[[str], Follower | None],
        log: Any,
    ) -> None:
        self.store = store
        #: Seconds one XREAD blocks waiting for records.
        self.block = block
        self.follower_of = follower_of
        self.log = log
        #: Kernels this node follows: kernel id -> the last seq read off the bus.
        self.followed: dict[str, int] = {}
        #: Records handed to followers, and reads that failed (for health).
        self.delivered = 0
        self.errors = 0
        self._wake = asyncio.Event()
        self._connection: Any = None

    def follow(self, kernel_id: str, head: int) -> None:
        """Read ``kernel_id``'s records above ``head`` from now on."""
        self.followed[kernel_id] = head
        self._wake.set()

    def forget(self, kernel_id: str) -> None:
        """Stop reading ``kernel_id`` (it ended, or this node records it now)."""
        self.followed.pop(kernel_id, None)

    async def run(self) -> None:
        """Read and deliver until cancelled; a failing read is logged once and retried."""
        # A connection of its own: a blocking read must not share one with requests, and
        # the socket timeout must outlast the block (redis-py 8 defaults to 5 s).
        self._connection = connect(
            self.store.url,
            socket_timeout=self.block + 30,
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
                reply = await self._connection.xread(
                    streams, count=1000, block=int(self.block * 1000)
                )
            except asyncio.CancelledError:
                raise
            except Exception as error:
                self.errors += 1
                if not failing:
                    self.log.error("Reading the record bus failed: %s", error)
                failing = True
                await asyncio.sleep(0.5)
                continue
            if failing:
                self.log.info("Reading the record bus works again")
            failing = False
            for key, entries in _streams(reply):
                self._deliver(_kernel_of(key), entries)

    def _deliver(self, kernel_id: str, entries: list[Any]) -> None:
        if kernel_id not in self.followed:
            return
        follower = self.follower_of(kernel_id)
        records = []
        for entry, fields in entries:
            self.followed[kernel_id] = seq_of(entry)
            if follower is None:
                continue
            try:
                record = record_of_entry(kernel_id, fields)
            except MalformedMessage:
                self.log.warning("Kernel %s: entry %s is not a record", kernel_id, entry)
                continue
            follower.deliver(record)
            records.append(record)
            self.delivered += 1
        # Should this node take the kernel over, it can write them back if Redis loses them.
        self.store.keep_ends(kernel_id, records)

    async def close(self) -> None:
        """Close the bus's connection (after :meth:`run` was cancelled)."""
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.aclose()


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
