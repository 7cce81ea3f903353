"""The daemon's log: quiet, one line per event worth knowing, optionally JSON or a file.

* **Quiet.** Nothing at WARNING is normal operation. :class:`KnownNoise` drops a warning
  that is only an upstream mismatch: jupyter_server's WebSocket mixin gives tornado its
  ping interval and timeout in milliseconds, and tornado (6.5+) warns that a 90,000 s
  timeout exceeds a 30,000 s interval (jupyter_server pings on its own schedule; tornado's
  is never used). Likewise pyzmq's "Got events for closed stream", when a client's kernel
  sockets close (it left) while the loop still had an event of theirs queued.
* **Structured.** With ``GatewayStreamApp.log_json`` every line is one JSON object:
  ``time``, ``level``, ``logger``, ``message``, and the event's fields where it gave them
  (``extra={"kernel_id": ...}``). Messages never carry kernel output or a token (the
  token is redacted by :class:`~.secrets.RedactingFilter` in any case).
* **A file.** ``GatewayStreamApp.log_file`` writes there instead of standard error;
  ``SIGHUP`` reopens it, for logrotate. The file is the daemon user's alone (0600, whatever
  the umask, and tightened if it was created wider): it names kernels, sessions and
  clients' addresses.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import stat
from collections.abc import Iterable
from typing import Any

__all__ = ["EVENT_FIELDS", "JsonFormatter", "KnownNoise", "LogSetup", "PrivateFileHandler"]

#: Fields an event may add to its line (``log.info(..., extra={...})``).
EVENT_FIELDS = (
    "kernel_id",
    "session_id",
    "surface",
    "since",
    "last_seq",
    "reason",
    "component",
    "state",
)


class KnownNoise(logging.Filter):
    """Drops warnings that are not the operator's to act on (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Got events for closed stream"):
            return False  # pyzmq: a socket we closed had an event queued (a client left)
        return not (
            message.startswith("The websocket_ping_timeout")
            and "cannot be longer than the websocket_ping_interval" in message
        )


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in EVENT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class PrivateFileHandler(logging.FileHandler):
    """A log file only its owner can read: created 0600 (the umask cannot widen it), and
    an existing file readable by others is narrowed to 0600 when opened or reopened."""

    def __init__(self, path: str) -> None:
        super().__init__(path, encoding="utf-8")

    def _open(self):  # type: ignore[no-untyped-def]  # logging's own signature
        descriptor = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if stat.S_IMODE(os.fstat(descriptor).st_mode) & 0o077:
            os.fchmod(descriptor, 0o600)
        return open(descriptor, "a", encoding=self.encoding, errors=self.errors)


class LogSetup:
    """Applies the log settings to the server's log handlers; reopens files on SIGHUP."""

    def __init__(self, loggers: Iterable[logging.Logger], *, json_lines: bool, path: str) -> None:
        #: The loggers that own handlers (the server's and the extension's, each an
        #: Application with a handler of its own).
        self.loggers = list(dict.fromkeys(loggers))
        self.json_lines = json_lines
        self.path = path
        self.file_handler: logging.FileHandler | None = None

    def apply(self) -> None:
        """Route to ``path`` (if set), format as JSON (if asked), drop known noise."""
        handlers = [handler for logger in self.loggers for handler in logger.handlers]
        if self.path:
            self.file_handler = PrivateFileHandler(self.path)
            if handlers:
                self.file_handler.setFormatter(handlers[0].formatter)
            for handler in handlers:
                for each in handler.filters:
                    if each not in self.file_handler.filters:
                        self.file_handler.addFilter(each)
            for logger in self.loggers:
                for handler in list(logger.handlers):
                    logger.removeHandler(handler)
                logger.addHandler(self.file_handler)
            handlers = [self.file_handler]
        for handler in handlers:
            if self.json_lines:
                handler.setFormatter(JsonFormatter())
            if not any(isinstance(f, KnownNoise) for f in handler.filters):
                handler.addFilter(KnownNoise())

    def reopen(self) -> None:
        """Reopen the log file (SIGHUP, after logrotate moved it); nothing to do when
        logging to standard error."""
        handler = self.file_handler
        if handler is None:
            return
        handler.acquire()
        try:
            handler.close()
            handler.stream = handler._open()
        finally:
            handler.release()
        self.loggers[0].info("Reopened the log file")
