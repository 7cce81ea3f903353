"""The blocking client, on httpx's ``Client``: no event loop of its own, so it works in any
thread, including one whose event loop is running (a Jupyter notebook's)."""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Generator, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from ..core.errors import ClientError
from . import api
from .api import Call, Event, ExecutionResult, StreamFilters
from .base import ClientBase
from .callbacks import ExecuteOptions, StartOptions, died, plan, result
from .resume import ResumableStream

if TYPE_CHECKING:
    from typing import Unpack

__all__ = ["SyncGatewayClient"]

T = TypeVar("T")


class SyncGatewayClient(ClientBase):
    """:class:`GatewayClient`'s methods, blocking, with the same arguments. Callbacks run in
    the calling thread and must be plain functions. ``stream`` and ``execution_events`` are
    generators: leaving one early (or its ``close()``) closes its connection."""

    _http: httpx.Client | None = None

    def __enter__(self) -> SyncGatewayClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the client's connections."""
        http, self._http = self._http, None
        if http is not None:
            http.close()

    def start_kernel(self, name: str | None = None) -> str:
        return self._perform(api.start_kernel(name))

    def list_kernels(self) -> list[dict[str, Any]]:
        return self._perform(api.list_kernels())

    def interrupt(self, kernel_id: str) -> None:
        self._perform(api.interrupt(kernel_id))

    def restart(self, kernel_id: str) -> None:
        self._perform(api.restart(kernel_id))

    def shutdown(self, kernel_id: str) -> None:
        self._perform(api.shutdown(kernel_id))

    def attach_kernel(
        self,
        connection_info: Mapping[str, Any],
        *,
        name: str | None = None,
        display_name: str | None = None,
        kernel_id: str | None = None,
    ) -> str:
        """As :meth:`GatewayClient.attach_kernel`."""
        return self._perform(api.attach_kernel(connection_info, name, display_name, kernel_id))

    def detach(self, kernel_id: str) -> None:
        self._perform(api.detach(kernel_id))

    def transcript(self, kernel_id: str, **params: Any) -> dict[str, Any]:
        return self._perform(api.transcript(kernel_id, params))

    def transcript_text(self, kernel_id: str, **params: Any) -> str:
        return self._perform(api.transcript_text(kernel_id, params))

    def execute(
        self, kernel_id: str, code: str, **options: Unpack[ExecuteOptions]
    ) -> ExecutionResult:
        """As :meth:`GatewayClient.execute`, with plain-function callbacks.

        Raises:
            TypeError: a callback returned an awaitable.
        """
        callbacks, start = plan(kernel_id, code, options)
        msg_id = self._perform(start)
        stream = self._execution_stream(kernel_id, msg_id, None, answered_before=True)
        with contextlib.closing(self._follow(stream)) as events:
            for event in events:
                for invocation in callbacks.invocations(event):
                    answer = invocation.callback(*invocation.args)
                    if inspect.isawaitable(answer):
                        _discard(answer)
                        raise TypeError("SyncGatewayClient's callbacks must be plain functions")
                    if invocation.answers_input:
                        self._perform(api.send_input(kernel_id, msg_id, str(answer)))
                if event.event == "done":
                    return result(kernel_id, event)
        summary = None
        with contextlib.suppress(ClientError):
            summary = self.execution(kernel_id, msg_id)
        raise died(kernel_id, msg_id, summary)

    def start_execution(self, kernel_id: str, code: str, **options: Unpack[StartOptions]) -> str:
        return self._perform(api.start_execution(kernel_id, code, **options))

    def execution(self, kernel_id: str, msg_id: str) -> ExecutionResult:
        return self._perform(api.execution(kernel_id, msg_id))

    def interrupt_execution(self, kernel_id: str, msg_id: str) -> None:
        self._perform(api.interrupt_execution(kernel_id, msg_id))

    def execution_events(
        self, kernel_id: str, msg_id: str, since: int | None = None
    ) -> Iterator[Event]:
        """As :meth:`GatewayClient.execution_events`."""
        return self._follow(self._execution_stream(kernel_id, msg_id, since))

    def stream(
        self, kernel_id: str, since: int | None = None, **filters: Unpack[StreamFilters]
    ) -> Iterator[Event]:
        """As :meth:`GatewayClient.stream`."""
        return self._follow(self._kernel_stream(kernel_id, since, filters))

    # -- plumbing --------------------------------------------------------------------

    def _client(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(**self._http_options())
        return self._http

    def _perform(self, call: Call[T]) -> T:
        try:
            response = self._client().request(
                call.method, call.path, params=call.query, content=call.body, headers=call.headers
            )
        except httpx.TransportError as error:
            raise api.transport_error(self.url, error) from error
        return call.answer(response.status_code, response.content)

    def _follow(self, stream: ResumableStream) -> Generator[Event, None, None]:
        """The stream's events, across as many connections as it takes."""
        http, timeout = self._client(), self._stream_timeout()
        while True:
            with (
                self._connecting(stream) as headers,
                http.stream("GET", stream.path, headers=headers, timeout=timeout) as response,
            ):
                stream.answered(response.status_code, response.read() if response.is_error else b"")
                for chunk in response.iter_bytes():
                    yield from stream.feed(chunk)
                    if stream.connection_over:
                        break
            if stream.finished:
                return
            time.sleep(self._reconnecting(stream, time.monotonic()).delay)


def _discard(awaitable: Any) -> None:
    """Close a coroutine that will not be awaited (so Python does not warn about it)."""
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()
