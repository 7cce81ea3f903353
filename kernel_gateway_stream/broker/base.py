"""The Broker contract: the recorder publishes each record once; the broker coalesces and hands
the resulting frames to every attached subscriber without waiting for any of them (DESIGN
invariant 4). What a broker needs of a subscriber is :class:`FrameSink`; the subscriber
every client connection is served by is in :mod:`.subscriber`, which builds on this module
(never the other way round).
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from typing import Protocol

from traitlets.config import LoggingConfigurable

from ..core.frames import Frame
from ..core.health import ComponentHealth
from ..core.messages import Record

__all__ = ["Broker", "FrameSink"]


class FrameSink(Protocol):
    """What a broker hands frames to: one client's subscriber (see
    :class:`.subscriber.Subscriber`). Hashable: a broker keys its sinks by themselves."""

    def offer(self, frame: Frame, now: float) -> None:
        """Called on the event loop for every live frame, in order; never waits. May raise:
        the broker then closes this sink alone and goes on with the others."""

    def close(self) -> None:
        """Called by the broker when :meth:`offer` raised."""


class _BrokerMeta(ABCMeta, type(LoggingConfigurable)):  # type: ignore[misc]
    pass


class Broker(LoggingConfigurable, metaclass=_BrokerMeta):  # type: ignore[metaclass]
    """Fans each kernel's records out to subscribers as coalesced, shared frames.

    The application creates one broker (``GatewayStreamApp.broker_class``). All methods
    are called on the event loop.
    """

    @abstractmethod
    def open_kernel(self, kernel_id: str, head: int) -> None:
        """Called by the Tap when it starts, with the transcript head it numbers from."""

    @abstractmethod
    def publish(self, record: Record) -> None:
        """Called by the Tap for every record, in order, after the store has it."""

    @abstractmethod
    def head(self, kernel_id: str) -> int:
        """The last sequence number published (or opened at) for ``kernel_id``; 0 if none."""

    @abstractmethod
    def attach(self, kernel_id: str, subscriber: FrameSink) -> int:
        """Called by :meth:`.subscriber.Subscriber.start`. Returns the head ``H``: the subscriber
        will be offered every frame whose sequence numbers are all above ``H``, and
        every record up to ``H`` is readable from the store."""

    @abstractmethod
    def cut(self, kernel_id: str) -> int:
        """Send what is pending for ``kernel_id`` now and return the head ``H``: every
        later frame lies wholly above ``H`` (a reader of the store up to ``H`` can then
        apply live frames above it with no overlap). 0 for a kernel not open here."""

    @abstractmethod
    def detach(self, kernel_id: str, subscriber: FrameSink) -> None:
        """Called by :meth:`.subscriber.Subscriber.close`."""

    @abstractmethod
    def close_kernel(self, kernel_id: str) -> None:
        """Called by the Tap when its kernel shuts down: flush what is pending to the
        attached subscribers, and forget the kernel."""

    @abstractmethod
    def health(self) -> ComponentHealth:
        """The broker's state for ``GET /api/gateway/health``."""
