"""Brokers: fan a kernel's IOPub frames out to its subscribers.

Imported by the recording (which publishes to the broker), the handlers (whose clients
subscribe) and the application; imports nothing of the package but :mod:`..core`: no
store (a subscriber replays from a :class:`TranscriptReader`), no kind of kernel.
"""

from .base import Broker
from .memory import MemoryBroker
from .subscriber import (
    ReplayLimits,
    Subscriber,
    SubscriberRegistry,
    TranscriptReader,
    Transport,
    TransportClosed,
)

__all__ = [
    "Broker",
    "MemoryBroker",
    "ReplayLimits",
    "Subscriber",
    "SubscriberRegistry",
    "TranscriptReader",
    "Transport",
    "TransportClosed",
]
