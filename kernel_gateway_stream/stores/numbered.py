"""What a SIGKILL cannot hide: each kernel's last numbered seq, in a shared file mapping.

After an unclean stop the store knows a kernel's durable head and its reservation, not
how many numbers were actually given out past the head: the reservation runs far ahead
(``reserve_ahead``), so "seqs 69-100068 were given out but not kept" overstates a loss of
one record. Each number given out is written into a memory-mapped file (a store to
memory, no system call); a killed process's pages stay in the page cache, so the next
start reads the last number each kernel was given. (A power loss can lose the file too:
then the count is unknown and the log says so.)

The file holds :data:`SLOTS` slots of 16 bytes of kernel id (a UUID) and 8 of seq; a
kernel whose id is not a UUID, or that finds no free slot, is not counted. One process
owns the file: the store's lock (:mod:`.lock`) is taken first.
"""

from __future__ import annotations

import mmap
import os
import struct
import uuid

__all__ = ["NumberedMarks"]

SLOTS = 4096
_SLOT = 24
_SEQ = struct.Struct("<q")
_EMPTY = bytes(16)


class NumberedMarks:
    """The file at ``path``: what the last run left (:attr:`found`), then this run's."""

    def __init__(self, path: str) -> None:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(descriptor, SLOTS * _SLOT)
            self._map = mmap.mmap(descriptor, SLOTS * _SLOT)
        finally:
            os.close(descriptor)
        #: kernel id -> the last seq the previous run gave out (its file, before this run's).
        self.found: dict[str, int] = self._read()
        self._map[:] = bytes(SLOTS * _SLOT)
        self._slots: dict[str, int] = {}

    def _read(self) -> dict[str, int]:
        found = {}
        for offset in range(0, SLOTS * _SLOT, _SLOT):
            key = self._map[offset : offset + 16]
            if key != _EMPTY:
                found[str(uuid.UUID(bytes=bytes(key)))] = _SEQ.unpack_from(self._map, offset + 16)[
                    0
                ]
        return found

    def note(self, kernel_id: str, seq: int) -> None:
        """``seq`` was given out for ``kernel_id``. Called for every record appended."""
        offset = self._slots.get(kernel_id)
        if offset is None:
            offset = self._claim(kernel_id)
            if offset is None:
                return
        _SEQ.pack_into(self._map, offset + 16, seq)

    def forget(self, kernel_id: str) -> None:
        """The kernel's transcript ended: its slot is free again."""
        offset = self._slots.pop(kernel_id, None)
        if offset is not None:
            self._map[offset : offset + _SLOT] = bytes(_SLOT)

    def _claim(self, kernel_id: str) -> int | None:
        try:
            key = uuid.UUID(kernel_id).bytes
        except ValueError:
            return None
        start = int.from_bytes(key[:4], "little") % SLOTS
        for probe in range(SLOTS):
            offset = ((start + probe) % SLOTS) * _SLOT
            if self._map[offset : offset + 16] == _EMPTY:
                _SEQ.pack_into(self._map, offset + 16, 0)
                self._map[offset : offset + 16] = key
                self._slots[kernel_id] = offset
                return offset
        return None

    def close(self) -> None:
        self._map.close()
