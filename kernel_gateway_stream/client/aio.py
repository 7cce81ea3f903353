"""The asynchronous client."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest, HTTPResponse

from ..core.errors import (
    AuthenticationError,
    ClientError,
    GatewayHTTPError,
    KernelDied,
    NotFound,
)

__all__ = ["Event", "ExecutionResult", "GatewayClient", "SSEParser"]

Callback = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class Event:
    """One Server-Sent Event: its name, its JSON data, and its id (the sequence number)."""

    event: str
    data: Any
    id: int | None = None


@dataclass
class ExecutionResult:
    """How an execution ended and what it produced (the gateway's summary)."""

    msg_id: str
    kernel_id: str
    status: str
    stdout: str = ""
    stderr: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None
    execution_count: int | None = None
    duration: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def from_summary(cls, kernel_id: str, summary: dict[str, Any]) -> ExecutionResult:
        return cls(
            msg_id=summary["msg_id"],
            kernel_id=kernel_id,
            status=summary["status"],
            stdout=summary.get("stdout", ""),
            stderr=summary.get("stderr", ""),
            outputs=summary.get("outputs", []),
            error=summary.get("error"),
            execution_count=summary.get("execution_count"),
            duration=summary.get("duration"),
        )


class SSEParser:
    """Incremental Server-Sent Events parser: feed bytes, get the complete events."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[Event]:
        self._buffer += chunk.replace(b"\r\n", b"\n")
        events = []
        while b"\n\n" in self._buffer:
            block, self._buffer = self._buffer.split(b"\n\n", 1)
            name, event_id, data = "message", None, []
            for line in block.decode("utf-8").split("\n"):
                if not line or line.startswith(":"):
                    continue
                key, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if key == "event":
                    name = value
                elif key == "id":
                    event_id = int(value) if value.isdigit() else None
                elif key == "data":
                    data.append(value)
            if data:
                events.append(Event(name, json.loads("\n".join(data)), event_id))
        return events


class GatewayClient:
    """Talks to a kernel_gateway_stream gateway (or the extension in a Jupyter server).

    Args:
        url: the server's base URL; default ``$KGS_URL`` or ``http://127.0.0.1:8888``.
        token: the API token; default ``$KGS_TOKEN`` or ``$JUPYTER_TOKEN``.
        request_timeout: seconds for each plain request.
        reconnect_attempts: how many times in a row a dropped event stream is resumed
            before :class:`ClientError` is raised.
        reconnect_delay: the first pause before resuming; it grows with each attempt.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        request_timeout: float = 60.0,
        reconnect_attempts: int = 30,
        reconnect_delay: float = 0.1,
    ) -> None:
        self.url = (url or os.environ.get("KGS_URL") or "http://127.0.0.1:8888").rstrip("/")
        self.token = token or os.environ.get("KGS_TOKEN") or os.environ.get("JUPYTER_TOKEN")
        self.request_timeout = request_timeout
        self.reconnect_attempts = reconnect_attempts
        self.reconnect_delay = reconnect_delay
        self._http: AsyncHTTPClient | None = None

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    # -- kernels ---------------------------------------------------------------------

    async def start_kernel(self, name: str | None = None) -> str:
        """Start a kernel (the server's default kernelspec unless ``name``); its id."""
        model = await self._json("POST", "/api/kernels", {"name": name} if name else {})
        kernel_id: str = model["id"]
        return kernel_id

    async def list_kernels(self) -> list[dict[str, Any]]:
        kernels: list[dict[str, Any]] = await self._json("GET", "/api/kernels")
        return kernels

    async def interrupt(self, kernel_id: str) -> None:
        await self._json("POST", f"/api/kernels/{quote(kernel_id)}/interrupt", {})

    async def restart(self, kernel_id: str) -> None:
        await self._json("POST", f"/api/kernels/{quote(kernel_id)}/restart", {})

    async def shutdown(self, kernel_id: str) -> None:
        await self._json("DELETE", f"/api/kernels/{quote(kernel_id)}")

    # -- transcripts -----------------------------------------------------------------

    async def transcript(self, kernel_id: str, **params: Any) -> dict[str, Any]:
        """One page of the transcript (``since``, ``limit``, ``parent``, ``msg_type``)."""
        page: dict[str, Any] = await self._json(
            "GET", f"/api/kernels/{quote(kernel_id)}/transcript?{_query(params)}"
        )
        return page

    async def transcript_text(self, kernel_id: str, **params: Any) -> str:
        """The stdout/stderr text of the transcript (optionally of one ``parent``)."""
        params["format"] = "text"
        response = await self._fetch(
            "GET", f"/api/kernels/{quote(kernel_id)}/transcript?{_query(params)}"
        )
        return response.body.decode("utf-8")

    # -- executions ------------------------------------------------------------------

    async def execute(
        self,
        kernel_id: str,
        code: str,
        *,
        on_stdout: Callback | None = None,
        on_stderr: Callback | None = None,
        on_output: Callback | None = None,
        on_event: Callback | None = None,
        input: Callback | None = None,
        timeout: float | None = None,
        stop_on_error: bool = True,
    ) -> ExecutionResult:
        """Run ``code`` on the kernel; callbacks get output as it happens.

        ``on_stdout(text)`` / ``on_stderr(text)``: stream text. ``on_output(event)``: each
        display, result or error. ``on_event(event)``: every event. ``input(prompt,
        password) -> str``: answers the kernel's ``input()`` (stdin is off without it).
        Callbacks may be coroutine functions. ``timeout`` interrupts the execution after so
        many seconds. A dropped connection is resumed from the last event received.

        Raises:
            KernelDied: the kernel died before the execution finished.
            NotFound: no such kernel.
            AuthenticationError: the token was refused.
        """
        started = await self._json(
            "POST",
            f"/api/kernels/{quote(kernel_id)}/execute",
            {
                "code": code,
                "allow_stdin": input is not None,
                "stop_on_error": stop_on_error,
                "timeout": timeout,
            },
        )
        msg_id: str = started["msg_id"]
        async for event in self.execution_events(kernel_id, msg_id):
            if on_event is not None:
                await _call(on_event, event)
            if event.event == "stdout" and on_stdout is not None:
                await _call(on_stdout, event.data["text"])
            elif event.event == "stderr" and on_stderr is not None:
                await _call(on_stderr, event.data["text"])
            elif event.event in ("display", "result", "error") and on_output is not None:
                await _call(on_output, event)
            elif event.event == "input_request" and input is not None:
                value = await _call(input, event.data["prompt"], event.data["password"])
                await self._json(
                    "POST",
                    f"/api/kernels/{quote(kernel_id)}/executions/{quote(msg_id)}/input",
                    {"value": str(value)},
                )
            elif event.event == "done":
                result = ExecutionResult.from_summary(kernel_id, event.data)
                if result.status == "died":
                    raise KernelDied(result)
                return result
        raise ClientError("the event stream ended before the execution did")

    async def execution_events(
        self, kernel_id: str, msg_id: str, since: int | None = None
    ) -> AsyncIterator[Event]:
        """One execution's events, ``done`` last; resumed from the last id if dropped."""
        path = f"/api/kernels/{quote(kernel_id)}/executions/{quote(msg_id)}/events"
        async for event in self._resumable(path, since):
            yield event
            if event.event == "done":
                return

    async def stream(
        self,
        kernel_id: str,
        since: int | None = None,
        *,
        parent: str | None = None,
        msg_types: list[str] | None = None,
    ) -> AsyncIterator[Event]:
        """A kernel's IOPub messages as events (``/stream``), resumed if dropped; ends with
        the kernel (``kernel_shutdown``)."""
        query = _query({"parent": parent, "msg_type": ",".join(msg_types or []) or None})
        async for event in self._resumable(
            f"/api/kernels/{quote(kernel_id)}/stream?{query}", since
        ):
            yield event
            if event.event == "kernel_shutdown":
                return

    async def _resumable(self, path: str, since: int | None) -> AsyncIterator[Event]:
        last = since
        failures = 0
        while True:
            try:
                async for event in self._events(path, last):
                    failures = 0
                    if event.event == "slow_consumer":
                        last = event.data.get("last_seq", last)
                        break
                    if event.id is not None:
                        if last is not None and event.id <= last and event.event != "done":
                            continue  # already had it
                        last = event.id
                    yield event
            except (GatewayHTTPError, KernelDied):
                raise
            except (OSError, HTTPClientError, asyncio.TimeoutError) as error:
                failures += 1
                if failures > self.reconnect_attempts:
                    raise ClientError(f"lost the connection to {self.url}: {error}") from error
            else:
                failures += 1
                if failures > self.reconnect_attempts:
                    raise ClientError(f"the event stream from {self.url} keeps ending")
            await asyncio.sleep(self.reconnect_delay * failures)

    async def _events(self, path: str, since: int | None) -> AsyncIterator[Event]:
        """One connection's events; returns when the server ends the response."""
        queue: asyncio.Queue[Event | BaseException | None] = asyncio.Queue()
        parser = SSEParser()
        body = bytearray()

        def on_chunk(chunk: bytes) -> None:
            body.extend(chunk)
            for event in parser.feed(chunk):
                queue.put_nowait(event)

        headers = self._headers()
        if since is not None:
            headers["Last-Event-ID"] = str(since)
        request = HTTPRequest(
            self.url + path, headers=headers, streaming_callback=on_chunk, request_timeout=0
        )
        http = AsyncHTTPClient(force_instance=True)
        fetch = asyncio.ensure_future(http.fetch(request, raise_error=False))
        fetch.add_done_callback(lambda done: queue.put_nowait(_outcome(done)))
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Event):
                    yield item
                elif item is None:
                    return
                else:
                    raise item
        finally:
            http.close()
            if not fetch.done():
                fetch.cancel()
            elif not fetch.cancelled() and fetch.exception() is None:
                response = fetch.result()
                if response.code >= 400 and response.code != 599:
                    _raise_for(response.code, bytes(body))

    # -- plumbing --------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"} if self.token else {}

    async def _fetch(self, method: str, path: str, body: Any = None) -> HTTPResponse:
        if self._http is None:
            self._http = AsyncHTTPClient(force_instance=True)
        payload = None if body is None else json.dumps(body)
        if payload is None and method == "POST":
            payload = ""
        request = HTTPRequest(
            self.url + path,
            method=method,
            body=payload,
            headers=self._headers(),
            request_timeout=self.request_timeout,
        )
        try:
            return await self._http.fetch(request)
        except HTTPClientError as error:
            if error.code == 599 or error.response is None:
                raise ClientError(f"could not reach {self.url}: {error}") from error
            _raise_for(error.code, error.response.body)
            raise  # unreachable: _raise_for always raises

    async def _json(self, method: str, path: str, body: Any = None) -> Any:
        response = await self._fetch(method, path, body)
        return json.loads(response.body) if response.body else None


def _outcome(done: asyncio.Future[HTTPResponse]) -> BaseException | None:
    """What the event queue gets when the connection ends: None, or its error."""
    if done.cancelled():
        return None
    error = done.exception()
    if error is not None:
        return error
    response = done.result()
    if response.code == 599 and response.error is not None:
        return response.error
    return None


def _raise_for(status: int, body: bytes) -> None:
    try:
        detail = json.loads(body)
        reason, message = detail.get("reason", ""), detail.get("message", "")
    except (ValueError, AttributeError):
        reason, message = "", body.decode("utf-8", "replace")[:200]
    kind = GatewayHTTPError
    if status in (401, 403):
        kind = AuthenticationError
    elif status == 404:
        kind = NotFound
    raise kind(status, reason or "error", message or f"HTTP {status}")


def _query(params: dict[str, Any]) -> str:
    return urlencode({k: v for k, v in params.items() if v is not None})


async def _call(callback: Callback, *args: Any) -> Any:
    result = callback(*args)
    if inspect.isawaitable(result):
        return await result
    return result
