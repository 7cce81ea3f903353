"""The fault harness's checker: what every client got, against the durable transcript and
the kernel's own count of what it printed (issue 25). Pure: no I/O, no clock.

The rules it checks, each a count that must be zero for the promise "no output lost,
ever, and a seq means one message":

* **forks**: a message a client got whose seqs hold other content in the transcript, or
  nothing at all (no record and no gap);
* **reused seqs**: a seq that reached clients as two different messages (two claims on one
  seq conflict when they cover the same seqs with other content, are of other types, or
  are stream text with no line in common, unless both are what the transcript holds: one
  history merged differently);
* **silent loss**: a line the kernel printed that a history (a client's, or the
  transcript) lacks, with no gap record of that history between the lines around it;
* **understated gaps**: gap records that say fewer were lost than the lines missing where
  they stand (a gap's ``lost``, else its range; ``lost: null`` says "unknown" and never
  understates);
* **executions that never end**: a burst the kernel ran with no ``idle`` status in the
  transcript though the transcript holds something of it, or nothing and no gap where it
  would be (and, counted apart, on a client). A burst of which the transcript holds
  nothing at all, behind a gap, is counted apart as *lost whole*: the transcript does not
  show it running, it says its seqs were lost (what an emptied Redis does to executions
  older than the ends its nodes keep), and its lines count as lost;
* **health ok while writes failed**: a node's ``/api/gateway/health`` said ``ok`` while
  that node could not reach Redis, ``grace`` seconds after it lost it.

Also counted, and not a broken rule by themselves: lines lost inside gaps (durable loss),
and messages clients got whose seqs the transcript holds only as a gap (delivered, never
made durable: what committed-only delivery rules out).

Every finding has a time; :func:`check` attributes it to the last fault begun at or before
that time (``"none"`` before the first), so the table says what each kind of fault costs:
a message, when it arrived; lines behind a gap, when the gap was recorded (or reached the
client; of several gaps around them, the one that says the most was lost); lines lost
silently, when the kernel printed them; an execution that never ended, when the gap where
its end would be was recorded, else when it ended in the kernel.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "Burst",
    "Closed",
    "Counts",
    "Delivery",
    "Event",
    "Fault",
    "Gap",
    "HealthSample",
    "History",
    "Outage",
    "Report",
    "check",
]

#: The fault kind of findings made before the first fault.
NO_FAULT = "none"


@dataclass(frozen=True, slots=True)
class Delivery:
    """A numbered message: ``first_seq..seq`` (a merged stream frame covers several)."""

    first_seq: int
    seq: int
    msg_type: str
    #: The ``msg_id`` of its parent (the execution it belongs to), "" if none.
    parent: str
    #: A stream's text; for any other message its content as canonical JSON.
    payload: str
    #: When it arrived (the transcript's records: 0).
    at: float = 0.0


@dataclass(frozen=True, slots=True)
class Gap:
    """A gap record: the seqs ``first_seq..last_seq`` hold nothing."""

    first_seq: int
    last_seq: int
    reason: str
    #: How many messages it says were lost: None when it gives no count (its range is the
    #: statement), -1 when it says the number is unknown (``"lost": null``).
    lost: int | None = None
    at: float = 0.0

    @property
    def stated(self) -> float:
        if self.lost is None:
            return self.last_seq - self.first_seq + 1
        return float("inf") if self.lost < 0 else self.lost


@dataclass(frozen=True, slots=True)
class Closed:
    """The server closed a client's connection (it reconnects with ``since``)."""

    code: int | None
    reason: str | None
    at: float = 0.0


Event = Delivery | Gap | Closed


@dataclass(frozen=True, slots=True)
class History:
    """What one client got, in order, across its reconnections; or the transcript."""

    name: str
    events: tuple[Event, ...]


@dataclass(frozen=True, slots=True)
class Burst:
    """One execution of the flooding kernel, in the kernel's own log: it printed the lines
    ``first_line..end_line - 1`` between ``started`` and ``ended``."""

    msg_id: str
    first_line: int
    end_line: int
    started: float
    ended: float

    def time_of(self, line: int) -> float:
        span = max(1, self.end_line - self.first_line)
        return self.started + (self.ended - self.started) * (line - self.first_line) / span


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault as the harness applied it: ``kind`` on ``target`` from ``start`` to ``end``."""

    kind: str
    target: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Outage:
    """A window in which ``node`` could not write to Redis (a Redis fault: every node)."""

    node: str
    start: float
    end: float
    kind: str


@dataclass(frozen=True, slots=True)
class HealthSample:
    node: str
    at: float
    status: str


@dataclass
class Counts:
    """The counts for one fault kind (or for the whole run)."""

    faults: int = 0
    forks: int = 0
    reused_seqs: int = 0
    silent_loss: int = 0
    understated_gaps: int = 0
    never_ended: int = 0
    never_ended_on_clients: int = 0
    #: Bursts the transcript holds nothing of, behind a gap (not a broken rule).
    lost_whole: int = 0
    health_ok_while_failing: int = 0
    #: Lines the kernel printed that the transcript lacks (inside gaps or not).
    lines_lost: int = 0
    #: Lines a client lacks, summed over clients.
    lines_missing_on_clients: int = 0
    delivered_not_durable: int = 0

    #: The counts that must be zero.
    RULES = (
        "forks",
        "reused_seqs",
        "silent_loss",
        "understated_gaps",
        "never_ended",
        "health_ok_while_failing",
    )

    def broken(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.RULES if getattr(self, name)}


@dataclass
class Report:
    total: Counts = field(default_factory=Counts)
    by_kind: dict[str, Counts] = field(default_factory=dict)
    #: One line per finding (the first few of each rule), for a reader.
    examples: list[str] = field(default_factory=list)

    def add(self, kind: str, name: str, amount: int = 1, example: str | None = None) -> None:
        if not amount:
            return
        counts = self.by_kind.setdefault(kind, Counts())
        setattr(counts, name, getattr(counts, name) + amount)
        setattr(self.total, name, getattr(self.total, name) + amount)
        if example and sum(e.startswith(name + ":") for e in self.examples) < 5:
            self.examples.append(f"{name}: {example}")


class _Timeline:
    """Which fault a moment belongs to: the last one begun at or before it."""

    def __init__(self, faults: Sequence[Fault]) -> None:
        self.faults = sorted(faults, key=lambda f: f.start)
        self.starts = [f.start for f in self.faults]

    def kind_at(self, moment: float) -> str:
        index = bisect.bisect_right(self.starts, moment) - 1
        return self.faults[index].kind if index >= 0 else NO_FAULT


def _lines(text: str) -> list[int]:
    return [int(token) for token in text.split() if token.isdigit()]


@dataclass
class _Lines:
    """A history's flood lines: line -> the seqs of the message that brought it."""

    where: dict[int, tuple[int, int]] = field(default_factory=dict)
    duplicates: int = 0


def _flood_lines(history: History, flood: set[str]) -> _Lines:
    """Complete lines only: a line cut across two messages counts for the second."""
    found = _Lines()
    carry = ""
    for event in history.events:
        if not (isinstance(event, Delivery) and event.msg_type == "stream"):
            continue
        if event.parent not in flood:
            continue
        text = carry + event.payload
        complete, _, carry = text.rpartition("\n")
        for line in _lines(complete):
            if line in found.where:
                found.duplicates += 1
            else:
                found.where[line] = (event.first_seq, event.seq)
    return found


def _payload_of(transcript: dict[int, Delivery], first: int, last: int) -> str | None:
    """What the transcript holds at ``first..last`` as one message would carry it, or
    None if some seq there is no record."""
    records = [transcript.get(seq) for seq in range(first, last + 1)]
    if any(record is None for record in records):
        return None
    chosen = [record for record in records if record is not None]
    if chosen[-1].msg_type == "stream":
        return "".join(record.payload for record in chosen)
    return chosen[-1].payload


def _check_forks(
    clients: Sequence[History],
    records: dict[int, Delivery],
    gap_seqs: list[tuple[int, int]],
    timeline: _Timeline,
    report: Report,
) -> None:
    def in_gap(seq: int) -> bool:
        index = bisect.bisect_right(gap_seqs, (seq, float("inf"))) - 1
        return index >= 0 and gap_seqs[index][0] <= seq <= gap_seqs[index][1]

    for client in clients:
        for event in client.events:
            if not isinstance(event, Delivery):
                continue
            kind = timeline.kind_at(event.at)
            stored = _payload_of(records, event.first_seq, event.seq)
            seqs = range(event.first_seq, event.seq + 1)
            if stored is None and any(in_gap(seq) for seq in seqs):
                report.add(kind, "delivered_not_durable")
                continue
            if stored != event.payload:
                report.add(
                    kind,
                    "forks",
                    example=f"{client.name} got seqs {event.first_seq}..{event.seq} as "
                    f"{event.payload!r:.60}, the transcript has {stored!r:.60}",
                )


def _conflict(one: Delivery, other: Delivery) -> bool:
    if (one.first_seq, one.seq) == (other.first_seq, other.seq):
        return (one.msg_type, one.payload) != (other.msg_type, other.payload)
    if one.msg_type != other.msg_type or one.msg_type != "stream":
        return True
    mine, theirs = set(_lines(one.payload)), set(_lines(other.payload))
    return bool(mine and theirs and not mine & theirs)


def _check_reuse(
    clients: Sequence[History],
    records: dict[int, Delivery],
    timeline: _Timeline,
    report: Report,
) -> None:
    """Two claims on one seq that cannot both be true. Two frames that are both what the
    transcript holds over their seqs are one history merged differently (they may share
    a record that holds no whole line, a newline the kernel sent alone)."""

    def durable(event: Delivery) -> bool:
        return _payload_of(records, event.first_seq, event.seq) == event.payload

    claims: dict[int, list[Delivery]] = {}
    for client in clients:
        for event in client.events:
            if isinstance(event, Delivery):
                for seq in range(event.first_seq, event.seq + 1):
                    known = claims.setdefault(seq, [])
                    if event not in known:
                        known.append(event)
    for seq, known in sorted(claims.items()):
        pairs = [
            (one, other)
            for index, one in enumerate(known)
            for other in known[index + 1 :]
            if _conflict(one, other) and not (durable(one) and durable(other))
        ]
        if pairs:
            one, other = pairs[0]
            report.add(
                timeline.kind_at(max(one.at, other.at)),
                "reused_seqs",
                example=f"seq {seq} came in {one.first_seq}..{one.seq} as {one.payload!r:.40} "
                f"and in {other.first_seq}..{other.seq} as {other.payload!r:.40}",
            )


def _check_loss(
    history: History,
    expected: dict[int, float],
    flood: set[str],
    timeline: _Timeline,
    report: Report,
    *,
    durable: bool,
) -> None:
    """Missing lines of one history: each run of them must lie behind gaps of that history
    that say at least as many were lost."""
    got = _flood_lines(history, flood)
    gaps = sorted(
        (event for event in history.events if isinstance(event, Gap)),
        key=lambda gap: gap.first_seq,
    )
    present = sorted(got.where)
    missing = sorted(set(expected) - set(got.where))
    # Runs of missing lines between the same two present lines.
    runs: dict[int, list[int]] = {}
    for line in missing:
        runs.setdefault(bisect.bisect_left(present, line), []).append(line)
    understated: set[Gap] = set()
    for index, run in runs.items():
        below = got.where[present[index - 1]][1] if index > 0 else 0
        above = got.where[present[index]][0] if index < len(present) else 1 << 62
        covering = [gap for gap in gaps if gap.last_seq > below and gap.first_seq < above]
        # Lines behind a gap were lost by the fault that made the gap (Redis restarted
        # empty loses what was printed long before): of several, the one that says the
        # most was lost (a takeover's gap of a few lines does not take the blame for a
        # Redis that forgot everything around it); lines lost silently, when printed.
        moment = max(covering, key=lambda gap: gap.stated).at if covering else expected[run[0]]
        kind = timeline.kind_at(moment)
        report.add(kind, "lines_lost" if durable else "lines_missing_on_clients", len(run))
        where = f"{history.name}: lines {run[0]}..{run[-1]} ({len(run)}) between seqs {below}"
        if not covering:
            report.add(kind, "silent_loss", len(run), f"{where} and {above}, no gap")
        elif sum(gap.stated for gap in covering) < len(run):
            for gap in covering:
                if gap not in understated:
                    understated.add(gap)
                    report.add(
                        kind,
                        "understated_gaps",
                        example=f"{where}: gap {gap.first_seq}..{gap.last_seq} "
                        f"({gap.reason}) says {gap.stated}",
                    )


def _end_gaps(
    transcript: History, bursts: Sequence[Burst], flood: set[str]
) -> dict[str, Gap | None]:
    """For each burst, the gap of the transcript between its last line and the next
    burst's first (where its ``idle`` would be) that says the most was lost, if any."""
    got = _flood_lines(transcript, flood)
    present = sorted(got.where)
    gaps = [event for event in transcript.events if isinstance(event, Gap)]
    found: dict[str, Gap | None] = {}
    for burst in bursts:
        index = bisect.bisect_left(present, burst.end_line)
        below = got.where[present[index - 1]][1] if index > 0 else 0
        above = got.where[present[index]][0] if index < len(present) else 1 << 62
        covering = [gap for gap in gaps if gap.last_seq > below and gap.first_seq < above]
        # Of several, the one that says the most was lost (as for lines, above).
        found[burst.msg_id] = max(covering, key=lambda gap: gap.stated, default=None)
    return found


def _ended(history: History) -> set[str]:
    ended = set()
    for event in history.events:
        if not (isinstance(event, Delivery) and event.msg_type == "status"):
            continue
        if json.loads(event.payload).get("execution_state") == "idle":
            ended.add(event.parent)
    return ended


def _check_health(
    samples: Iterable[HealthSample],
    outages: Sequence[Outage],
    grace: float,
    report: Report,
) -> None:
    for sample in samples:
        if sample.status != "ok":
            continue
        for outage in outages:
            same = outage.node in ("*", sample.node)
            if same and outage.start + grace <= sample.at <= outage.end:
                report.add(
                    outage.kind,
                    "health_ok_while_failing",
                    example=f"{sample.node} said ok {sample.at - outage.start:.1f} s into "
                    f"{outage.kind}",
                )
                break


def check(
    clients: Sequence[History],
    transcript: History,
    bursts: Sequence[Burst],
    faults: Sequence[Fault] = (),
    health: Iterable[HealthSample] = (),
    outages: Sequence[Outage] = (),
    grace: float = 0.0,
    earlier: Sequence[History] = (),
) -> Report:
    """Count what each rule of the module docstring finds.

    ``transcript`` holds the durable records (:class:`Delivery`, one seq each) and gap
    records; ``bursts`` what the kernel says it printed (its executions); ``faults`` when
    each fault ran, ``outages`` when each node could not write, ``health`` what nodes said
    meanwhile; ``earlier``, the transcript as read before faults that may erase it (Redis
    restarted empty): what clients got is checked against every record ever durable, and
    a seq durable with other content before is a reused seq. Raises nothing on
    inconsistent input: that is what it counts."""
    report = Report()
    timeline = _Timeline(faults)
    for fault in faults:
        report.add(fault.kind, "faults")
    records = {e.seq: e for e in transcript.events if isinstance(e, Delivery)}
    for before in earlier:
        for event in before.events:
            if not isinstance(event, Delivery):
                continue
            now = records.setdefault(event.seq, event)
            if (now.msg_type, now.payload) != (event.msg_type, event.payload):
                report.add(
                    timeline.kind_at(now.at),
                    "reused_seqs",
                    example=f"the transcript had seq {event.seq} as {event.payload!r:.40}, "
                    f"then as {now.payload!r:.40}",
                )
    gap_seqs = sorted((e.first_seq, e.last_seq) for e in transcript.events if isinstance(e, Gap))
    _check_forks(clients, records, gap_seqs, timeline, report)
    _check_reuse(clients, records, timeline, report)
    expected: dict[int, float] = {}
    for burst in bursts:
        for line in range(burst.first_line, burst.end_line):
            expected[line] = burst.time_of(line)
    flood = {burst.msg_id for burst in bursts}
    _check_loss(transcript, expected, flood, timeline, report, durable=True)
    for client in clients:
        _check_loss(client, expected, flood, timeline, report, durable=False)
    ended = _ended(transcript)
    ended_on = [_ended(client) for client in clients]
    end_gaps = _end_gaps(transcript, bursts, flood)
    touched = {event.parent for event in transcript.events if isinstance(event, Delivery)}
    for burst in bursts:
        gap = end_gaps[burst.msg_id]
        kind = timeline.kind_at(burst.ended if gap is None else gap.at)
        if burst.msg_id not in touched and gap is not None:
            report.add(kind, "lost_whole")
        elif burst.msg_id not in ended:
            where = (
                "no gap where it would be"
                if gap is None
                else f"inside the {gap.reason} gap {gap.first_seq}-{gap.last_seq}"
                f" (lost {gap.lost}) recorded at {gap.at:.3f}"
            )
            report.add(
                kind,
                "never_ended",
                example=f"{burst.msg_id} (lines {burst.first_line}-{burst.end_line - 1}, ended"
                f" at {burst.ended:.3f}) has no idle in the transcript: {where}",
            )
        report.add(kind, "never_ended_on_clients", sum(burst.msg_id not in e for e in ended_on))
    _check_health(health, outages, grace, report)
    return report
