"""One writer per store: an exclusive lock beside an embedded transcript store.

Two processes on one SQLite store damage each other silently (each numbers the other's
kernels again, writes false gaps, re-attaches and shuts down kernels it does not own).
So the first process to open a store takes ``fcntl.flock(LOCK_EX)`` on ``<store>.lock``,
and holds it until it closes the store (the kernel releases it when the process ends,
however it ends: no stale lock after a crash); the file holds its PID, for the message a
second process prints when it refuses.

The lock is the process's, not a store object's: tests and restarts in one process
reopen the same store, and a process never locks itself out. It is counted: the last
store of the process to close the store lets it go (a process that ends lets it go too).
Several nodes on Redis do not use this (each holds its kernels' leases there).
"""

from __future__ import annotations

import fcntl
import os
import threading

from ..core.errors import StoreInUse, StoreUnavailable

__all__ = ["StoreLock", "hold_store_lock", "lock_path"]

#: Lock files this process holds, by real path: their descriptors (closing one releases
#: the lock) and how many open stores hold each.
_HELD: dict[str, list[int]] = {}
_GUARD = threading.Lock()


def lock_path(store_path: str) -> str:
    """The lock file of the store at ``store_path``."""
    return os.path.abspath(store_path) + ".lock"


class StoreLock:
    """One store's hold on the lock; :meth:`release` (idempotent) when the store closes."""

    def __init__(self, key: str) -> None:
        self._key: str | None = key

    def release(self) -> None:
        """The last hold of the process releases the lock."""
        key, self._key = self._key, None
        if key is None:
            return
        with _GUARD:
            held = _HELD.get(key)
            if held is None:
                return
            held[1] -= 1
            if held[1] <= 0:
                del _HELD[key]
                os.close(held[0])


def hold_store_lock(store_path: str) -> StoreLock:
    """Take the store's lock, or refuse. Returns this store's hold on it.

    Called by the store's ``open()`` before it reads or writes anything.

    Raises:
        StoreInUse: another process holds the lock (the message names its PID and the
            option that gives this one a store of its own).
        StoreUnavailable: the lock file cannot be created.
    """
    path = lock_path(store_path)
    key = os.path.realpath(path)
    with _GUARD:
        if key in _HELD:
            _HELD[key][1] += 1
            return StoreLock(key)
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as error:
            raise StoreUnavailable(f"cannot open {path}: {error.strerror}") from error
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as error:
            holder = _read_pid(descriptor)
            os.close(descriptor)
            raise StoreInUse(
                f"the transcript store {store_path} is in use by process {holder} (one "
                "gateway per store): stop it, or give this one a store of its own with "
                "--SQLiteTranscriptStore.path=..."
            ) from error
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        _HELD[key] = [descriptor, 1]
        return StoreLock(key)


def _read_pid(descriptor: int) -> str:
    """The holder's PID as it wrote it, or "unknown" (it may not have written it yet)."""
    try:
        text = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isascii() and text.isdigit() else "unknown"
