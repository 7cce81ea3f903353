"""The execute API: run code on a kernel and follow it, without the Jupyter protocol.

* ``POST /api/kernels/{id}/execute`` ``{"code", "allow_stdin", "stop_on_error", "timeout"}``:
  201 ``{"msg_id"}``; or, with ``Accept: text/event-stream``, the execution's events in the
  response itself: first ``execution`` ``{"msg_id", "kernel_id"}`` (also in the
  ``X-Execution-Msg-Id`` header), last ``done``.
* ``GET /api/kernels/{id}/executions/{msg_id}``: the summary, rebuilt from the transcript.
* ``GET /api/kernels/{id}/executions/{msg_id}/events``: its events as SSE, resumable with
  ``Last-Event-ID`` or ``?since=``; the last event is ``done`` with the summary.
* ``POST /api/kernels/{id}/executions/{msg_id}/input`` ``{"value"}``: answers a pending
  ``input_request`` (409 if none is pending).
* ``POST /api/kernels/{id}/executions/{msg_id}/interrupt``: interrupts the kernel if, and
  only if, this execution is the one running (404 unknown, 409 queued or finished).

The events are those of :mod:`kernel_gateway_stream.core.executions`. Every endpoint
requires ``execute`` on ``kernels``; request bodies are limited in size (413).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.iostream import StreamClosedError

from ..core.endings import server_error
from ..core.errors import BadRequest, LocalError, NoInputPending, UnknownExecution
from ..core.executions import UNFINISHED, EncodedSummary, ExecutionSummary
from ..core.frames import Frame, frames_from_records
from ..core.marks import is_mark
from ..core.wire import Protocol, encode_sse
from ..executions import ExecutionManager
from .common import (
    KERNEL_ACTION,
    LimitedBodyMixin,
    ServicesMixin,
    json_body,
    parse_timeout,
    requires,
)
from .stream import CONTENT_TYPE, SSEHandler

#: Bytes of a summary written before waiting for the client to take them.
SEND_CHUNK = 1024 * 1024

__all__ = [
    "ExecuteHandler",
    "ExecutionEventsHandler",
    "ExecutionHandler",
    "ExecutionInputHandler",
    "ExecutionInterruptHandler",
]


class _ExecutionsMixin:
    settings: dict[str, Any]

    @property
    def executions(self) -> ExecutionManager:
        manager: ExecutionManager = self.services.executions  # type: ignore[attr-defined]
        return manager

    def encode_summary(self, summary: ExecutionSummary, **extra: str) -> EncodedSummary:
        """The summary as JSON; one that cannot be written whole (a kernel's output nested
        past what JSON encodes) is its outcome alone, logged (see ExecutionSummary.encode)."""
        encoded = summary.encode(**extra)
        if encoded.failure is not None:
            log: Any = self.log  # type: ignore[attr-defined]
            log.warning("Execution %s: %s", summary.msg_id, encoded.failure)
        return encoded

    def done_event(self, summary: ExecutionSummary | None, last_seq: int | None) -> bytes:
        """The last event: ``done`` with the summary, after a ``server_error`` event if
        the summary holds only the outcome. Never raises."""
        if summary is None:
            return encode_sse("done", last_seq, b"{}")
        encoded = self.encode_summary(summary)
        done = encode_sse("done", last_seq, encoded.data)
        if encoded.failure is None:
            return done
        return server_error(summary.last_seq, encoded.failure).sse_event() + done


class _ExecutionStream(_ExecutionsMixin, SSEHandler):
    """One execution's normalized events, as Server-Sent Events, ending with ``done``."""

    encoding = Protocol.EXECUTION
    msg_id = ""

    async def stream_execution(self, kernel_id: str, msg_id: str, since: int | None) -> None:
        """Replay the execution from ``since`` (its start when None), then live, until done."""
        self.msg_id = msg_id
        subscriber = await self._subscribe(kernel_id, since or 0, msg_id, None)
        await self._stream(since or 0, subscriber)

    async def after_send(self, frames: list[Frame]) -> None:
        for frame in frames:
            message = frame.message
            ended = message.execution_state == "idle" and message.parent_msg_id == self.msg_id
            if not ended and not is_mark(message):
                continue
            summary = await self.executions.summary(self.subscriber.kernel_id, self.msg_id)
            if summary is not None and summary.status in UNFINISHED:
                continue  # a gap record: output may be missing, but it goes on
            if self.is_open():
                self.write(self.done_event(summary, frame.last_seq))
            self._end()
            return


class ExecutionEventsHandler(_ExecutionStream):
    """``GET .../executions/{msg_id}/events``."""

    @web.authenticated
    @requires(KERNEL_ACTION)
    async def get(self, kernel_id: str, msg_id: str) -> None:  # type: ignore[override]
        try:
            since = self.last_event_id()
            summary = await self.executions.summary(kernel_id, msg_id)
            if summary is None:
                raise UnknownExecution(msg_id)
            finished = summary.status not in UNFINISHED
            if finished and since is not None and since >= summary.last_seq:
                # Resumed after the last event: nothing to replay, the answer is done.
                self.set_header("Content-Type", CONTENT_TYPE)
                self._streaming = True
                self.finish(self.done_event(summary, summary.last_seq))
                return
            if not (await self.services.locate(kernel_id)).running:
                await self._from_transcript(kernel_id, msg_id, since or 0, summary)
                return
            await self.stream_execution(kernel_id, msg_id, since)
        except LocalError as error:
            self.write_error_json(error)

    async def _from_transcript(
        self, kernel_id: str, msg_id: str, since: int, summary: ExecutionSummary
    ) -> None:
        """The kernel is gone: the execution's events after ``since`` from its transcript,
        page by page, then ``done`` (it ended, one way or another, with the kernel)."""
        self.set_header("Content-Type", CONTENT_TYPE)
        self._streaming = True
        store = self.services.store
        limits = self.services.replay
        while True:
            page = await store.read(
                kernel_id, since, limits.page_records, parent=msg_id, max_bytes=limits.page_bytes
            )
            if not page.records:
                break
            for frame in frames_from_records(page.records, limits.frame_bytes):
                self.write(frame.encode(Protocol.EXECUTION)[0])
            await self.flush()
            since = page.records[-1].seq
        # Read again now that the kernel is gone: the summary passed in may be from before
        # it went (this request waited for a summary slot while it was shut down).
        summary = await self.executions.summary(kernel_id, msg_id) or summary
        self.finish(self.done_event(summary, summary.last_seq))


@web.stream_request_body
class ExecuteHandler(LimitedBodyMixin, _ExecutionStream):  # type: ignore[misc]
    """``POST /api/kernels/{id}/execute``."""

    @web.authenticated
    @requires(KERNEL_ACTION)
    async def post(self, kernel_id: str) -> None:  # type: ignore[override]
        try:
            body = json_body(self)
            code = body.get("code")
            if not isinstance(code, str):
                raise BadRequest("'code' (a string) is required")
            allow_stdin = body.get("allow_stdin", False)
            stop_on_error = body.get("stop_on_error", True)
            if not isinstance(allow_stdin, bool) or not isinstance(stop_on_error, bool):
                raise BadRequest("'allow_stdin' and 'stop_on_error' must be booleans")
            timeout = parse_timeout(body.get("timeout"))
            await self.services.locate(kernel_id, running=True)
            msg_id = await self.executions.execute(
                kernel_id,
                code,
                allow_stdin=allow_stdin,
                stop_on_error=stop_on_error,
                timeout=timeout,
            )
            if "text/event-stream" in self.request.headers.get("Accept", ""):
                # The caller needs the msg_id to send input or interrupt: say it first.
                self.set_header("X-Execution-Msg-Id", msg_id)
                started = json.dumps({"msg_id": msg_id, "kernel_id": kernel_id}).encode()
                self.write(encode_sse("execution", None, started))
                await self.stream_execution(kernel_id, msg_id, None)
                return
        except LocalError as error:
            self.write_error_json(error)
            return
        self.set_status(201)
        self.finish(json.dumps({"msg_id": msg_id, "kernel_id": kernel_id}))


class ExecutionHandler(_ExecutionsMixin, ServicesMixin, APIHandler):
    """``GET /api/kernels/{id}/executions/{msg_id}``: the summary."""

    @web.authenticated
    @requires(KERNEL_ACTION)
    async def get(self, kernel_id: str, msg_id: str) -> None:  # type: ignore[override]
        try:
            await self.services.locate(kernel_id)
        except LocalError as error:
            self.write_error_json(error)
            return
        executions = self.executions
        # Built, encoded and sent in one slot: concurrent reads of a large summary wait
        # their turn instead of each holding its own copy (max_concurrent_summaries).
        async with executions.summary_slots:
            try:
                summary = await executions.build_summary(kernel_id, msg_id)
                if summary is None:
                    raise UnknownExecution(msg_id)
            except LocalError as error:
                self.write_error_json(error)
                return
            data = self.encode_summary(summary, kernel_id=kernel_id).data
            del summary
            await self._send(data, executions.summary_write_timeout)

    async def _send(self, data: bytes, timeout: float) -> None:
        """``data`` as the body, a chunk at a time; a client that does not read it within
        ``timeout`` seconds is disconnected (it holds a slot meanwhile)."""
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        view = memoryview(data)
        try:
            for start in range(0, len(view), SEND_CHUNK):
                self.write(bytes(view[start : start + SEND_CHUNK]))
                await asyncio.wait_for(self.flush(), timeout)
            self.finish()
        except (asyncio.TimeoutError, StreamClosedError):
            self.log.info("A summary read was too slow or went away; disconnected")
            self.request.connection.close()  # type: ignore[union-attr]


@web.stream_request_body
class ExecutionInputHandler(  # type: ignore[misc]  # prepare: as APIHandler's
    LimitedBodyMixin, _ExecutionsMixin, ServicesMixin, APIHandler
):
    """``POST .../executions/{msg_id}/input``: answer the kernel's input_request."""

    @web.authenticated
    @requires(KERNEL_ACTION)
    async def post(self, kernel_id: str, msg_id: str) -> None:  # type: ignore[override]
        try:
            value = json_body(self).get("value")
            if not isinstance(value, str):
                raise BadRequest("'value' (a string) is required")
            await self.services.locate(kernel_id, running=True)
            if not self.executions.answer(kernel_id, msg_id, value):
                raise NoInputPending(f"execution {msg_id!r} is not waiting for input")
        except LocalError as error:
            self.write_error_json(error)
            return
        self.finish(json.dumps({"msg_id": msg_id, "sent": True}))


@web.stream_request_body
class ExecutionInterruptHandler(  # type: ignore[misc]  # prepare: as APIHandler's
    LimitedBodyMixin, _ExecutionsMixin, ServicesMixin, APIHandler
):
    """``POST .../executions/{msg_id}/interrupt``: interrupt the kernel running it."""

    @web.authenticated
    @requires(KERNEL_ACTION)
    async def post(self, kernel_id: str, msg_id: str) -> None:  # type: ignore[override]
        try:
            json_body(self)  # (none expected; a huge one is still refused)
            await self.services.locate(kernel_id, running=True)
            await self.executions.interrupt(kernel_id, msg_id)
        except LocalError as error:
            self.write_error_json(error)
            return
        self.finish(json.dumps({"msg_id": msg_id, "interrupted": True}))
