"""Helpers shared by the handlers: the gateway's services and parameter parsing."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from tornado import web

from ..broker.base import Broker
from ..core.errors import BadRequest, LocalError
from ..core.frames import Frame, SharedMerges
from ..core.messages import KernelMessage
from ..core.subscription import SubscriberQueue
from ..stores.base import TranscriptStore
from ..tap import TapManager

__all__ = [
    "SETTINGS_KEY",
    "Services",
    "ServicesMixin",
    "discarded_notice",
    "parse_msg_types",
    "parse_seq",
]

SETTINGS_KEY = "kernel_gateway_stream"


@dataclass(frozen=True, slots=True)
class Services:
    """What the application hands its handlers, under ``settings[SETTINGS_KEY]``."""

    store: TranscriptStore
    broker: Broker
    taps: TapManager
    subscriber_options: dict[str, Any]
    #: Seconds between SSE keep-alive comments.
    sse_heartbeat: float = 15.0
    #: Merges of queued frames, shared by the subscribers that are behind together.
    merges: SharedMerges = field(default_factory=SharedMerges)

    def new_queue(
        self,
        since: int,
        *,
        parent: str | None = None,
        msg_types: frozenset[str] | None = None,
    ) -> SubscriberQueue:
        """A subscriber queue with the configured limits (``subscriber_options``)."""
        options = self.subscriber_options
        return SubscriberQueue(
            since=since,
            max_bytes=options["max_bytes"],
            max_lag=options["max_lag"],
            merge_max_bytes=options["merge_max_bytes"],
            merges=self.merges,
            parent=parent,
            msg_types=msg_types,
        )


class ServicesMixin:
    """For handlers: the gateway's services, and the JSON answer to a caller's error."""

    #: jupyter_server's authorizer guards every handler of ours as the kernels resource.
    auth_resource = "kernels"
    settings: dict[str, Any]

    @property
    def services(self) -> Services:
        services: Services = self.settings[SETTINGS_KEY]
        return services

    def write_error_json(self, error: LocalError) -> None:
        """Finish the request with ``error``'s status and ``{"reason", "message"}``."""
        handler: Any = self
        handler.set_status(error.status)
        handler.finish(json.dumps(error.to_json()))


def parse_seq(name: str, value: str | None) -> int | None:
    """A sequence-number parameter: a non-negative integer, or None when absent.

    Raises:
        BadRequest: anything else.
    """
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        raise BadRequest(f"{name} must be a non-negative integer, got {value!r}") from None
    if number < 0:
        raise BadRequest(f"{name} must be a non-negative integer, got {value!r}")
    return number


def discarded_notice(first_seq: int, last_seq: int, session: str) -> Frame:
    """The IOPub message that tells a reader retention already discarded what it asked for."""
    message = KernelMessage.synthesize(
        "kernel_gateway_stream_discarded",
        {"first_seq": first_seq, "last_seq": last_seq, "reason": "retention"},
        msg_id=f"discarded-{first_seq}-{last_seq}",
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        session=session,
    )
    return Frame.reply("iopub", message)


def parse_msg_types(values: list[str]) -> frozenset[str] | None:
    """``msg_type`` parameters, repeated or comma-separated; None when absent."""
    names = {name.strip() for value in values for name in value.split(",") if name.strip()}
    return frozenset(names) or None


def no_delay(handler: web.RequestHandler) -> None:
    """Turn Nagle's algorithm off for a streaming response: the broker already merges what
    should be merged, and a small event held for the peer's delayed ACK waits ~40 ms."""
    stream = getattr(handler.request.connection, "stream", None)
    if stream is not None:
        stream.set_nodelay(True)
