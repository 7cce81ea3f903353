"""Helpers shared by the handlers: the gateway's services and parameter parsing."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..broker.base import Broker
from ..core.errors import BadRequest
from ..core.frames import Frame
from ..core.messages import KernelMessage
from ..stores.base import TranscriptStore
from ..tap import TapManager

__all__ = ["SETTINGS_KEY", "Services", "discarded_notice", "parse_msg_types", "parse_seq"]

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
