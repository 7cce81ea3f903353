"""Tornado handlers: the channels WebSocket, SSE, the transcript, the execute API, health.

Every surface finds its kernel through one lookup, :meth:`.common.Services.locate`.
Imported by the application and the metrics alone; imports the layers below it.
"""

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
