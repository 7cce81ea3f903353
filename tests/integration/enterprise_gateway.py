"""Enterprise Gateway, a real one, for the upstream tests.

Enterprise Gateway 3.3 pins jupyter_server 1.x and jupyter_client 6, so it runs from a
virtualenv of its own, made from PyPI once and kept outside the working tree: in
``$KGS_ENTERPRISE_GATEWAY_VENV`` if set, else in the user's cache directory
(``~/.cache/kernel_gateway_stream/``). ``python -m tests.integration.enterprise_gateway``
makes it ahead of the tests (``.ci/run`` does); it is made once, under a lock, and a
virtualenv whose install did not finish is made again.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from ..timing import seconds
from .daemon import free_port

VERSION = "3.3.0"
REQUIREMENTS = (f"jupyter-enterprise-gateway=={VERSION}", "ipykernel")


def venv_path() -> Path:
    named = os.environ.get("KGS_ENTERPRISE_GATEWAY_VENV")
    if named:
        return Path(named)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "kernel_gateway_stream" / f"enterprise-gateway-{VERSION}"


def ensure_venv() -> Path:
    """The virtualenv, made if it is not there; raises RuntimeError saying why not."""
    venv = venv_path()
    done = venv / ".installed"
    if done.exists():
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        steps = (
            [sys.executable, "-m", "venv", str(venv)],
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *REQUIREMENTS],
        )
        for step in steps:
            result = subprocess.run(step, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(
                    f"Could not make Enterprise Gateway's virtualenv in {venv} "
                    f"({' '.join(step[-3:])} exited {result.returncode}): "
                    f"{(result.stderr or result.stdout)[-2000:]}"
                )
        done.write_text(VERSION)
    return venv


class EnterpriseGateway:
    """``jupyter enterprisegateway`` from the virtualenv, on its defaults but the token
    (listing off, ``root`` refused), its kernels ipykernel from the same virtualenv."""

    def __init__(self, venv: Path, home: Path, token: str) -> None:
        self.venv = venv
        self.home = home
        self.token = token
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log = home / "enterprise_gateway.log"
        home.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        bin_dir = self.venv / "bin"
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("JUPYTER", "PYTHON", "KERNEL_"))
        }
        env.update(
            # The kernelspec says "python": the virtualenv's, with jupyter_client 6.
            PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            VIRTUAL_ENV=str(self.venv),
            JUPYTER_DATA_DIR=str(self.home / "data"),
            JUPYTER_RUNTIME_DIR=str(self.home / "runtime"),
            JUPYTER_CONFIG_DIR=str(self.home / "config"),
            PYDEVD_DISABLE_FILE_VALIDATION="1",
        )
        argv = [
            str(bin_dir / "jupyter-enterprisegateway"),
            "--ip=127.0.0.1",
            f"--port={self.port}",
            f"--EnterpriseGatewayApp.auth_token={self.token}",
        ]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                argv, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )

    async def wait_ready(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds(60)
        while True:
            assert self.process is not None
            assert self.process.poll() is None, self.log.read_text(errors="replace")
            try:
                await AsyncHTTPClient().fetch(
                    f"{self.url}/api/kernelspecs",
                    headers={"Authorization": f"token {self.token}"},
                )
                return
            except (OSError, HTTPClientError):
                assert loop.time() < deadline, self.log.read_text(errors="replace")
                await asyncio.sleep(0.2)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(seconds(30))
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


if __name__ == "__main__":
    print(ensure_venv())
