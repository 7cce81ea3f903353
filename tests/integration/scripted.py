"""A gateway stand-in that answers each connection with the next scripted response: what a
real gateway does rarely (a ``gateway_shutdown`` event, bare-CR line ends, a request it
never answers), on demand. It runs in a thread, so blocking clients can use it too."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from typing import Any

from ..timing import seconds

__all__ = ["HANG", "ScriptedGateway", "sse", "sse_response"]

#: A piece of a scripted answer: say nothing more, and keep the connection open until the
#: server closes.
HANG = b"hang"
#: A scripted answer: bytes, or pieces of bytes sent one after the other.
Answer = bytes | list[bytes]


def sse(event: str, data: Any, event_id: int | None = None, end: bytes = b"\n") -> bytes:
    """One Server-Sent Event, with ``end`` as its line end."""
    lines = [f"event: {event}", f"data: {json.dumps(data, ensure_ascii=False)}", ""]
    if event_id is not None:
        lines.insert(0, f"id: {event_id}")
    return end.join(line.encode() for line in lines) + end


def sse_response(*events: bytes) -> bytes:
    """A 200 event stream holding ``events``; it ends when the connection closes."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    return head + b"".join(events)


class ScriptedGateway:
    """Answers the n-th connection with ``responses[n]`` then closes it (an empty answer
    closes it without a word); past the script, it does that to every connection.
    ``requests`` records each request's line and headers (names in lower case)."""

    def __init__(self, responses: list[Answer]) -> None:
        self.responses = list(responses)
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.accepted = threading.Semaphore(0)
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def wait_accepted(self) -> None:
        """Until one more connection has been accepted and its request read."""
        assert self.accepted.acquire(timeout=seconds(60)), "no connection came"

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() in the thread
        self._listener.close()
        self._thread.join(seconds(10))

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection:
            self._read_and_answer(connection)

    def _read_and_answer(self, connection: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            data = connection.recv(65536)
            if not data:
                return
            head += data
        line, *fields = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        headers = {}
        for field in fields:
            name, _, value = field.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.requests.append((line, headers))
        self.accepted.release()
        response = self.responses.pop(0) if self.responses else b""
        for piece in response if isinstance(response, list) else [response]:
            if piece == HANG:
                self._closed.wait()
                return
            connection.sendall(piece)
