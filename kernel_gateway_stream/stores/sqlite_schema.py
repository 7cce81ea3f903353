"""The SQLite transcript database: its schema, its files and its connections.

Layout (schema version 2)::

    kernels        key (small integer) per kernel id; head, reservation, retention state
    chunks         id = key << 40 | first seq: runs of encoded records (core/records.py)
    parents        each parent header once per kernel, by reference
    chunk_parents  which chunks hold records of which parent (one execution's records)
    marks          lifecycle statuses and gap records again, for the execution summaries
    cursors        the last seq sent to each named client session
    links          how to reach each running kernel (connection info), to re-attach it
    meta           schema version

Rows are a rowid table's (a WITHOUT ROWID table puts a large row's overflow on a page of
its own: 1 KB messages took 3.3 bytes on disk per byte). Files are private: the directory
0700 when the store creates it, the database (and SQLite's ``-wal``/``-shm``, which take
the database's mode) 0600.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3

from ..core.errors import StoreUnavailable

__all__ = [
    "SCHEMA_VERSION",
    "SEQ_BITS",
    "chunk_id",
    "connect",
    "connect_reader",
    "create_private_file",
    "kernel_range",
    "prepare_directory",
]

SCHEMA_VERSION = 2
#: A chunk's id is ``key << SEQ_BITS | first_seq``: 2**40 sequence numbers per kernel.
SEQ_BITS = 40
_SEQ_MASK = (1 << SEQ_BITS) - 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value);
CREATE TABLE IF NOT EXISTS kernels (
    key INTEGER PRIMARY KEY,
    kernel_id TEXT NOT NULL UNIQUE,
    head INTEGER NOT NULL DEFAULT 0,
    reserved INTEGER NOT NULL DEFAULT 0,
    first_seq INTEGER NOT NULL DEFAULT 1,
    bytes INTEGER NOT NULL DEFAULT 0,
    started REAL,
    ended REAL
);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY,
    last_seq INTEGER NOT NULL,
    time REAL NOT NULL,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS parents (
    kernel_key INTEGER NOT NULL,
    ref INTEGER NOT NULL,
    msg_id TEXT,
    msg_type TEXT,
    header BLOB NOT NULL,
    PRIMARY KEY (kernel_key, ref)
);
CREATE INDEX IF NOT EXISTS parents_by_msg_id ON parents (kernel_key, msg_id);
CREATE TABLE IF NOT EXISTS chunk_parents (
    kernel_key INTEGER NOT NULL,
    ref INTEGER NOT NULL,
    chunk INTEGER NOT NULL,
    PRIMARY KEY (kernel_key, ref, chunk)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS marks (
    kernel_key INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (kernel_key, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS links (
    kernel_id TEXT PRIMARY KEY,
    data TEXT NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS cursors (
    kernel_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (kernel_id, session_id)
) WITHOUT ROWID;
"""


def chunk_id(key: int, seq: int) -> int:
    return (key << SEQ_BITS) | (seq & _SEQ_MASK)


def kernel_range(key: int) -> tuple[int, int]:
    """The smallest and largest chunk id of kernel ``key``."""
    return key << SEQ_BITS, (key << SEQ_BITS) | _SEQ_MASK


def prepare_directory(path: str, *, private: bool) -> None:
    """Create the database's directory (0700); with ``private``, tighten an existing one
    too (the default directory is the gateway's own; an operator's may be shared).

    Raises:
        StoreUnavailable: it cannot be created or is not a directory.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if private:
            os.chmod(directory, 0o700)
    except OSError as error:
        raise StoreUnavailable(f"cannot create {directory}: {error.strerror}") from error
    if not os.path.isdir(directory):  # pragma: no cover - makedirs raised already
        raise StoreUnavailable(f"{directory} is not a directory")


def create_private_file(path: str) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist; make it 0600 (and any
    ``-wal``/``-shm`` beside it) if it does. SQLite gives the files it creates the
    database's mode, so the database must exist before SQLite opens it."""
    try:
        descriptor = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    except IsADirectoryError as error:
        raise StoreUnavailable(f"{path} is a directory") from error
    except OSError as error:
        raise StoreUnavailable(f"cannot open {path}: {error.strerror}") from error
    os.close(descriptor)
    for name in (path, path + "-wal", path + "-shm"):
        with contextlib.suppress(FileNotFoundError):
            if os.stat(name).st_mode & 0o077:
                os.chmod(name, 0o600)


def connect(path: str, synchronous: str, max_file_bytes: int = 0) -> sqlite3.Connection:
    """A connection in WAL mode, in autocommit (transactions are explicit)."""
    connection = sqlite3.connect(path, check_same_thread=False, timeout=30, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute(f"PRAGMA synchronous={synchronous}")
    # Truncate the WAL back to this after a checkpoint, so a burst does not leave it large.
    connection.execute("PRAGMA journal_size_limit=67108864")
    if max_file_bytes:
        page_size = connection.execute("PRAGMA page_size").fetchone()[0]
        connection.execute(f"PRAGMA max_page_count={max(16, max_file_bytes // page_size)}")
    return connection


def connect_reader(path: str) -> sqlite3.Connection:
    """A connection that only reads: it sets no journal mode (the writer's connection made
    the database WAL, which the file says) and refuses to write. Setting WAL writes the
    file's header: a reader that opened another file put at the path (replaced while the
    gateway ran, until the writer notices and sets it aside) wrote it."""
    connection = sqlite3.connect(path, check_same_thread=False, timeout=30, isolation_level=None)
    connection.execute("PRAGMA query_only=1")
    return connection
