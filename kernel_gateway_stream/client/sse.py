"""Server-Sent Events: bytes in, events out. Pure: no I/O, no clock, no event loop.

It follows the HTML Living Standard, "Server-sent events", 9.2.6 "Interpreting an event
stream":

* A line ends with CRLF, LF or CR, and with nothing else. ``str.splitlines()``, and so
  httpx's ``iter_lines()``, also split at U+0085, U+2028, U+2029 and a few control
  characters; the kernel's JSON holds those raw (jupyter_client encodes with
  ``ensure_ascii=False``), so a line must be split here, on bytes. UTF-8 never uses the
  bytes CR and LF inside a character, so splitting before decoding is safe.
* A CR that ends a chunk ends its line at once; an LF that opens the next chunk is the
  rest of that CRLF, not an empty line.
* A byte order mark opening the stream is dropped. Lines are decoded as UTF-8, with
  U+FFFD for invalid bytes.
* A line that starts with a colon is a comment (the gateway's keep-alive).
* ``event`` sets the event type, ``data`` adds a line of data, ``id`` sets the last event
  ID unless its value holds NUL, ``retry`` (ASCII digits only) sets the reconnection time;
  other fields are ignored. One space after the colon is not part of the value.
* An empty line dispatches the event. An event with no ``data`` field is not dispatched.
  The type defaults to ``message``. The last event ID **persists**: an event without an
  ``id`` field has the ID of the one before it.
* An event the stream ends in the middle of is discarded.

Every byte is looked at once: a chunk is scanned once for line ends, a line split over
many chunks is joined once, and an event's data is joined once, when it is dispatched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["EventDecoder", "EventStreamParser", "LineSplitter", "ServerSentEvent"]


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One dispatched event, as the standard defines it (its ``MessageEvent``, less the
    origin and ports a browser adds)."""

    #: The event type (``message`` unless an ``event`` field said otherwise).
    event: str
    #: The ``data`` lines, joined with LF.
    data: str
    #: The last event ID: this event's ``id`` field, or the one before it ("" if none yet).
    id: str


_LINE_END = re.compile(rb"\r\n?|\n")
_BOM = "\ufeff"


class LineSplitter:
    """Cuts a byte stream into lines at CRLF, LF or CR; the line ends are dropped."""

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self._after_cr = False

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines that ``chunk`` completes, in order."""
        start = 0
        if self._after_cr and chunk[:1] == b"\n":
            start = 1  # the LF of a CRLF whose CR ended the last chunk
        if chunk:
            self._after_cr = False
        lines = []
        for end in _LINE_END.finditer(chunk, start):
            piece = chunk[start : end.start()]
            if self._pieces:
                self._pieces.append(piece)
                piece = b"".join(self._pieces)
                self._pieces = []
            lines.append(piece)
            start = end.end()
            self._after_cr = end.group() == b"\r" and start == len(chunk)
        if start < len(chunk):
            self._pieces.append(chunk[start:])
        return lines

    @property
    def pending(self) -> int:
        """Bytes held for a line that has not ended yet."""
        return sum(map(len, self._pieces))


class EventDecoder:
    """Turns lines into events, keeping the last event ID across them."""

    def __init__(self) -> None:
        self._type = ""
        self._data: list[str] = []
        self._first_line = True
        #: The last event ID buffer; it outlives each event.
        self.last_event_id = ""
        #: The reconnection time the server asked for, in milliseconds, if it did.
        self.retry: int | None = None
        #: How many comment lines were read (the gateway sends one as a keep-alive).
        self.comments = 0

    def feed_line(self, line: str) -> ServerSentEvent | None:
        """Take one line (without its end); the event it dispatches, if it does."""
        if self._first_line:
            self._first_line = False
            line = line.removeprefix(_BOM)
        if not line:
            return self._dispatch()
        if line[0] == ":":
            self.comments += 1
            return None
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._type = value
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry = int(value)
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        data, event_type = self._data, self._type
        self._data, self._type = [], ""
        if not data:
            return None
        return ServerSentEvent(event_type or "message", "\n".join(data), self.last_event_id)


class EventStreamParser:
    """A :class:`LineSplitter` feeding an :class:`EventDecoder`: chunks in, events out."""

    def __init__(self) -> None:
        self.lines = LineSplitter()
        self.decoder = EventDecoder()

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """The events that ``chunk`` completes, in order."""
        events = []
        for line in self.lines.feed(chunk):
            event = self.decoder.feed_line(line.decode("utf-8", "replace"))
            if event is not None:
                events.append(event)
        return events
