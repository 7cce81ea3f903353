"""Brokers: fan a kernel's IOPub frames out to its subscribers."""

from .base import Broker
from .memory import MemoryBroker
from .subscriber import ReplayLimits, Subscriber, SubscriberRegistry, Transport, TransportClosed

__all__ = [
    "Broker",
    "MemoryBroker",
    "ReplayLimits",
    "Subscriber",
    "SubscriberRegistry",
    "Transport",
    "TransportClosed",
]
