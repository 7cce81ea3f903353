"""A reader's SQLite connection never writes the file it opens: a file put in the
database's place while the gateway runs is set aside as it was (see
tests/faults/test_sqlite_replaced.py, where a reader thread that opened its connection
before the writer noticed the replacement once wrote the new file's header)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kernel_gateway_stream.stores.sqlite_schema import connect, connect_reader


def test_a_reader_leaves_an_empty_file_empty(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite3"
    path.touch()
    reader = connect_reader(str(path))
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        reader.execute("SELECT seq FROM cursors").fetchall()
    reader.close()
    assert path.stat().st_size == 0
    # The control: the writer's connection makes the file WAL, which writes its header.
    connect(str(path), "NORMAL").close()
    assert path.stat().st_size > 0


def test_a_reader_reads_what_the_writer_wrote_and_cannot_write(tmp_path: Path) -> None:
    path = str(tmp_path / "transcripts.sqlite3")
    writer = connect(path, "NORMAL")
    writer.execute("CREATE TABLE t (x INTEGER)")
    writer.execute("INSERT INTO t VALUES (1)")
    reader = connect_reader(path)
    assert reader.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert reader.execute("SELECT x FROM t").fetchall() == [(1,)]
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader.execute("INSERT INTO t VALUES (2)")
    writer.execute("INSERT INTO t VALUES (3)")
    assert reader.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,), (3,)]
    reader.close()
    writer.close()
