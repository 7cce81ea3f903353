"""``execute()``'s logic without its I/O: which callbacks an event calls, and how it ends.

Both clients follow an execution's events and, for each, run the :class:`Invocation` values
:meth:`ExecutionCallbacks.invocations` gives, in order; an invocation that
``answers_input`` has its callback's return value sent to the kernel as the input. The
``done`` event ends the call with :func:`result`; a ``kernel_shutdown`` event before it
ends it with :func:`died`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

from ..core.errors import KernelDied
from . import api
from .api import Call, Event, ExecutionResult

__all__ = [
    "Callback",
    "ExecuteOptions",
    "ExecutionCallbacks",
    "Invocation",
    "StartOptions",
    "died",
    "plan",
    "result",
]

Callback = Callable[..., Any]

#: The events that end an execution's stream.
EXECUTION_ENDS = frozenset({"done", "kernel_shutdown"})
_OUTPUTS = frozenset({"display", "result", "error"})


class StartOptions(TypedDict, total=False):
    """The options of an execution (``POST .../execute``)."""

    #: Whether the kernel may ask for input (default False).
    allow_stdin: bool
    #: Whether the kernel aborts the executions queued after a failed one (default True).
    stop_on_error: bool
    #: Interrupt the execution after so many seconds (default: never).
    timeout: float | None


class ExecuteOptions(TypedDict, total=False):
    """The keyword arguments of ``execute()``, in both clients."""

    on_stdout: Callback | None
    on_stderr: Callback | None
    on_output: Callback | None
    on_event: Callback | None
    input: Callback | None
    timeout: float | None
    stop_on_error: bool


@dataclass(frozen=True, slots=True)
class Invocation:
    """One call of a caller's callback."""

    callback: Callback
    args: tuple[Any, ...]
    #: The callback's return value is the answer to the kernel's ``input_request``.
    answers_input: bool = False


@dataclass(frozen=True, slots=True)
class ExecutionCallbacks:
    """The callbacks given to ``execute()``; each may be None."""

    on_stdout: Callback | None = None
    on_stderr: Callback | None = None
    on_output: Callback | None = None
    on_event: Callback | None = None
    input: Callback | None = None

    def invocations(self, event: Event) -> list[Invocation]:
        """The callbacks ``event`` calls, in order: ``on_event`` first, then its own."""
        calls = [Invocation(self.on_event, (event,))] if self.on_event is not None else []
        name = event.event
        if name == "stdout" and self.on_stdout is not None:
            calls.append(Invocation(self.on_stdout, (event.data["text"],)))
        elif name == "stderr" and self.on_stderr is not None:
            calls.append(Invocation(self.on_stderr, (event.data["text"],)))
        elif name in _OUTPUTS and self.on_output is not None:
            calls.append(Invocation(self.on_output, (event,)))
        elif name == "input_request" and self.input is not None:
            prompt = (event.data["prompt"], event.data["password"])
            calls.append(Invocation(self.input, prompt, answers_input=True))
        return calls


def plan(
    kernel_id: str, code: str, options: ExecuteOptions
) -> tuple[ExecutionCallbacks, Call[str]]:
    """``execute()``'s callbacks, and the call that starts its execution.

    Raises:
        TypeError: an option ``execute()`` does not take.
    """
    unknown = sorted(set(options) - ExecuteOptions.__optional_keys__)
    if unknown:
        raise TypeError(f"execute() got unexpected keyword arguments: {', '.join(unknown)}")
    callbacks = ExecutionCallbacks(
        on_stdout=options.get("on_stdout"),
        on_stderr=options.get("on_stderr"),
        on_output=options.get("on_output"),
        on_event=options.get("on_event"),
        input=options.get("input"),
    )
    start = api.start_execution(
        kernel_id,
        code,
        allow_stdin=callbacks.input is not None,
        stop_on_error=options.get("stop_on_error", True),
        timeout=options.get("timeout"),
    )
    return callbacks, start


def result(kernel_id: str, done: Event) -> ExecutionResult:
    """The result that a ``done`` event carries.

    Raises:
        KernelDied: its status is ``died``.
    """
    outcome = ExecutionResult.from_summary(kernel_id, done.data)
    if outcome.status == "died":
        raise KernelDied(outcome)
    return outcome


def died(kernel_id: str, msg_id: str, summary: ExecutionResult | None) -> KernelDied:
    """The error for a kernel that shut down before the execution's ``done``: with the
    execution's summary if the gateway still had it."""
    if summary is None:
        summary = ExecutionResult(msg_id, kernel_id, "died", reason="kernel_shutdown")
    return KernelDied(summary)
