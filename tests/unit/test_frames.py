"""Frames: encoded once per protocol, carrying their seq range, merged render-equivalently."""

from __future__ import annotations

import json

import pytest
from helpers import frame, make_message, record, status, stream

from kernel_gateway_stream.core.frames import (
    MERGE_FRAME_MIN_ALONE,
    Frame,
    frames_from_records,
    merge_runs,
)
from kernel_gateway_stream.core.wire import SEQ_METADATA_KEY, Protocol, decode_v1, websocket_frame


def _texts(frames: list[Frame]) -> list[str | None]:
    return [f.text for f in frames]


def _ranges(frames: list[Frame]) -> list[tuple[int | None, int | None]]:
    return [(f.first_seq, f.last_seq) for f in frames]


def _legacy(f: Frame) -> dict[str, object]:
    payload, binary = f.encode(Protocol.LEGACY)
    assert binary is False
    result: dict[str, object] = json.loads(payload)
    return result


def _v1(f: Frame) -> tuple[str, list[bytes]]:
    payload, binary = f.encode(Protocol.V1)
    assert binary is True
    return decode_v1(payload)


def test_encode_is_cached_per_protocol() -> None:
    """Invariant 4: a frame is encoded once per protocol; later calls return that object."""
    f = frame(1, stream("stdout", "a"))
    legacy = f.encode(Protocol.LEGACY)
    v1 = f.encode(Protocol.V1)
    assert f.encode(Protocol.LEGACY) is legacy
    assert f.encode(Protocol.V1) is v1
    assert legacy[0] is f.encode(Protocol.LEGACY)[0]
    assert legacy != v1


def test_framed_is_the_encoding_as_one_websocket_frame_built_once() -> None:
    """Invariant 4: the whole WebSocket frame is built once per protocol, and holds the
    same payload as encode()."""
    f = frame(1, stream("stdout", "a"))
    framed = f.framed(Protocol.V1)
    assert f.framed(Protocol.V1) is framed
    assert framed == websocket_frame(*f.encode(Protocol.V1))


def test_record_frame_carries_its_seq_in_metadata() -> None:
    """Invariant 5: an IOPub frame says which seq it is, under SEQ_METADATA_KEY."""
    message = make_message("status", {"execution_state": "busy"}, "exec-1", {"keep": 1})
    f = Frame.from_record(record(42, message))
    assert (f.channel, f.first_seq, f.last_seq) == ("iopub", 42, 42)

    legacy = _legacy(f)
    assert legacy["metadata"] == {"keep": 1, SEQ_METADATA_KEY: {"seq": 42, "first_seq": 42}}
    assert legacy["content"] == {"execution_state": "busy"}

    channel, parts = _v1(f)
    assert channel == "iopub"
    assert json.loads(parts[2]) == {"keep": 1, SEQ_METADATA_KEY: {"seq": 42, "first_seq": 42}}
    assert parts[0] == message.raw_header
    assert parts[1] == message.raw_parent_header
    assert parts[3] == message.raw_content


def test_v1_frame_keeps_buffers() -> None:
    """Invariant 4: buffers follow the JSON parts in a v1 frame."""
    message = make_message("comm_msg", {"data": {}}, "exec-1", buffers=(b"\x00a", b"b"))
    _, parts = _v1(frame(3, message))
    assert parts[4:] == [b"\x00a", b"b"]


def test_reply_frame_has_no_seq() -> None:
    """Invariant 5: replies on a client's own channel carry no sequence number."""
    message = make_message("execute_reply", {"status": "ok"}, "exec-1", {"m": 2})
    f = Frame.reply("shell", message)
    assert (f.channel, f.first_seq, f.last_seq, f.text) == ("shell", None, None, None)
    assert _legacy(f)["metadata"] == {"m": 2}
    assert _legacy(f)["channel"] == "shell"
    channel, parts = _v1(f)
    assert (channel, parts) == ("shell", message.parts())


def test_merged_frame_content_and_seq_range() -> None:
    """Invariant 6: a merged frame's text is its frames' texts joined in order, and its
    metadata gives the seq range it covers."""
    run = [
        frame(5, stream("stdout", "a\n")),
        frame(6, stream("stdout", "bé")),
        frame(7, stream("stdout", "c\n")),
    ]
    merged = Frame.join(run)

    assert (merged.first_seq, merged.last_seq, merged.text) == (5, 7, "a\nbéc\n")
    assert merged.message is run[0].message
    assert merged.size == run[0].message.size + len("a\nbéc\n")
    legacy = _legacy(merged)
    assert legacy["content"] == {"name": "stdout", "text": "a\nbéc\n"}
    assert legacy["metadata"] == {SEQ_METADATA_KEY: {"seq": 7, "first_seq": 5}}
    assert legacy["msg_id"] == run[0].message.msg_id
    _, parts = _v1(merged)
    assert json.loads(parts[3]) == {"name": "stdout", "text": "a\nbéc\n"}
    assert json.loads(parts[2]) == {SEQ_METADATA_KEY: {"seq": 7, "first_seq": 5}}


def test_join_of_one_frame_is_that_frame() -> None:
    """Invariant 4: a run of one is not copied (its encoding cache stays shared)."""
    f = frame(1, stream("stdout", "x"))
    assert Frame.join([f]) is f


def test_can_merge_only_consecutive_streams_of_one_parent_and_name() -> None:
    """Invariant 6: merging never crosses a parent msg_id, a stream name, a gap in seq,
    or a non-stream message."""
    base = frame(1, stream("stdout", "a", parent="p1"))
    assert base.can_merge(frame(2, stream("stdout", "b", parent="p1"))) is True
    assert base.can_merge(frame(2, stream("stdout", "b", parent="p2"))) is False
    assert base.can_merge(frame(2, stream("stderr", "b", parent="p1"))) is False
    assert base.can_merge(frame(3, stream("stdout", "b", parent="p1"))) is False
    assert base.can_merge(frame(1, stream("stdout", "b", parent="p1"))) is False
    assert base.can_merge(frame(2, status("busy", parent="p1"))) is False
    assert frame(1, status("busy", parent="p1")).can_merge(base) is False
    assert base.can_merge(Frame.reply("shell", stream("stdout", "b", parent="p1"))) is False
    assert (
        Frame.reply("iopub", stream("stdout", "a", parent="p1")).can_merge(
            frame(1, stream("stdout", "b", parent="p1"))
        )
        is False
    )


def test_can_merge_without_parent() -> None:
    """Invariant 6: two parentless stream messages share the (None) parent."""
    assert frame(1, stream("stdout", "a", None)).can_merge(frame(2, stream("stdout", "b", None)))
    assert not frame(1, stream("stdout", "a", None)).can_merge(frame(2, stream("stdout", "b")))


def test_merged_frame_merges_on() -> None:
    """Invariant 6: a merged frame extends with the frame after its last seq."""
    merged = Frame.join([frame(1, stream("stdout", "a")), frame(2, stream("stdout", "b"))])
    assert merged.can_merge(frame(3, stream("stdout", "c"))) is True
    assert merged.can_merge(frame(2, stream("stdout", "c"))) is False
    again = Frame.join([merged, frame(3, stream("stdout", "c"))])
    assert (again.first_seq, again.last_seq, again.text) == (1, 3, "abc")


def test_merge_runs_respects_max_bytes_and_order() -> None:
    """Invariant 6: runs are cut at max_bytes, kept in order, and concatenate to the input."""
    frames = [frame(seq, stream("stdout", f"{seq:03d}", msg_id=f"m{seq}")) for seq in range(1, 6)]
    size = frames[0].size
    assert all(f.size == size for f in frames)

    merged = merge_runs(frames, max_bytes=2 * size)

    assert _ranges(merged) == [(1, 2), (3, 4), (5, 5)]
    assert _texts(merged) == ["001002", "003004", "005"]
    assert merged[2] is frames[4]
    assert _ranges(merge_runs(frames, max_bytes=2 * size - 1)) == [(s, s) for s in range(1, 6)]
    assert _ranges(merge_runs(frames, max_bytes=5 * size)) == [(1, 5)]


def test_merge_runs_keeps_an_oversized_frame_whole() -> None:
    """Invariant 6: a single frame larger than max_bytes is sent whole, never split."""
    small = [frame(1, stream("stdout", "a")), frame(3, stream("stdout", "b"))]
    big = frame(2, stream("stdout", "x" * 5000))
    max_bytes = 3 * small[0].size
    assert big.size > max_bytes
    merged = merge_runs([small[0], big, small[1]], max_bytes=max_bytes)
    assert _ranges(merged) == [(1, 1), (2, 2), (3, 3)]
    assert merged[1] is big


def test_merge_runs_leaves_a_large_frame_as_it_is() -> None:
    """Invariant 4: a frame of MERGE_FRAME_MIN_ALONE bytes or more (the broker's merge of
    a burst) is sent as it is, shared and encoded once, not merged again for one client;
    small frames around it still merge."""
    big_text = "x" * MERGE_FRAME_MIN_ALONE
    frames = [
        frame(1, stream("stdout", "a")),
        frame(2, stream("stdout", "b")),
        frame(3, stream("stdout", big_text)),
        frame(4, stream("stdout", big_text)),
        frame(5, stream("stdout", "c")),
        frame(6, stream("stdout", "d")),
    ]
    merged = merge_runs(frames, max_bytes=1 << 20)
    assert _ranges(merged) == [(1, 2), (3, 3), (4, 4), (5, 6)]
    assert merged[1] is frames[2]
    assert merged[2] is frames[3]
    records = [record(f.last_seq or 0, f.message) for f in frames]
    assert _ranges(frames_from_records(records, 1 << 20)) == _ranges(merged)


def test_merge_runs_never_crosses_other_messages() -> None:
    """Invariant 6: a non-stream message, another parent or stream name ends a run."""
    frames = [
        frame(1, stream("stdout", "a", "p1")),
        frame(2, stream("stdout", "b", "p1")),
        frame(3, status("busy", "p1")),
        frame(4, stream("stdout", "c", "p1")),
        frame(5, stream("stderr", "d", "p1")),
        frame(6, stream("stderr", "e", "p1")),
        frame(7, stream("stderr", "f", "p2")),
        frame(8, stream("stdout", "g", "p2")),
        Frame.reply("shell", make_message("execute_reply", {"status": "ok"}, "p2")),
        frame(9, stream("stdout", "h", "p2")),
    ]
    merged = merge_runs(frames, max_bytes=1 << 20)
    assert _ranges(merged) == [(1, 2), (3, 3), (4, 4), (5, 6), (7, 7), (8, 8), (None, None), (9, 9)]
    assert _texts(merged) == ["ab", None, "c", "de", "f", "g", None, "h"]


def test_merge_runs_of_nothing() -> None:
    """Invariant 6: no frames in, no frames out."""
    assert merge_runs([], max_bytes=10) == []
    assert frames_from_records([], max_bytes=10) == []


def test_frames_from_records_merges_replayed_runs() -> None:
    """Invariant 5: a replay is every record once, in order, runs merged."""
    records = [
        record(10, stream("stdout", "1\n", "p1")),
        record(11, stream("stdout", "2\n", "p1")),
        record(12, stream("stdout", "3\n", "p1")),
        record(13, status("idle", "p1")),
        record(14, stream("stderr", "e", "p2")),
        record(15, stream("stdout", "o", "p2")),
        record(16, stream("stdout", "p", "p2")),
    ]
    frames = frames_from_records(records, max_bytes=1 << 20)
    assert _ranges(frames) == [(10, 12), (13, 13), (14, 14), (15, 16)]
    assert _texts(frames) == ["1\n2\n3\n", None, "e", "op"]
    assert all(f.channel == "iopub" for f in frames)
    assert frames[1].message is records[3].message


@pytest.mark.parametrize("max_bytes", [1, 300, 1 << 20])
def test_frames_from_records_covers_every_seq_once(max_bytes: int) -> None:
    """Invariant 5: whatever max_bytes, the frames cover each seq once, in order."""
    records = [record(seq, stream("stdout", str(seq), "p")) for seq in range(1, 21)]
    frames = frames_from_records(records, max_bytes)
    covered = [seq for f in frames for seq in range(f.first_seq or 0, (f.last_seq or 0) + 1)]
    assert covered == list(range(1, 21))
    assert "".join(f.text or "" for f in frames) == "".join(str(seq) for seq in range(1, 21))


@pytest.mark.parametrize("seed", range(8))
def test_frames_from_records_makes_the_runs_merge_runs_makes(seed: int) -> None:
    """Invariant 6: replay's record-level merging is the frame-level merging exactly (same
    runs, text, ranges and first messages), whatever the mix of parents, names, gaps."""
    import random

    rng = random.Random(seed)
    records, seq = [], 0
    for _ in range(300):
        seq += rng.choice((1, 1, 1, 2))
        if rng.random() < 0.1:
            message = status(rng.choice(["busy", "idle"]), rng.choice(["p", "q"]))
        else:
            text = "x" * rng.choice((rng.randrange(0, 90), MERGE_FRAME_MIN_ALONE))
            message = stream(rng.choice(["stdout", "stderr"]), text, rng.choice(["p", "q"]))
        records.append(record(seq, message))
    max_bytes = rng.choice([1, 500, 4000, 1 << 20])
    fast = frames_from_records(records, max_bytes)
    slow = merge_runs([Frame.from_record(r) for r in records], max_bytes)
    assert _ranges(fast) == _ranges(slow)
    assert _texts(fast) == _texts(slow)
    assert [f.message for f in fast] == [f.message for f in slow]


def test_records_from_a_kernels_replay_are_merged_nowhere() -> None:
    """A message recorded from a launcher kernel's replay (what a killed gateway had not
    made durable, some of which its clients had) keeps its own msg_id on every surface, so a
    gateway chained behind can tell which of them it has: the coalescer, the subscriber
    queues and replays all leave it whole (one rule, ``continues``)."""
    from kernel_gateway_stream.core.coalescer import Coalescer
    from kernel_gateway_stream.core.messages import REPLAYED_METADATA_KEY

    plain = [stream("stdout", f"{i}\n", "p") for i in range(2)]
    again = [stream("stdout", f"{i}\n", "p").marked_replayed() for i in range(2, 4)]
    assert [m.replayed for m in plain + again] == [False, False, True, True]
    assert json.loads(again[0].raw_metadata) == {REPLAYED_METADATA_KEY: True}
    assert again[0].marked_replayed() is again[0]
    records = [record(seq, m) for seq, m in enumerate(plain + again, start=1)]

    replayed = frames_from_records(records, 1 << 20)
    assert _ranges(replayed) == [(1, 2), (3, 3), (4, 4)]
    assert [f.message.msg_id for f in replayed[1:]] == [m.msg_id for m in again]

    queued = merge_runs([Frame.from_record(r) for r in records], 1 << 20)
    assert _ranges(queued) == _ranges(replayed)

    coalescer = Coalescer(window=1.0)
    out = coalescer.feed(records[0], now=10.0)  # after a quiet spell: at once
    for r in records[1:]:
        out += coalescer.feed(r, now=10.001)
    out += coalescer.flush()
    assert _ranges(out) == [(1, 1), (2, 2), (3, 3), (4, 4)]
    assert [f.text for f in out] == ["0\n", "1\n", "2\n", "3\n"]
