"""The forkserver's wire format (see :mod:`..kernel_forkserver` and
:mod:`..kernels.forkserver`): pure, no I/O.

A request and a reply are one frame each: four bytes of length (big-endian), then that
many bytes of JSON. A kernel's exit status comes on a pipe of its own as four bytes, a
signed big-endian int in :class:`subprocess.Popen`'s convention (``-N`` for a signal).
"""

from __future__ import annotations

import json
import struct
from typing import Any

__all__ = [
    "FORKSERVER_MODULE",
    "LAUNCHER_MODULE",
    "MAX_FRAME",
    "READY",
    "decode_status",
    "encode_frame",
    "encode_status",
    "take_frame",
]

#: The modules a local kernel is started with, and the forkserver that forks them.
LAUNCHER_MODULE = "kernel_gateway_stream.kernel_launcher"
FORKSERVER_MODULE = "kernel_gateway_stream.kernel_forkserver"
#: The byte the forkserver writes once it has imported the kernel's modules.
READY = b"R"
#: A frame longer than this is refused (a kernel's environment is a few KiB).
MAX_FRAME = 16 * 1024 * 1024

_LENGTH = struct.Struct("!I")
_STATUS = struct.Struct("!i")


def encode_frame(value: Any) -> bytes:
    body = json.dumps(value).encode()
    return _LENGTH.pack(len(body)) + body


def take_frame(buffer: bytes) -> tuple[Any, bytes] | None:
    """The first whole frame in ``buffer`` and what follows it, or None if it is not all
    there yet. A length over :data:`MAX_FRAME` is a ValueError."""
    if len(buffer) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack_from(buffer)
    if length > MAX_FRAME:
        raise ValueError(f"a forkserver frame of {length} bytes")
    end = _LENGTH.size + length
    if len(buffer) < end:
        return None
    return json.loads(buffer[_LENGTH.size : end]), buffer[end:]


def encode_status(returncode: int) -> bytes:
    return _STATUS.pack(returncode)


def decode_status(data: bytes) -> int | None:
    """The exit status in ``data``, or None if it is not all there."""
    if len(data) < _STATUS.size:
        return None
    (returncode,) = _STATUS.unpack_from(data)
    return int(returncode)
