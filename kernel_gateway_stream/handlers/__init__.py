"""Tornado handlers: the channels WebSocket, SSE, the transcript, the execute API, health."""

from .channels import ChannelsHandler, StreamChannelsConnection
from .health import HealthHandler
from .stream import StreamHandler
from .transcript import TranscriptHandler

__all__ = [
    "ChannelsHandler",
    "HealthHandler",
    "StreamChannelsConnection",
    "StreamHandler",
    "TranscriptHandler",
]
