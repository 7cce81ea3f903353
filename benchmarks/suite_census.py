"""Where the test suite's time goes: ``python -m benchmarks.suite_census [PYTEST ARGS]``.

Runs ``python -m tests`` (the arguments go to it) and meanwhile reads, a few times a
second, every process's CPU from ``/proc`` and the machine's busy and idle time from
``/proc/stat``. At the end it prints, per kind of process (daemons, kernels, pytest
workers, chromium, ...), the core-seconds spent meanwhile and how many started, then how
much of the cores' time was idle, and writes every process it saw to a JSON file
(``--out``). What docs/guarantees.md says of the suite's CPU and idle share was read this
way.

A process that starts and ends between two reads is not seen: the census undercounts,
and ``/proc/stat``'s busy time says by how much. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

#: Seconds between two reads of /proc.
INTERVAL = 0.4

#: (kind, what its command line holds), first match wins: the order matters where one
#: command line holds several (a daemon's arguments name pytest's temporary directory).
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("chromium", ("chrom",)),
    ("pytest worker", ("exec(eval(sys.stdin",)),  # pytest-xdist's workers (execnet)
    ("pytest", ("-m pytest", "-m tests")),
    ("kernel forkserver", ("kernel_forkserver",)),
    ("kernel", ("ipykernel", "kernel_launcher", "firehose")),
    ("daemon", ("kernel_gateway_stream",)),
    ("jupyter servers", ("jupyter", "without_iri", "enterprise_gateway")),
    ("mypy", ("mypy",)),
    ("node, npm", ("node", "npm")),
)


def kind_of(command: list[str]) -> str:
    """The kind of the process whose command line is ``command``."""
    line = " ".join(command)
    for kind, marks in KINDS:
        if any(mark in line for mark in marks):
            return kind
    return "other"


@dataclass
class Seen:
    """One process as the census last saw it."""

    pid: int
    command: list[str]
    cpu: float  # seconds, user and system, since the process started
    before: float = 0.0  # what of it was spent before the census began
    started: bool = True  # whether it started while the census ran

    @property
    def kind(self) -> str:
        return kind_of(self.command)

    @property
    def spent(self) -> float:
        """Seconds of CPU spent while the census ran."""
        return self.cpu - self.before


def _cpu_times() -> tuple[int, int]:
    """The machine's total and idle (with iowait) time, in clock ticks."""
    with open("/proc/stat") as stat:
        fields = [int(field) for field in stat.readline().split()[1:]]
    return sum(fields), fields[3] + fields[4]


class Census:
    """Reads /proc in a thread until :meth:`stop`."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], Seen] = {}
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        #: The machine's (total, idle) clock ticks when the census started and ended.
        self.start_times = self.end_times = (0, 0)

    def start(self) -> None:
        self.start_times = _cpu_times()
        # What already runs (the machine's services, a database) counts from here on,
        # not from its own start.
        self._scan()
        for seen in self.seen.values():
            seen.before, seen.started = seen.cpu, False
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.end_times = _cpu_times()

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL):
            self._scan()
        self._scan()

    def _scan(self) -> None:
        me = os.getpid()
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != me:
                self._read(int(entry))

    def _read(self, pid: int) -> None:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                text = stat.read()
            fields = text[text.rindex(")") + 2 :].split()
            cpu = (int(fields[11]) + int(fields[12])) / self._ticks
            key = (pid, int(fields[19]))  # a pid and its start time: one process
            # Read each time: a child seen between its fork and its exec shows its
            # parent's command line first (a zombie's is empty: the last one stands).
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                parts = cmdline.read().split(b"\0")
            command = [part.decode(errors="replace") for part in parts if part]
            seen = self.seen.setdefault(key, Seen(pid, command, cpu))
            if command:
                seen.command = command
            seen.cpu = cpu
        except (OSError, ValueError, IndexError):
            pass  # ended meanwhile

    def report(self) -> str:
        """The table: core-seconds and processes per kind, then the idle share."""
        seconds: dict[str, float] = defaultdict(float)
        counts: Counter[str] = Counter()
        for seen in self.seen.values():
            seconds[seen.kind] += seen.spent
            counts[seen.kind] += seen.started
        lines = ["| kind | core-seconds | processes started |", "|---|---:|---:|"]
        for kind, spent in sorted(seconds.items(), key=lambda item: -item[1]):
            lines.append(f"| {kind} | {spent:.1f} | {counts[kind]} |")
        lines.append(
            f"| all the census saw | {sum(seconds.values()):.1f} | {sum(counts.values())} |"
        )
        total = (self.end_times[0] - self.start_times[0]) / self._ticks
        idle = (self.end_times[1] - self.start_times[1]) / self._ticks
        if total:
            lines.append(
                f"\n/proc/stat: {total - idle:.0f} core-seconds busy, {idle:.0f} idle "
                f"({idle / total:.0%} of the cores' time)"
            )
        return "\n".join(lines)


def main(arguments: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/suite_census.json"))
    options, pytest_arguments = parser.parse_known_args(arguments)
    census = Census()
    census.start()
    began = time.monotonic()
    try:
        status = subprocess.call([sys.executable, "-m", "tests", *pytest_arguments])
    finally:
        census.stop()
    print(f"\n`python -m tests` took {time.monotonic() - began:.0f} s, exit status {status}\n")
    print(census.report())
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(
        json.dumps([{**asdict(seen), "kind": seen.kind} for seen in census.seen.values()])
    )
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
