"""Keeping the gateway's secrets from its kernels and out of its logs.

Code in a kernel is untrusted. What the gateway does so that a kernel does not find its
token (DESIGN, "Trust"):

* the variables that hold secrets (``JUPYTER_TOKEN`` and those the operator lists) and
  any variable holding the token under another name are removed from the gateway's
  environment before any kernel starts, so kernels do not inherit them, and filtered
  again from each kernel's launch environment (a kernelspec may template them in:
  :class:`~.kernels.StreamKernelManager`);
* their values are overwritten in the process's initial environment block, which
  ``/proc/<pid>/environ`` shows whatever ``os.environ`` became since (Linux);
* the daemon marks itself not dumpable (``prctl(PR_SET_DUMPABLE, 0)``), so a kernel
  running as the same user cannot read its memory or environment through ``/proc`` or
  ``ptrace`` (root can: run kernels as an unprivileged user);
* the daemon's server-info file in the runtime directory omits the token, and its login
  cookies are signed with a secret held in memory (:func:`login_cookie_key`), not with
  jupyter_server's ``jupyter_cookie_secret`` file, from which a kernel could sign itself a
  cookie.

What remains (docs/guarantees.md, "What code in a kernel can reach, per launch"): a kernel
running as the gateway's own user can read the files that user can read, the gateway's
configuration file included. Keep the token in the environment (``JUPYTER_TOKEN``), not on
the command line (``ps`` shows it to every user) nor in a file kernels can read.

:class:`RedactingFilter` keeps the token, and any ``token=`` query parameter, out of
every log line (tornado logs a failing request's URI, ``?token=`` included).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import hmac
import logging
import os
import re
import sys
from collections.abc import Collection

__all__ = [
    "RedactingFilter",
    "forbid_dumping",
    "login_cookie_key",
    "remove_secrets_from_environment",
    "wipe_from_arguments",
]

_PR_SET_DUMPABLE = 4


def remove_secrets_from_environment(names: Collection[str], values: Collection[str]) -> list[str]:
    """Remove the variables ``names``, and any holding one of ``values``, from this
    process's environment and wipe them from its initial environment block. Returns the
    names removed."""
    secrets = [value for value in values if value]
    removed = [
        name
        for name, value in os.environ.items()
        if name in names or any(secret in value for secret in secrets)
    ]
    wiped = {os.environ[name] for name in removed} | set(secrets)
    for name in removed:
        del os.environ[name]
    if sys.platform == "linux":
        with contextlib.suppress(OSError, ValueError, IndexError):
            _wipe_initial_environment(wiped)
    return removed


def _wipe_initial_environment(values: Collection[str]) -> None:
    """Overwrite ``values`` wherever they appear in the block the kernel gave this
    process at exec (``/proc/self/stat`` fields 50 and 51: env_start, env_end). Nothing
    points into it once the variables are unset."""
    _wipe_process_block(47, values)


def wipe_from_arguments(values: Collection[str]) -> bool:
    """Overwrite ``values`` wherever they appear in this process's argument block (what
    ``/proc/<pid>/cmdline`` and ``ps`` show every local user; ``/proc/self/stat`` fields 48
    and 49: arg_start, arg_end). Linux only; True if anything was overwritten. Python's
    ``sys.argv`` is a copy, untouched. What was visible before this call (the start-up's
    first second) was visible: keep secrets off the command line."""
    if sys.platform != "linux":
        return False
    with contextlib.suppress(OSError, ValueError, IndexError):
        return _wipe_process_block(45, values)
    return False


def _wipe_process_block(first_field: int, values: Collection[str]) -> bool:
    """Overwrite ``values`` with ``x`` in the memory between the addresses in fields
    ``first_field`` and ``first_field + 1`` (0-based, after the command name) of
    ``/proc/self/stat``. True if anything was overwritten."""
    secrets = [value.encode() for value in values if value]
    with open("/proc/self/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    start, end = int(fields[first_field]), int(fields[first_field + 1])
    if not secrets or not 0 < start < end:
        return False
    block = ctypes.string_at(start, end - start)
    wiped = False
    for secret in secrets:
        offset = block.find(secret)
        while offset != -1:
            ctypes.memset(start + offset, ord("x"), len(secret))
            wiped = True
            offset = block.find(secret, offset + len(secret))
    return wiped


def login_cookie_key(token: str) -> bytes:
    """The key the daemon's login cookies are signed with: derived from ``token`` (a
    cookie is then worth what the token is, and ends with it), or random for this run
    when there is no token. It exists only in the daemon's memory."""
    if not token:
        return os.urandom(32)
    return hmac.new(token.encode(), b"kernel_gateway_stream login cookie", hashlib.sha256).digest()


def forbid_dumping() -> bool:
    """Make this process not dumpable (Linux): its ``/proc/<pid>/`` files become root's,
    and other processes of the same user cannot ptrace it. True if it took effect."""
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


_TOKEN_PARAMETER = re.compile(r"((?:token|auth|key|code|state|xsrf)[^=&\s]*=)[^&\s'\"]+", re.I)


class RedactingFilter(logging.Filter):
    """Rewrites a log record so that it holds none of ``secrets`` and no value of a
    ``token=`` (or similar) URL parameter; attached to the log's handlers."""

    def __init__(self, secrets: Collection[str]) -> None:
        super().__init__()
        self.secrets = [secret for secret in secrets if secret]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = self.redact(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        return True

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "[secret]")
        if "=" in text:
            text = _TOKEN_PARAMETER.sub(r"\1[secret]", text)
        return text
