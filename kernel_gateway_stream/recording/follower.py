"""A follower: a kernel that another node records (see :mod:`..cluster`). Its records come
off the record bus; it reads no IOPub of its own."""

from __future__ import annotations

from typing import Any

__all__ = ["_FOLLOWED"]


class _Followed:
    """The IOPub source of a follower: none (its records come off the record bus)."""

    rejected = replays = invalid = 0
    reachable = True

    def start(self) -> None:
        pass

    def reconnect(self) -> None:
        pass

    def drain(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def acknowledge(self, msg_id: str) -> None:
        pass


_FOLLOWED: Any = _Followed()
