"""A Server-Sent Events reader for the tests, on tornado's streaming HTTP client."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from ..timing import seconds


@dataclass
class Event:
    id: int | None
    event: str
    data: Any


def parse_events(buffer: bytes) -> tuple[list[Event], int, bytes]:
    """Complete events in ``buffer``, the number of comment lines, and the rest."""
    events: list[Event] = []
    comments = 0
    while b"\n\n" in buffer:
        block, buffer = buffer.split(b"\n\n", 1)
        fields: dict[str, list[str]] = {}
        for line in block.decode().split("\n"):
            if line.startswith(":"):
                comments += 1
                continue
            name, _, value = line.partition(": ")
            fields.setdefault(name, []).append(value)
        if "event" in fields:
            event_id = int(fields["id"][0]) if "id" in fields else None
            data = json.loads("\n".join(fields.get("data", [])))
            events.append(Event(event_id, fields["event"][0], data))
    return events, comments, buffer


class SSEReader:
    """Reads one stream in the background; the tests wait on what has arrived."""

    def __init__(
        self, url: str, headers: dict[str, str], method: str = "GET", body: str | None = None
    ) -> None:
        self.events: list[Event] = []
        self.comments = 0
        self.raw = b""
        self._buffer = b""
        self._arrived = asyncio.Event()
        self._client = AsyncHTTPClient(force_instance=True)
        request = HTTPRequest(
            url,
            method=method,
            body=body,
            headers=headers,
            streaming_callback=self._feed,
            request_timeout=seconds(600),
        )
        self.response = asyncio.ensure_future(self._client.fetch(request, raise_error=False))

    def _feed(self, chunk: bytes) -> None:
        self.raw += chunk
        events, comments, self._buffer = parse_events(self._buffer + chunk)
        self.events.extend(events)
        self.comments += comments
        self._arrived.set()

    async def until(self, done: Any, timeout: float = 120) -> list[Event]:
        """Wait until ``done(events)`` is true; returns the events so far."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds(timeout)
        while not done(self.events):
            if self.response.done():
                raise AssertionError(f"stream ended early: {self.response.result().code}")
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), max(0.01, deadline - loop.time()))
            except asyncio.TimeoutError:
                last = [(e.id, e.event) for e in self.events[-5:]]
                raise AssertionError(
                    f"not done in {seconds(timeout):.0f} s: {len(self.events)} events, "
                    f"the last {last}"
                ) from None
        return self.events

    async def until_idle(self, parent: str, timeout: float = 120) -> list[Event]:
        def idle(events: list[Event]) -> bool:
            return any(
                e.event == "status"
                and e.data["content"]["execution_state"] == "idle"
                and e.data["parent_header"].get("msg_id") == parent
                for e in events
            )

        return await self.until(idle, timeout)

    def close(self) -> None:
        self._client.close()


def stream_text(events: list[Event], name: str = "stdout") -> str:
    return "".join(
        e.data["content"]["text"]
        for e in events
        if e.event == "stream" and e.data["content"]["name"] == name
    )
