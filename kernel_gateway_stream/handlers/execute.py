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
* ``POST /api/kernels/{id}/executions/{msg_id}/interrupt``: interrupts the kernel.

The events are those of :mod:`kernel_gateway_stream.core.executions`.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from ..core.errors import BadRequest, LocalError, NoInputPending, UnknownExecution, UnknownKernel
from ..core.frames import Frame
from ..core.subscription import LIFECYCLE_STATES
from ..core.wire import Protocol, encode_sse
from ..executions import UNFINISHED, ExecutionManager
from .common import ServicesMixin, parse_seq
from .stream import CONTENT_TYPE, StreamHandler

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
        manager: ExecutionManager = self.settings["kernel_gateway_stream_executions"]
        return manager


def _json_body(handler: Any) -> dict[str, Any]:
    try:
        body = json.loads(handler.request.body or b"{}")
    except ValueError:
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


class ExecutionEventsHandler(_ExecutionsMixin, StreamHandler):
    """One execution's normalized events, as Server-Sent Events, ending with ``done``."""

    encoding = Protocol.EXECUTION
    msg_id = ""

    @web.authenticated
    @authorized
    async def get(self, kernel_id: str, msg_id: str) -> None:  # type: ignore[override]
        last_event_id = self.request.headers.get("Last-Event-ID")
        try:
            since = parse_seq("since", self.get_argument("since", None) or last_event_id)
            summary = await self.executions.summary(kernel_id, msg_id)
            if summary is None:
                raise UnknownExecution(msg_id)
            finished = summary.status not in UNFINISHED
            if finished and since is not None and since >= summary.last_seq:
                # Resumed after the last event: nothing to replay, the answer is done.
                data = json.dumps(summary.to_json()).encode()
                self.set_header("Content-Type", CONTENT_TYPE)
                self._streaming = True
                self.finish(encode_sse("done", summary.last_seq, data))
                return
            await self.stream_execution(kernel_id, msg_id, since)
        except LocalError as error:
            self.write_error_json(error)

    async def stream_execution(self, kernel_id: str, msg_id: str, since: int | None) -> None:
        """Replay the execution from ``since`` (its start when None), then live, until done."""
        self.msg_id = msg_id
        subscriber = await self._subscribe(kernel_id, since or 0, msg_id, None)
        await self._stream(since or 0, subscriber)

    async def after_send(self, frames: list[Frame]) -> None:
        for frame in frames:
            message = frame.message
            ended = message.execution_state == "idle" and message.parent_msg_id == self.msg_id
            if ended or message.execution_state in LIFECYCLE_STATES:
                summary = await self.executions.summary(self.subscriber.kernel_id, self.msg_id)
                data = json.dumps(summary.to_json() if summary else {}).encode()
                if self.is_open():
                    self.write(encode_sse("done", frame.last_seq, data))
                self._end()
                return


class ExecuteHandler(ExecutionEventsHandler):
    """``POST /api/kernels/{id}/execute``."""

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str) -> None:
        try:
            body = _json_body(self)
            code = body.get("code")
            if not isinstance(code, str):
                raise BadRequest("'code' (a string) is required")
            allow_stdin = body.get("allow_stdin", False)
            stop_on_error = body.get("stop_on_error", True)
            if not isinstance(allow_stdin, bool) or not isinstance(stop_on_error, bool):
                raise BadRequest("'allow_stdin' and 'stop_on_error' must be booleans")
            timeout = body.get("timeout")
            is_number = isinstance(timeout, int | float) and not isinstance(timeout, bool)
            if timeout is not None and (not is_number or timeout <= 0):
                raise BadRequest("'timeout' must be a positive number of seconds, or null")
            if kernel_id not in self.kernel_manager:
                raise UnknownKernel(kernel_id)
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
    @authorized
    async def get(self, kernel_id: str, msg_id: str) -> None:
        try:
            running = kernel_id in self.kernel_manager
            if not running and await self.services.store.info(kernel_id) is None:
                raise UnknownKernel(kernel_id)
            summary = await self.executions.summary(kernel_id, msg_id)
            if summary is None:
                raise UnknownExecution(msg_id)
        except LocalError as error:
            self.write_error_json(error)
            return
        self.finish(json.dumps({"kernel_id": kernel_id, **summary.to_json()}))


class ExecutionInputHandler(_ExecutionsMixin, ServicesMixin, APIHandler):
    """``POST .../executions/{msg_id}/input``: answer the kernel's input_request."""

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str, msg_id: str) -> None:
        try:
            value = _json_body(self).get("value")
            if not isinstance(value, str):
                raise BadRequest("'value' (a string) is required")
            if kernel_id not in self.kernel_manager:
                raise UnknownKernel(kernel_id)
            executor = self.executions.executors.get(kernel_id)
            if executor is None or not executor.answer(msg_id, value):
                raise NoInputPending(f"execution {msg_id!r} is not waiting for input")
        except LocalError as error:
            self.write_error_json(error)
            return
        self.finish(json.dumps({"msg_id": msg_id, "sent": True}))


class ExecutionInterruptHandler(_ExecutionsMixin, ServicesMixin, APIHandler):
    """``POST .../executions/{msg_id}/interrupt``: interrupt the kernel running it."""

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str, msg_id: str) -> None:
        try:
            await self.executions.interrupt(kernel_id)
        except LocalError as error:
            self.write_error_json(error)
            return
        self.finish(json.dumps({"msg_id": msg_id, "interrupted": True}))
