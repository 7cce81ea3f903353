"""Tornado handlers: the channels WebSocket and the transcript REST API."""

from .channels import ChannelsHandler, StreamChannelsConnection
from .stream import StreamHandler
from .transcript import TranscriptHandler

__all__ = ["ChannelsHandler", "StreamChannelsConnection", "StreamHandler", "TranscriptHandler"]
