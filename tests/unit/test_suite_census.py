"""The suite's census (benchmarks/suite_census.py): what docs/guarantees.md says of the
suite's CPU was read with it, so it is tested like the other benchmark tools."""

from __future__ import annotations

import subprocess
import sys
import time

from benchmarks.suite_census import Census, kind_of


def test_each_kind_of_the_suites_processes_is_told_apart() -> None:
    python = sys.executable
    assert kind_of([python, "-m", "kernel_gateway_stream", "--port=1"]) == "daemon"
    # A daemon whose arguments name pytest's temporary directory is still a daemon.
    assert (
        kind_of([python, "-m", "kernel_gateway_stream", "--path=/t/pytest-of-root/x.sqlite3"])
        == "daemon"
    )
    assert kind_of([python, "-m", "ipykernel_launcher", "-f", "k.json"]) == "kernel"
    assert kind_of([python, "-m", "kernel_gateway_stream.kernel_launcher", "-f", "k"]) == "kernel"
    assert kind_of([python, "-m", "kernel_gateway_stream.kernel_forkserver", "3", "0"]) == (
        "kernel forkserver"
    )
    assert kind_of([python, "-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"]) == (
        "pytest worker"
    )
    assert kind_of(["/usr/lib/chromium/chromium", "--type=renderer"]) == "chromium"
    assert kind_of([python, "tests/without_iri.py", "jupyterlab", "--port=2"]) == (
        "jupyter servers"
    )
    assert kind_of(["sleep", "1"]) == "other"
    assert kind_of([]) == "other"


def test_a_process_that_spends_cpu_is_counted_under_its_kind() -> None:
    census = Census()
    census.start()
    try:
        # A "kernel" by its command line that spins for about half a second of CPU.
        spin = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
        child = subprocess.Popen([sys.executable, "-c", spin, "ipykernel"])
        child.wait()
        time.sleep(0.1)
    finally:
        census.stop()
    # It ended after at least one read: seen, with most of its CPU (what it spent after
    # the last read before it ended is missed).
    [seen] = [seen for seen in census.seen.values() if seen.pid == child.pid]
    assert seen.kind == "kernel"
    assert seen.cpu > 0
    report = census.report()
    assert "| kernel |" in report
    assert "/proc/stat:" in report


def test_a_process_that_ran_before_counts_only_what_it_spends_meanwhile() -> None:
    # It spends about 0.3 s of CPU, says so, then sleeps until it is killed.
    spin = (
        "import sys, time\nend = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\nprint(flush=True)\ntime.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        child.stdout.readline()
        census = Census()
        census.start()
        time.sleep(0.5)
        census.stop()
    finally:
        child.kill()
        child.wait()
    [seen] = [seen for seen in census.seen.values() if seen.pid == child.pid]
    assert seen.cpu >= 0.3
    assert not seen.started
    assert seen.spent < 0.1  # it slept meanwhile
