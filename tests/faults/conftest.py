"""Fixtures of the fault tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ..integration.redis_server import RedisServer, require_redis_server


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own (never the shared one): a restart on the same port
    comes back empty."""
    require_redis_server()
    instance = RedisServer(tmp_path / "redis")
    instance.start()
    yield instance
    instance.stop()
