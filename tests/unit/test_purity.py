"""Invariant 7: the pure core does no I/O, reads no clock and imports no event loop."""

from __future__ import annotations

import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import kernel_gateway_stream.core as core

CORE_DIR = Path(core.__file__).parent
CORE_MODULES = sorted(info.name for info in pkgutil.iter_modules(core.__path__))

_IMPORT_ALL = """
import importlib, json, pkgutil, sys
import kernel_gateway_stream.core as core
for info in pkgutil.iter_modules(core.__path__):
    importlib.import_module("kernel_gateway_stream.core." + info.name)
print(json.dumps(sorted(sys.modules)))
"""

_CLOCK_CALLS = re.compile(
    r"\btime\.(time|monotonic|perf_counter|time_ns|monotonic_ns)\b"
    r"|\bdatetime\.(now|utcnow|today)\b"
    r"|\bdate\.today\b"
    r"|^\s*from\s+time\s+import\b",
    re.MULTILINE,
)


def test_core_modules_are_discovered() -> None:
    """Invariant 7: the purity checks below cover every module of the core."""
    assert set(CORE_MODULES) >= {
        "coalescer",
        "errors",
        "frames",
        "messages",
        "sequencer",
        "subscription",
        "wire",
    }


def test_importing_the_core_imports_no_event_loop_or_socket_library() -> None:
    """Invariant 7: importing every core module pulls in neither asyncio, tornado nor zmq."""
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout))
    assert {f"kernel_gateway_stream.core.{name}" for name in CORE_MODULES} <= loaded
    forbidden = {name for name in loaded if name.split(".")[0] in {"asyncio", "tornado", "zmq"}}
    assert forbidden == set()


def test_core_source_reads_no_clock() -> None:
    """Invariant 7: no core module calls time.time / time.monotonic / datetime.now."""
    offenders = {
        path.name: _CLOCK_CALLS.findall(path.read_text(encoding="utf-8"))
        for path in sorted(CORE_DIR.glob("*.py"))
    }
    assert len(offenders) == len(CORE_MODULES) + 1  # and __init__.py
    assert {name: found for name, found in offenders.items() if found} == {}


def test_clock_pattern_catches_clock_calls() -> None:
    """Invariant 7: the source check above can fail (it sees the calls it looks for)."""
    for source in (
        "t = time.time()",
        "t = time.monotonic()",
        "d = datetime.now(timezone.utc)",
        "d = datetime.datetime.utcnow()",
        "from time import monotonic",
    ):
        assert _CLOCK_CALLS.search(source), source
    assert _CLOCK_CALLS.search("def feed(self, record, now): return now + self.window") is None
