"""A redis-server of a test's own, on a free port, keeping nothing on disk (so that a
restart on the same port comes back empty), optionally asking for a password. For the tests
that must not touch the shared Redis: fault injection, authentication."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from ..timing import seconds
from .daemon import free_port
from .waits import wait_until

__all__ = ["RedisServer", "require_redis_server"]


def require_redis_server() -> None:
    """Fail under CI, skip elsewhere, when redis-server is not installed."""
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed: CI must run the Redis tests")
        pytest.skip("redis-server is not installed")


class RedisServer:
    """See the module docstring. :meth:`start` it (again, after :meth:`kill`: empty)."""

    def __init__(self, root: Path, password: str | None = None) -> None:
        self.root = root
        self.password = password
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        root.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        config = self.root / "redis.conf"
        text = f'port {self.port}\nbind 127.0.0.1\nsave ""\nappendonly no\ndir {self.root}\n'
        if self.password is not None:
            text += f"requirepass {self.password}\n"
        config.write_text(text)
        config.chmod(0o600)
        with open(self.root / "redis.log", "ab") as log:
            self.process = subprocess.Popen(
                ["redis-server", str(config)], stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )

    async def wait_ready(self) -> None:
        import redis

        def answers() -> bool:
            assert self.process is not None
            assert self.process.poll() is None, "redis-server exited"
            client = redis.Redis(port=self.port, password=self.password, socket_timeout=1)
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False
            finally:
                client.close()

        await wait_until(answers, "the test's redis-server")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(seconds(10))
            except subprocess.TimeoutExpired:
                self.kill()
