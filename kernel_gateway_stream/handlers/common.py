"""Helpers shared by the handlers: the gateway's services and parameter parsing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..broker.base import Broker
from ..core.errors import BadRequest
from ..stores.base import TranscriptStore
from ..tap import TapManager

__all__ = ["SETTINGS_KEY", "Services", "parse_seq"]

SETTINGS_KEY = "kernel_gateway_stream"


@dataclass(frozen=True, slots=True)
class Services:
    """What the application hands its handlers, under ``settings[SETTINGS_KEY]``."""

    store: TranscriptStore
    broker: Broker
    taps: TapManager
    subscriber_options: dict[str, Any]


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
