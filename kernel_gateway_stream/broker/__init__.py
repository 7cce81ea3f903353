"""Brokers: fan a kernel's IOPub frames out to its subscribers."""

from .base import Broker, Subscriber, Transport, TransportClosed
from .memory import MemoryBroker

__all__ = ["Broker", "MemoryBroker", "Subscriber", "Transport", "TransportClosed"]
