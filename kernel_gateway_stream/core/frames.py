"""Frames: what subscribers are sent, each encoded at most once per protocol.

A :class:`Frame` is one outgoing message: an IOPub message from the transcript (with its
sequence number), a run of consecutive ``stream`` messages merged into one (with the
sequence range it covers), or a reply on a client's own shell, control or stdin
channel (no sequence number). Frames are shared by every subscriber that is sent
them; :meth:`Frame.encode` caches its result so that a message is encoded once per
protocol, not once per client (DESIGN invariant 4).

Merging is render-equivalent (DESIGN invariant 6): two frames merge only when both are
``stream`` messages of the same parent ``msg_id`` and stream name whose sequence ranges
touch, so a merge never crosses another message.
"""

from __future__ import annotations

from dataclasses import field, replace

from .executions import normalize
from .messages import KernelMessage, Record, dumps_json, dumps_stream_content, value_class
from .wire import (
    Protocol,
    encode_legacy,
    encode_sse,
    encode_v1,
    metadata_with_seq,
    websocket_frame,
)

__all__ = ["MERGE_FRAME_MIN_ALONE", "Frame", "SharedMerges", "frames_from_records", "merge_runs"]


@value_class(frozen=True, slots=True)
class Frame:
    """One outgoing message. Build with :meth:`from_record`, :meth:`reply` or :meth:`merge`."""

    channel: str
    message: KernelMessage
    first_seq: int | None = None
    last_seq: int | None = None
    #: The merged text when this frame stands for several stream messages.
    merged_text: str | None = None
    _encoded: dict[Protocol, tuple[bytes, bool]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _framed: dict[Protocol, bytes] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_record(cls, record: Record) -> Frame:
        return cls("iopub", record.message, record.first_seq, record.seq)

    @classmethod
    def reply(cls, channel: str, message: KernelMessage) -> Frame:
        """A message for one client's own channel; it has no sequence number."""
        return cls(channel, message)

    @property
    def text(self) -> str | None:
        """The stream text this frame carries (merged or not); None if not a stream frame."""
        return self.merged_text if self.merged_text is not None else self.message.text

    @property
    def size(self) -> int:
        """Approximate bytes on the wire; what subscriber queues count."""
        if self.merged_text is None:
            return self.message.size
        return self.message.size + len(self.merged_text)

    def can_merge(self, other: Frame) -> bool:
        """True if ``other`` may be appended to this frame without changing what renders."""
        return (
            self.channel == "iopub"
            and other.channel == "iopub"
            and self.message.is_stream
            and other.message.is_stream
            and self.last_seq is not None
            and other.first_seq == self.last_seq + 1
            and continues(self.message, other.message)
        )

    @staticmethod
    def join(run: list[Frame]) -> Frame:
        """A run of frames, each mergeable with the next, as one frame.

        The text is joined once, so merging a burst of n messages costs O(total text),
        not O(n²).
        """
        if len(run) == 1:
            return run[0]
        first = run[0]
        return Frame(
            "iopub",
            first.message,
            first.first_seq,
            run[-1].last_seq,
            "".join(frame.text or "" for frame in run),
        )

    def encode(self, protocol: Protocol) -> tuple[bytes, bool]:
        """The payload for a client of ``protocol`` and whether it is a binary frame."""
        cached = self._encoded.get(protocol)
        if cached is None:
            cached = self._encode(protocol)
            self._encoded[protocol] = cached
        return cached

    def framed(self, protocol: Protocol) -> bytes:
        """:meth:`encode`'s payload as a whole WebSocket frame (header and payload), built
        once per protocol however many clients it is written to. The payload alone is not
        kept as well: a frame queued for a client that fell behind would hold its bytes
        twice, and the queue's bound counts them once."""
        framed = self._framed.get(protocol)
        if framed is None:
            encoded = self._encoded.get(protocol) or self._encode(protocol)
            framed = self._framed[protocol] = websocket_frame(*encoded)
        return framed

    def _encode(self, protocol: Protocol) -> tuple[bytes, bool]:
        message = self.message
        metadata = message.raw_metadata
        if self.first_seq is not None and self.last_seq is not None:
            metadata = metadata_with_seq(metadata, self.first_seq, self.last_seq)
        content = message.raw_content
        if self.merged_text is not None:
            content = dumps_stream_content(message.stream_name or "", self.merged_text)
        if protocol is Protocol.V1:
            parts = [message.raw_header, message.raw_parent_header, metadata, content]
            return encode_v1(self.channel, [*parts, *message.buffers]), True
        if protocol is Protocol.EXECUTION:
            event = normalize(message, self.merged_text)
            if event is None:
                return b"", False
            return encode_sse(event[0], self.last_seq, dumps_json(event[1])), False
        if protocol is Protocol.SSE:
            # The legacy JSON of the message is the event's data; buffers are not sent.
            legacy, _ = encode_legacy(self.channel, replace(message, buffers=()), metadata, content)
            return encode_sse(message.msg_type, self.last_seq, legacy), False
        return encode_legacy(self.channel, message, metadata, content)


def continues(message: KernelMessage, other: KernelMessage) -> bool:
    """True if stream message ``other``, next in the transcript after stream message
    ``message``, may be merged into it: the same stream of the same request's output, and
    neither recorded from a kernel's replay (see ``REPLAYED_METADATA_KEY``). The one rule
    of the coalescer, the subscriber queues and replays."""
    return (
        other.stream_name == message.stream_name
        and other.parent_msg_id == message.parent_msg_id
        and not message.replayed
        and not other.replayed
    )


#: A frame of this many bytes or more is sent as it is, never merged into another.
MERGE_FRAME_MIN_ALONE = 16 * 1024


def frames_from_records(records: list[Record], max_bytes: int) -> list[Frame]:
    """Turn transcript records into frames, merging consecutive stream records.

    Used for replay, where there is no reason to wait: every run of mergeable records
    becomes one frame of at most ``max_bytes`` of text (a longer single record stays whole).
    """
    # The same runs as ``merge_runs([Frame.from_record(r) for r in records], max_bytes)``,
    # found on the records themselves: a replay makes one Frame per run, not per record.
    frames: list[Frame] = []
    count = len(records)
    start = 0
    while start < count:
        record = records[start]
        message = record.message
        end = start + 1
        if message.stream_name is not None and message.size < MERGE_FRAME_MIN_ALONE:
            run_bytes = message.size
            previous = record.seq
            while end < count:
                following = records[end]
                other = following.message
                if (
                    following.seq != previous + 1
                    or not continues(message, other)
                    or other.size >= MERGE_FRAME_MIN_ALONE
                    or run_bytes + other.size > max_bytes
                ):
                    break
                run_bytes += other.size
                previous = following.seq
                end += 1
        if end - start == 1:
            frames.append(Frame("iopub", message, record.first_seq, record.seq))
        else:
            text = "".join(r.message.text or "" for r in records[start:end])
            frames.append(Frame("iopub", message, record.seq, records[end - 1].seq, text))
        start = end
    return frames


def merge_runs(frames: list[Frame], max_bytes: int) -> list[Frame]:
    """Merge each run of mergeable frames into one frame of at most ``max_bytes``.

    Only frames under :data:`MERGE_FRAME_MIN_ALONE` bytes are merged. A larger one (the
    broker's merge of a burst) is already few frames for its bytes, and is shared by
    every client and encoded once; merged again it would be a frame of one client's own,
    its text joined and encoded for that client alone. With 100 clients behind a 4 KiB
    firehose, each at its own position, that was 95 % of the daemon's CPU (py-spy).
    """
    merged: list[Frame] = []
    run: list[Frame] = []
    run_bytes = 0
    for frame in frames:
        if (
            run
            and frame.size < MERGE_FRAME_MIN_ALONE
            and run[0].size < MERGE_FRAME_MIN_ALONE
            and run[-1].can_merge(frame)
            and run_bytes + frame.size <= max_bytes
        ):
            run.append(frame)
            run_bytes += frame.size
            continue
        if run:
            merged.append(Frame.join(run))
        run, run_bytes = [frame], frame.size
    if run:
        merged.append(Frame.join(run))
    return merged


#: Longest queue whose merge :class:`SharedMerges` remembers. Subscribers behind together
#: are a few frames behind; a long queue is one slow client's, and remembering it would
#: keep its backlog alive.
MEMO_MAX_FRAMES = 64
MEMO_MAX_BYTES = 1 << 20


class SharedMerges:
    """:func:`merge_runs` with a memory of its last few answers, shared by subscribers.

    Subscribers that fall behind together (a thousand watchers of one kernel, all a few
    frames behind the same burst) queue the same frames, the same objects; merging them
    once gives them all one merged frame, encoded once (DESIGN invariant 4) instead of once
    per subscriber. Keyed by the identity of the frames, which the memory keeps alive, so
    an identity is never reused while remembered.
    """

    __slots__ = ("_memory", "size")

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._memory: dict[tuple[int, ...], tuple[list[Frame], list[Frame], int]] = {}

    def merge_runs(self, frames: list[Frame], max_bytes: int) -> list[Frame]:
        key = tuple(map(id, frames))
        known = self._memory.get(key)
        if known is not None and known[2] == max_bytes:
            return list(known[1])
        merged = merge_runs(frames, max_bytes)
        if len(frames) > MEMO_MAX_FRAMES or sum(f.size for f in frames) > MEMO_MAX_BYTES:
            return merged  # a slow client's own backlog: nobody shares it, keep nothing
        if len(self._memory) >= self.size:
            del self._memory[next(iter(self._memory))]
        self._memory[key] = (frames, merged, max_bytes)
        return list(merged)
