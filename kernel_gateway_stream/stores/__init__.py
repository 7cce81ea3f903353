"""Transcript stores: where every IOPub record is kept, durably, by sequence number."""

from .base import TranscriptInfo, TranscriptPage, TranscriptStore
from .sqlite import SQLiteTranscriptStore

__all__ = ["SQLiteTranscriptStore", "TranscriptInfo", "TranscriptPage", "TranscriptStore"]
