"""Transcripts in Redis Streams, shared by several gateways (see :mod:`..cluster`).

Keys, all of one kernel in one hash slot (``{kernel_id}`` is a Redis Cluster hash tag)::

    <prefix>{K}:log      stream: one entry per record, id ``<seq>-0`` (explicit, so ids
                         are strictly increasing: a stale writer cannot append out of order)
    <prefix>{K}:marks    stream: the lifecycle statuses and gap records again (execution
                         summaries read them without scanning the log)
    <prefix>{K}:meta     hash: head (last seq written), reserved, started, ended
    <prefix>{K}:lease    string: ``<node>:<token>`` of the node that records the kernel
    <prefix>{K}:fence    counter: the fencing token, one more at every acquisition
    <prefix>{K}:cursors  hash: session id -> last seq sent
    <prefix>kernels      hash: kernel id -> how to reach it (the kernel directory), signed
    <prefix>nodes        hash: node name -> its URL (for requests only the owner serves), signed

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
redis-py's retries cannot duplicate an entry. With each batch ``reserved`` becomes the
head plus ``reserve_ahead``: a node taking over numbers on above it, after a gap record,
so no number a client may have seen is given twice (DESIGN invariant 1).

Durability is Redis's: with ``appendonly yes`` and ``appendfsync everysec`` a crash of
Redis loses at most a second; without persistence (this machine's Redis) a restart of Redis
loses every transcript.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Collection
from typing import Any

from traitlets import Float, Int, Unicode

from ..core.errors import MalformedMessage, StoreUnavailable, UntrustedEntry
from ..core.health import ComponentHealth, State
from ..core.marks import gap_record, is_mark
from ..core.messages import Record, load_json_object
from ..core.records import NO_PARENT, ParentHeader, decode_chunk, encode_record
from .base import TranscriptInfo, TranscriptPage, TranscriptStore
from .pending import PendingBuffer
from .query import Query
from .redis_trust import EntrySigner, redact_url
from .sqlite import iso_date

__all__ = ["Fenced", "RedisKeys", "RedisTranscriptStore", "entry_id", "record_of_entry"]

_FAR = 1 << 62

#: KEYS: log, marks, meta, lease. ARGV: lease value, maxlen, reserve_ahead, then per record
#: seq, r, p, pi, pt, mark ("1" or "0"). Returns the head.
_APPEND = """
local holder = redis.call('GET', KEYS[4])
if holder ~= ARGV[1] then
  return redis.error_reply('FENCED held by ' .. tostring(holder))
end
local maxlen = tonumber(ARGV[2])
local head = tonumber(redis.call('HGET', KEYS[3], 'head') or '0')
local i = 4
while i + 5 <= #ARGV do
  local seq = tonumber(ARGV[i])
  if seq > head then
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
    if ARGV[i + 5] == '1' then
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', 100000, id, unpack(fields))
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

#: KEYS: lease, fence. ARGV: node, ttl_ms. The lease value if this node holds it now
#: (renewed, or newly taken with the next fencing token), else false.
_ACQUIRE = """
local current = redis.call('GET', KEYS[1])
if current then
  if string.sub(current, 1, #ARGV[1] + 1) == ARGV[1] .. ':' then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return current
  end
  return false
end
local token = redis.call('INCR', KEYS[2])
local value = ARGV[1] .. ':' .. token
redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2])
return value
"""

#: KEYS: lease, fence, meta. ARGV: node, ttl_ms, head. A new lease value for ``node`` if
#: the lease is free, nobody was handed the kernel, and the transcript's head is still
#: ``head`` (nobody wrote since this node did); else false.
_REACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local fields = redis.call('HMGET', KEYS[3], 'head', 'handed_over')
if (fields[1] or '0') ~= ARGV[3] or fields[2] then return false end
local token = redis.call('INCR', KEYS[2])
local value = ARGV[1] .. ':' .. token
redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2])
return value
"""

#: KEYS: lease. ARGV: value, ttl_ms. 1 if renewed, 0 if the lease is not this value's.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

#: KEYS: lease. ARGV: value. 1 if released.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


#: KEYS: lease, meta. ARGV: value, clean ("1" or "0"). 1 if released: the next owner numbers
#: on from the head (clean) or after a gap for the reservation (not clean).
_HAND_OVER = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[2], 'handed_over', ARGV[2])
return redis.call('DEL', KEYS[1])
"""


class Fenced(Exception):
    """An append was refused: another node holds the kernel's lease now."""


class RedisKeys:
    """The key names (see the module docstring)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.kernels = f"{prefix}kernels"
        #: node name -> the URL other nodes forward its kernels' requests to
        self.nodes = f"{prefix}nodes"

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
        return [record.seq, data, b"", b"", b"", b"1" if is_mark(message) else b"0"]
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
        b"1" if is_mark(message) else b"0",
    ]


def _make_gap(kernel_id: str, first: int, last: int, now: float) -> Record:
    return gap_record(kernel_id, first, last, "store_backlog_full", now=now, date=iso_date(now))


def connect(url: str, *, pool_size: int | None = None, **kwargs: Any) -> Any:
    """An asyncio Redis client for ``url`` (hiredis parses replies when installed). With
    ``pool_size``, at most that many connections, a command waiting for one to be free
    (redis-py's default pool raises "Too many connections" instead: 300 clients
    connecting at once made it refuse their cursor lookups)."""
    import redis.asyncio as aioredis

    if pool_size is None:
        return aioredis.Redis.from_url(url, **kwargs)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=pool_size, timeout=kwargs.pop("pool_timeout", 30), **kwargs
    )
    return aioredis.Redis(connection_pool=pool)


class RedisTranscriptStore(TranscriptStore):
    """Transcripts in Redis Streams (see the module docstring)."""

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
        "still receive it).",
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
    close_timeout = Float(
        10.0,
        config=True,
        help="Seconds a stop waits for what is not yet in Redis to be written.",
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.recovered = []
        self.keys = RedisKeys(self.key_prefix)
        self.pending = PendingBuffer(self.max_pending_bytes, _make_gap)
        #: The lease value this node appends with, per kernel (set by the cluster node).
        self.leases: dict[str, str] = {}
        #: Kernels whose appends were refused (another node holds the lease).
        self.fenced: set[str] = set()
        #: Called with a kernel id whose append was fenced.
        self.on_fenced: list[Any] = []
        #: ``await reacquire(kernel_id) -> bool``: the cluster node's, see :meth:`_write`.
        self.reacquire: Any = None
        #: Kernels taken over after a clean hand-over (no gap: the kernel held its output).
        self.handed_over: set[str] = set()
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
        self._cursors: dict[tuple[str, str], int] = {}

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
        for name, source in (
            ("append", _APPEND),
            ("acquire", _ACQUIRE),
            ("renew", _RENEW),
            ("release", _RELEASE),
            ("hand_over", _HAND_OVER),
            ("reacquire", _REACQUIRE),
        ):
            self._scripts[name] = self._redis.register_script(source)

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
                try:
                    await self._write(batch)
                except Exception as error:  # Redis down or refusing: keep, retry later
                    self.pending.untake()
                    self.failures += 1
                    if self.last_error is None:
                        self.log.error("Writing transcripts to Redis failed: %s", error)
                    self.last_error = str(error)
                    await asyncio.sleep(self.retry_interval)
                    continue
                if self.last_error is not None:
                    self.log.info("Writing transcripts to Redis works again")
                self.last_error = None
                self.batches += 1
                self.pending.commit(batch)
                self.pending.settle_dropped(time.time())
                self._written.set()
                self._written = asyncio.Event()

    async def _write(self, batch: list[Record]) -> None:
        by_kernel: dict[str, list[Record]] = {}
        for record in batch:
            by_kernel.setdefault(record.kernel_id, []).append(record)
        for kernel_id, records in by_kernel.items():
            if kernel_id in self.fenced:
                continue  # not ours to write any more (dropped: the new owner numbers on)
            lease = self.leases.get(kernel_id, "")
            try:
                try:
                    await self.append_now(kernel_id, records, lease)
                except Fenced:
                    # The lease ran out (this node was too busy to renew it in time) and
                    # nobody took it or wrote since: take it again, and write on.
                    if self.reacquire is None or not await self.reacquire(kernel_id):
                        raise
                    await self.append_now(kernel_id, records, self.leases[kernel_id])
            except Fenced:
                self.fenced.add(kernel_id)
                self.log.error(
                    "Kernel %s: another node holds its lease now; %d records from seq %d "
                    "were not written by this node",
                    kernel_id,
                    len(records),
                    records[0].seq,
                    extra={"kernel_id": kernel_id},
                )
                for callback in self.on_fenced:
                    callback(kernel_id)

    async def append_now(self, kernel_id: str, records: list[Record], lease: str) -> int:
        """Write ``records`` (in order) through the fenced append; the head after it.

        Raises:
            Fenced: ``lease`` is not the kernel's lease.
        """
        import redis

        keys = self.keys
        args: list[Any] = [lease, self.max_records_per_kernel, self.reserve_ahead]
        for record in records:
            args.extend(_record_args(record))
        try:
            head = await self._scripts["append"](
                keys=[
                    keys.of(kernel_id, "log"),
                    keys.of(kernel_id, "marks"),
                    keys.of(kernel_id, "meta"),
                    keys.of(kernel_id, "lease"),
                ],
                args=args,
            )
        except redis.ResponseError as error:
            if str(error).startswith("FENCED"):
                raise Fenced(str(error)) from error
            raise
        return int(head)

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
            entry = self._signer().sign("kernel", kernel_id, json.dumps(link).encode())
            self._background(self._redis.hset(self.keys.kernels, kernel_id, entry))

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
                if kernel_id in self.fenced:
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

    # -- leases (the cluster node's) -------------------------------------------------

    async def acquire(self, kernel_id: str, node: str, ttl: float) -> str | None:
        """Take (or renew) the kernel's lease for ``node``; its value, or None if another
        node holds it."""
        keys = self.keys
        value = await self._scripts["acquire"](
            keys=[keys.of(kernel_id, "lease"), keys.of(kernel_id, "fence")],
            args=[node, int(ttl * 1000)],
        )
        return value.decode() if isinstance(value, bytes) else value

    async def acquire_again(self, kernel_id: str, node: str, ttl: float) -> str | None:
        """A new lease for ``node`` if the lease ran out unused (see ``_REACQUIRE``)."""
        keys = self.keys
        head = await self._redis.hget(keys.of(kernel_id, "meta"), "head")
        value = await self._scripts["reacquire"](
            keys=[
                keys.of(kernel_id, "lease"),
                keys.of(kernel_id, "fence"),
                keys.of(kernel_id, "meta"),
            ],
            args=[node, int(ttl * 1000), (head or b"0").decode()],
        )
        return value.decode() if isinstance(value, bytes) else value

    async def renew(self, kernel_id: str, value: str, ttl: float) -> bool:
        renewed = await self._scripts["renew"](
            keys=[self.keys.of(kernel_id, "lease")], args=[value, int(ttl * 1000)]
        )
        return bool(renewed)

    async def release(self, kernel_id: str, value: str) -> bool:
        released = await self._scripts["release"](
            keys=[self.keys.of(kernel_id, "lease")], args=[value]
        )
        return bool(released)

    async def holder(self, kernel_id: str) -> str | None:
        value = await self._redis.get(self.keys.of(kernel_id, "lease"))
        return value.decode() if isinstance(value, bytes) else value

    async def hand_over(self, kernel_id: str, value: str, clean: bool) -> bool:
        """Release the kernel's lease for another node to take (a graceful stop), saying
        whether everything this node gave a number is written and the kernel holds what
        it publishes from here on (``clean``: the next owner needs no gap)."""
        released = await self._scripts["hand_over"](
            keys=[self.keys.of(kernel_id, "lease"), self.keys.of(kernel_id, "meta")],
            args=[value, "1" if clean else "0"],
        )
        return bool(released)

    async def take_over(self, kernel_id: str, lease: str, reason: str) -> Record | None:
        """Number on above what the last owner reserved: one gap record for the numbers it
        may have given out without writing (and whatever the kernel printed while no node
        recorded it). Returns the gap record, written, or None if the kernel has no
        transcript yet, or if its last owner handed it over cleanly (see
        :meth:`hand_over`; :attr:`handed_over` then has it)."""
        meta = self.keys.of(kernel_id, "meta")
        head, reserved, handed = await self._redis.hmget(meta, "head", "reserved", "handed_over")
        if handed is not None:
            await self._redis.hdel(meta, "handed_over")
        if handed == b"1":
            self.handed_over.add(kernel_id)
            return None
        if head is None and reserved is None:
            return None
        if handed == b"0":
            reason = "owner_stopped"
        head = int(head or 0)
        last = max(int(reserved or 0), head + 1)
        now = time.time()
        gap = gap_record(kernel_id, head + 1, last, reason, now=now, date=iso_date(now))
        await self.append_now(kernel_id, [gap], lease)
        return gap

    # -- reads ---------------------------------------------------------------------

    async def head(self, kernel_id: str) -> int:
        info = await self.info(kernel_id)
        return info.head if info is not None else 0

    async def info(self, kernel_id: str) -> TranscriptInfo | None:
        keys = self.keys
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.of(kernel_id, "meta"), "head", "started", "ended")
            pipe.xrange(keys.of(kernel_id, "log"), "-", "+", count=1)
            (head, started, ended), first = await pipe.execute()
        assigned = self.pending.assigned_head(kernel_id)
        if head is None and not assigned:
            return None
        durable = int(head or 0)
        top = max(durable, assigned)
        first_seq = seq_of(first[0][0]) if first else durable + 1
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
        upper = until if until is not None else _FAR
        pending, committed = self.pending.snapshot(kernel_id, since, upper)
        info = await self.info(kernel_id)
        head = info.head if info else 0
        first_seq = info.first_seq if info else 1
        query = Query(
            since, min(upper, committed, head), limit, parent, msg_types, marks, max_bytes
        )
        records, taken = await self._read_log(kernel_id, query)
        last = records[-1].seq if records else since
        full = query.full(len(records), taken)
        if not full:
            for record in pending:
                if record.seq <= last or not query.wants(record):
                    continue
                records.append(record)
                last = record.seq
                taken += record.message.size
                if query.full(len(records), taken):
                    full = True
                    break
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
        pending, committed = self.pending.snapshot(kernel_id, since, _FAR)
        entries = await self._redis.xrange(
            self.keys.of(kernel_id, "marks"), entry_id(since + 1), "+"
        )
        stored = []
        for entry, fields in entries:
            if seq_of(entry) > committed:
                break
            with contextlib.suppress(MalformedMessage):
                stored.append(record_of_entry(kernel_id, fields))
        last = stored[-1].seq if stored else since
        return stored + [r for r in pending if r.seq > last and is_mark(r.message)]

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
            "fenced_kernels": sorted(self.fenced),
        }
        if pending.dropping:
            return ComponentHealth("store", State.FAILING, "backlog_full_records_dropped", details)
        if self.last_error is not None and pending.records:
            return ComponentHealth("store", State.DEGRADED, "writes_failing", details)
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
