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

The summary is rebuilt from the transcript alone, so it survives the caller's disconnect
and a gateway restart. Its status is ``running`` until the kernel goes idle for the
request, then ``ok``, ``error``, ``interrupted`` (a ``KeyboardInterrupt``) or ``aborted``
(the kernel skipped the request after an earlier error: no ``execute_input`` was seen).
The execute API adds ``queued`` (sent, nothing recorded yet) and ``died`` (the kernel
restarted or died before the request finished).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .messages import KernelMessage, Record

__all__ = ["INPUT_REQUEST", "ExecutionSummary", "normalize", "summarize"]

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

    @property
    def duration(self) -> float | None:
        if self.started is None or self.ended is None:
            return None
        return self.ended - self.started

    def to_json(self) -> dict[str, Any]:
        return {
            "msg_id": self.msg_id,
            "status": self.status,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "outputs": self.outputs,
            "error": self.error,
            "execution_count": self.execution_count,
            "started": self.started,
            "ended": self.ended,
            "duration": self.duration,
            "last_seq": self.last_seq,
        }


def summarize(msg_id: str, records: Iterable[Record]) -> ExecutionSummary | None:
    """The summary of execution ``msg_id`` from its records (in seq order); None if none."""
    summary = ExecutionSummary(msg_id)
    seen_input = seen_any = False
    for record in records:
        message = record.message
        if message.parent_msg_id != msg_id:
            continue
        seen_any = True
        summary.last_seq = record.seq
        if summary.started is None:
            summary.started = record.time
        if message.is_stream:
            if message.stream_name == "stderr":
                summary.stderr += message.text or ""
            else:
                summary.stdout += message.text or ""
            continue
        kind = message.msg_type
        if kind == "execute_input":
            seen_input = True
            count = message.content().get("execution_count")
            summary.execution_count = count if isinstance(count, int) else None
        elif kind in ("display_data", "execute_result"):
            event = normalize(message)
            assert event is not None
            summary.outputs.append({"type": event[0], **event[1]})
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
                summary.status = "ok" if seen_input else "aborted"
    return summary if seen_any else None
