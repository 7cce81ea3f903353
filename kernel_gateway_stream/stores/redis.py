"""Transcripts in Redis Streams, shared by several gateways (see :mod:`..cluster`).

Keys, all of one kernel in one hash slot (``{kernel_id}`` is a Redis Cluster hash tag)::

    <prefix>{K}:log      stream: one entry per record, id ``<seq>-0`` (explicit, so ids
                         are strictly increasing: a stale writer cannot append out of order)
    <prefix>{K}:marks    stream: the lifecycle statuses and gap records again (execution
                         summaries read them without scanning the log)
    <prefix>{K}:ends     stream: the execution ends again (execute_input, error, idle
                         status, lifecycle statuses), the last ENDS_MAXLEN: what a
                         node keeps in memory to write back if Redis loses the log
    <prefix>{K}:handed_ends  stream: the ends a node that did not hold the lease kept,
                         put there when Redis lost its data, for the next owner to write
                         back (:meth:`RedisTranscriptStore.hand_ends`)
    <prefix>{K}:meta     hash: head (last seq written), reserved, started, ended
    <prefix>{K}:lease    string: ``<node>:<token>`` of the node that records the kernel
    <prefix>{K}:fence    counter: the fencing token, one more at every acquisition
    <prefix>{K}:cursors  hash: session id -> last seq sent
    <prefix>kernels      hash: kernel id -> how to reach it (the kernel directory), signed
    <prefix>nodes        hash: node name -> its URL (for requests only the owner serves), signed
    <prefix>incarnation  string: a random id, written once (``SET NX``): when it is missing
                         or changed, Redis lost its data (restarted empty, or flushed)

The directory's and the nodes' entries are signed with the cluster secret, and one that
does not check is never acted on (:mod:`.redis_trust`): code that reaches Redis cannot
point a node at its own listener or have it attach a kernel of its own.

An entry's fields: ``r``, the record in the codec of :mod:`..core.records` (shared with
SQLite); ``p``, ``pi`` and ``pt``, its parent header and that header's msg_id and msg_type
(only when it has one).

Writes: :meth:`RedisTranscriptStore.append` returns at once (DESIGN invariant 4); the
record is readable from a bounded in-memory buffer (:class:`.pending.PendingBuffer`) until
a writer task has it in Redis. The writer appends each kernel's batch through one script
that first checks the caller's lease value, so a node that lost its lease (paused, cut
off) cannot append once another holds it (a fencing token: DESIGN, "Scaling past one
machine"); records already in Redis (a retried call that had landed) are skipped, so
redis-py's retries cannot duplicate an entry; a record at or below the head that is not
the one Redis holds at its seq is refused (FORKED): this node numbered it, another wrote
that number, and it must never be confirmed as written. With each batch ``reserved`` becomes the
head plus ``reserve_ahead``: a node taking over numbers on above it, after a gap record,
so no number a client may have seen is given twice (DESIGN invariant 1). The script also
refuses a batch when the kernel's head in Redis is below the head this node last wrote
(:class:`StoreLost`): Redis forgot records (it restarted empty, or failed over to a replica
that lacked them), and the node first covers them with a gap record (see :mod:`..cluster`)
instead of appending after a silent hole.

A record reaches clients only once it is in Redis (:attr:`~.base.TranscriptStore.committed_only`,
see :mod:`..core.committed`): the writer tells the recorders what each confirmed append
wrote (:attr:`~.base.TranscriptStore.written`), and reads serve what Redis holds, never
the pending buffer. A node that stops recording a kernel forsakes what it numbered and did
not write (:meth:`RedisTranscriptStore.forsake`): none of it is written after that, and a
node taking the kernel over (this one again, too) numbers on above it, after a gap.

Durability is Redis's: with ``appendonly yes`` and ``appendfsync everysec`` a crash of
Redis loses at most a second; without persistence (this machine's Redis) a restart of Redis
loses every transcript.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import deque
from collections.abc import Collection
from typing import Any, Protocol

from traitlets import Float, Int, Unicode

from ..core.errors import MalformedMessage, StoreUnavailable, UntrustedEntry
from ..core.health import ComponentHealth, State
from ..core.marks import backlog_gap, is_end, is_mark
from ..core.messages import Record, load_json_object
from ..core.records import NO_PARENT, ParentHeader, decode_chunk, encode_record
from .base import TranscriptInfo, TranscriptPage, TranscriptStore
from .pending import PendingBuffer, cost
from .query import Query
from .redis_trust import EntrySigner, redact_url

__all__ = [
    "NO_LEASE",
    "AppendLease",
    "Fenced",
    "Forked",
    "RedisKeys",
    "RedisTranscriptStore",
    "StoreLost",
    "entry_id",
    "record_of_entry",
]

_FAR = 1 << 62

#: Entries kept in a kernel's ends stream (about three per execution): what a node that
#: joins the kernel starts its kept ends with (:meth:`RedisTranscriptStore.load_ends`).
ENDS_MAXLEN = 3000

#: KEYS: log, marks, meta, lease, ends. ARGV: lease value, maxlen, reserve_ahead, the head
#: the writer last wrote (0: none), then per record seq, r, p, pi, pt, and "1" for a mark
#: that ends executions (in the marks and the ends streams), "3" for another mark (the
#: marks stream), "2" for another execution end (the ends stream), "0" for the rest.
#: Returns the head. Refused with LOST when the head is below the writer's (Redis forgot
#: records), with FENCED when the lease is not the writer's, and with FORKED when a record
#: at or below the head is not the one Redis holds at its seq (another node numbered it:
#: only a retried append that had landed may be skipped, never another writer's numbers).
_APPEND = """
local head = tonumber(redis.call('HGET', KEYS[3], 'head') or '0')
if head < tonumber(ARGV[4]) then
  return redis.error_reply('LOST ' .. head)
end
local holder = redis.call('GET', KEYS[4])
if holder ~= ARGV[1] then
  return redis.error_reply('FENCED held by ' .. tostring(holder))
end
local maxlen = tonumber(ARGV[2])
local i = 5
local first = nil
while i + 5 <= #ARGV do
  local seq = tonumber(ARGV[i])
  if seq <= head then
    local found = redis.call('XRANGE', KEYS[1], ARGV[i] .. '-0', ARGV[i] .. '-0')
    if #found == 1 then
      local fields = found[1][2]
      if fields[1] ~= 'r' or fields[2] ~= ARGV[i + 1] then
        return redis.error_reply('FORKED ' .. ARGV[i])
      end
    else
      if first == nil then
        local oldest = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
        first = 0
        if #oldest == 1 then first = tonumber(string.match(oldest[1][1], '^(%d+)')) end
      end
      -- Not trimmed away (older than the oldest entry): inside another writer's gap.
      if seq >= first then
        return redis.error_reply('FORKED ' .. ARGV[i])
      end
    end
  else
    local id = ARGV[i] .. '-0'
    local fields = {'r', ARGV[i + 1]}
    if ARGV[i + 2] ~= '' then
      table.insert(fields, 'p'); table.insert(fields, ARGV[i + 2])
      table.insert(fields, 'pi'); table.insert(fields, ARGV[i + 3])
      table.insert(fields, 'pt'); table.insert(fields, ARGV[i + 4])
    end
    if maxlen > 0 then
      redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, id, unpack(fields))
    else
      redis.call('XADD', KEYS[1], id, unpack(fields))
    end
    -- pcall: a copy that has the entry already (written back after Redis lost the log
    -- but kept this stream) must not fail the append.
    local kind = ARGV[i + 5]
    if kind == '1' or kind == '3' then
      redis.pcall('XADD', KEYS[2], 'MAXLEN', '~', 100000, id, unpack(fields))
    end
    if kind == '1' or kind == '2' then
      redis.pcall('XADD', KEYS[5], 'MAXLEN', '~', ENDS_MAXLEN, id, unpack(fields))
    end
    head = seq
  end
  i = i + 6
end
local reserved = head + tonumber(ARGV[3])
local before = tonumber(redis.call('HGET', KEYS[3], 'reserved') or '0')
if reserved < before then reserved = before end
redis.call('HSET', KEYS[3], 'head', head, 'reserved', reserved)
return head
"""


class Fenced(Exception):
    """An append was refused: the kernel's lease is not the value it came with (another
    node holds it, or this node took it again with a new value meanwhile)."""


class Forked(Fenced):
    """An append was refused: a record at or below the kernel's head in Redis is not the
    record Redis holds at its seq. Another node numbered the kernel on meanwhile (this
    node's numbers are stale), so this node's records must never reach a client: the
    same as fenced, for good (a lease taken again does not make them true)."""


class StoreLost(Exception):
    """An append was refused: the kernel's head in Redis (:attr:`head`) is below the head
    this node wrote before. Redis lost records (restarted empty, or failed over to a
    replica that lacked them); nothing is appended until they are covered by a gap."""

    def __init__(self, kernel_id: str, head: int, known: int) -> None:
        super().__init__(
            f"Redis has kernel {kernel_id}'s transcript up to seq {head} only, and this node "
            f"wrote it up to {known}: Redis lost records (restarted empty, or failed over)"
        )
        self.head = head
        self.known = known


class AppendLease(Protocol):
    """What the writer asks of the leases (the cluster node's lease map,
    :class:`~kernel_gateway_stream.cluster.leases.LeaseMap`): the store keeps none itself."""

    def value(self, kernel_id: str) -> str:
        """The lease value to append ``kernel_id``'s records with ("" if none)."""

    def is_fenced(self, kernel_id: str) -> bool:
        """An append of ``kernel_id`` was refused: its records are not written any more."""

    async def reacquire(self, kernel_id: str, tried: str = "") -> bool:
        """An append with lease value ``tried`` was refused: True if the lease is this
        node's (again), with another value (:meth:`value` has it): this node took it again
        meanwhile, or it ran out unused and is taken again now."""

    def store_lost(self, kernel_id: str, head: int) -> bool:
        """An append of ``kernel_id`` found Redis's head at ``head``, below what this node
        wrote: Redis lost records. True if the node covers them with a gap (the records
        wait until then); False if it will not (the kernel ended here meanwhile)."""

    def fence(self, kernel_id: str) -> None:
        """An append of ``kernel_id`` was refused for good: another node holds its lease."""

    def fenced_kernels(self) -> list[str]:
        """The kernels whose appends are refused, sorted (for health)."""


class _NoLease:
    """No lease (no cluster node): every append is refused by the script."""

    def value(self, kernel_id: str) -> str:
        return ""

    def is_fenced(self, kernel_id: str) -> bool:
        return False

    async def reacquire(self, kernel_id: str, tried: str = "") -> bool:
        return False

    def store_lost(self, kernel_id: str, head: int) -> bool:
        return False

    def fence(self, kernel_id: str) -> None:
        pass

    def fenced_kernels(self) -> list[str]:
        return []


NO_LEASE: AppendLease = _NoLease()


class RedisKeys:
    """The key names (see the module docstring)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.kernels = f"{prefix}kernels"
        #: node name -> the URL other nodes forward its kernels' requests to
        self.nodes = f"{prefix}nodes"
        #: a random id written once: missing or changed, Redis lost its data
        self.incarnation = f"{prefix}incarnation"

    def of(self, kernel_id: str, what: str) -> str:
        return f"{self.prefix}{{{kernel_id}}}:{what}"


def entry_id(seq: int) -> str:
    """The stream entry id of the record numbered ``seq``."""
    return f"{seq}-0"


def seq_of(entry: bytes | str) -> int:
    raw = entry.decode() if isinstance(entry, bytes) else entry
    return int(raw.partition("-")[0])


def record_of_entry(kernel_id: str, fields: dict[bytes, bytes]) -> Record:
    """The record a stream entry holds.

    Raises:
        MalformedMessage: the entry is not one this store wrote.
    """
    data = fields.get(b"r")
    if data is None:
        raise MalformedMessage("a stream entry without a record")
    raw_parent = fields.get(b"p")
    parent = None
    if raw_parent is not None:
        msg_id = fields.get(b"pi", b"").decode() or None
        msg_type = fields.get(b"pt", b"").decode() or None
        parent = ParentHeader(raw_parent, msg_id, msg_type)
    records = decode_chunk(data, kernel_id, lambda ref: parent)
    if len(records) != 1:
        raise MalformedMessage("a stream entry holds one record")
    return records[0]


def _record_args(record: Record) -> list[bytes | str | int]:
    message = record.message
    has_parent = message.raw_parent_header not in (b"{}", b"")
    data = encode_record(record, 1 if has_parent else NO_PARENT)
    if not has_parent:
        return [record.seq, data, b"", b"", b"", _kind(message)]
    parent_type = b""
    if message.parent_msg_type is None:
        with contextlib.suppress(MalformedMessage):
            found = load_json_object(message.raw_parent_header, "parent_header").get("msg_type")
            parent_type = found.encode() if isinstance(found, str) else b""
    else:
        parent_type = message.parent_msg_type.encode()
    return [
        record.seq,
        data,
        message.raw_parent_header,
        (message.parent_msg_id or "").encode(),
        parent_type,
        _kind(message),
    ]


def _kind(message: Any) -> bytes:
    """The append script's flag: ``1`` a mark that ends executions (a lifecycle status),
    ``3`` another mark (a gap), ``2`` another execution end, ``0`` else."""
    if is_mark(message):
        return b"1" if is_end(message) else b"3"
    return b"2" if is_end(message) else b"0"


def connect(url: str, *, pool_size: int | None = None, **kwargs: Any) -> Any:
    """An asyncio Redis client for ``url`` (hiredis parses replies when installed). With
    ``pool_size``, at most that many connections, a command waiting for one to be free
    (redis-py's default pool raises "Too many connections" instead: 300 clients
    connecting at once made it refuse their cursor lookups).

    A command whose connection turns out closed is sent again on a new one, twice at
    most: after Redis restarts, every pooled connection is dead, and redis-py's default
    (no retry) failed the first request on each (the transcript API answered 500). Every
    write is safe to send twice: the append script skips records that landed, and the
    others set values. Timeouts are not retried (a paused Redis would hold each request
    three times as long)."""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    kwargs.setdefault(
        "retry",
        Retry(ExponentialBackoff(cap=0.5, base=0.05), 2, supported_errors=(RedisConnectionError,)),
    )
    if pool_size is None:
        return aioredis.Redis.from_url(url, **kwargs)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=pool_size, timeout=kwargs.pop("pool_timeout", 30), **kwargs
    )
    return aioredis.Redis(connection_pool=pool)


class RedisTranscriptStore(TranscriptStore):
    """Transcripts in Redis Streams (see the module docstring)."""

    committed_only = True

    url = Unicode(
        "redis://127.0.0.1:6379/0",
        config=True,
        help="The Redis server (redis://[user:password@]host:port/db, rediss:// for TLS). "
        "Set by GatewayStreamApp.redis_url.",
    )
    key_prefix = Unicode(
        "kgs:",
        config=True,
        help="Prefix of every key the gateway writes, so that several clusters (or tests) can "
        "share one Redis.",
    )
    max_records_per_kernel = Int(
        1_000_000,
        config=True,
        help="Records kept per kernel's stream (XADD MAXLEN ~: Redis trims whole blocks, so "
        "a little more is kept); 0 keeps every record. Older records read as discarded.",
    )
    max_pending_bytes = Int(
        64 * 1024 * 1024,
        config=True,
        help="Most bytes of records appended but not yet in Redis (Redis slow or unreachable); "
        "past it the transcript gets a gap record for what could not be kept (live clients "
        "still receive it). Statuses and the gateway's own records have a reserve of an "
        "eighth more, so that every execution still ends in the transcript. Kernels started "
        "by the gateway's launcher lose nothing here: within an eighth of the bound their "
        "Taps stop reading, and each kernel keeps what it publishes (up to its "
        "iopub_hold_bytes) until the store has room again, for 30 s at most.",
    )
    batch_records = Int(2000, config=True, help="Most records sent to Redis in one call.")
    reserve_ahead = Int(
        1000,
        config=True,
        help="Sequence numbers reserved in Redis ahead of those written. A node taking over a "
        "kernel numbers on above the reservation, after a gap record for it.",
    )
    max_connections = Int(
        32,
        config=True,
        help="Connections to Redis for requests (reads, writes, leases); a request waits for a "
        "free one. The record bus has one more of its own.",
    )
    retry_interval = Float(
        0.5, config=True, help="Seconds before a failed write to Redis is tried again."
    )
    stall_after = Float(
        1.0,
        config=True,
        help="Seconds a write to Redis may wait for its answer before health says the store "
        "is degraded (writes_stalled): a paused or unreachable Redis, or one cut off by the "
        "network, does not fail a write until the socket times out, and nothing becomes "
        "durable meanwhile.",
    )
    close_timeout = Float(
        10.0,
        config=True,
        help="Seconds a stop waits for what is not yet in Redis to be written.",
    )
    keep_ends_bytes = Int(
        1024 * 1024,
        config=True,
        help="Per kernel this node records, most bytes of the execution ends it wrote "
        "(execute_input, error, idle status, the kernel's lifecycle statuses) kept in memory, "
        "the newest, "
        "to write back at their seqs when Redis loses its data (restarted empty, or failed "
        "over without them): the executions they end still end in the transcript, with how, "
        "inside store_lost gaps. 0 keeps none. About 1.7 KB an execution of ipykernel's.",
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.recovered = []
        self.keys = RedisKeys(self.key_prefix)
        self.pending = PendingBuffer(self.max_pending_bytes, backlog_gap)
        #: The lease every append goes with (the cluster node's lease map sets it).
        self.lease: AppendLease = NO_LEASE
        #: Signs the directory's and the nodes' entries (set by the cluster node).
        self.signer: EntrySigner | None = None
        #: Directory entries refused, as last read (each is logged once).
        self._refused: dict[str, bytes] = {}
        self._redis: Any = None
        self._writer: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._written: asyncio.Event | None = None
        self._closing = False
        self._scripts: dict[str, Any] = {}
        self.batches = 0
        self.failures = 0
        self.last_error: str | None = None
        #: When the write in flight was sent (monotonic seconds), else None.
        self._write_sent: float | None = None
        #: kernel id -> the execution ends this node wrote, oldest first, within
        #: :attr:`keep_ends_bytes` (see :meth:`ends_since`).
        self._ends: dict[str, deque[Record]] = {}
        self._ends_bytes: dict[str, int] = {}
        self._cursors: dict[tuple[str, str], int] = {}
        #: kernel id -> the head after this node's last append that Redis confirmed: what
        #: Redis must still have (see :class:`StoreLost`).
        self.confirmed: dict[str, int] = {}
        #: kernel id -> the last seq this node numbered before it stopped recording the
        #: kernel: records up to it are never written (see :meth:`forsake`).
        self.forsaken: dict[str, int] = {}

    # -- life ----------------------------------------------------------------------

    def open(self) -> None:
        import redis

        probe = redis.Redis.from_url(self.url, socket_connect_timeout=5, socket_timeout=5)
        try:
            probe.ping()
        except redis.RedisError as error:
            where = redact_url(self.url)
            raise StoreUnavailable(f"cannot reach Redis at {where}: {error}") from error
        finally:
            probe.close()
        # Request/response traffic only: blocking reads have connections of their own.
        self._redis = connect(
            self.url, pool_size=self.max_connections, socket_timeout=10, socket_connect_timeout=5
        )
        self._scripts["append"] = self._redis.register_script(
            _APPEND.replace("ENDS_MAXLEN", str(ENDS_MAXLEN))
        )

    @property
    def redis(self) -> Any:
        """The shared asyncio client (request and response; never a blocking read)."""
        return self._redis

    def close(self) -> None:
        self._closing = True
        if self._writer is not None:
            self._writer.cancel()
        if self._redis is not None:
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().create_task(self._redis.aclose())

    def _ensure_writer(self) -> None:
        if self._writer is None or self._writer.done():
            if self._closing:
                return
            self._wake = asyncio.Event()
            self._written = asyncio.Event()
            self._writer = asyncio.get_running_loop().create_task(self._write_loop())
        assert self._wake is not None
        self._wake.set()

    # -- writes --------------------------------------------------------------------

    def append(self, record: Record) -> None:
        self.pending.push(record)
        self._ensure_writer()

    async def _write_loop(self) -> None:
        assert self._wake is not None
        assert self._written is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            while True:
                batch = self.pending.take(self.batch_records)
                if not batch:
                    break
                self._write_sent = time.monotonic()
                try:
                    await self._write(batch)
                except Exception as error:  # Redis down or refusing: keep, retry later
                    self.pending.untake()
                    self.failures += 1
                    if self.last_error is None:
                        self.log.error("Writing transcripts to Redis failed: %s", error)
                    self.last_error = str(error)
                    self._write_sent = None
                    await asyncio.sleep(self.retry_interval)
                    continue
                self._write_sent = None
                if self.last_error is not None:
                    self.log.info("Writing transcripts to Redis works again")
                self.last_error = None
                self.batches += 1
                self.pending.commit(batch)
                self.pending.settle_dropped(time.time())
                self._written.set()
                self._written = asyncio.Event()

    def forsake(self, kernel_id: str) -> None:
        """This node stopped recording ``kernel_id`` (its lease ran out or was taken): what
        it numbered and has not written is never written (a node that takes the kernel
        over, this one too, covers it with its gap: see :meth:`forsaken_head`). Records
        in an append under way land or are fenced as a whole."""
        head = self.pending.assigned_head(kernel_id)
        if head:
            self.forsaken[kernel_id] = max(head, self.forsaken.get(kernel_id, 0))

    def forsaken_head(self, kernel_id: str) -> int:
        """The last seq this node numbered for ``kernel_id`` and forsook (0: none)."""
        return self.forsaken.get(kernel_id, 0)

    def keep_ends(self, kernel_id: str, records: list[Record]) -> None:
        """Keep the execution ends among ``records`` (in seq order, after every one kept):
        written by this node, or by the kernel's owner and read off the record bus (a
        follower that takes the kernel over keeps what its last owner wrote)."""
        if self.keep_ends_bytes <= 0:
            return
        ends = [record for record in records if is_end(record.message)]
        if not ends:
            return
        kept = self._ends.setdefault(kernel_id, deque())
        size = self._ends_bytes.get(kernel_id, 0)
        if kept and ends[0].seq < kept[-1].first_seq:
            # Some older than one kept (loaded from Redis after the bus brought newer, or
            # handed over by another node): merged, in seq order, each once.
            merged = sorted({r.seq: r for r in [*ends, *kept]}.values(), key=lambda r: r.seq)
            kept.clear()
            size = 0
            ends = merged
        for record in ends:
            if kept and record.first_seq <= kept[-1].seq:
                continue  # had already (a catch-up overlapping the bus)
            kept.append(record)
            size += cost(record)
        while size > self.keep_ends_bytes and kept:
            size -= cost(kept.popleft())
        self._ends_bytes[kernel_id] = size

    def ends_since(self, kernel_id: str, after: int, until: int) -> list[Record]:
        """The execution ends of ``kernel_id`` this node still keeps, whose seqs are
        after ``after`` and at most ``until``, in seq order: what it writes back when Redis
        lost the records up to ``until`` (see :attr:`keep_ends_bytes`)."""
        return [
            record
            for record in self._ends.get(kernel_id, ())
            if record.first_seq > after and record.seq <= until
        ]

    async def load_ends(self, kernel_id: str) -> None:
        """Keep the execution ends Redis has of ``kernel_id`` (its ends stream, the newest
        first, within :attr:`keep_ends_bytes`, and those other nodes handed over, see
        :meth:`hand_ends`): a node that joins a kernel, or starts again, or takes it over,
        can write back what earlier owners wrote should Redis lose it."""
        if self.keep_ends_bytes <= 0:
            return
        records = []
        for what in ("ends", "handed_ends"):
            entries = await self._redis.xrevrange(
                self.keys.of(kernel_id, what), "+", "-", count=ENDS_MAXLEN
            )
            for _, fields in entries:
                with contextlib.suppress(MalformedMessage):
                    records.append(record_of_entry(kernel_id, fields))
        if records:
            self.keep_ends(kernel_id, sorted(records, key=lambda record: record.seq))

    async def hand_ends(self, kernel_id: str) -> int:
        """Put the execution ends this node keeps of ``kernel_id`` where the node that
        takes the kernel over finds them (:meth:`load_ends`); how many. For a node that
        does not hold the kernel's lease when Redis lost its data: the owner that covers
        the loss writes back only the ends it keeps itself, and those this node wrote
        before it lost the lease (Redis acknowledged them, the kernel let them go, then
        Redis lost them) or read off the bus where the owner did not were lost with them:
        their executions never ended in the transcript. Their own stream, with ids of
        Redis's choosing: the ends stream's ids are seqs, and the new owner's are past them."""
        kept = list(self._ends.get(kernel_id, ()))
        if not kept:
            return 0
        key = self.keys.of(kernel_id, "handed_ends")
        pipe = self._redis.pipeline(transaction=False)
        for record in kept:
            _, data, parent, parent_id, parent_type, _ = _record_args(record)
            fields: dict[str, bytes | str | int] = {"r": data}
            if parent:
                fields.update(p=parent, pi=parent_id, pt=parent_type)
            pipe.xadd(key, fields, maxlen=ENDS_MAXLEN, approximate=True)  # type: ignore[arg-type]
        await pipe.execute()
        return len(kept)

    def forget_ends(self, kernel_id: str) -> None:
        self._ends.pop(kernel_id, None)
        self._ends_bytes.pop(kernel_id, None)

    def _tell_written(self, kernel_id: str, records: list[Record]) -> None:
        written = self.written
        if written is None:
            return
        try:
            written(kernel_id, records)
        except Exception:  # an adapter's edge: the records are written all the same
            self.log.exception("Fanning out the records written of %s failed", kernel_id)

    async def _write(self, batch: list[Record]) -> None:
        by_kernel: dict[str, list[Record]] = {}
        for record in batch:
            by_kernel.setdefault(record.kernel_id, []).append(record)
        for kernel_id, records in by_kernel.items():
            lease = self.lease
            if lease.is_fenced(kernel_id):
                continue  # not ours to write any more (dropped: the new owner numbers on)
            forsaken = self.forsaken.get(kernel_id)
            if forsaken is not None:
                records = [record for record in records if record.seq > forsaken]
                if not records:
                    continue
            value = lease.value(kernel_id)
            try:
                try:
                    await self.append_now(kernel_id, records, value)
                except Forked:
                    raise
                except Fenced:
                    # This node took the lease again meanwhile (a new value), or the lease
                    # ran out (too busy to renew it in time) and nobody took it or wrote
                    # since: take it again. Either way, write on with its value.
                    if not await lease.reacquire(kernel_id, value):
                        raise
                    await self.append_now(kernel_id, records, lease.value(kernel_id))
                self.keep_ends(kernel_id, records)
                self._tell_written(kernel_id, records)
            except StoreLost as error:
                if lease.store_lost(kernel_id, error.head):
                    raise  # kept, and written once the node has covered what Redis lost
                # The kernel ended here meanwhile: nobody writes its lease back, and its
                # last records cannot be written after a hole.
                self.log.error(
                    "Kernel %s: %s; its last %d records (from seq %d) are not written",
                    kernel_id, error, len(records), records[0].seq,
                    extra={"kernel_id": kernel_id},
                )  # fmt: skip
                lease.fence(kernel_id)
            except Fenced as error:
                self.log.error(
                    "Kernel %s: %s; %d records from seq %d were not written by this node",
                    kernel_id,
                    error if isinstance(error, Forked) else "another node holds its lease now",
                    len(records),
                    records[0].seq,
                    extra={"kernel_id": kernel_id},
                )
                lease.fence(kernel_id)

    async def append_now(
        self, kernel_id: str, records: list[Record], lease: str, *, known: int | None = None
    ) -> int:
        """Write ``records`` (in order) through the fenced append; the head after it.
        ``known``: the head Redis must have at least (default: the last this node wrote;
        0 when writing the gap that covers what Redis lost).

        Raises:
            StoreLost: Redis's head is below ``known``.
            Fenced: ``lease`` is not the kernel's lease.
        """
        import redis

        keys = self.keys
        if known is None:
            known = self.confirmed.get(kernel_id, 0)
        args: list[Any] = [lease, self.max_records_per_kernel, self.reserve_ahead, known]
        for record in records:
            args.extend(_record_args(record))
        try:
            head = await self._scripts["append"](
                keys=[
                    keys.of(kernel_id, "log"),
                    keys.of(kernel_id, "marks"),
                    keys.of(kernel_id, "meta"),
                    keys.of(kernel_id, "lease"),
                    keys.of(kernel_id, "ends"),
                ],
                args=args,
            )
        except redis.ResponseError as error:
            text = str(error)
            if text.startswith("LOST"):
                raise StoreLost(kernel_id, int(text.split()[1]), known) from error
            if text.startswith("FENCED"):
                raise Fenced(text) from error
            if text.startswith("FORKED"):
                raise Forked(
                    f"kernel {kernel_id}: Redis holds another record at seq {text.split()[1]}"
                ) from error
            raise
        head = int(head)
        self.confirmed[kernel_id] = max(head, self.confirmed.get(kernel_id, 0))
        return head

    def kernel_started(self, kernel_id: str, now: float) -> None:
        self._background(
            self._redis.hset(self.keys.of(kernel_id, "meta"), mapping={"started": now, "ended": ""})
        )

    def kernel_ended(self, kernel_id: str, now: float) -> None:
        self._background(self._redis.hset(self.keys.of(kernel_id, "meta"), "ended", now))

    def save_link(self, kernel_id: str, link: dict[str, Any] | None) -> None:
        if link is None:
            self._background(self._redis.hdel(self.keys.kernels, kernel_id))
        else:
            self._background(self.put_link(kernel_id, link))

    async def put_link(self, kernel_id: str, link: dict[str, Any]) -> None:
        """Write ``kernel_id``'s directory entry, signed, now."""
        entry = self._signer().sign("kernel", kernel_id, json.dumps(link).encode())
        await self._redis.hset(self.keys.kernels, kernel_id, entry)

    async def incarnation(self) -> str:
        """The id of Redis's data set: written once (``SET NX``) by the first node that
        finds none, so a missing or changed one means that Redis lost its data."""
        key = self.keys.incarnation
        await self._redis.set(key, uuid.uuid4().hex, nx=True)
        value = await self._redis.get(key)
        return value.decode() if isinstance(value, bytes) else str(value)

    async def run_id(self) -> str:
        """Redis's ``INFO`` run_id: a new one after each restart or failover."""
        info = await self._redis.info("server")
        return str(info.get("run_id", ""))

    async def ended(self, kernel_id: str) -> bool:
        """True if ``kernel_id``'s transcript says its kernel ended (its tombstone)."""
        return bool(await self._redis.hget(self.keys.of(kernel_id, "meta"), "ended"))

    def _signer(self) -> EntrySigner:
        if self.signer is None:
            raise RuntimeError("the cluster node gives the Redis store its signer")
        return self.signer

    def _open_link(self, kernel_id: str, data: bytes) -> dict[str, Any] | None:
        """The directory entry ``data`` of ``kernel_id``, checked; None (logged once per
        entry) if it is not signed with the cluster secret or not a JSON object."""
        try:
            link = json.loads(self._signer().open("kernel", kernel_id, data))
        except (UntrustedEntry, ValueError) as error:
            if self._refused.get(kernel_id) != data:
                self.log.error(
                    "Kernel %s of the directory in Redis is not attached: %s",
                    kernel_id, error, extra={"kernel_id": kernel_id},
                )  # fmt: skip
            self._refused[kernel_id] = data
            return None
        return link if isinstance(link, dict) else None

    async def load_link(self, kernel_id: str) -> dict[str, Any] | None:
        """``kernel_id``'s directory entry, if it has one signed with the cluster secret."""
        data = await self._redis.hget(self.keys.kernels, kernel_id)
        return None if data is None else self._open_link(kernel_id, data)

    async def save_node(self, node: str, url: str) -> None:
        """Publish ``node``'s URL, signed, for the others to forward requests to."""
        entry = self._signer().sign("node", node, url.encode())
        await self._redis.hset(self.keys.nodes, node, entry)

    async def node_url(self, node: str) -> str | None:
        """``node``'s URL, or None if it has none.

        Raises:
            UntrustedEntry: its entry is not signed with the cluster secret.
        """
        data = await self._redis.hget(self.keys.nodes, node)
        if data is None:
            return None
        return self._signer().open("node", node, data).decode()

    def save_cursor(self, kernel_id: str, session_id: str, seq: int) -> None:
        self._cursors[(kernel_id, session_id)] = seq
        if len(self._cursors) > 10000:
            self._cursors.clear()
        self._background(self._redis.hset(self.keys.of(kernel_id, "cursors"), session_id, seq))

    def _background(self, command: Any) -> None:
        task = asyncio.ensure_future(command)
        task.add_done_callback(self._logged)

    def _logged(self, task: asyncio.Future[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.failures += 1
            self.last_error = str(task.exception())
            self.log.warning("A write to Redis failed: %s", task.exception())

    async def flush(self, timeout: float | None = None) -> bool:
        target = self.pending.assigned()
        deadline = None if timeout is None else time.monotonic() + timeout

        def done() -> bool:
            for kernel_id, head in target.items():
                if self.lease.is_fenced(kernel_id):
                    continue
                records, _ = self.pending.snapshot(kernel_id, 0, head)
                if records:
                    return False
            return True

        while not done():
            if self._writer is None or self._writer.done():
                return done()
            assert self._written is not None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._written.wait()), left)
        return True

    # -- reads ---------------------------------------------------------------------

    def has_room(self) -> bool:
        return self.pending.has_room()

    def durable_head(self, kernel_id: str) -> int:
        return self.pending.durable_head(kernel_id)

    async def head(self, kernel_id: str) -> int:
        """The last seq written or numbered here (the recorder numbers on above it)."""
        info = await self.info(kernel_id)
        durable = info.head if info is not None else 0
        return max(durable, self.pending.assigned_head(kernel_id), self.forsaken_head(kernel_id))

    async def info(self, kernel_id: str) -> TranscriptInfo | None:
        keys = self.keys
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.of(kernel_id, "meta"), "head", "started", "ended")
            pipe.xrange(keys.of(kernel_id, "log"), "-", "+", count=1)
            (head, started, ended), first = await pipe.execute()
        assigned = self.pending.assigned_head(kernel_id)
        if head is None and not assigned:
            return None
        # What Redis holds, not what this node numbered: a number is the history only once
        # Redis has it (see the module docstring).
        top = int(head or 0)
        first_seq = seq_of(first[0][0]) if first else top + 1
        if first:
            # A gap record's entry is at its last number; it stands for the ones before.
            with contextlib.suppress(MalformedMessage):
                first_seq = record_of_entry(kernel_id, first[0][1]).first_seq
        return TranscriptInfo(kernel_id, first_seq, top, _float(started), _float(ended))

    async def read(
        self,
        kernel_id: str,
        since: int,
        limit: int,
        *,
        until: int | None = None,
        parent: str | None = None,
        msg_types: Collection[str] | None = None,
        marks: bool = False,
        max_bytes: int | None = None,
    ) -> TranscriptPage:
        """Raises:
        StoreUnavailable: Redis could not be reached (restarting, failing over): a reader
            may try again (a replay does, for a while)."""
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        upper = until if until is not None else _FAR
        try:
            info = await self.info(kernel_id)
            head = info.head if info else 0
            first_seq = info.first_seq if info else 1
            # What Redis holds alone: a pending record may yet be fenced, its number given
            # to other output by another node (see the module docstring).
            query = Query(since, min(upper, head), limit, parent, msg_types, marks, max_bytes)
            records, taken = await self._read_log(kernel_id, query)
        except (RedisConnectionError, RedisTimeoutError) as error:
            raise StoreUnavailable(f"reading from Redis: {error}") from error
        full = query.full(len(records), taken)
        scanned = records[-1].seq if full else max(since, min(upper, head))
        discarded = (since + 1, first_seq - 1) if since + 1 < first_seq else None
        return TranscriptPage(records, head, first_seq, discarded, scanned)

    async def _read_log(self, kernel_id: str, query: Query) -> tuple[list[Record], int]:
        records: list[Record] = []
        taken = 0
        cursor = query.since
        key = self.keys.of(kernel_id, "log")
        while cursor < query.upper:
            count = max(16, min(1000, query.limit - len(records)))
            entries = await self._redis.xrange(
                key, entry_id(cursor + 1), entry_id(query.upper), count=count
            )
            if not entries:
                break
            for entry, fields in entries:
                cursor = seq_of(entry)
                try:
                    record = record_of_entry(kernel_id, fields)
                except MalformedMessage:
                    self.log.warning("Kernel %s: entry %s is not a record", kernel_id, entry)
                    continue
                if not query.wants(record):
                    continue
                records.append(record)
                taken += record.message.size
                if query.full(len(records), taken):
                    return records, taken
            if len(entries) < count:
                break
        return records, taken

    async def marks(self, kernel_id: str, since: int) -> list[Record]:
        entries = await self._redis.xrange(
            self.keys.of(kernel_id, "marks"), entry_id(since + 1), "+"
        )
        stored = []
        for _, fields in entries:
            with contextlib.suppress(MalformedMessage):
                stored.append(record_of_entry(kernel_id, fields))
        return stored

    async def load_cursor(self, kernel_id: str, session_id: str) -> int | None:
        cached = self._cursors.get((kernel_id, session_id))
        if cached is not None:
            return cached
        value = await self._redis.hget(self.keys.of(kernel_id, "cursors"), session_id)
        return int(value) if value is not None else None

    async def load_links(self) -> dict[str, dict[str, Any]]:
        """The kernel directory: every entry signed with the cluster secret (the others
        are left out, each logged once)."""
        raw = await self._redis.hgetall(self.keys.kernels)
        links: dict[str, dict[str, Any]] = {}
        for key, data in raw.items():
            kernel_id = key.decode(errors="replace")
            link = self._open_link(kernel_id, data)
            if link is not None:
                links[kernel_id] = link
        return links

    # -- health --------------------------------------------------------------------

    def health(self) -> ComponentHealth:
        pending = self.pending.stats()
        details = {
            "redis": redact_url(self.url),
            "pending_records": pending.records,
            "pending_bytes": pending.bytes,
            "max_pending_bytes": pending.max_bytes,
            "dropped_records": pending.dropped_records,
            "gap_records": pending.gap_records,
            "write_batches": self.batches,
            "write_failures": self.failures,
            "last_error": self.last_error,
            "fenced_kernels": self.lease.fenced_kernels(),
        }
        if pending.dropping:
            return ComponentHealth("store", State.FAILING, "backlog_full_records_dropped", details)
        if self.last_error is not None and pending.records:
            return ComponentHealth("store", State.DEGRADED, "writes_failing", details)
        sent = self._write_sent
        waiting = 0.0 if sent is None else time.monotonic() - sent
        if waiting > self.stall_after:
            details["write_waiting_seconds"] = round(waiting, 1)
            return ComponentHealth("store", State.DEGRADED, "writes_stalled", details)
        if pending.bytes > pending.max_bytes // 2:
            return ComponentHealth("store", State.DEGRADED, "backlog_high", details)
        return ComponentHealth("store", State.OK, None, details)


def _float(value: Any) -> float | None:
    if value in (None, b"", ""):
        return None
    try:
        return float(value)
    except ValueError:
        return None
