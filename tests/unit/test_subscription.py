"""A subscriber's bounded queue (Invariants 3 and 5): nothing dropped silently, resume
exact across the replay-to-live handoff, explicit overflow with where to resume."""

from __future__ import annotations

import pytest
from helpers import frame, make_message, status, stream

from kernel_gateway_stream.core.frames import Frame, SharedMerges
from kernel_gateway_stream.core.subscription import Overflow, SubscriberQueue


def _ranges(frames: list[Frame]) -> list[tuple[int | None, int | None]]:
    return [(f.first_seq, f.last_seq) for f in frames]


def _out(seq: int, text: str = "x", parent: str = "p1", name: str = "stdout") -> Frame:
    return frame(seq, stream(name, text, parent, msg_id=f"m{seq:04d}"))


def _reply(msg_id: str = "r1") -> Frame:
    return Frame.reply(
        "shell", make_message("execute_reply", {"status": "ok"}, "p1", msg_id=msg_id)
    )


def test_offer_then_take_keeps_order() -> None:
    """Invariant 5: frames come out in the order they were offered."""
    queue = SubscriberQueue(since=0)
    frames = [frame(1, status("busy")), _out(2), frame(3, status("idle")), _out(4, "y", "p2")]
    for f in frames:
        assert queue.offer(f, now=1.0) is None
    assert len(queue) == 4
    assert queue.queued_bytes == sum(f.size for f in frames)

    taken = queue.take()

    assert taken == frames
    assert all(a is b for a, b in zip(taken, frames, strict=True))
    assert len(queue) == 0
    assert queue.queued_bytes == 0
    assert queue.take() == []


def test_take_merges_consecutive_stream_frames() -> None:
    """Invariant 3: a subscriber that is behind is coalesced harder: take() merges runs."""
    queue = SubscriberQueue(since=0)
    for f in (
        _out(1, "a"),
        _out(2, "b"),
        _out(3, "c"),
        frame(4, status("idle")),
        _out(5, "d"),
        _out(6, "e", name="stderr"),
    ):
        queue.offer(f, now=1.0)

    taken = queue.take()

    assert _ranges(taken) == [(1, 3), (4, 4), (5, 5), (6, 6)]
    assert [f.text for f in taken] == ["abc", None, "d", "e"]


def test_take_respects_merge_max_bytes() -> None:
    """Invariant 3: merged frames stay within merge_max_bytes."""
    frames = [_out(seq, "z") for seq in range(1, 6)]
    queue = SubscriberQueue(since=0, merge_max_bytes=2 * frames[0].size)
    for f in frames:
        queue.offer(f, now=1.0)
    assert _ranges(queue.take()) == [(1, 2), (3, 4), (5, 5)]


def test_frames_at_or_below_since_are_dropped() -> None:
    """Invariant 5: subscribing with since=S yields only seq > S, each once."""
    queue = SubscriberQueue(since=5)
    assert queue.last_seq == 5
    for seq in (3, 4, 5, 6, 6, 7, 5, 7):
        assert queue.offer(_out(seq, str(seq)), now=1.0) is None
    assert _ranges(queue.take()) == [(6, 7)]


def test_merged_frame_whose_last_seq_is_delivered_is_dropped() -> None:
    """Invariant 5: a live frame wholly at or below what was replayed is not sent again."""
    queue = SubscriberQueue(since=0)
    queue.sent([_out(1), _out(2), _out(3)])
    assert queue.last_seq == 3
    assert queue.offer(Frame.join([_out(2, "b"), _out(3, "c")]), now=1.0) is None
    assert len(queue) == 0
    assert queue.offer(_out(4, "d"), now=1.0) is None
    assert _ranges(queue.take()) == [(4, 4)]


def test_start_after_positions_the_queue() -> None:
    """Invariant 5: start_after(H) (going live at the head) skips everything <= H."""
    queue = SubscriberQueue(since=0)
    queue.start_after(10)
    assert queue.last_seq == 10
    for seq in (9, 10, 11, 12):
        queue.offer(_out(seq, str(seq)), now=1.0)
    assert _ranges(queue.take()) == [(11, 12)]


def test_start_after_does_not_let_already_queued_seqs_in_again() -> None:
    """Invariant 5: positioning below what is queued does not admit duplicates."""
    queue = SubscriberQueue(since=0)
    queue.offer(_out(5), now=1.0)
    queue.start_after(3)
    assert queue.offer(_out(5), now=1.0) is None
    assert queue.offer(_out(4), now=1.0) is None
    assert _ranges(queue.take()) == [(5, 5)]


def test_replay_to_live_handoff_delivers_each_seq_once_in_order() -> None:
    """Invariant 5: live frames queued while holding, then a replay of (since, head], then
    the live frames: every seq > since once, in order."""
    queue = SubscriberQueue(since=2, holding=True)
    # Live frames arrive while the replay is running (the broker flushed at attach: head=6).
    for seq in (7, 8, 9):
        assert queue.offer(_out(seq, str(seq)), now=1.0) is None
    assert queue.take() == []
    replay = [Frame.join([_out(3, "3"), _out(4, "4")]), frame(5, status()), _out(6, "6")]
    queue.sent(replay)
    assert queue.last_seq == 6
    # A live frame the replay already covered (offered late) is dropped.
    assert queue.offer(_out(6, "6"), now=1.0) is None
    queue.holding = False

    live = queue.take()
    queue.sent(live)

    delivered = [
        seq for f in replay + live for seq in range(f.first_seq or 0, (f.last_seq or 0) + 1)
    ]
    assert delivered == [3, 4, 5, 6, 7, 8, 9]
    assert "".join(f.text or "" for f in live) == "789"
    assert queue.last_seq == 9


def test_holding_queues_but_take_returns_nothing() -> None:
    """Invariant 5: while a replay is sent, live frames wait in the queue."""
    queue = SubscriberQueue(since=0, holding=True)
    queue.offer(_out(1, "a"), now=1.0)
    queue.offer(_out(2, "b"), now=1.0)
    assert queue.take() == []
    assert len(queue) == 2
    assert queue.queued_bytes == _out(1).size + _out(2).size
    queue.holding = False
    assert [f.text for f in queue.take()] == ["ab"]


def test_overflow_by_bytes_reports_reason_and_last_sent_seq() -> None:
    """Invariant 3: past max_bytes, offer returns an explicit Overflow naming the reason and
    the last seq the subscriber was sent, so it can resume from the transcript."""
    one = _out(1).size
    queue = SubscriberQueue(since=0, max_bytes=3 * one)
    for seq in (1, 2):
        queue.offer(_out(seq), now=1.0)
    queue.sent(queue.take())
    assert queue.last_seq == 2
    for seq in (3, 4, 5):
        assert queue.offer(_out(seq), now=1.0) is None
    assert queue.queued_bytes == 3 * one

    overflow = queue.offer(_out(6), now=1.0)

    assert overflow == Overflow(
        reason=f"slow consumer: more than {3 * one} bytes queued",
        last_seq=2,
        queued_bytes=4 * one,
    )
    assert queue.overflow is overflow
    assert len(queue) == 0
    assert queue.queued_bytes == 0
    assert queue.take() == []


def test_overflow_by_lag_uses_now() -> None:
    """Invariant 3: a subscriber whose oldest queued frame is older than max_lag overflows."""
    queue = SubscriberQueue(since=10, max_lag=60.0)
    assert queue.offer(_out(11), now=100.0) is None
    assert queue.offer(_out(12), now=160.0) is None  # exactly max_lag behind: still fine

    overflow = queue.offer(_out(13), now=160.5)

    assert overflow is not None
    assert overflow.reason == "slow consumer: more than 60 s behind"
    assert overflow.last_seq == 10
    assert overflow.queued_bytes == 3 * _out(11).size


def test_lag_counts_from_the_oldest_frame_still_queued() -> None:
    """Invariant 3: a subscriber that keeps taking is never behind, however long it runs."""
    queue = SubscriberQueue(since=0, max_lag=1.0)
    for seq in range(1, 50):
        assert queue.offer(_out(seq), now=float(seq)) is None
        queue.sent(queue.take())
    assert queue.last_seq == 49
    assert queue.overflow is None


def test_after_overflow_every_offer_returns_it_and_queues_nothing() -> None:
    """Invariant 3: once over the limit, the subscriber gets nothing more, silently or not."""
    queue = SubscriberQueue(since=0, max_bytes=1)
    overflow = queue.offer(_out(1), now=1.0)
    assert overflow is not None
    assert overflow.last_seq == 0

    assert queue.offer(_out(2), now=2.0) is overflow
    assert queue.offer(_reply(), now=2.0) is overflow
    assert len(queue) == 0
    assert queue.queued_bytes == 0
    assert queue.take() == []


def test_replies_are_queued_and_never_deduplicated() -> None:
    """Invariant 3: replies have no seq, so they are never mistaken for a replayed frame."""
    queue = SubscriberQueue(since=100)
    first, second = _reply("r1"), _reply("r2")
    assert queue.offer(first, now=1.0) is None
    assert queue.offer(second, now=1.0) is None
    assert queue.offer(first, now=1.0) is None

    taken = queue.take()

    assert [f.message.msg_id for f in taken] == ["r1", "r2", "r1"]
    queue.sent(taken)
    assert queue.last_seq == 100


def test_replies_between_stream_frames_keep_their_place() -> None:
    """Invariant 5: a reply is sent in order and ends a merge run."""
    queue = SubscriberQueue(since=0)
    for f in (_out(1, "a"), _out(2, "b"), _reply(), _out(3, "c"), _out(4, "d")):
        queue.offer(f, now=1.0)
    taken = queue.take()
    assert _ranges(taken) == [(1, 2), (None, None), (3, 4)]
    assert [f.channel for f in taken] == ["iopub", "shell", "iopub"]


def test_sent_tracks_the_last_seq_handed_over() -> None:
    """Invariant 3: last_seq is the last IOPub seq handed to the transport."""
    queue = SubscriberQueue(since=0)
    queue.sent([])
    assert queue.last_seq == 0
    queue.sent([_out(1), Frame.join([_out(2), _out(3)]), _reply()])
    assert queue.last_seq == 3
    queue.sent([_reply()])
    assert queue.last_seq == 3
    queue.sent([_out(2)])
    assert queue.last_seq == 3


@pytest.mark.parametrize("holding", [False, True])
def test_overflow_while_holding_reports_the_replayed_position(holding: bool) -> None:
    """Invariant 3: a subscriber that overflows during replay resumes after what it got."""
    queue = SubscriberQueue(since=0, max_bytes=2 * _out(1).size, holding=holding)
    queue.sent([Frame.join([_out(1), _out(2)])])
    queue.offer(_out(3), now=0.0)
    queue.offer(_out(4), now=0.0)
    overflow = queue.offer(_out(5), now=0.0)
    assert overflow is not None
    assert overflow.last_seq == 2


def test_subscribers_behind_together_share_one_merged_frame() -> None:
    """Invariant 4: two subscribers holding the same queued frames get the same merged
    frame object, so it is encoded once for both; other frames merge on their own."""
    merges = SharedMerges(size=2)
    frames = [_out(seq, str(seq)) for seq in range(1, 4)]
    first, second = (SubscriberQueue(since=0, merges=merges) for _ in range(2))
    for queue in (first, second):
        for f in frames:
            queue.offer(f, now=1.0)
    (merged,) = first.take()
    (again,) = second.take()
    assert merged is again
    assert (merged.first_seq, merged.last_seq, merged.text) == (1, 3, "123")
    other = SubscriberQueue(since=0, merges=merges)
    for f in [_out(seq, str(seq)) for seq in range(1, 4)]:  # equal, but other objects
        other.offer(f, now=1.0)
    (separate,) = other.take()
    assert separate is not merged
    assert separate.text == "123"
    assert len(merges._memory) == 2
