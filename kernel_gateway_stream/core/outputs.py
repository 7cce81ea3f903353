"""Cell outputs rebuilt from the transcript, as a notebook's output area would show them.

A page that was reloaded, or opened after its cells ran, received none of their output.
The transcript has all of it; what the page needs is each cell's *latest* execution, in
the notebook's own output format (nbformat v4 outputs), already folded the way JupyterLab's
output area folds it, so that a cell that printed 100,000 progress updates costs the size
of the last one:

* consecutive ``stream`` messages of the same name are one output; a carriage return
  rewinds to the start of its line and a backspace removes the character before it, as in
  JupyterLab's ``OutputAreaModel`` (``removeOverwrittenChars``): text overwritten is gone,
  a trailing ``\\r`` is kept so that the next text overwrites its line;
* ``clear_output`` empties the outputs, or, with ``wait``, empties them when the next output
  arrives;
* ``update_display_data`` replaces the data of every output shown with its ``display_id``
  (in any cell);
* ``execute_input`` gives the execution count; the ``idle`` status for the request, and the
  gateway's lifecycle marks, end it (the same rules as :class:`.executions.SummaryBuilder`);
* output an ipywidgets ``Output`` widget captures (``with out: print(...)``) belongs to the
  widget, not to the cell: while a widget's state names a request in its ``msg_id`` (the
  kernel says so in a ``comm_msg`` ``update``, and clears it when the capture ends), the
  outputs of that request are left out, as JupyterLab's output area hands them to the
  widget (a message hook on that request); the widget's own model, which the kernel keeps,
  shows them again after a reload.

Which cell ran which request comes from the gateway's request marks
(:func:`.marks.request_mark`): JupyterLab puts the cell's id in each ``execute_request``'s
``metadata.cellId``, and the gateway records ``msg_id -> cell_id`` when it forwards one.

Pure: :class:`CellRestorer` is fed records in seq order and gives a JSON-ready answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .executions import UNFINISHED
from .marks import GAP_MSG_TYPE, MAX_CELL_ID, REQUEST_MSG_TYPE, is_terminal, mark_reason
from .messages import KernelMessage, Record

__all__ = ["CellRestorer", "ExecutionOutputs", "StreamText", "cell_request", "fold_text"]

#: Comm messages that can start or end an Output widget's capture.
CAPTURE_MSG_TYPES = frozenset({"comm_open", "comm_msg", "comm_close"})
#: What an Output widget takes from the request it captures (JupyterLab's output area
#: would have shown it in the cell).
CAPTURED_MSG_TYPES = frozenset(
    {"stream", "display_data", "execute_result", "error", "clear_output", "update_display_data"}
)
#: Output widgets capturing at once that are remembered (a kernel's own choice: bounded).
MAX_CAPTURES = 1000


def cell_request(parts: list[bytes]) -> tuple[str, str] | None:
    """``(msg_id, cell_id)`` of a client's ``execute_request`` (its parts, ``[header,
    parent_header, metadata, content, ...]``) that names its notebook cell in
    ``metadata.cellId``, as JupyterLab's do; None otherwise (or if either is not a
    string of sensible length)."""
    if len(parts) < 3 or b"cellId" not in parts[2]:
        return None
    try:
        header, metadata = json.loads(parts[0]), json.loads(parts[2])
    except ValueError:
        return None
    if not isinstance(header, dict) or not isinstance(metadata, dict):
        return None
    msg_id, cell_id = header.get("msg_id"), metadata.get("cellId")
    if not isinstance(msg_id, str) or not isinstance(cell_id, str):
        return None
    if not 0 < len(msg_id) <= MAX_CELL_ID or not 0 < len(cell_id) <= MAX_CELL_ID:
        return None
    return msg_id, cell_id


def _fix_backspace(text: str) -> str:
    """Each backspace removes the character before it unless that is a newline (then it
    stays, as in JupyterLab, whose rule is: remove any ``[^\n]\b`` until none is left)."""
    if "\b" not in text:
        return text
    out: list[str] = []
    for char in text:
        if char == "\b" and out and out[-1] != "\n":
            out.pop()
        else:
            out.append(char)
    return "".join(out)


def _fold_line(line: str) -> str:
    """One line (no newline in it) with its carriage returns applied: each part written
    over the start of what the line shows, a longer earlier part showing past it. Linear:
    built from the last part back, each earlier part showing only past what covers it."""
    if "\r" not in line:
        return line
    parts = line.split("\r")
    pieces = [parts[-1]]
    covered = len(parts[-1])
    for part in reversed(parts[:-1]):
        if len(part) > covered:
            pieces.append(part[covered:])
            covered = len(part)
    shown = "".join(pieces)
    if line.endswith("\r"):
        shown += "\r"  # the next text overwrites this line
    return shown


def fold_text(text: str) -> str:
    """``text`` as a terminal (and JupyterLab's output area) would leave it."""
    text = _fix_backspace(text)
    if "\r" not in text:
        return text
    while "\r\n" in text:
        text = text.replace("\r\n", "\n")
    return "\n".join(_fold_line(line) for line in text.split("\n"))


class StreamText:
    """A stream output's text, folded as it grows, in time linear in what is added: the
    lines before the last newline are final (a carriage return rewinds only its own line);
    only the last line is folded again.

    ``limit`` bounds the characters kept: beyond it, the earliest final lines are dropped
    and counted in :attr:`omitted` (the whole text is in the transcript)."""

    __slots__ = ("_done", "_done_length", "_line", "limit", "omitted")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._done: list[str] = []
        self._done_length = 0
        self._line = ""
        self.omitted = 0

    def add(self, text: str) -> None:
        text = self._line + text
        if "\b" in text or "\r" in text:
            text = fold_text(text)
        cut = text.rfind("\n") + 1
        if cut:
            self._done.append(text[:cut])
            self._done_length += cut
        self._line = text[cut:]
        if len(self._line) > self.limit:
            # One line longer than all that is kept: its end is what shows.
            excess = len(self._line) - self.limit
            self._line = self._line[excess:]
            self.omitted += excess
        if self._done_length + len(self._line) > 2 * self.limit:
            self._trim()

    def _trim(self) -> None:
        whole = "".join(self._done)
        excess = max(0, len(whole) + len(self._line) - self.limit)
        if excess:
            # Keep whole lines where possible: cut just after a newline.
            cut = whole.find("\n", excess - 1) + 1 if excess <= len(whole) else len(whole)
            cut = cut or len(whole)
            self.omitted += cut
            whole = whole[cut:]
        self._done = [whole] if whole else []
        self._done_length = len(whole)

    @property
    def size(self) -> int:
        return self._done_length + len(self._line)

    def text(self) -> str:
        if self.size > self.limit:
            self._trim()
        return "".join(self._done) + self._line


@dataclass
class ExecutionOutputs:
    """One execution's outputs and state, as its cell should show them."""

    msg_id: str
    cell_id: str
    request_seq: int
    status: str = "queued"
    execution_count: int | None = None
    first_seq: int | None = None
    last_seq: int | None = None
    reason: str | None = None
    #: Outputs in order; a stream output's text is a :class:`StreamText` until :meth:`to_json`.
    outputs: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[tuple[int, int]] = field(default_factory=list)
    truncated: bool = False
    _clear_on_next: bool = False
    _seen_input: bool = False
    _error: dict[str, Any] | None = None
    _other_bytes: int = 0

    def to_json(self, budget: int) -> tuple[dict[str, Any], int]:
        """The execution as the answer shows it, and its outputs' size: the newest outputs
        that fit in ``budget`` bytes (sizes as counted when they came), the rest left out
        (``truncated``)."""
        kept: list[dict[str, Any]] = []
        used = 0
        for output in reversed(self.outputs):
            stream = output.get("text")
            size = stream.size if isinstance(stream, StreamText) else output.get("_size", 0)
            if used + size > budget and kept:
                self.truncated = True
                break
            used += size
            kept.append(output)
        outputs: list[dict[str, Any]] = []
        display_ids: dict[str, list[int]] = {}
        for output in reversed(kept):
            shown = {k: v for k, v in output.items() if not k.startswith("_")}
            stream = shown.get("text")
            if isinstance(stream, StreamText):
                shown["text"] = stream.text()
                if stream.omitted:
                    self.truncated = True
            display_id = output.get("_display_id")
            if isinstance(display_id, str):
                display_ids.setdefault(display_id, []).append(len(outputs))
            outputs.append(shown)
        answer = {
            "cell_id": self.cell_id,
            "msg_id": self.msg_id,
            "status": self.status,
            "execution_count": self.execution_count,
            "reason": self.reason,
            "first_seq": self.first_seq if self.first_seq is not None else self.request_seq,
            "last_seq": self.last_seq if self.last_seq is not None else self.request_seq,
            "outputs": outputs,
            "display_ids": display_ids,
            "gaps": [{"first_seq": first, "last_seq": last} for first, last in self.gaps[-100:]],
            "truncated": self.truncated,
        }
        return answer, used


def _size(value: Any) -> int:
    return len(json.dumps(value, default=str))


class CellRestorer:
    """The latest execution of each cell from a kernel's records (see the module
    docstring). Feed records in seq order with :meth:`feed`; :meth:`result` answers.

    ``max_text`` bounds each stream output's text (its tail is kept); ``max_output_bytes``
    bounds the rest of one execution's outputs (the earliest are dropped past it);
    ``max_cells`` bounds how many cells are answered (the latest run are kept). Whatever
    was left out is marked ``truncated``."""

    def __init__(
        self,
        *,
        max_text: int = 256 * 1024,
        max_output_bytes: int = 4 * 1024 * 1024,
        max_cells: int = 1000,
        max_outputs: int = 2000,
        max_displays: int = 100,
    ) -> None:
        self.max_text = max_text
        self.max_outputs = max_outputs
        self.max_displays = max_displays
        self.max_output_bytes = max_output_bytes
        self.max_cells = max_cells
        self.head = 0
        #: The latest execution of each cell, by cell id, in the order they were run.
        self._cells: dict[str, ExecutionOutputs] = {}
        #: Executions still fed (each the latest of its cell), by request msg_id.
        self._running: dict[str, ExecutionOutputs] = {}
        #: Outputs shown with a display_id, in any cell: display_id -> outputs.
        self._displays: dict[str, list[dict[str, Any]]] = {}
        #: Output widgets capturing a request's output now: comm_id -> request msg_id.
        self._captures: dict[str, str] = {}
        self.truncated = False

    def feed(self, records: Iterable[Record]) -> None:
        for record in records:
            self.head = max(self.head, record.seq)
            message = record.message
            kind = message.msg_type
            if kind == REQUEST_MSG_TYPE:
                self._request(message, record.seq)
                continue
            if kind in CAPTURE_MSG_TYPES:
                self._capture(message)
            execution = self._running.get(message.parent_msg_id or "")
            if execution is not None:
                if kind in CAPTURED_MSG_TYPES and self._captured(message.parent_msg_id):
                    continue  # the Output widget's, not the cell's
                self._feed(execution, message, record)
            elif kind == GAP_MSG_TYPE or (kind == "status" and is_terminal(message)):
                self._mark(record)
            elif kind == "update_display_data":
                self._update_display(message)  # from an execution of no cell we know

    def _capture(self, message: KernelMessage) -> None:
        """A comm message: an Output widget starts or stops capturing a request's output
        (``{"method": "update", "state": {"msg_id": ...}}``), or a widget is closed."""
        if message.msg_type == "comm_msg" and b'"msg_id"' not in message.raw_content:
            return  # most widget traffic: read no further
        content = message.content()
        comm_id = content.get("comm_id")
        if not isinstance(comm_id, str):
            return
        data = content.get("data")
        state = data.get("state") if isinstance(data, dict) else None
        if message.msg_type == "comm_close":
            self._captures.pop(comm_id, None)
        elif isinstance(state, dict) and isinstance(state.get("msg_id"), str):
            if state["msg_id"]:
                self._captures[comm_id] = state["msg_id"]
                if len(self._captures) > MAX_CAPTURES:  # widgets never closed: the oldest
                    del self._captures[next(iter(self._captures))]
            else:
                self._captures.pop(comm_id, None)

    def _captured(self, msg_id: str | None) -> bool:
        return bool(self._captures) and msg_id in self._captures.values()

    def _request(self, message: KernelMessage, seq: int) -> None:
        content = message.content()
        msg_id, cell_id = content.get("msg_id"), content.get("cell_id")
        if not isinstance(msg_id, str) or not isinstance(cell_id, str):
            return
        previous = self._cells.pop(cell_id, None)
        if previous is not None:
            self._retire(previous)
        execution = ExecutionOutputs(msg_id, cell_id, seq)
        self._cells[cell_id] = execution
        self._running[msg_id] = execution
        if len(self._cells) > self.max_cells:
            oldest = next(iter(self._cells))
            self._retire(self._cells.pop(oldest))
            self.truncated = True

    def _retire(self, execution: ExecutionOutputs) -> None:
        """An execution no longer answered (its cell ran again, or too many cells did)."""
        self._running.pop(execution.msg_id, None)
        for output in execution.outputs:
            self._forget_display(output)

    def _mark(self, record: Record) -> None:
        """A gap, or the kernel gone: every execution of the kernel still unfinished hears."""
        message = record.message
        for execution in self._running.values():
            if execution.status not in UNFINISHED:
                continue
            if message.msg_type == GAP_MSG_TYPE:
                if execution.first_seq is not None:
                    execution.gaps.append((record.first_seq, record.seq))
                continue
            # Taken by the kernel (its busy for it, if nothing more): it died running it.
            execution.status = "died" if execution.first_seq is not None else "aborted"
            execution.reason = mark_reason(message)
            execution.last_seq = record.seq

    def _feed(self, execution: ExecutionOutputs, message: KernelMessage, record: Record) -> None:
        if execution.first_seq is None:
            execution.first_seq = record.seq
        execution.last_seq = record.seq
        kind = message.msg_type
        if message.is_stream:
            self._stream(execution, message.stream_name or "stdout", message.text or "")
            return
        content = message.content()
        if kind == "execute_input":
            execution._seen_input = True
            if execution.status == "queued":
                execution.status = "running"
            execution.execution_count = _count(content.get("execution_count"))
        elif kind == "status":
            if message.execution_state == "busy" and execution.status == "queued":
                execution.status = "running"
            elif message.execution_state == "idle" and execution.status in UNFINISHED:
                if execution._error is not None:
                    interrupted = execution._error.get("ename") == "KeyboardInterrupt"
                    execution.status = "interrupted" if interrupted else "error"
                else:
                    execution.status = "ok" if execution._seen_input else "aborted"
        elif kind == "clear_output":
            if content.get("wait"):
                execution._clear_on_next = True
            else:
                self._clear(execution)
        elif kind in ("display_data", "execute_result"):
            output: dict[str, Any] = {
                "output_type": kind,
                "data": _dict(content.get("data")),
                "metadata": _dict(content.get("metadata")),
            }
            if kind == "execute_result":
                output["execution_count"] = _count(content.get("execution_count"))
            transient = content.get("transient")
            display_id = transient.get("display_id") if isinstance(transient, dict) else None
            if isinstance(display_id, str):
                output["_display_id"] = display_id
                shown = self._displays.setdefault(display_id, [])
                shown.append(output)
                if len(shown) > self.max_displays:  # the oldest are not updated any more
                    del shown[0]
            self._add(execution, output)
        elif kind == "update_display_data":
            self._update_display(message)
        elif kind == "error":
            traceback = content.get("traceback")
            execution._error = {
                "output_type": "error",
                "ename": str(content.get("ename", "")),
                "evalue": str(content.get("evalue", "")),
                "traceback": [str(line) for line in traceback]
                if isinstance(traceback, list)
                else [],
            }
            self._add(execution, dict(execution._error))

    def _stream(self, execution: ExecutionOutputs, name: str, text: str) -> None:
        if execution._clear_on_next:
            self._clear(execution)
        outputs = execution.outputs
        last = outputs[-1] if outputs else None
        if last is not None and last.get("output_type") == "stream" and last.get("name") == name:
            last["text"].add(text)
            return
        stream = StreamText(self.max_text)
        stream.add(text)
        self._add(execution, {"output_type": "stream", "name": name, "text": stream})

    def _add(self, execution: ExecutionOutputs, output: dict[str, Any]) -> None:
        if execution._clear_on_next:
            self._clear(execution)
        outputs = execution.outputs
        outputs.append(output)
        if len(outputs) > self.max_outputs:  # many outputs (stdout and stderr by turns)
            self._drop(execution, 0)
        if output.get("output_type") == "stream":
            return
        # Bound what is not stream text: the earliest such outputs go first.
        output["_owner"] = execution
        output["_size"] = _size({k: v for k, v in output.items() if not k.startswith("_")})
        execution._other_bytes += output["_size"]
        self._bound(execution, keep=output)

    def _bound(self, execution: ExecutionOutputs, keep: dict[str, Any] | None = None) -> None:
        """Drop the execution's earliest outputs that are not streams while they are over
        its budget (the newest, ``keep``, stays whatever its size)."""
        while execution._other_bytes > self.max_output_bytes:
            index = next(
                (
                    i
                    for i, o in enumerate(execution.outputs)
                    if o.get("output_type") != "stream" and o is not keep
                ),
                None,
            )
            if index is None:
                return
            self._drop(execution, index)

    def _drop(self, execution: ExecutionOutputs, index: int) -> None:
        dropped = execution.outputs.pop(index)
        execution._other_bytes -= dropped.get("_size", 0)
        self._forget_display(dropped)
        execution.truncated = True

    def _clear(self, execution: ExecutionOutputs) -> None:
        execution._clear_on_next = False
        execution._other_bytes = 0
        for output in execution.outputs:
            self._forget_display(output)
        execution.outputs = []

    def _forget_display(self, output: dict[str, Any]) -> None:
        display_id = output.get("_display_id")
        shown = self._displays.get(display_id) if isinstance(display_id, str) else None
        if shown is not None:
            shown[:] = [o for o in shown if o is not output]
            if not shown:
                del self._displays[display_id]  # type: ignore[arg-type]

    def _update_display(self, message: KernelMessage) -> None:
        content = message.content()
        transient = content.get("transient")
        display_id = transient.get("display_id") if isinstance(transient, dict) else None
        if not isinstance(display_id, str):
            return
        targets = self._displays.get(display_id)
        if not targets:
            return
        data, metadata = _dict(content.get("data")), _dict(content.get("metadata"))
        size = _size({"data": data, "metadata": metadata})  # once, however many it updates
        for output in list(targets):
            owner = output.get("_owner")
            output["data"], output["metadata"] = data, metadata
            if isinstance(owner, ExecutionOutputs):
                owner._other_bytes += size - output.get("_size", 0)
                output["_size"] = size
                self._bound(owner)

    def result(self, *, since: int = 0, max_bytes: int = 16 * 1024 * 1024) -> list[dict[str, Any]]:
        """The latest execution of each cell, in the order the cells were last run: those
        unfinished, or with a record after ``since``. Past ``max_bytes`` of outputs in all,
        the earliest executions are answered without their outputs (``truncated``)."""
        chosen = [
            execution
            for execution in self._cells.values()
            if execution.status in UNFINISHED
            or (execution.last_seq if execution.last_seq is not None else execution.request_seq)
            > since
        ]
        answer: list[dict[str, Any]] = []
        budget = max_bytes
        for execution in reversed(chosen):
            shown, used = execution.to_json(min(budget, self.max_output_bytes + self.max_text))
            if budget <= 0 or used > budget:
                shown["outputs"], shown["display_ids"], shown["truncated"] = [], {}, True
                self.truncated = True
                used = 0
            budget -= used
            answer.append(shown)
        answer.reverse()
        return answer


def _count(value: Any) -> int | None:
    """An execution count a page can hold (JavaScript numbers are exact to 2**53), else
    None: a kernel's code can set any value, and one bad count must not cost the page
    the whole answer."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53:
        return value
    return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
