"""The coalescer (Invariant 6): render-equivalent merging, no added latency for a lone
message, at most one window for a burst. Time is passed in; no clock is read."""

from __future__ import annotations

import functools
import itertools
import random
from dataclasses import dataclass, field

import pytest
from helpers import record, status, stream

from kernel_gateway_stream.core.coalescer import Coalescer
from kernel_gateway_stream.core.frames import Frame
from kernel_gateway_stream.core.messages import KernelMessage, Record

WINDOW = 0.5  # a binary fraction: deadlines below are exact floats


def _ranges(frames: list[Frame]) -> list[tuple[int | None, int | None]]:
    return [(f.first_seq, f.last_seq) for f in frames]


def _out(seq: int, text: str, now: float, *, parent: str = "p1", name: str = "stdout") -> Record:
    return record(seq, stream(name, text, parent, msg_id=f"m{seq:04d}"), time=now)


def test_lone_message_after_quiet_period_goes_out_at_once() -> None:
    """Invariant 6: a lone stream message after a quiet period adds no latency."""
    coalescer = Coalescer(window=WINDOW)
    first = _out(1, "a", 10.0)
    out = coalescer.feed(first, now=10.0)
    assert _ranges(out) == [(1, 1)]
    assert out[0].message is first.message
    assert out[0].text == "a"
    assert coalescer.next_deadline() is None

    # Quiet for exactly one window: the next message goes out at once too.
    assert _ranges(coalescer.feed(_out(2, "b", 10.5), now=10.5)) == [(2, 2)]
    assert _ranges(coalescer.feed(_out(3, "c", 20.0), now=20.0)) == [(3, 3)]


def test_message_within_window_is_held_until_deadline() -> None:
    """Invariant 6: a burst waits, but no longer than the window's deadline."""
    coalescer = Coalescer(window=WINDOW)
    coalescer.feed(_out(1, "a", 10.0), now=10.0)

    assert coalescer.feed(_out(2, "b", 10.25), now=10.25) == []
    assert coalescer.next_deadline() == 10.5
    assert coalescer.due(10.25) == []
    assert coalescer.due(10.4999) == []
    assert coalescer.next_deadline() == 10.5

    released = coalescer.due(10.5)
    assert _ranges(released) == [(2, 2)]
    assert released[0].text == "b"
    assert coalescer.next_deadline() is None
    assert coalescer.due(10.5) == []


def test_due_starts_a_new_window() -> None:
    """Invariant 6: output keeps flowing once per window while a burst lasts."""
    coalescer = Coalescer(window=WINDOW)
    coalescer.feed(_out(1, "a", 10.0), now=10.0)
    coalescer.feed(_out(2, "b", 10.1), now=10.1)
    assert _ranges(coalescer.due(10.5)) == [(2, 2)]

    assert coalescer.feed(_out(3, "c", 10.75), now=10.75) == []
    assert coalescer.next_deadline() == 11.0
    assert _ranges(coalescer.due(11.0)) == [(3, 3)]

    # A late timer: due() at 11.75 sends, and the next window ends at 12.25.
    assert coalescer.feed(_out(4, "d", 11.25), now=11.25) == []
    assert coalescer.next_deadline() == 11.5
    assert _ranges(coalescer.due(11.75)) == [(4, 4)]
    assert coalescer.feed(_out(5, "e", 12.0), now=12.0) == []
    assert coalescer.next_deadline() == 12.25


def test_burst_is_merged_into_one_frame() -> None:
    """Invariant 6: consecutive stream messages of one parent and name merge, text joined."""
    coalescer = Coalescer(window=WINDOW)
    coalescer.feed(_out(1, "1\n", 10.0), now=10.0)
    for seq, now in ((2, 10.1), (3, 10.2), (4, 10.3)):
        assert coalescer.feed(_out(seq, f"{seq}\n", now), now=now) == []
    assert coalescer.next_deadline() == 10.5

    released = coalescer.due(10.5)
    assert _ranges(released) == [(2, 4)]
    assert released[0].text == "2\n3\n4\n"


def test_non_stream_message_flushes_pending_then_itself() -> None:
    """Invariant 6: merging never goes past a non-stream message, and order is kept."""
    coalescer = Coalescer(window=WINDOW)
    coalescer.feed(_out(1, "a", 10.0), now=10.0)
    coalescer.feed(_out(2, "b", 10.1), now=10.1)
    coalescer.feed(_out(3, "c", 10.2), now=10.2)
    idle = record(4, status("idle", "p1"), time=10.3)

    out = coalescer.feed(idle, now=10.3)

    assert _ranges(out) == [(2, 3), (4, 4)]
    assert [f.text for f in out] == ["bc", None]
    assert out[1].message is idle.message
    assert coalescer.next_deadline() is None


def test_non_stream_message_with_nothing_pending_goes_out_alone() -> None:
    """Invariant 6: a non-stream message is never held."""
    coalescer = Coalescer(window=WINDOW)
    assert _ranges(coalescer.feed(record(1, status("busy")), now=10.0)) == [(1, 1)]
    assert _ranges(coalescer.feed(record(2, status("idle")), now=10.0)) == [(2, 2)]
    assert coalescer.next_deadline() is None


def test_stream_after_non_stream_flush_keeps_the_window() -> None:
    """Invariant 6: a flush by a non-stream message does not end the burst's window."""
    coalescer = Coalescer(window=WINDOW)
    coalescer.feed(_out(1, "a", 10.0), now=10.0)
    coalescer.feed(_out(2, "b", 10.1), now=10.1)
    coalescer.feed(record(3, status("idle")), now=10.2)
    assert coalescer.feed(_out(4, "c", 10.3), now=10.3) == []
    assert coalescer.next_deadline() == 10.5


@pytest.mark.parametrize(
    ("parent", "name"), [("p2", "stdout"), ("p1", "stderr")], ids=["parent", "name"]
)
def test_different_parent_or_name_flushes_the_run_and_starts_another(
    parent: str, name: str
) -> None:
    """Invariant 6: merging never crosses a parent msg_id or a stream name; the new run
    keeps the current deadline."""
    coalescer = Coalescer(window=WINDOW)
    coalescer.feed(_out(1, "a", 10.0), now=10.0)
    coalescer.feed(_out(2, "b", 10.1), now=10.1)
    coalescer.feed(_out(3, "c", 10.15), now=10.15)

    out = coalescer.feed(_out(4, "d", 10.2, parent=parent, name=name), now=10.2)

    assert _ranges(out) == [(2, 3)]
    assert out[0].text == "bc"
    assert (out[0].message.parent_msg_id, out[0].message.stream_name) == ("p1", "stdout")
    assert coalescer.next_deadline() == 10.5
    released = coalescer.due(10.5)
    assert _ranges(released) == [(4, 4)]
    assert (released[0].message.parent_msg_id, released[0].message.stream_name) == (parent, name)


def test_run_reaching_max_bytes_goes_out_at_once() -> None:
    """Invariant 6: a run that reaches max_bytes is sent without waiting for the window.
    Its bytes are the message it becomes: the first record's parts, then the others'
    content only."""
    size = Frame.from_record(_out(2, "b", 0.0)).size
    content = len(_out(3, "c", 0.0).message.raw_content)
    coalescer = Coalescer(window=WINDOW, max_bytes=size + content)
    coalescer.feed(_out(1, "a", 10.0), now=10.0)
    assert coalescer.feed(_out(2, "b", 10.1), now=10.1) == []

    out = coalescer.feed(_out(3, "c", 10.2), now=10.2)

    assert _ranges(out) == [(2, 3)]
    assert out[0].text == "bc"
    assert coalescer.next_deadline() is None


def test_message_that_would_pass_max_bytes_starts_a_new_run() -> None:
    """Invariant 6: a run never grows past max_bytes; the message that would pass it
    flushes the run and waits in a new one, with the same deadline."""
    size = Frame.from_record(_out(2, "b", 0.0)).size
    long_content = len(_out(3, "c" * 40, 0.0).message.raw_content)
    coalescer = Coalescer(window=WINDOW, max_bytes=size + long_content - 1)
    coalescer.feed(_out(1, "a", 10.0), now=10.0)
    coalescer.feed(_out(2, "b", 10.1), now=10.1)

    out = coalescer.feed(_out(3, "c" * 40, 10.2), now=10.2)

    assert _ranges(out) == [(2, 2)]
    assert coalescer.next_deadline() == 10.5
    assert [f.text for f in coalescer.due(10.5)] == ["c" * 40]


def test_quiet_counts_from_when_the_last_frame_was_written() -> None:
    """Invariant 6 with many subscribers: writing a frame to all of them may take longer
    than ``quiet``; the next record of the flood, read after that, is not taken for the
    first after a quiet period (which would send it alone, and so every next one)."""
    coalescer = Coalescer(window=WINDOW, quiet=0.125)
    assert _ranges(coalescer.feed(_out(1, "a", 10.0), now=10.0)) == [(1, 1)]
    coalescer.written(10.25)  # the writes to every subscriber took 250 ms
    assert coalescer.feed(_out(2, "b", 10.3125), now=10.3125) == []  # 62.5 ms after: held
    assert coalescer.next_deadline() == 10.4375
    # Without the writes counted, the same record went out at once.
    other = Coalescer(window=WINDOW, quiet=0.125)
    other.feed(_out(1, "a", 10.0), now=10.0)
    assert _ranges(other.feed(_out(2, "b", 10.3125), now=10.3125)) == [(2, 2)]


def test_writing_only_other_messages_does_not_hold_the_next_line() -> None:
    """Invariant 6: ``written`` after a status message (no stream frame went out since the
    last one it was told of) moves nothing: a cell's first line is not held."""
    coalescer = Coalescer(window=WINDOW, quiet=0.125)
    coalescer.feed(_out(1, "a", 10.0), now=10.0)
    coalescer.written(10.0)
    coalescer.feed(record(2, status("busy"), time=20.0), now=20.0)
    coalescer.written(20.0)
    assert _ranges(coalescer.feed(_out(3, "b", 20.01), now=20.01)) == [(3, 3)]


def test_window_zero_means_no_coalescing() -> None:
    """Invariant 6: with window=0 every message goes out at once, on its own."""
    coalescer = Coalescer(window=0)
    for seq in range(1, 6):
        assert _ranges(coalescer.feed(_out(seq, "x", 10.0), now=10.0)) == [(seq, seq)]
        assert coalescer.next_deadline() is None
    assert coalescer.flush() == []


def test_flush_sends_everything_pending() -> None:
    """Invariant 6: flush() (subscriber attach, shutdown) sends the pending run now."""
    coalescer = Coalescer(window=WINDOW)
    assert coalescer.flush() == []
    coalescer.feed(_out(1, "a", 10.0), now=10.0)
    coalescer.feed(_out(2, "b", 10.1), now=10.1)
    coalescer.feed(_out(3, "c", 10.2), now=10.2)

    out = coalescer.flush()

    assert _ranges(out) == [(2, 3)]
    assert out[0].text == "bc"
    assert coalescer.flush() == []
    assert coalescer.next_deadline() is None
    assert coalescer.due(99.0) == []


@pytest.mark.parametrize(("window", "max_bytes"), [(-0.1, 10), (0.1, 0), (0.1, -1)])
def test_constructor_rejects_bad_limits(window: float, max_bytes: int) -> None:
    """Invariant 6: a negative window or a non-positive byte limit is refused."""
    with pytest.raises(ValueError, match="need window >= 0"):
        Coalescer(window=window, max_bytes=max_bytes)


# --- property: a seeded random workload -------------------------------------------------


@dataclass
class _Run:
    """What one simulated kernel fed in and what the coalescer sent, with times."""

    window: float
    records: list[Record] = field(default_factory=list)
    emitted: list[tuple[float, Frame]] = field(default_factory=list)
    #: seq -> True when that record was sent at the instant it arrived.
    immediate_expected: dict[int, bool] = field(default_factory=dict)


_ALPHABET = "abc xyz\n\r\té✓0123456789"


@functools.cache
def _simulate(seed: int, count: int = 3000) -> _Run:
    rng = random.Random(seed)
    window = (0.01, 0.05, 0.2, 0.0)[seed % 4]
    # Half the runs with a quiet threshold of its own, as the broker configures it.
    quiet = window / rng.choice([1, 4])
    coalescer = Coalescer(window=window, max_bytes=rng.choice([1200, 4000, 65536]), quiet=quiet)
    parents = ["p1", "p2", "p3"][: rng.choice([2, 3])]
    run = _Run(window)
    now = 1000.0
    key = (parents[0], "stdout")
    last_stream_emit: float | None = None

    def emit(at: float, frames: list[Frame]) -> None:
        nonlocal last_stream_emit
        for frame in frames:
            run.emitted.append((at, frame))
            if frame.message.is_stream:
                last_stream_emit = at

    def fire_deadlines(until: float) -> None:
        # The adapter's timer: due() is called at every deadline that has come.
        while (deadline := coalescer.next_deadline()) is not None and deadline <= until:
            frames = coalescer.due(deadline)
            assert len(frames) == 1
            emit(deadline, frames)

    for seq in range(1, count + 1):
        previous = now
        gap_kind = rng.random()
        if gap_kind < 0.3:
            gap = 0.0
        elif gap_kind < 0.8:
            gap = rng.uniform(0, window / 4) if window else rng.uniform(0, 0.001)
        elif gap_kind < 0.95:
            gap = rng.uniform(0, 2 * window)
        else:
            gap = rng.uniform(window, 5 * window + 0.01)
        now = previous + gap
        if rng.random() < 0.2:
            # A timer firing at some other moment finds nothing due.
            moment = rng.uniform(previous, now)
            fire_deadlines(moment)
            assert coalescer.due(moment) == []
        fire_deadlines(now)

        if rng.random() < 0.08:
            message: KernelMessage = status(rng.choice(["busy", "idle"]), rng.choice(parents))
        else:
            if rng.random() < 0.15:
                key = (rng.choice(parents), rng.choice(["stdout", "stderr"]))
            text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randrange(0, 40)))
            message = stream(key[1], text, key[0])
        item = record(seq, message, time=now)
        run.records.append(item)
        nothing_pending = coalescer.next_deadline() is None
        quiet = last_stream_emit is None or last_stream_emit + window <= now
        run.immediate_expected[seq] = message.is_stream and nothing_pending and quiet
        emit(now, coalescer.feed(item, now))
    emit(now, coalescer.flush())
    return run


SEEDS = [0, 1, 2, 3, 5, 42]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_workload_text_is_render_equivalent(seed: int) -> None:
    """Invariant 6: per (parent, stream name), the sent text concatenates to exactly the
    text the kernel published."""
    run = _simulate(seed)
    sent: dict[tuple[str | None, str], list[str]] = {}
    published: dict[tuple[str | None, str], list[str]] = {}
    for _, frame in run.emitted:
        if frame.message.stream_name is not None:
            key = (frame.message.parent_msg_id, frame.message.stream_name)
            sent.setdefault(key, []).append(frame.text or "")
    for item in run.records:
        if item.message.stream_name is not None:
            key = (item.message.parent_msg_id, item.message.stream_name)
            published.setdefault(key, []).append(item.message.text or "")
    assert {k: "".join(v) for k, v in sent.items()} == {k: "".join(v) for k, v in published.items()}
    assert len(published) >= 4


@pytest.mark.parametrize("seed", SEEDS)
def test_random_workload_covers_every_seq_once_in_order(seed: int) -> None:
    """Invariants 5 and 6: frames' seq ranges are contiguous, cover every seq exactly
    once and in order, and a merged frame spans only streams of its own parent and name."""
    run = _simulate(seed)
    ranges = [(frame.first_seq, frame.last_seq) for _, frame in run.emitted]
    assert ranges[0][0] == 1
    assert ranges[-1][1] == len(run.records)
    for (_, previous_last), (first, last) in itertools.pairwise(ranges):
        assert first == (previous_last or 0) + 1
        assert last is not None
        assert last >= first
    by_seq = {item.seq: item.message for item in run.records}
    merged = 0
    for _, frame in run.emitted:
        assert frame.first_seq is not None
        assert frame.last_seq is not None
        covered = [by_seq[seq] for seq in range(frame.first_seq, frame.last_seq + 1)]
        if len(covered) > 1:
            merged += 1
            assert all(m.is_stream for m in covered)
            assert {(m.parent_msg_id, m.stream_name) for m in covered} == {
                (frame.message.parent_msg_id, frame.message.stream_name)
            }
            assert frame.text == "".join(m.text or "" for m in covered)
        else:
            assert frame.message is covered[0]
    if run.window > 0:
        assert merged > 0


@pytest.mark.parametrize("seed", SEEDS)
def test_random_workload_latency_is_at_most_one_window(seed: int) -> None:
    """Invariant 6: no frame waits longer than one window after its first record arrived,
    and a stream message arriving after a quiet period (nothing pending, no stream frame
    sent for a window) goes out the instant it arrives."""
    run = _simulate(seed)
    arrival = {item.seq: item.time for item in run.records}
    times = [at for at, _ in run.emitted]
    assert times == sorted(times)
    immediate = 0
    for at, frame in run.emitted:
        assert frame.first_seq is not None
        assert at <= arrival[frame.first_seq] + run.window
        if run.immediate_expected[frame.first_seq]:
            immediate += 1
            assert at == arrival[frame.first_seq]
            assert frame.last_seq == frame.first_seq
    assert immediate > 0


def test_spaced_output_wider_than_quiet_is_never_held() -> None:
    """Invariant 6: a message after a quiet period goes at once, and "quiet" is its own
    threshold: prints 10 ms apart are each sent at once with a 50 ms window."""
    coalescer = Coalescer(window=0.5, quiet=0.0625)
    for seq in range(1, 20):
        now = 10.0 + seq * 0.125
        assert _ranges(coalescer.feed(_out(seq, f"{seq}\n", now), now=now)) == [(seq, seq)]
    assert coalescer.next_deadline() is None


def test_output_closer_than_quiet_is_merged_until_it_pauses_or_the_window_ends() -> None:
    """Invariant 6: a flood (messages closer than ``quiet``) waits, at most one window; a
    short burst waits only until it pauses for ``quiet``."""
    coalescer = Coalescer(window=0.5, quiet=0.0625)
    assert _ranges(coalescer.feed(_out(1, "a", 10.0), now=10.0)) == [(1, 1)]
    # A short burst: held until it has been quiet for ``quiet``.
    assert coalescer.feed(_out(2, "b", 10.03125), now=10.03125) == []
    assert coalescer.next_deadline() == 10.09375
    assert _ranges(coalescer.due(10.09375)) == [(2, 2)]
    # A flood: every message within ``quiet`` of the last, so the window decides.
    now = 10.125
    for seq in range(3, 13):
        assert coalescer.feed(_out(seq, "x", now), now=now) == []
        assert coalescer.due(now) == []
        now += 0.046875
    assert coalescer.next_deadline() == 10.59375
    assert _ranges(coalescer.due(10.59375)) == [(3, 12)]
    # A message after a pause longer than ``quiet`` goes at once, inside the window.
    assert _ranges(coalescer.feed(_out(13, "d", 10.75), now=10.75)) == [(13, 13)]


def test_a_late_timer_does_not_hold_the_message_after_a_pause() -> None:
    """Invariant 6: if the timer is late, the next message after a pause sends what was
    pending and itself, merged."""
    coalescer = Coalescer(window=0.5, quiet=0.0625)
    coalescer.feed(_out(1, "a", 10.0), now=10.0)
    coalescer.feed(_out(2, "b", 10.03125), now=10.03125)
    out = coalescer.feed(_out(3, "c", 10.25), now=10.25)
    assert _ranges(out) == [(2, 3)]
    assert out[0].text == "bc"
    assert coalescer.next_deadline() is None


def test_frames_per_second_are_bounded_by_quiet_whatever_the_arrival_pattern() -> None:
    """Invariant 6: however messages arrive, stream frames go out at most once per
    ``quiet`` (plus the frames a non-stream message or a full run forces)."""
    rng = random.Random(7)
    quiet = 0.0625
    coalescer = Coalescer(window=0.5, quiet=quiet)
    now, sent = 10.0, []
    for seq in range(1, 3000):
        now += rng.choice((0.0, 0.001, 0.01, 0.03, 0.07, 0.2))
        for frame in coalescer.due(now) + coalescer.feed(_out(seq, "x", now), now=now):
            sent.append((now, frame))
    times = [t for t, _ in sent]
    assert all(b - a >= quiet for a, b in itertools.pairwise(times))
    assert [seq for _, f in sent for seq in range(f.first_seq, f.last_seq + 1)] == list(
        range(1, sum(f.last_seq - f.first_seq + 1 for _, f in sent) + 1)
    )


def test_quiet_must_lie_within_the_window() -> None:
    with pytest.raises(ValueError, match="quiet <= window"):
        Coalescer(window=0.05, quiet=0.1)
    with pytest.raises(ValueError, match="quiet <= window"):
        Coalescer(window=0.05, quiet=-1)
