"""The last root step of a kernel in its own network namespace: expose, drop, exec.

:class:`~.netns.NetnsProvisioner` runs, for each kernel::

    ip netns exec <namespace> python -I -S netns_enter.py --uid U --gid G --setpriv PATH \\
        [--expose DIR ...] -- <kernel argv>

By path, with ``-I -S``: it imports nothing of the package (importing the package takes
seconds; this runs at every kernel start) and only the standard library. Still root and
in the kernel's namespace, it

1. makes a mount namespace of its own (``ip netns exec`` made one already; this one keeps
   the host's mounts safe if it is ever run otherwise), whose mounts do not propagate back;
2. exposes each ``--expose`` directory that the kernel's user could not reach because an
   ancestor denies it search permission (a Python installed under ``/root``): that
   ancestor is covered by an empty tmpfs holding only read-only binds of those
   directories, at their own paths. Elsewhere the kernel sees the host's files with its
   own user's permissions;
3. sets the umask to 077 (what the kernel writes, in ``/tmp`` too, is its own);
4. *execs* ``setpriv``, which clears the supplementary groups, switches to ``U``/``G``,
   empties the bounding, inheritable and ambient capability sets, sets no_new_privs and
   execs the kernel. Each step execs the next: the provisioner's process is the kernel.

Every failure ends it with status 126 and a one-line reason on stderr.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import stat
import sys
from collections.abc import Sequence

_CLONE_NEWNS = 0x00020000
_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_REMOUNT = 0x20
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_SLAVE = 0x80000
_FAILED = 126


class EnterError(Exception):
    """A step failed; the message is its one-line reason."""


def blocking_ancestor(path: str, uid: int, gid: int) -> str | None:
    """The first directory on the way from ``/`` to ``path`` (excluded) that user
    ``uid``, in group ``gid`` and no other, may not search; None if it may search all.

    Judged by the mode bits (ACLs are not read): an ACL that grants search only makes an
    exposure that was not needed.
    """
    parts = os.path.normpath(path).split(os.sep)[1:]
    current = os.sep
    for part in parts[:-1]:
        current = os.path.join(current, part)
        info = os.stat(current)
        if info.st_uid == uid:
            searchable = info.st_mode & stat.S_IXUSR
        elif info.st_gid == gid:
            searchable = info.st_mode & stat.S_IXGRP
        else:
            searchable = info.st_mode & stat.S_IXOTH
        if not searchable:
            return current
    return None


def _libc() -> ctypes.CDLL:
    # The interpreter's own symbols include libc's (find_library would run ldconfig).
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise EnterError(f"{what}: {os.strerror(error)}")


def _mount(
    libc: ctypes.CDLL,
    source: str | None,
    target: str,
    kind: str | None,
    flags: int,
    data: str | None = None,
) -> None:
    def encode(text: str | None) -> bytes | None:
        return None if text is None else os.fsencode(text)

    _check(
        libc.mount(
            encode(source), encode(target), encode(kind), ctypes.c_ulong(flags), encode(data)
        ),
        f"mount {source or ''} {target}",
    )


def expose(directories: Sequence[str], uid: int, gid: int) -> list[str]:
    """Expose ``directories`` to ``uid``/``gid`` in a mount namespace of this process's
    own (see the module docstring); the directories that needed it."""
    blocked: dict[str, list[str]] = {}
    for directory in directories:
        directory = os.path.realpath(directory)
        if not os.path.isdir(directory):
            continue  # nothing to expose (a prefix configured for another host)
        ancestor = blocking_ancestor(directory, uid, gid)
        if ancestor is not None:
            blocked.setdefault(ancestor, []).append(directory)
    libc = _libc()
    _check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(libc, None, "/", None, _MS_REC | _MS_SLAVE)
    if not blocked:
        return []
    # Opened before their ancestors are covered: bound from these descriptors afterwards.
    handles = {
        directory: os.open(directory, os.O_PATH | os.O_DIRECTORY)
        for directories_under in blocked.values()
        for directory in directories_under
    }
    for ancestor in sorted(blocked):
        _mount(libc, "tmpfs", ancestor, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
        for directory in sorted(blocked[ancestor]):
            os.makedirs(directory, mode=0o755, exist_ok=True)
            source = f"/proc/self/fd/{handles[directory]}"
            _mount(libc, source, directory, None, _MS_BIND | _MS_REC)
            _mount(
                libc,
                None,
                directory,
                None,
                _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV,
            )
    for handle in handles.values():
        os.close(handle)
    return [directory for directories_under in blocked.values() for directory in directories_under]


def setpriv_argv(setpriv: str, uid: int, gid: int, argv: Sequence[str]) -> list[str]:
    """``setpriv``'s command line that runs ``argv`` as ``uid``/``gid`` with no groups,
    no capabilities in any set, and no_new_privs."""
    return [
        setpriv,
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
        *argv,
    ]


def main(arguments: Sequence[str] | None = None) -> int:
    """Expose, drop and exec (it returns only on failure: 126)."""
    parser = argparse.ArgumentParser(prog="netns_enter.py")
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--gid", type=int, required=True)
    parser.add_argument("--setpriv", required=True)
    parser.add_argument("--expose", action="append", default=[])
    parser.add_argument("argv", nargs="+")
    options = parser.parse_args(arguments)
    if options.uid <= 0 or options.gid <= 0:
        print("netns_enter: refusing to run a kernel as uid or gid 0", file=sys.stderr)
        return _FAILED
    try:
        expose(options.expose, options.uid, options.gid)
        os.umask(0o077)
        command = setpriv_argv(options.setpriv, options.uid, options.gid, options.argv)
        os.execv(command[0], command)
    except (EnterError, OSError) as error:
        print(f"netns_enter: {error}", file=sys.stderr)
    return _FAILED


if __name__ == "__main__":
    sys.exit(main())
