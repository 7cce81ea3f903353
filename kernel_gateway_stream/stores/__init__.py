"""Transcript stores: where every IOPub record is kept, durably, by sequence number.

Imported by the recording (the one writer), the cluster node (its leases append through
the Redis store), the executions, the handlers, the metrics and the application; imports
nothing of the package but :mod:`..core`.
"""

from .base import TranscriptInfo, TranscriptPage, TranscriptStore
from .sqlite import SQLiteTranscriptStore

__all__ = ["SQLiteTranscriptStore", "TranscriptInfo", "TranscriptPage", "TranscriptStore"]
