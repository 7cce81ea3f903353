"""How a client's stream ends, and what it is told.

Every stream the gateway ends on purpose ends with a reason and the last sequence number
the client was sent, so it can resume exactly (``?since=`` / ``Last-Event-ID``):

==================  =====  ================================================================
reason              close  when
==================  =====  ================================================================
slow_consumer       4008   the client fell behind past its limit (DESIGN invariant 3)
kernel_shutdown     1001   the kernel shut down (after what was queued for the client)
gateway_shutdown    1001   the gateway is stopping (SIGTERM, SIGINT); it may come back
lease_lost          1012   this node stopped recording the kernel (its lease ran out or was
                           taken): resume on any node, this one included
malformed_message   1007   the client sent a frame that is not a message (no last_seq)
server_error        1011   the gateway failed to serve the client (a bug); resume elsewhere
==================  =====  ================================================================

A WebSocket gets the close code and a JSON close reason (RFC 6455 section 7.4: codes
4000-4999 are the application's); an SSE stream gets a last event named after the
reason, whose data is the same JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .wire import close_reason, encode_sse

__all__ = [
    "CLOSE_GOING_AWAY",
    "CLOSE_MALFORMED",
    "CLOSE_SERVER_ERROR",
    "CLOSE_SERVICE_RESTART",
    "CLOSE_SLOW",
    "Ending",
    "gateway_shutdown",
    "kernel_shutdown",
    "lease_lost",
    "malformed",
    "server_error",
    "slow_consumer",
]

CLOSE_GOING_AWAY = 1001
CLOSE_MALFORMED = 1007
CLOSE_SERVER_ERROR = 1011
#: RFC 6455's registry: "Service Restart" (JupyterLab reconnects after it).
CLOSE_SERVICE_RESTART = 1012
CLOSE_SLOW = 4008


@dataclass(frozen=True, slots=True)
class Ending:
    """Why a stream ends (``reason``), where to resume (``last_seq``), and the WebSocket
    close ``code``."""

    reason: str
    last_seq: int | None
    code: int
    message: str | None = None

    def close_reason(self) -> str:
        """The JSON close reason, cut to fit a WebSocket close frame."""
        fields: dict[str, str | int | None] = {}
        if self.last_seq is not None:
            fields["last_seq"] = self.last_seq
        if self.message is not None:
            fields["message"] = self.message
        return close_reason(self.reason, **fields)

    def sse_event(self) -> bytes:
        """The last event of an SSE stream."""
        data: dict[str, str | int | None] = {"reason": self.reason, "last_seq": self.last_seq}
        if self.message is not None:
            data["message"] = self.message
        return encode_sse(self.reason, None, json.dumps(data).encode())


def slow_consumer(last_seq: int, message: str | None = None) -> Ending:
    return Ending("slow_consumer", last_seq, CLOSE_SLOW, message)


def kernel_shutdown(last_seq: int) -> Ending:
    return Ending("kernel_shutdown", last_seq, CLOSE_GOING_AWAY)


def gateway_shutdown(last_seq: int) -> Ending:
    return Ending("gateway_shutdown", last_seq, CLOSE_GOING_AWAY)


def lease_lost(last_seq: int) -> Ending:
    return Ending("lease_lost", last_seq, CLOSE_SERVICE_RESTART)


def malformed(message: str) -> Ending:
    return Ending("malformed_message", None, CLOSE_MALFORMED, message)


def server_error(last_seq: int, message: str) -> Ending:
    return Ending("server_error", last_seq, CLOSE_SERVER_ERROR, message[:100])
