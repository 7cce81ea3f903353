"""The Broker contract: the Tap publishes each record once; the broker coalesces and hands
the resulting frames to every attached subscriber without waiting for any of them (DESIGN
invariant 4). Subscribers themselves are in :mod:`.subscriber`.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from typing import TYPE_CHECKING

from traitlets.config import LoggingConfigurable

from ..core.health import ComponentHealth
from ..core.messages import Record

if TYPE_CHECKING:
    from .subscriber import Subscriber

__all__ = ["Broker"]


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
    def attach(self, kernel_id: str, subscriber: Subscriber) -> int:
        """Called by :meth:`Subscriber.start`. Returns the head ``H``: the subscriber
        will be offered every frame whose sequence numbers are all above ``H``, and
        every record up to ``H`` is readable from the store."""

    @abstractmethod
    def cut(self, kernel_id: str) -> int:
        """Send what is pending for ``kernel_id`` now and return the head ``H``: every
        later frame lies wholly above ``H`` (a reader of the store up to ``H`` can then
        apply live frames above it with no overlap). 0 for a kernel not open here."""

    @abstractmethod
    def detach(self, kernel_id: str, subscriber: Subscriber) -> None:
        """Called by :meth:`Subscriber.close`."""

    @abstractmethod
    def close_kernel(self, kernel_id: str) -> None:
        """Called by the Tap when its kernel shuts down: flush what is pending to the
        attached subscribers, and forget the kernel."""

    @abstractmethod
    def health(self) -> ComponentHealth:
        """The broker's state for ``GET /api/gateway/health``."""
