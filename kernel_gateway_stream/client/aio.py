"""The asynchronous client, on httpx's ``AsyncClient``.

Event streams are pulled from the response as the caller iterates, so a caller that
stops reading stops the socket: TCP pushes back to the gateway, whose slow-consumer policy
then drops the stream (and the client resumes it). Nothing is read ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
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

__all__ = ["Event", "ExecutionResult", "GatewayClient"]

T = TypeVar("T")


class GatewayClient(ClientBase):
    """Talks to a kernel_gateway_stream gateway (or the extension in a Jupyter server).

    Use it as ``async with GatewayClient(...) as gateway``, or call :meth:`aclose`. Its
    arguments are :class:`~kernel_gateway_stream.client.base.ClientBase`'s.
    """

    _http: httpx.AsyncClient | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _closing: asyncio.Task[None] | None = None

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client's connections."""
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    def close(self) -> None:
        """Close the connections from synchronous code: on the event loop that opened them
        if it is not running, else as a task of the running one. Prefer :meth:`aclose`."""
        http, self._http = self._http, None
        if http is None or self._loop is None or self._loop.is_closed():
            return
        if not self._loop.is_running():
            self._loop.run_until_complete(http.aclose())
        elif _running_loop() is self._loop:
            self._closing = self._loop.create_task(http.aclose())
        else:  # running in another thread
            asyncio.run_coroutine_threadsafe(http.aclose(), self._loop)

    # -- kernels ---------------------------------------------------------------------

    async def start_kernel(self, name: str | None = None) -> str:
        """Start a kernel (the server's default kernelspec unless ``name``); its id."""
        return await self._perform(api.start_kernel(name))

    async def list_kernels(self) -> list[dict[str, Any]]:
        return await self._perform(api.list_kernels())

    async def interrupt(self, kernel_id: str) -> None:
        await self._perform(api.interrupt(kernel_id))

    async def restart(self, kernel_id: str) -> None:
        await self._perform(api.restart(kernel_id))

    async def shutdown(self, kernel_id: str) -> None:
        await self._perform(api.shutdown(kernel_id))

    async def attach_kernel(
        self,
        connection_info: Mapping[str, Any],
        *,
        name: str | None = None,
        display_name: str | None = None,
        kernel_id: str | None = None,
    ) -> str:
        """Attach a running kernel by its connection info (a connection file's fields);
        its kernel id (``kernel_id`` again, to number its transcript on)."""
        call = api.attach_kernel(connection_info, name, display_name, kernel_id)
        return await self._perform(call)

    async def detach(self, kernel_id: str) -> None:
        """Stop following an attached kernel; it runs on."""
        await self._perform(api.detach(kernel_id))

    # -- transcripts -----------------------------------------------------------------

    async def transcript(self, kernel_id: str, **params: Any) -> dict[str, Any]:
        """One page of the transcript (``since``, ``limit``, ``parent``, ``msg_type``)."""
        return await self._perform(api.transcript(kernel_id, params))

    async def transcript_text(self, kernel_id: str, **params: Any) -> str:
        """The stdout/stderr text of the transcript (``since``, ``parent``)."""
        return await self._perform(api.transcript_text(kernel_id, params))

    # -- executions ------------------------------------------------------------------

    async def execute(
        self, kernel_id: str, code: str, **options: Unpack[ExecuteOptions]
    ) -> ExecutionResult:
        """Run ``code`` on the kernel; callbacks get output as it happens.

        Keyword arguments, all optional: ``on_stdout(text)`` / ``on_stderr(text)``: stream
        text. ``on_output(event)``: each display, result or error. ``on_event(event)``:
        every event. ``input(prompt, password) -> str``: answers the kernel's ``input()``
        (stdin is off without it). Callbacks may be coroutine functions. ``timeout``:
        interrupt the execution after so many seconds. ``stop_on_error`` (default True):
        the kernel aborts what was queued after an error. A dropped connection is resumed
        from the last event received.

        Raises:
            KernelDied: the kernel died or shut down before the execution finished.
            NotFound: no such kernel.
            AuthenticationError: the token was refused.
            GatewayUnreachable: the gateway could not be reached, or not again in time.
        """
        callbacks, start = plan(kernel_id, code, options)
        msg_id = await self._perform(start)
        stream = self._execution_stream(kernel_id, msg_id, None, answered_before=True)
        async with contextlib.aclosing(self._follow(stream)) as events:
            async for event in events:
                for invocation in callbacks.invocations(event):
                    answer = invocation.callback(*invocation.args)
                    if inspect.isawaitable(answer):
                        answer = await answer
                    if invocation.answers_input:
                        await self._perform(api.send_input(kernel_id, msg_id, str(answer)))
                if event.event == "done":
                    return result(kernel_id, event)
        summary = None
        with contextlib.suppress(ClientError):
            summary = await self.execution(kernel_id, msg_id)
        raise died(kernel_id, msg_id, summary)

    async def start_execution(
        self, kernel_id: str, code: str, **options: Unpack[StartOptions]
    ) -> str:
        """Send ``code`` to the kernel without following it; the execution's msg_id."""
        return await self._perform(api.start_execution(kernel_id, code, **options))

    async def execution(self, kernel_id: str, msg_id: str) -> ExecutionResult:
        """An execution's summary so far (its ``status`` may be ``queued`` or ``running``)."""
        return await self._perform(api.execution(kernel_id, msg_id))

    async def interrupt_execution(self, kernel_id: str, msg_id: str) -> None:
        """Interrupt the kernel running this execution.

        Raises:
            GatewayHTTPError: 409 ``execution_not_running`` (the gateway may say so).
            NotFound: no such kernel or execution.
        """
        await self._perform(api.interrupt_execution(kernel_id, msg_id))

    async def execution_events(
        self, kernel_id: str, msg_id: str, since: int | None = None
    ) -> AsyncIterator[Event]:
        """One execution's events, ``done`` last; resumed from the last id if dropped.

        A kernel that shuts down first ends them with ``kernel_shutdown`` instead.
        """
        async for event in self._follow(self._execution_stream(kernel_id, msg_id, since)):
            yield event

    async def stream(
        self, kernel_id: str, since: int | None = None, **filters: Unpack[StreamFilters]
    ) -> AsyncIterator[Event]:
        """A kernel's IOPub messages as events (``/stream``), resumed if dropped; ends with
        the kernel (``kernel_shutdown``, delivered last)."""
        async for event in self._follow(self._kernel_stream(kernel_id, since, filters)):
            yield event

    # -- plumbing --------------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        """The connection pool, made on the running event loop (a pool is bound to one)."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop:
            self._http = httpx.AsyncClient(**self._http_options())
            self._loop = loop
        return self._http

    async def _perform(self, call: Call[T]) -> T:
        try:
            response = await self._client().request(
                call.method, call.path, params=call.query, content=call.body, headers=call.headers
            )
        except httpx.TransportError as error:
            raise api.transport_error(self.url, error) from error
        return call.answer(response.status_code, response.content)

    async def _follow(self, stream: ResumableStream) -> AsyncGenerator[Event, None]:
        """The stream's events, across as many connections as it takes."""
        http, timeout = self._client(), self._stream_timeout()
        while True:
            with self._connecting(stream) as headers:
                async with http.stream(
                    "GET", stream.path, headers=headers, timeout=timeout
                ) as response:
                    error_body = await response.aread() if response.is_error else b""
                    stream.answered(response.status_code, error_body)
                    async for chunk in response.aiter_bytes():
                        for event in stream.feed(chunk):
                            yield event
                        if stream.connection_over:
                            break
            if stream.finished:
                return
            await asyncio.sleep(self._reconnecting(stream, asyncio.get_running_loop().time()).delay)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
