"""The replay-to-live hand-off (core/handoff.py), driven with no event loop.

Invariant 5 (resume is exact) and invariant 4 (a client catching up holds no live frames):
a two-party harness plays the adapter's part: a transcript that grows while the
subscriber reads, a fan-out that attaches it, and a record of what it was sent.
"""

from __future__ import annotations

import random

import pytest
from helpers import frame, status, stream

from kernel_gateway_stream.core.frames import Frame
from kernel_gateway_stream.core.handoff import (
    ATTACH,
    LIVE,
    STOPPED,
    Handoff,
    HeldReply,
    Read,
    interleave,
)


class Harness:
    """A transcript that grows by ``rate`` records per page read, read ``page`` at a
    time; what the subscriber was sent, and when it attached."""

    def __init__(self, head: int, page: int, rate: int) -> None:
        self.head = head
        self.page = page
        self.rate = rate
        self.sent: list[int] = []
        self.attached_at: int | None = None
        self.reads_while_attached = 0

    def run(self, since: int | None, live_within: int) -> int:
        handoff = Handoff(since, live_within=live_within)
        action = handoff.begin(self.head)
        steps = 0
        while action not in (LIVE, STOPPED):
            steps += 1
            assert steps < 100_000, "the hand-off does not converge"
            if isinstance(action, Read):
                if self.attached_at is not None:
                    self.reads_while_attached += 1
                records = list(
                    range(action.after + 1, min(action.until, action.after + self.page) + 1)
                )
                self.sent += records
                self.head += self.rate  # the kernel goes on meanwhile
                reached = records[-1] if records else action.until
                action = handoff.page_sent(action, reached, self.head)
            else:
                assert action is ATTACH
                self.attached_at = self.head
                action = handoff.attached(self.head)
        return handoff.cursor or 0


@pytest.mark.parametrize("seed", range(20))
def test_resume_is_exact_whatever_the_pace(seed: int) -> None:
    """Every number after ``since`` up to the attach point is read once, in order; it
    attaches only once it is within ``live_within``; and from the attach point the live
    feed takes over (the cursor ends there)."""
    rng = random.Random(seed)
    head = rng.randint(0, 50_000)
    since = rng.randint(0, head)
    page = rng.randint(100, 5000)
    # Any pace a replay can outrun, however slightly (a kernel that outruns the replay is
    # never caught up with: its client goes on reading, a page at a time, holding no more).
    harness = Harness(head, page=page, rate=rng.randint(0, page - 1))
    live_within = rng.randint(1, 10_000)
    cursor = harness.run(since, live_within)
    assert harness.attached_at is not None
    assert harness.sent == list(range(since + 1, harness.attached_at + 1))
    assert cursor == harness.attached_at
    # Attached, it reads only the short stretch that was left: what one read let come.
    left = max(live_within, harness.rate)
    assert harness.reads_while_attached <= left // harness.page + 1


def test_no_since_goes_live_at_once() -> None:
    handoff = Handoff(None, live_within=100)
    assert handoff.begin(42) is ATTACH
    assert handoff.attached(42) is LIVE
    assert handoff.cursor == 42


def test_a_client_far_behind_reads_without_attaching() -> None:
    """Invariant 4: catching up, it is not attached, so it holds no live frames."""
    handoff = Handoff(0, live_within=1000)
    assert (read := handoff.begin(100_000)) == Read(0, 100_000)
    assert (read := handoff.page_sent(read, 5000, 101_000)) == Read(5000, 101_000)
    assert handoff.attached_at is None
    assert handoff.page_sent(read, 100_500, 101_000) is ATTACH
    assert (read := handoff.attached(101_200)) == Read(100_500, 101_200)
    assert handoff.page_sent(read, 101_200, 101_300) is LIVE


def test_a_kernel_that_outpaces_each_read_is_caught_up_with() -> None:
    """However fast the kernel, once a read covers all there was when it began, the
    subscriber attaches: it does not chase the head for ever (what came during that read
    is one read's worth, read while live frames wait in the bounded queue)."""
    handoff = Handoff(0, live_within=10)
    assert (read := handoff.begin(3000)) == Read(0, 3000)
    assert (read := handoff.page_sent(read, 1000, 4000)) == Read(1000, 4000)
    assert handoff.page_sent(read, 4000, 7000) is ATTACH


def test_stopped_reads_to_the_end_and_does_not_go_live() -> None:
    """The kernel shut down: read what is there, then STOPPED, attached or not."""
    handoff = Handoff(0, live_within=10)
    assert (read := handoff.begin(100)) == Read(0, 100)
    handoff.stop()
    assert (read := handoff.page_sent(read, 50, 100)) == Read(50, 100)
    assert handoff.page_sent(read, 100, 100) is STOPPED
    attached = Handoff(0, live_within=1000)
    assert attached.begin(100) is ATTACH
    assert (read := attached.attached(100)) == Read(0, 100)
    attached.stop()
    assert attached.page_sent(read, 100, 100) is STOPPED


def test_a_page_the_filters_emptied_still_advances() -> None:
    """A filtered read that found nothing reports how far it looked: no re-reading."""
    handoff = Handoff(0, live_within=10)
    assert (read := handoff.begin(10_000)) == Read(0, 10_000)
    assert handoff.page_sent(read, 10_000, 10_000) is ATTACH


def _frames(*seqs: int) -> list[Frame]:
    return [frame(seq, stream("stdout", f"{seq}\n")) for seq in seqs]


def _reply(after: int) -> HeldReply:
    return HeldReply(after, Frame.reply("shell", status("idle", msg_id=f"reply-{after}")))


def test_interleave_puts_each_reply_after_the_output_that_preceded_it() -> None:
    """Item 19: a reply held while the client was away comes back where it was: after
    the last IOPub message at or below the head when it arrived."""
    frames = _frames(5, 6, 7, 8)
    replies = [_reply(3), _reply(6), _reply(6), _reply(8), _reply(20)]
    out, placed = interleave(frames, replies)
    order = [f.last_seq if f.channel == "iopub" else f"r{f.message.msg_id[6:]}" for f in out]
    assert order == ["r3", 5, 6, "r6", "r6", 7, 8, "r8"]
    assert placed == 4  # the one after seq 20 waits for a later page, or for going live
    assert interleave([], replies) == ([], 0)
    assert interleave(frames, []) == (frames, 0)


def test_interleave_respects_merged_frames() -> None:
    """A merged frame (5..9) is one message: a reply from the middle goes after it."""
    merged = Frame.join(_frames(5, 6, 7, 8, 9))
    out, placed = interleave([merged, *_frames(10)], [_reply(7)])
    assert [f.channel for f in out] == ["iopub", "shell", "iopub"]
    assert placed == 1
