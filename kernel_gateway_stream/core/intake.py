"""What a kernel may put into a transcript: one rule for every IOPub source. Pure.

A kernel runs code the gateway does not control, and that code can publish anything on
its IOPub channel (with the kernel's key, or through an upstream server that relays what
the kernel sends). Some messages only the gateway writes, because readers act on them:

* its marks (every ``kernel_gateway_stream_*`` message type: gap records, lifecycle
  notes, cell requests), which fake gaps in ``/cells`` or hide output;
* a kernel's ``status`` of ``restarting`` or ``dead``, which ends every execution running
  and marks the kernel gone.

:func:`check` refuses those. The one exception is the spool notice of the gateway's own
launcher (:data:`..marks.SPOOL_MSG_TYPE`), which a ZMQ source reads and does not record;
through an upstream it is refused like the rest. Sources call :func:`check` before they
hand a message to the Tap; what they refuse they count and log.
"""

from __future__ import annotations

from dataclasses import dataclass

from .marks import LIFECYCLE_STATES, REPLAY_MSG_TYPE, SPOOL_MSG_TYPE
from .messages import KernelMessage

__all__ = ["Accept", "Refuse", "Verdict", "check"]

GATEWAY_PREFIX = "kernel_gateway_stream"


@dataclass(frozen=True, slots=True)
class Accept:
    """The message may be recorded."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """The message is the gateway's to write: ``reason`` says which kind it forges."""

    reason: str


Verdict = Accept | Refuse
ACCEPT = Accept()


def check(message: KernelMessage, *, allow_spool: bool = False) -> Verdict:
    """Whether ``message``, from a kernel, may be recorded as the kernel's. With
    ``allow_spool`` (a ZMQ source of a kernel the gateway's launcher started), the
    launcher's spool notice and replay wrapper pass (what a wrapper holds is checked on
    its own)."""
    msg_type = message.msg_type
    if msg_type.startswith(GATEWAY_PREFIX):
        if allow_spool and msg_type in (SPOOL_MSG_TYPE, REPLAY_MSG_TYPE):
            return ACCEPT
        return Refuse(f"a message only the gateway writes ({msg_type[:80]})")
    if msg_type == "status" and message.execution_state in LIFECYCLE_STATES:
        return Refuse(f"a kernel status only the gateway writes ({message.execution_state})")
    return ACCEPT
