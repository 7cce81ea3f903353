"""The leases: which kernels this node records, and the value it appends with.

A kernel's lease is a Redis key taken with ``SET NX PX`` and a fencing token (``INCR``):
the node holding it records the kernel, and the store's append script refuses records
that do not come with its value (see :mod:`..stores.redis`). A fencing token never goes
backwards: Redis restarted empty starts ``INCR`` at 1 again, so every acquisition first
raises the counter above the highest token this node has seen for the kernel.
:class:`LeaseMap` is the node's one map of the leases it holds, and the store asks it for
the value of each append (:class:`..stores.redis.AppendLease`); it takes, renews, releases
and hands the leases over.

Imported by :mod:`.node` alone; builds on the Redis store (its connection, keys and append).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..core.marks import GAP_MSG_TYPE, gap_record, iso_date
from ..core.messages import Record
from ..core.ownership import overdue
from ..stores.redis import RedisTranscriptStore

__all__ = ["LeaseMap"]

#: The next fencing token: ``INCR`` of the counter (KEYS[2]), raised above ARGV[3], the
#: highest token the node has seen for the kernel (the counter restarts at 1 when Redis
#: lost its data).
_NEXT_TOKEN = """
local token = redis.call('INCR', KEYS[2])
if token <= tonumber(ARGV[3]) then
  token = tonumber(ARGV[3]) + 1
  redis.call('SET', KEYS[2], token)
end
"""

#: KEYS: lease, fence. ARGV: node, ttl_ms, floor. The lease value if this node holds it
#: now (renewed, or newly taken with the next fencing token), else false.
_ACQUIRE = (
    """
local current = redis.call('GET', KEYS[1])
if current then
  if string.sub(current, 1, #ARGV[1] + 1) == ARGV[1] .. ':' then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return current
  end
  return false
end
"""
    + _NEXT_TOKEN
    + """
local value = ARGV[1] .. ':' .. token
redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2])
return value
"""
)

#: KEYS: lease, fence, meta. ARGV: node, ttl_ms, floor, head. A new lease value for
#: ``node`` if the lease is free, nobody was handed the kernel, and the transcript's head
#: is still ``head`` (nobody wrote since this node did); else false.
_REACQUIRE = (
    """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local fields = redis.call('HMGET', KEYS[3], 'head', 'handed_over')
if (fields[1] or '0') ~= ARGV[4] or fields[2] then return false end
"""
    + _NEXT_TOKEN
    + """
local value = ARGV[1] .. ':' .. token
redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2])
return value
"""
)

#: KEYS: lease, meta. ARGV: value, ttl_ms. ``{renewed, head}``: renewed is 1 if renewed,
#: 0 if the lease is not this value's; head, the transcript's head in Redis (0: none).
_RENEW = """
local head = tonumber(redis.call('HGET', KEYS[2], 'head') or '0')
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return {redis.call('PEXPIRE', KEYS[1], ARGV[2]), head}
end
return {0, head}
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


class LeaseMap:
    """The leases this node holds (see the module docstring); set as the store's
    :attr:`~..stores.redis.RedisTranscriptStore.lease` when made.

    A kernel closed here keeps its value until its last records are written and its lease
    released (:meth:`closing`, :meth:`forget`): it is no longer :meth:`held`, but the
    store still appends with it.
    """

    def __init__(self, store: RedisTranscriptStore, node: str, ttl: float, log: Any) -> None:
        self.store = store
        self.node = node
        #: Seconds a lease lasts without renewal.
        self.ttl = ttl
        self.log = log
        self._values: dict[str, str] = {}
        self._closing: set[str] = set()
        #: Kernels whose appends were refused (another node holds the lease).
        self.fenced: set[str] = set()
        #: Called with a kernel id whose append was fenced.
        self.on_fenced: list[Callable[[str], None]] = []
        #: Kernels taken over after a clean hand-over (no gap: the kernel held its output).
        self.handed_over: set[str] = set()
        #: The highest fencing token seen for each kernel (held, or read as its holder's):
        #: the floor of the next acquisition's.
        self.tokens: dict[str, int] = {}
        #: Kernels held here whose records Redis lost (an append found its head too low),
        #: by the head it had: the node covers them with a gap (:meth:`store_lost`).
        self.lost: dict[str, int] = {}
        #: Called with a kernel id when an append finds that Redis lost its records.
        self.on_store_lost: list[Callable[[str], None]] = []
        #: When the last request that took or renewed each lease held was sent (monotonic):
        #: the owner stops recording by :func:`..core.ownership.step_down_at`.
        self.renewed_at: dict[str, float] = {}
        self._scripts: dict[str, Any] = {}
        store.lease = self

    # -- the map ---------------------------------------------------------------------

    def held(self) -> dict[str, str]:
        """The kernels this node records: kernel id -> lease value."""
        return {k: v for k, v in self._values.items() if k not in self._closing}

    def holds(self, kernel_id: str) -> bool:
        return kernel_id in self._values and kernel_id not in self._closing

    def hold(self, kernel_id: str, value: str) -> None:
        """This node holds ``kernel_id``'s lease, ``value``."""
        self.saw(kernel_id, value)
        self._values[kernel_id] = value
        self._closing.discard(kernel_id)
        self.fenced.discard(kernel_id)

    def drop(self, kernel_id: str) -> str | None:
        """This node no longer holds ``kernel_id``'s lease (lost, or handed over): its
        value, None if it did not hold it."""
        if not self.holds(kernel_id):
            return None
        self.renewed_at.pop(kernel_id, None)
        return self._values.pop(kernel_id)

    def overdue(self, now: float) -> list[str]:
        """The kernels held here whose lease was not renewed in time at ``now`` (monotonic):
        this node must stop recording them (see :func:`..core.ownership.step_down_at`)."""
        held = {k: at for k, at in self.renewed_at.items() if self.holds(k)}
        return overdue(held, self.ttl, now)

    def closing(self, kernel_id: str) -> str | None:
        """``kernel_id`` ended here: no longer held, its value kept for the last appends
        until :meth:`forget`. Its value, None if it was not held."""
        if not self.holds(kernel_id):
            return None
        self._closing.add(kernel_id)
        return self._values[kernel_id]

    def forget(self, kernel_id: str, value: str) -> None:
        """The lease ``value`` of a closed kernel is released: forget it (unless the kernel
        was taken again meanwhile)."""
        if kernel_id in self._closing and self._values.get(kernel_id) == value:
            del self._values[kernel_id]
            self._closing.discard(kernel_id)
            self.tokens.pop(kernel_id, None)
            self.lost.pop(kernel_id, None)
            self.renewed_at.pop(kernel_id, None)
            self.store.confirmed.pop(kernel_id, None)
            self.store.forget_ends(kernel_id)

    def saw(self, kernel_id: str, value: str | None) -> None:
        """``value`` was ``kernel_id``'s lease: its token is a floor for the next one."""
        if value:
            token = value.rpartition(":")[2]
            if token.isdigit():
                self.tokens[kernel_id] = max(self.tokens.get(kernel_id, 0), int(token))

    # -- what the store asks (AppendLease) -----------------------------------------------

    def value(self, kernel_id: str) -> str:
        return self._values.get(kernel_id, "")

    def is_fenced(self, kernel_id: str) -> bool:
        return kernel_id in self.fenced

    async def reacquire(self, kernel_id: str, tried: str = "") -> bool:
        """The store's append with lease value ``tried`` was refused: True if this node
        holds the lease with another value already (it took the lease again meanwhile:
        never mistaken for another node's), or takes it again now because nobody else
        took it or wrote since (this node was only late renewing it)."""
        if not self.holds(kernel_id):
            return False
        before = self._values[kernel_id]
        if tried and before != tried:
            return True
        value = await self.acquire_again(kernel_id, self.node, self.ttl)
        if not self.holds(kernel_id):
            # Let go of meanwhile (lost: the node follows the kernel now): not taken back.
            if value is not None:
                await self.release(kernel_id, value)
            return False
        if self._values[kernel_id] != before:
            return True  # taken again meanwhile, by another caller (the writer, a renewal)
        if value is None:
            return False
        self.hold(kernel_id, value)
        self.log.warning(
            "Kernel %s: this node's lease ran out before it was renewed; taken again",
            kernel_id, extra={"kernel_id": kernel_id},
        )  # fmt: skip
        return True

    def store_lost(self, kernel_id: str, head: int) -> bool:
        if not self.holds(kernel_id):
            return False
        self.lost[kernel_id] = head
        for callback in self.on_store_lost:
            callback(kernel_id)
        return True

    def fence(self, kernel_id: str) -> None:
        self.fenced.add(kernel_id)
        for callback in self.on_fenced:
            callback(kernel_id)

    def fenced_kernels(self) -> list[str]:
        return sorted(self.fenced)

    # -- Redis -----------------------------------------------------------------------

    def _script(self, name: str) -> Any:
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = self.store.redis.register_script(_SCRIPTS[name])
        return script

    async def acquire(self, kernel_id: str, node: str, ttl: float) -> str | None:
        """Take (or renew) the kernel's lease for ``node``; its value, or None if another
        node holds it."""
        keys = self.store.keys
        sent = time.monotonic()
        value = await self._script("acquire")(
            keys=[keys.of(kernel_id, "lease"), keys.of(kernel_id, "fence")],
            args=[node, int(ttl * 1000), self.tokens.get(kernel_id, 0)],
        )
        value = value.decode() if isinstance(value, bytes) else value
        self.saw(kernel_id, value)
        if value:
            self.renewed_at[kernel_id] = sent
        return value

    async def acquire_again(self, kernel_id: str, node: str, ttl: float) -> str | None:
        """A new lease for ``node`` if the lease ran out unused (see ``_REACQUIRE``): free,
        and the transcript's head still the one this node last wrote (the store's
        ``confirmed``), so that no other node wrote in between. (The head read just before
        would do for a node that was never paused; one paused while another took the kernel
        over, numbered on and let the lease run out would take it back over their records.)"""
        keys = self.store.keys
        sent = time.monotonic()
        head = self.store.confirmed.get(kernel_id, 0)
        value = await self._script("reacquire")(
            keys=[
                keys.of(kernel_id, "lease"),
                keys.of(kernel_id, "fence"),
                keys.of(kernel_id, "meta"),
            ],
            args=[node, int(ttl * 1000), self.tokens.get(kernel_id, 0), str(head)],
        )
        value = value.decode() if isinstance(value, bytes) else value
        self.saw(kernel_id, value)
        if value:
            self.renewed_at[kernel_id] = sent
        return value

    async def renew(self, kernel_id: str, value: str, ttl: float) -> tuple[bool, int]:
        """Renew the kernel's lease ``value``: whether it was still this value (renewed),
        and the kernel's head in Redis (0: none; below what this node wrote, Redis lost
        records)."""
        keys = self.store.keys
        sent = time.monotonic()
        renewed, head = await self._script("renew")(
            keys=[keys.of(kernel_id, "lease"), keys.of(kernel_id, "meta")],
            args=[value, int(ttl * 1000)],
        )
        if renewed and self._values.get(kernel_id) == value:
            self.renewed_at[kernel_id] = sent
        return bool(renewed), int(head)

    async def release(self, kernel_id: str, value: str) -> bool:
        released = await self._script("release")(
            keys=[self.store.keys.of(kernel_id, "lease")], args=[value]
        )
        return bool(released)

    async def holder(self, kernel_id: str) -> str | None:
        value = await self.store.redis.get(self.store.keys.of(kernel_id, "lease"))
        value = value.decode() if isinstance(value, bytes) else value
        self.saw(kernel_id, value)
        return value

    async def hand_over(self, kernel_id: str, value: str, clean: bool) -> bool:
        """Release the kernel's lease for another node to take (a graceful stop), saying
        whether everything this node gave a number is written and the kernel holds what
        it publishes from here on (``clean``: the next owner needs no gap)."""
        released = await self._script("hand_over")(
            keys=[self.store.keys.of(kernel_id, "lease"), self.store.keys.of(kernel_id, "meta")],
            args=[value, "1" if clean else "0"],
        )
        return bool(released)

    async def take_over(
        self, kernel_id: str, lease: str, reason: str, seen: int = 0
    ) -> Record | None:
        """Number on above what the last owner reserved: one gap record for the numbers it
        may have given out without writing (and whatever the kernel printed while no node
        recorded it). ``seen``: the last seq this node had of the kernel; Redis's head
        below it means that Redis lost records too (reason ``store_lost``): the gap then
        covers them, and ``reserve_ahead`` numbers past ``seen`` (the lost reservation).
        Returns the gap record, written, or None if the kernel has no transcript yet, or
        if its last owner handed it over cleanly (see :meth:`hand_over`;
        :attr:`handed_over` then has it)."""
        meta = self.store.keys.of(kernel_id, "meta")
        head, reserved, handed = await self.store.redis.hmget(
            meta, "head", "reserved", "handed_over"
        )
        if handed is not None:
            await self.store.redis.hdel(meta, "handed_over")
        if handed == b"1":
            self.handed_over.add(kernel_id)
            return None
        if head is None and reserved is None and not seen:
            return None
        if handed == b"0":
            reason = "owner_stopped"
        head = int(head or 0)
        # Above every number the last owner reserved, and every one this node numbered
        # and forsook when it lost the kernel before (it may have fanned none of them
        # out, but its writer must never land one of them after this gap).
        last = max(int(reserved or 0), head + 1, self.store.forsaken_head(kernel_id))
        kept: list[Record] = []
        # Ends this node keeps past what Redis has: read off the record bus, or handed
        # over by the last owner (written by it, then lost with Redis's data).
        ends = self.store.ends_since(kernel_id, head, 1 << 62)
        top = max(seen, ends[-1].seq if ends else 0)
        if head < top:
            # Redis lost what this node had seen, or what the last owner wrote: the
            # execution ends kept of that go back at their seqs, between store_lost gaps.
            reason = "store_lost"
            last = max(last, top + max(self.store.reserve_ahead, 1))
            kept = self._kept_and_lost(kernel_id, head, top, reason)
            head = top
        now = time.time()
        gap = gap_record(kernel_id, head + 1, last, reason, now=now, date=iso_date(now))
        await self.store.append_now(kernel_id, [*kept, gap], lease, known=0)
        return gap

    async def cover_loss(self, kernel_id: str, lease: str, known: int) -> list[Record]:
        """Redis lost records of a kernel this node records (it wrote them up to seq
        ``known``): the execution ends this node keeps of them written back at their seqs
        (:meth:`..stores.redis.RedisTranscriptStore.ends_since`), and gap records (reason
        ``store_lost``) for the rest of what Redis no longer has, up to ``known``, so that
        the next append numbers on after it. Returns the gap records written, in seq
        order: none if Redis has everything up to ``known``."""
        head = await self.store.redis.hget(self.store.keys.of(kernel_id, "meta"), "head")
        head = int(head or 0)
        if head >= known:
            return []
        written = self._kept_and_lost(kernel_id, head, known, "store_lost")
        await self.store.append_now(kernel_id, written, lease, known=0)
        return [record for record in written if record.message.msg_type == GAP_MSG_TYPE]

    def _kept_and_lost(self, kernel_id: str, head: int, last: int, reason: str) -> list[Record]:
        """Seqs ``head + 1`` to ``last``, which Redis does not have: the execution ends this
        node keeps of them, at their seqs, and gap records (``reason``) for the rest, in
        seq order."""
        now = time.time()
        date = iso_date(now)
        written: list[Record] = []
        after = head
        for record in [*self.store.ends_since(kernel_id, head, last), None]:
            first = last + 1 if record is None else record.first_seq
            if first > after + 1:
                written.append(
                    gap_record(kernel_id, after + 1, first - 1, reason, now=now, date=date)
                )
            if record is not None:
                written.append(record)
                after = record.seq
        return written


_SCRIPTS = {
    "acquire": _ACQUIRE,
    "renew": _RENEW,
    "release": _RELEASE,
    "hand_over": _HAND_OVER,
    "reacquire": _REACQUIRE,
}
