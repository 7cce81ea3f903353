"""What the clients ask the gateway, and how they read its answers. No I/O.

Both clients (:mod:`.aio` and :mod:`.sync`) send the :class:`Call` values built here and
hand the answer back to :meth:`Call.answer`, which maps an error answer to the client's
exceptions:

* 401, 403: :class:`AuthenticationError`;
* 404: :class:`NotFound` (``reason`` ``unknown_kernel`` or ``unknown_execution``);
* any other status of 400 or more: :class:`GatewayHTTPError` with its status and reason
  (``409 execution_not_running``, ``409 no_input_pending``, ``413 payload_too_large``...).

The gateway's error bodies are ``{"reason", "message"}``; jupyter_server's own have a
``message`` and no reason. A body that is not JSON is quoted, cut to 200 characters.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypedDict, TypeVar
from urllib.parse import quote, urlencode

import httpx

from ..core.errors import (
    AuthenticationError,
    ClientError,
    GatewayHTTPError,
    GatewayUnreachable,
    NotFound,
)
from .sse import ServerSentEvent

__all__ = [
    "Call",
    "Event",
    "ExecutionResult",
    "StreamFilters",
    "error_for",
    "event_from",
    "transport_error",
]

T = TypeVar("T")
Query = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Event:
    """One Server-Sent Event: its name, its JSON data, and its id (the sequence number).

    ``id`` is the stream's last event ID when the event came (an event with no ``id`` field
    of its own has the one before it), or None before the first.
    """

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
    #: Why it ended so, when the gateway says (for ``died``, ``aborted``...).
    reason: str | None = None

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
            reason=summary.get("reason"),
        )


def _json(body: bytes) -> Any:
    return json.loads(body) if body else None


def _nothing(body: bytes) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request, and how to read a successful answer's body into ``T``."""

    method: str
    path: str
    query: Query = ()
    #: The JSON body, encoded; None sends none.
    body: bytes | None = None
    read: Callable[[bytes], T] = _json

    @property
    def headers(self) -> dict[str, str]:
        return {"Content-Type": "application/json"} if self.body is not None else {}

    def answer(self, status: int, body: bytes) -> T:
        """The answer's value.

        Raises:
            GatewayHTTPError: the status is 400 or more (see the module's docstring).
        """
        if status >= 400:
            raise error_for(status, body)
        return self.read(body)


def _post(path: str, body: Mapping[str, Any], read: Callable[[bytes], T]) -> Call[T]:
    return Call("POST", path, body=json.dumps(body).encode(), read=read)


def kernel_path(kernel_id: str, *rest: str) -> str:
    return "/".join(["/api/kernels", quote(kernel_id, safe=""), *(quote(x, safe="") for x in rest)])


def query(params: Mapping[str, Any]) -> Query:
    """Query parameters without the None ones; a list or tuple repeats its parameter."""
    pairs = []
    for name, value in params.items():
        for item in value if isinstance(value, list | tuple) else [value]:
            if item is not None:
                pairs.append((name, str(item)))
    return tuple(pairs)


# -- the calls -----------------------------------------------------------------------


def start_kernel(name: str | None) -> Call[str]:
    return _post("/api/kernels", {"name": name} if name else {}, lambda body: _json(body)["id"])


def attach_kernel(
    connection_info: Mapping[str, Any],
    name: str | None,
    display_name: str | None,
    kernel_id: str | None,
) -> Call[str]:
    body: dict[str, Any] = {"connection_info": dict(connection_info)}
    for key, value in (("name", name), ("display_name", display_name), ("id", kernel_id)):
        if value is not None:
            body[key] = value
    return _post("/api/kernels", body, lambda reply: _json(reply)["id"])


def detach(kernel_id: str) -> Call[None]:
    return Call("DELETE", kernel_path(kernel_id), query({"shutdown": "false"}), read=_nothing)


def list_kernels() -> Call[list[dict[str, Any]]]:
    return Call("GET", "/api/kernels")


def interrupt(kernel_id: str) -> Call[None]:
    return _post(kernel_path(kernel_id, "interrupt"), {}, _nothing)


def restart(kernel_id: str) -> Call[None]:
    return _post(kernel_path(kernel_id, "restart"), {}, _nothing)


def shutdown(kernel_id: str) -> Call[None]:
    return Call("DELETE", kernel_path(kernel_id), read=_nothing)


def transcript(kernel_id: str, params: Mapping[str, Any]) -> Call[dict[str, Any]]:
    return Call("GET", kernel_path(kernel_id, "transcript"), query(params))


def transcript_text(kernel_id: str, params: Mapping[str, Any]) -> Call[str]:
    path = kernel_path(kernel_id, "transcript")
    return Call("GET", path, query({**params, "format": "text"}), read=bytes.decode)


def start_execution(
    kernel_id: str,
    code: str,
    *,
    allow_stdin: bool = False,
    stop_on_error: bool = True,
    timeout: float | None = None,
) -> Call[str]:
    body = {
        "code": code,
        "allow_stdin": allow_stdin,
        "stop_on_error": stop_on_error,
        "timeout": timeout,
    }
    return _post(kernel_path(kernel_id, "execute"), body, lambda answer: _json(answer)["msg_id"])


def execution(kernel_id: str, msg_id: str) -> Call[ExecutionResult]:
    def read(body: bytes) -> ExecutionResult:
        return ExecutionResult.from_summary(kernel_id, _json(body))

    return Call("GET", kernel_path(kernel_id, "executions", msg_id), read=read)


def send_input(kernel_id: str, msg_id: str, value: str) -> Call[None]:
    path = kernel_path(kernel_id, "executions", msg_id, "input")
    return _post(path, {"value": value}, _nothing)


def interrupt_execution(kernel_id: str, msg_id: str) -> Call[None]:
    return _post(kernel_path(kernel_id, "executions", msg_id, "interrupt"), {}, _nothing)


class StreamFilters(TypedDict, total=False):
    """Which of a kernel's IOPub messages ``stream()`` gets (all by default)."""

    #: Only those of this execution (its msg_id).
    parent: str | None
    #: Only messages of these types.
    msg_types: list[str] | None


def stream_path(kernel_id: str, filters: StreamFilters) -> str:
    """The path and query of a kernel's IOPub as events."""
    types = ",".join(filters.get("msg_types") or []) or None
    params = query({"parent": filters.get("parent"), "msg_type": types})
    path = kernel_path(kernel_id, "stream")
    return f"{path}?{urlencode(params)}" if params else path


def events_path(kernel_id: str, msg_id: str) -> str:
    """The path of one execution's events."""
    return kernel_path(kernel_id, "executions", msg_id, "events")


# -- answers and failures ------------------------------------------------------------


def error_for(status: int, body: bytes) -> GatewayHTTPError:
    """The exception for an error answer (see the module's docstring)."""
    try:
        detail = json.loads(body)
        reason, message = detail.get("reason"), detail.get("message")
    except (ValueError, AttributeError):
        reason, message = None, body.decode("utf-8", "replace")[:200]
    kind = GatewayHTTPError
    if status in (401, 403):
        kind = AuthenticationError
    elif status == 404:
        kind = NotFound
    message = " ".join(str(message or "").split())  # one line
    return kind(status, str(reason or "error"), message or f"HTTP {status}")


def transport_error(url: str, error: httpx.TransportError) -> ClientError:
    """The client's exception for an HTTP request that got no complete answer."""
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
        return GatewayUnreachable(url, describe(error))
    if isinstance(error, httpx.TimeoutException):
        return ClientError(f"no answer from the gateway at {url} in time ({describe(error)})")
    return ClientError(f"lost the connection to the gateway at {url} ({describe(error)})")


def describe(error: BaseException) -> str:
    """An exception in one line: its type and message, or those of the system error behind
    it (``ConnectionRefusedError: [Errno 111] ...`` says more than "All connection
    attempts failed")."""
    cause: BaseException | None = error
    for _ in range(16):  # a chain is short; a cycle must not hang us
        if cause is None:
            break
        if isinstance(cause, OSError) and cause.errno is not None:
            error = cause
        cause = cause.__cause__ or cause.__context__
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def event_from(sse: ServerSentEvent) -> Event:
    """Our :class:`Event` from a parsed one: JSON data, and the id as a sequence number.

    Raises:
        ClientError: the data is not JSON.
    """
    try:
        data = json.loads(sse.data)
    except ValueError as error:
        raise ClientError(
            f"the gateway sent a {sse.event!r} event whose data is not JSON"
        ) from error
    event_id = int(sse.id) if sse.id.isascii() and sse.id.isdigit() else None
    return Event(sse.event, data, event_id)
