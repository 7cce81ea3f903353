"""A process that has imported ipykernel once and forks each local kernel from there.

``python -m kernel_gateway_stream.kernel_forkserver FD PADDING`` is started by the gateway
(:mod:`.kernels.forkserver`), with ``FD`` one end of a socket pair and no other way in: it
has no path on the filesystem, and a kernel it forks closes its copy. A kernel start that
execs Python spends about 0.6 s of CPU importing ipykernel and IPython before it runs any
of its own code; a fork of this process has them already.

It imports :mod:`.kernel_launcher` (ipykernel, IPython, pyzmq), makes itself not dumpable
(code in a kernel, which runs as the same user, can neither trace it nor read its memory,
so it cannot change what the next kernels are forked from), writes :data:`READY`, then
serves one request at a time: a frame ``{"argv", "env", "cwd"}`` (see :mod:`.core.forking`)
with four descriptors passed along (``SCM_RIGHTS``): the kernel's stdin, stdout, stderr,
and the write end of a pipe for its exit status. It forks and answers ``{"pid"}``. The
child, before it runs anything of the kernel:

* is dumpable again, as an exec'd kernel is, starts a session of its own (as
  jupyter_client's launcher does: the kernel's process group is its pid) and resets the
  signal handlers this process set;
* makes the three descriptors its stdio and closes every other one (the socket pair, the
  other kernels' status pipes);
* takes the request's working directory, environment (``os.environ``, replaced whole) and
  arguments (``sys.argv``; ``sys.path[0]`` is the working directory, as under ``python -m``);
* writes the request's command into its argument block, so that ``ps`` and
  ``/proc/<pid>/cmdline`` show ``python -m kernel_gateway_stream.kernel_launcher -f
  <connection file>`` as for a kernel started with exec (the gateway finds the kernels it
  started by that, after a restart). The block is the one this process was started with,
  and ``PADDING`` makes it long enough;
* returns from the loop to this module's top level and runs the launcher there as
  ``__main__`` (``runpy``, as ``python -m`` does), so that the interpreter ends as it
  would after an exec (``atexit``, threads).

Python's ``random`` reseeds itself in a forked child. Hash randomization does not: forked
kernels share this process's ``PYTHONHASHSEED``. Which starts may fork, and which exec as
before, is the gateway's to decide (:mod:`.kernels.forkserver`).

It reaps the kernels it forked and writes each one's exit status to its pipe. When the
socket pair closes (the gateway stopped, or was killed) it exits; the kernels run on, as
kernels started with exec outlive the gateway.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import runpy
import select
import signal
import socket
import sys
import traceback
from typing import Any, NamedTuple

from .core.forking import LAUNCHER_MODULE, READY, encode_frame, encode_status, take_frame

__all__ = ["LAUNCHER_MODULE", "main", "serve", "set_command_line"]

_PR_SET_DUMPABLE = 4
#: The descriptors a request passes: stdin, stdout, stderr, the exit status pipe.
DESCRIPTORS = 4


class Launch(NamedTuple):
    """What a forked child runs once it is back at the top level."""

    argv: list[str]


def serve(control_fd: int) -> Launch | None:
    """Serve requests on ``control_fd`` until it closes (None); in a forked child, the
    launch it is to run."""
    # Kernels run as this user: none may trace what forks the next ones. Before anything
    # else: the interpreter's own start (a few tens of ms) is the only window left.
    _set_dumpable(False)
    # The collector walked what the import builds over and over while it ran (about a fifth
    # of its CPU): off for the import, then what it built is frozen out of every later
    # collection, here and in each kernel forked from here, which keeps it all its life.
    gc.disable()
    import kernel_gateway_stream.kernel_launcher  # noqa: F401  what every kernel imports

    gc.freeze()
    gc.enable()

    control = socket.socket(fileno=control_fd)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the gateway's terminal
    statuses: dict[int, int] = {}  # pid -> write end of its status pipe
    buffer = b""
    descriptors: list[int] = []
    control.sendall(READY)
    while True:
        readable, _, _ = select.select([control.fileno(), wake_read], [], [])
        if wake_read in readable:
            while True:
                try:
                    if not os.read(wake_read, 512):
                        break
                except BlockingIOError:
                    break
            _reap(statuses)
        if control.fileno() not in readable:
            continue
        try:
            data, received, _flags, _address = socket.recv_fds(control, 1 << 16, DESCRIPTORS)
        except OSError:
            data, received = b"", []
        descriptors.extend(received)
        if not data:
            return None  # the gateway is gone: its kernels run on
        buffer += data
        while (framed := take_frame(buffer)) is not None:
            request, buffer = framed
            stdio, descriptors = descriptors[:DESCRIPTORS], descriptors[DESCRIPTORS:]
            if len(stdio) != DESCRIPTORS:
                for fd in stdio:
                    os.close(fd)
                control.sendall(encode_frame({"error": "descriptors missing"}))
                continue
            try:
                pid = os.fork()
            except OSError as error:
                for fd in stdio:
                    os.close(fd)
                control.sendall(encode_frame({"error": str(error)}))
                continue
            if pid == 0:
                try:
                    return _become_kernel(request, stdio, control)
                except BaseException:  # never back into the loop: this is not the server
                    traceback.print_exc()
                    os._exit(1)
            for fd in stdio[:3]:
                os.close(fd)
            statuses[pid] = stdio[3]
            control.sendall(encode_frame({"pid": pid}))


def _reap(statuses: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = statuses.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):  # the gateway let go of the kernel
                os.write(fd, encode_status(os.waitstatus_to_exitcode(status)))
            os.close(fd)


def _become_kernel(request: dict[str, Any], stdio: list[int], control: socket.socket) -> Launch:
    _set_dumpable(True)  # as an exec'd kernel is: its user may debug it
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setsid()
    for target, fd in enumerate(stdio[:3]):
        os.dup2(fd, target)
    control.close()
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the wake-up pipe, other kernels' pipes
    cwd = request["cwd"]
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(request["env"])
    argv: list[str] = request["argv"]
    sys.path[0] = os.getcwd()
    set_command_line(argv)
    return Launch(argv)


def _set_dumpable(dumpable: bool) -> None:
    """Linux's ``PR_SET_DUMPABLE``: a process that is not dumpable cannot be traced, nor
    its memory read, by other processes of its user. A fork inherits it."""
    if sys.platform != "linux":
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, int(dumpable), 0, 0, 0)


def set_command_line(argv: list[str]) -> bool:
    """Show ``argv`` as this process's command line (``/proc/self/cmdline``, ``ps``), as
    setproctitle does: the words, spaced, over the argument block the process was started
    with, ended before the block's last byte (which is then not a NUL: Linux then reads the
    block as a title, up to its first NUL). Cut to the block's length. Linux only; True if
    it was written."""
    if sys.platform != "linux":
        return False
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])
    except (OSError, ValueError, IndexError):
        return False
    size = end - start
    if size < 2:
        return False
    title = b" ".join(os.fsencode(word) for word in argv)[: size - 2]
    block = title + b"\0" + b" " * (size - len(title) - 1)
    ctypes.memmove(start, block, size)
    return True


def main() -> None:
    launch = serve(int(sys.argv[1]))
    if launch is None:
        return
    sys.argv = [launch.argv[0], *launch.argv[3:]]
    # Run as ``python -m`` runs it: once, as __main__ (imported ahead under its own name,
    # runpy would warn and leave a second copy of it).
    sys.modules.pop(LAUNCHER_MODULE, None)
    runpy.run_module(LAUNCHER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
