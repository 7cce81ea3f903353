"""Executions as programs see them: normalized events, and a summary from the transcript.

A program that runs code need not know the Jupyter protocol. An execution's IOPub messages
(those whose parent is its ``execute_request``) become events:

==============  ===============================  =====================================
event           from                             data
==============  ===============================  =====================================
stdout/stderr   ``stream``                       ``{"text"}``
display         ``display_data``,                ``{"data", "metadata", "transient"}``
                ``update_display_data``
result          ``execute_result``               ``{"data", "metadata", "execution_count"}``
error           ``error``                        ``{"ename", "evalue", "traceback"}``
input_request   the kernel's ``input_request``   ``{"prompt", "password"}``
status          ``status``                       ``{"execution_state"}``
done            the execution's ``idle``         the summary (:class:`ExecutionSummary`)
==============  ===============================  =====================================

The summary is rebuilt from the transcript alone (:class:`SummaryBuilder` states the
rules), so it survives the caller's disconnect and a gateway restart.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .marks import GAP_MSG_TYPE, is_mark, is_terminal, mark_reason
from .messages import KernelMessage, Record, dumps_json
from .oversize import is_cut

__all__ = [
    "INPUT_REQUEST",
    "UNFINISHED",
    "EncodedSummary",
    "ExecutionSummary",
    "SummaryBuilder",
    "normalize",
    "summarize",
]

#: msg_type of the record the gateway writes when the kernel asks one of its executions
#: for input (the request itself travels on stdin, which the transcript does not see).
INPUT_REQUEST = "input_request"

_EVENTS = {
    "display_data": "display",
    "update_display_data": "display",
    "execute_result": "result",
    "error": "error",
    "status": "status",
    INPUT_REQUEST: "input_request",
}
_FIELDS = {
    "display": ("data", "metadata", "transient"),
    "result": ("data", "metadata", "execution_count"),
    "error": ("ename", "evalue", "traceback"),
    "status": ("execution_state",),
    "input_request": ("prompt", "password"),
}


def normalize(message: KernelMessage, text: str | None = None) -> tuple[str, dict[str, Any]] | None:
    """The program-facing event for an execution's message, or None if it has none.

    ``text`` is the merged text of a coalesced stream frame (default: the message's own).
    """
    if message.is_stream:
        return message.stream_name or "stdout", {"text": message.text if text is None else text}
    event = _EVENTS.get(message.msg_type)
    if event is None:
        return None
    content = message.content()
    return event, {name: content.get(name) for name in _FIELDS[event]}


@dataclass
class ExecutionSummary:
    """What an execution produced, and how it ended."""

    msg_id: str
    status: str = "running"
    stdout: str = ""
    stderr: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None
    execution_count: int | None = None
    started: float | None = None
    ended: float | None = None
    last_seq: int = 0
    #: Why an execution ended ``died`` or ``aborted`` (a lifecycle mark's reason).
    reason: str | None = None
    #: ``(first_seq, last_seq)`` of transcript gaps while it ran: output may be missing.
    gaps: list[tuple[int, int]] = field(default_factory=list)
    #: Characters of stdout / stderr left out at the front (see ``max_text``).
    stdout_omitted: int = 0
    stderr_omitted: int = 0
    #: Outputs left out at the end, past ``max_output_bytes`` (all are in the transcript).
    outputs_omitted: int = 0
    #: Messages the gateway recorded cut (over its max_message_bytes): of a stream, only
    #: the start of its text is in stdout / stderr.
    messages_cut: int = 0

    @property
    def duration(self) -> float | None:
        if self.started is None or self.ended is None:
            return None
        return self.ended - self.started

    def to_json(self) -> dict[str, Any]:
        return {
            "msg_id": self.msg_id,
            "status": self.status,
            "reason": self.reason,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "stdout_omitted": self.stdout_omitted,
            "stderr_omitted": self.stderr_omitted,
            "outputs": self.outputs,
            "outputs_omitted": self.outputs_omitted,
            "messages_cut": self.messages_cut,
            "error": self.error,
            "execution_count": self.execution_count,
            "started": self.started,
            "ended": self.ended,
            "duration": self.duration,
            "last_seq": self.last_seq,
            "gaps": [list(gap) for gap in self.gaps],
        }

    def encode(self, **extra: Any) -> EncodedSummary:
        """The summary as JSON (with ``extra`` fields first), whatever it holds.

        Every value parsed from a kernel's message is strict JSON (see
        :func:`.messages.load_json_object`), but an output nested as deeply as the parser
        allows is one level deeper in a summary. If the whole summary cannot be written,
        its outcome still is (``msg_id``, ``status``, ``reason``, times, ``last_seq``,
        ``gaps``) with empty outputs and ``summary_error`` saying why: an execution always
        ends with an answer. Never raises.
        """
        try:
            return EncodedSummary(dumps_json({**extra, **self.to_json()}), None)
        except (ValueError, TypeError, RecursionError) as error:
            failure = f"the summary could not be written as JSON ({type(error).__name__})"
        count = self.execution_count
        outcome = {
            **{key: value for key, value in extra.items() if isinstance(value, str)},
            "msg_id": self.msg_id,
            "status": self.status,
            "reason": self.reason,
            "stdout": "",
            "stderr": "",
            "stdout_omitted": 0,
            "stderr_omitted": 0,
            "outputs": [],
            "error": None,
            "execution_count": count if isinstance(count, int) else None,
            "started": self.started,
            "ended": self.ended,
            "duration": self.duration,
            "last_seq": self.last_seq,
            "gaps": [[first, last] for first, last in self.gaps],
            "summary_error": failure,
        }
        return EncodedSummary(dumps_json(outcome), failure)


@dataclass(frozen=True, slots=True)
class EncodedSummary:
    """A summary as JSON (:meth:`ExecutionSummary.encode`); ``failure`` says why it holds
    only the outcome (None: the whole summary)."""

    data: bytes
    failure: str | None


#: What an output costs in a summary besides its message's bytes (the dicts around it).
OUTPUT_OVERHEAD = 512

#: Summary statuses of an execution that has not ended.
UNFINISHED = frozenset({"queued", "running"})


class _Tail:
    """The last ``limit`` characters of a stream of text, in linear time overall."""

    __slots__ = ("_chunks", "_length", "limit", "omitted")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._chunks: list[str] = []
        self._length = 0
        self.omitted = 0

    def add(self, text: str) -> None:
        self._chunks.append(text)
        self._length += len(text)
        if self._length > 2 * self.limit:
            self._trim()

    def _trim(self) -> None:
        whole = "".join(self._chunks)
        cut = max(0, len(whole) - self.limit)
        self.omitted += cut
        self._chunks = [whole[cut:]]
        self._length = len(whole) - cut

    def text(self) -> str:
        if self._length > self.limit:
            self._trim()
        return "".join(self._chunks)


class SummaryBuilder:
    """Rebuilds one execution's summary from the transcript, a page at a time.

    Pure, and linear in the records fed: the adapter reads the execution's records (those
    whose parent is its ``execute_request``) page by page into :meth:`feed`, the kernel's
    marks after its start into :meth:`feed_marks`, and calls :meth:`result`. The rules:

    * ``running`` until the kernel goes ``idle`` for the request; then ``ok``, ``error``,
      ``interrupted`` (a ``KeyboardInterrupt``) or ``aborted`` (skipped after an earlier
      error: no ``execute_input`` was seen).
    * A lifecycle status (the kernel is gone: restarted, died, shut down) after its start
      and before its idle ends it: ``died`` (once the kernel took it: any record of it,
      its ``busy`` status alone too), or ``aborted`` if it had not started, with the mark's
      reason. A lifecycle request (a restart or shutdown was asked for) while it
      ran does not end it (the kernel may still report: ipykernel interrupts the running
      cell when asked to go); the status the kernel reports stands, with the reason.
    * Sent but not seen yet (``sent_after``: the transcript head when it was sent) is
      ``queued``; a lifecycle mark after the send makes it ``aborted``.
    * Gap records while it ran are listed: part of its output may be missing.
    * stdout and stderr keep their last ``max_text`` characters each; what was left out
      at the front is counted (the whole text is in the transcript).
    * Outputs are kept until their messages come to ``max_output_bytes``; later ones are
      counted in ``outputs_omitted`` (updates of a kept display still apply).
    """

    def __init__(
        self, msg_id: str, *, max_text: int = 8 * 1024 * 1024, max_output_bytes: int = 0
    ) -> None:
        self.summary = ExecutionSummary(msg_id)
        #: Outputs kept until their messages come to this many bytes (0: no limit).
        self._max_output_bytes = max_output_bytes
        self._output_bytes = 0
        self._stdout = _Tail(max_text)
        self._stderr = _Tail(max_text)
        self._first_seq: int | None = None
        self._seen_input = False
        #: Outputs with a display_id, for update_display_data.
        self._displays: dict[str, dict[str, Any]] = {}
        self._marks: list[Record] = []

    @property
    def first_seq(self) -> int | None:
        """The sequence number of the execution's first record; None until one is fed."""
        return self._first_seq

    def feed(self, records: Iterable[Record]) -> None:
        """The execution's records, in seq order (records of other parents are ignored)."""
        summary = self.summary
        msg_id = summary.msg_id
        for record in records:
            message = record.message
            if message.parent_msg_id != msg_id:
                continue
            if self._first_seq is None:
                self._first_seq = record.seq
                summary.started = record.time
            summary.last_seq = record.seq
            if message.is_stream:
                tail = self._stderr if message.stream_name == "stderr" else self._stdout
                tail.add(message.text or "")
                continue
            self._feed_other(message, record)

    def _feed_other(self, message: KernelMessage, record: Record) -> None:
        summary = self.summary
        kind = message.msg_type
        if is_cut(message):
            summary.messages_cut += 1
        if kind == "stream":  # recorded cut (see .oversize): the start of its text
            content = message.content()
            tail = self._stderr if content.get("name") == "stderr" else self._stdout
            text = content.get("text")
            tail.add(text if isinstance(text, str) else "")
            return
        if kind == "execute_input":
            self._seen_input = True
            count = message.content().get("execution_count")
            summary.execution_count = count if isinstance(count, int) else None
        elif kind in ("display_data", "execute_result", "update_display_data"):
            self._feed_output(message)
        elif kind == "error":
            event = normalize(message)
            assert event is not None
            summary.error = event[1]
        elif kind == "status" and message.execution_state == "idle":
            summary.ended = record.time
            if summary.error is not None:
                interrupted = summary.error.get("ename") == "KeyboardInterrupt"
                summary.status = "interrupted" if interrupted else "error"
            else:
                summary.status = "ok" if self._seen_input else "aborted"

    def _feed_output(self, message: KernelMessage) -> None:
        if message.msg_type != "update_display_data" and self._max_output_bytes:
            # Counted before it is parsed: 300,000 small displays are 300,000 dicts.
            cost = message.size + OUTPUT_OVERHEAD
            if self._output_bytes + cost > self._max_output_bytes:
                self.summary.outputs_omitted += 1
                return
            self._output_bytes += cost
        event = normalize(message)
        assert event is not None
        name, data = event
        transient = data.get("transient")
        display_id = transient.get("display_id") if isinstance(transient, dict) else None
        if message.msg_type == "update_display_data":
            known = self._displays.get(display_id) if isinstance(display_id, str) else None
            if known is not None:
                known.update(data)
            return
        output = {"type": name, **data}
        self.summary.outputs.append(output)
        if isinstance(display_id, str):
            self._displays[display_id] = output

    def feed_marks(self, marks: Iterable[Record]) -> None:
        """The kernel's marks (lifecycle statuses, gap records) in seq order, at least
        those after the execution was sent; others are ignored."""
        self._marks.extend(record for record in marks if is_mark(record.message))

    def result(self, *, sent_after: int | None = None) -> ExecutionSummary | None:
        """The summary; None if nothing is known of the execution.

        ``sent_after`` is the transcript head when the gateway sent the execution (it is
        then ``queued`` until its first record); None if the gateway did not send it.
        """
        summary = self.summary
        summary.stdout, summary.stderr = self._stdout.text(), self._stderr.text()
        summary.stdout_omitted, summary.stderr_omitted = self._stdout.omitted, self._stderr.omitted
        start = self._first_seq if self._first_seq is not None else sent_after
        if start is None:
            return None
        if self._first_seq is None:
            summary.status = "queued"
        end = summary.last_seq if summary.status not in UNFINISHED else None
        for mark in self._marks:
            if mark.seq <= start or (end is not None and mark.first_seq > end):
                continue
            if mark.message.msg_type == GAP_MSG_TYPE:
                summary.gaps.append((mark.first_seq, mark.seq))
            elif summary.status in UNFINISHED and is_terminal(mark.message):
                # Taken by the kernel (its busy for it, if nothing more): it died running
                # it, whether or not its execute_input was recorded before the end.
                summary.status = "died" if self._first_seq is not None else "aborted"
                summary.reason = mark_reason(mark.message)
                summary.ended = mark.time
                summary.last_seq = mark.seq
                end = mark.seq
            elif summary.reason is None and (end is None or mark.seq <= end):
                summary.reason = mark_reason(mark.message)
        return summary


def summarize(msg_id: str, records: Iterable[Record]) -> ExecutionSummary | None:
    """The summary of execution ``msg_id`` from its records and the kernel's marks (in
    seq order, as the transcript has them); None if none of them is the execution's."""
    builder = SummaryBuilder(msg_id)
    records = list(records)
    builder.feed(records)
    builder.feed_marks(records)
    return builder.result()
