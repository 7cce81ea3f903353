"""Giving freed memory back to the operating system after a burst.

A flood, a replay or a storm of reconnecting clients allocates hundreds of megabytes that
the gateway frees again once it is over. glibc's allocator keeps freed memory in its arenas
(one per thread that allocates), so the process's RSS stays at its peak: measured after a
120,000-message flood, 387 MiB with 113 MiB in use. :class:`HeapTrimmer` calls glibc's
``malloc_trim(0)`` when RSS is ``threshold`` above the lowest it has been after a trim,
at most every ``interval`` seconds, off the event loop (a trim with little to give back
costs little). Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
from collections.abc import Callable

from tornado.ioloop import PeriodicCallback

__all__ = ["HeapTrimmer", "pin_mmap_threshold", "resident_bytes"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """This process's resident set size (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _malloc_trim() -> Callable[[], object] | None:
    with contextlib.suppress(OSError, AttributeError):
        trim = ctypes.CDLL("libc.so.6").malloc_trim
        trim.argtypes = [ctypes.c_size_t]
        return lambda: trim(0)
    return None


#: glibc's mallopt parameter for the size from which allocations are mmap()ed.
_M_MMAP_THRESHOLD = -3


def pin_mmap_threshold(size: int) -> bool:
    """Have glibc serve every allocation of ``size`` bytes or more with its own mmap(), and
    keep it so. By default glibc raises that threshold (up to 32 MiB) each time such a
    block is freed, after which large blocks come from its arenas and stay resident once
    freed: a kernel sending 8 MiB messages then leaves the gateway holding hundreds of
    megabytes that nothing uses (measured: a peak of 539 MiB against 426 MiB pinned, for
    the same flood). False where this is not glibc."""
    with contextlib.suppress(OSError, AttributeError):
        mallopt = ctypes.CDLL("libc.so.6").mallopt
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return bool(mallopt(_M_MMAP_THRESHOLD, size))
    return False


class HeapTrimmer:
    """See the module docstring. ``start()`` once the loop runs; ``stop()`` at shutdown."""

    def __init__(self, interval: float, threshold: int) -> None:
        self.interval = interval
        self.threshold = threshold
        self.trims = 0
        self._trim = _malloc_trim()
        self._floor = resident_bytes()
        self._timer: PeriodicCallback | None = None
        self._running = False

    def start(self) -> None:
        if self._trim is None or self.interval <= 0:
            return
        self._timer = PeriodicCallback(self._check, self.interval * 1000)
        self._timer.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.stop()

    async def _check(self) -> None:
        if self._running or self._trim is None:
            return
        if resident_bytes() - self._floor < self.threshold:
            return
        self._running = True
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._trim)
            self.trims += 1
        finally:
            self._running = False
            self._floor = min(self._floor, resident_bytes())
