"""Local kernels forked from a process that has imported ipykernel already.

A kernel the gateway starts with exec spends about 0.6 s of CPU importing ipykernel and
IPython before it runs anything. :class:`ForkServer` starts
:mod:`kernel_gateway_stream.kernel_forkserver` once (it pays that import once) and asks it
for each later kernel: a fork, a few milliseconds. :class:`ForkedProcess` is the handle the
provisioner keeps in place of a :class:`subprocess.Popen`.

A start forks only where the result is the kernel an exec would have started (see
:func:`fork_key`): the command is ``<this interpreter> -m kernel_gateway_stream.kernel_launcher
...``, the kernel is independent of the gateway (it outlives it: jupyter_client then sets no
``JPY_PARENT_PID``, whose parent would be the forkserver), and every variable that Python
or the modules imported ahead read when they start (``PYTHON*``, ``LD_*``, the locale, the
time zone, a few others listed in :data:`READ_AT_IMPORT`) is what the forkserver started
with. Under another ``HOME`` it forks too, unless either home has a user site directory
(Python puts it on ``sys.path`` at start). Any other start execs, as before; so does
every start once a forkserver has failed. One forkserver per such set of variables, at
most :data:`MAX_SERVERS` at once. A forkserver holds the code it imported: once a package
directory on the path changes (``pip install``, see :func:`code_stamp`), the next start
gets a new forkserver.

What differs from an exec: a forked kernel's parent is the forkserver (``pgrep -P`` of the
gateway finds the forkserver, and the kernels under it), its stdin is ``/dev/null`` (an
exec'd kernel's is a pipe nobody writes to), and forked kernels share the forkserver's
hash seed (``PYTHONHASHSEED``; ``random`` reseeds itself after a fork).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import site
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from ..core.forking import (
    FORKSERVER_MODULE,
    LAUNCHER_MODULE,
    READY,
    decode_status,
    encode_frame,
    take_frame,
)

__all__ = [
    "ForkServer",
    "ForkServerUnavailable",
    "ForkedProcess",
    "code_stamp",
    "fork_key",
    "launch",
    "start_environment",
]

#: Variables read when Python starts or when the modules the forkserver imports ahead are
#: imported (jupyter_core, IPython, traitlets): a start whose value differs execs.
READ_AT_IMPORT = (
    "JUPYTER_ALLOW_INSECURE_WRITES",
    "IPYTHON_SUPPRESS_CONFIG_ERRORS",
    "TRAITLETS_APPLICATION_RAISE_CONFIG_FILE_ERROR",
    "LANG",
    "LANGUAGE",
    "LOCPATH",
    "TZ",
    "TZDIR",
    "TMPDIR",
    "GLIBC_TUNABLES",
    "GEVENT_SUPPORT",
    "DISPLAY",
)
READ_AT_IMPORT_PREFIXES = (
    "PYTHON",
    "LD_",
    "LC_",
    "MALLOC_",
    "PYDEVD_",
    "DEBUGPY_",
    "PYZMQ_",
    "TORNADO_",
    "IDE_PROJECT_ROOTS",
    "LIBRARY_ROOTS",
    "PATHS_FROM_ECLIPSE_TO_PYTHON",
)
#: The argument block a forked kernel writes its command line into: a connection file's
#: path and the interpreter's, with room to spare.
COMMAND_LINE_ROOM = 4096
#: Forkservers (one per set of start-up variables) kept at once; the oldest is closed.
MAX_SERVERS = 4
#: How long the forkserver may take to import ipykernel before a start gives up on it.
READY_TIMEOUT = 60.0
#: A forked kernel's exit status when the forkserver did not report it.
UNKNOWN_EXIT = 255
#: Seconds a forked kernel may have ended before the forkserver reports its status.
STATUS_GRACE = 2.0


class ForkServerUnavailable(Exception):
    """The forkserver could not start or answer: the kernel is started with exec."""


class ForkRefused(ForkServerUnavailable):
    """The forkserver could not fork this one start (it says why); it serves the next."""


def fork_key(
    command: list[str], env: Mapping[str, str], independent: bool
) -> tuple[Any, ...] | None:
    """What a forkserver for this start must have started with, or None if this start
    cannot fork (see the module's docstring)."""
    if sys.platform != "linux" or not independent or "JPY_PARENT_PID" in env:
        return None
    if command[:3] != [sys.executable, "-m", LAUNCHER_MODULE]:
        return None
    variables = tuple(
        sorted(
            (name, value)
            for name, value in env.items()
            if name in READ_AT_IMPORT or name.startswith(READ_AT_IMPORT_PREFIXES)
        )
    )
    home = env.get("HOME")
    return (variables, home if _user_site(home) else None)


def start_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What the forkserver starts with: the variables read at start-up, ``HOME`` and
    ``PATH``, nothing else. Its forks replace ``os.environ`` whole, but
    ``/proc/<pid>/environ`` shows the block a process was exec'd with: the forkserver's,
    which then holds nothing of one kernelspec's own variables for another's kernels."""
    return {
        name: value
        for name, value in env.items()
        if name in READ_AT_IMPORT
        or name.startswith(READ_AT_IMPORT_PREFIXES)
        or name in ("HOME", "PATH")
    }


def code_stamp(env: Mapping[str, str]) -> tuple[int, ...]:
    """The modification times of the directories a forkserver imports from (this
    interpreter's ``sys.path`` and the start's ``PYTHONPATH``): installing, upgrading or
    removing a package changes its directory's, and a forkserver started before would
    fork the old code. Not ``sys.path[0]``: the gateway's script directory, or the
    directory it was started in with ``python -m`` (often the notebooks' root, where files
    come and go), is not the forkserver's (it starts in ``/``)."""
    places = [*sys.path[1:], *env.get("PYTHONPATH", "").split(os.pathsep)]
    stamp = []
    for place in places:
        if not place:
            continue
        try:
            stamp.append(os.stat(place).st_mtime_ns)
        except OSError:
            stamp.append(-1)
    return tuple(stamp)


def _user_site(home: str | None) -> bool:
    """True if Python started under ``home`` would put a user site directory on its path."""
    if not home or not site.ENABLE_USER_SITE:
        return False
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return os.path.isdir(os.path.join(home, ".local", "lib", version, "site-packages"))


class ForkedProcess:
    """A kernel the forkserver forked, with what jupyter_client's provisioner asks of a
    :class:`subprocess.Popen`: ``pid``, ``poll``, ``wait``, ``send_signal``, ``terminate``,
    ``kill``, ``returncode``. Signals go through a pidfd where Linux has them, so a pid
    reused after the kernel ended is never signalled by these (jupyter_client signals the
    process group by number, as for an exec'd kernel). Its end is the status the
    forkserver reports; if the forkserver is gone, or has not reported
    :data:`STATUS_GRACE` seconds after the process ended (stopped, or stuck), the end is
    :data:`UNKNOWN_EXIT`."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int, status_fd: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._status_fd: int | None = status_fd
        self._status = b""
        self._pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self._pidfd = os.pidfd_open(pid)
        self._ended_unreported: float | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                self._read_status()
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(left)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        with self._lock:
            if self.returncode is None:
                self._read_status()
            if self.returncode is not None:
                return
            if self._pidfd is not None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, signum)
                return
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read_status(self) -> None:
        if self._status_fd is not None:
            try:
                data = os.read(self._status_fd, 4)
            except BlockingIOError:
                data = None
            if data:
                self._status += data
                returncode = decode_status(self._status)
                if returncode is not None:
                    self._ended(returncode)
                return
            if data == b"":  # the forkserver is gone: ask the process itself
                os.close(self._status_fd)
                self._status_fd = None
        if self._alive():
            return
        if self._status_fd is None:
            self._ended(UNKNOWN_EXIT)
            return
        now = time.monotonic()
        if self._ended_unreported is None:
            self._ended_unreported = now
        elif now - self._ended_unreported > STATUS_GRACE:
            self._ended(UNKNOWN_EXIT)

    def _alive(self) -> bool:
        if self._pidfd is not None:
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)
            return not poller.poll(0)
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def _ended(self, returncode: int) -> None:
        self.returncode = returncode
        for fd in (self._status_fd, self._pidfd):
            if fd is not None:
                os.close(fd)
        self._status_fd = self._pidfd = None

    def __del__(self) -> None:
        for fd in (self._status_fd, self._pidfd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)


class ForkServer:
    """One forkserver process, started with ``env``; :meth:`launch` is thread-safe and
    blocks (the first call while the forkserver imports ipykernel)."""

    def __init__(self, env: Mapping[str, str], stamp: tuple[int, ...]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    FORKSERVER_MODULE,
                    str(theirs.fileno()),
                    "." * COMMAND_LINE_ROOM,
                ],
                env=start_environment(env),
                cwd="/",
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
            )
        except OSError as error:
            ours.close()
            raise ForkServerUnavailable(f"cannot start the forkserver: {error}") from error
        finally:
            theirs.close()
        self.control = ours
        self.stamp = stamp  # :func:`code_stamp` when it started
        self._lock = threading.Lock()
        self._ready = False
        self._buffer = b""
        self.failed = False

    def launch(
        self, argv: list[str], env: Mapping[str, str], cwd: str, stdio: tuple[int, int, int]
    ) -> ForkedProcess:
        with self._lock:
            if self.failed:
                raise ForkServerUnavailable("the forkserver failed before")
            try:
                return self._launch(argv, env, cwd, stdio)
            except ForkRefused:
                raise
            except (OSError, ValueError, ForkServerUnavailable) as error:
                self.failed = True
                self._close()
                if isinstance(error, ForkServerUnavailable):
                    raise
                raise ForkServerUnavailable(f"the forkserver failed: {error}") from error

    def _launch(
        self, argv: list[str], env: Mapping[str, str], cwd: str, stdio: tuple[int, int, int]
    ) -> ForkedProcess:
        if not self._ready:
            self.control.settimeout(READY_TIMEOUT)
            if self.control.recv(1) != READY:
                raise ForkServerUnavailable("the forkserver ended before it was ready")
            self._ready = True
        status_read, status_write = os.pipe()
        try:
            request = encode_frame({"argv": argv, "env": dict(env), "cwd": cwd})
            sent = socket.send_fds(self.control, [request], [*stdio, status_write])
            self.control.sendall(request[sent:])  # a long environment may go in parts
        finally:
            os.close(status_write)
        try:
            reply = self._reply()
        except BaseException:
            os.close(status_read)
            raise
        if "pid" not in reply:
            os.close(status_read)
            raise ForkRefused(f"the forkserver could not fork it: {reply.get('error')}")
        os.set_blocking(status_read, False)
        return ForkedProcess(int(reply["pid"]), status_read, argv)

    def _reply(self) -> dict[str, Any]:
        while (framed := take_frame(self._buffer)) is None:
            data = self.control.recv(1 << 16)
            if not data:
                raise ForkServerUnavailable("the forkserver ended")
            self._buffer += data
        reply, self._buffer = framed
        return dict(reply)

    def close(self) -> None:
        """Let the forkserver go: it exits; the kernels it forked run on. Waits for a
        start in progress."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        self.control.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


_servers: dict[tuple[Any, ...], ForkServer] = {}
_servers_lock = threading.Lock()


def launch(
    key: tuple[Any, ...],
    argv: list[str],
    env: Mapping[str, str],
    cwd: str,
    stdio: tuple[int, int, int],
) -> ForkedProcess:
    """Fork a kernel from the forkserver for ``key`` (:func:`fork_key`), started on first
    use with ``env``. Blocking: call it in a thread. ForkServerUnavailable if it cannot,
    and from then on for that key (a forkserver that failed is not started again: each
    start would pay its import and exec anyway)."""
    evicted = []
    stamp = code_stamp(env)
    with _servers_lock:
        server = _servers.get(key)
        if server is not None and server.stamp != stamp and not server.failed:
            evicted.append(_servers.pop(key))  # its code changed since it started
            server = None
        if server is None:
            if len(_servers) >= MAX_SERVERS:
                evicted.append(_servers.pop(next(iter(_servers))))
            server = _servers[key] = ForkServer(env, stamp)
    for old in evicted:
        old.close()  # outside the lock: it waits for that forkserver to exit
    return server.launch(argv, env, cwd, stdio)
