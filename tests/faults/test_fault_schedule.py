"""A short seeded fault schedule over three nodes (tests/faults/harness.py), asserting every
rule the harness's checker counts (tests/faults/checker.py): no fork, no reused seq, no
silent loss, no understated gap, no health ``ok`` while a node cannot write, and every
execution ends in the transcript (its ``idle`` is recorded, whatever the faults took). Not
asserted, and printed: the lines lost inside gap records (what a fault can cost, said).
Nine faults, one of each kind, in a shuffled order; the long runs are
``python -m benchmarks --only faults`` (docs/guarantees.md has their figures).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..integration.redis_server import require_redis_server
from .harness import Options, run, table
from .schedule import KINDS

#: Its own redis-server and ports: it may run beside anything, but three daemons and a
#: flooding kernel are heavy, so it shares a worker with the other several-node tests.
pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("several-nodes")]

SEED = 5
#: One of each kind.
FAULTS = len(KINDS)


async def test_a_seeded_schedule_of_every_kind_of_fault_breaks_no_rule(
    tmp_path: Path,
) -> None:
    require_redis_server()
    options = Options(
        seed=SEED,
        faults=FAULTS,
        burst_lines=300,
        burst_interval=0.4,
        longest=3.0,
        settle=(0.5, 1.5),
    )
    outcome = await run(tmp_path, options)
    print(table(outcome.report))
    print(f"gap records: {dict(outcome.gaps)}; client closes: {dict(outcome.closes)}")
    assert outcome.lines > 0, "the kernel printed nothing"
    broken = outcome.report.total.broken()  # every rule the checker counts
    if broken:  # what the nodes said, for a run that cannot be had again
        print("\n".join(outcome.notes))
        print_node_logs(tmp_path / "nodes")
    assert not broken, f"{broken}\n" + "\n".join(outcome.report.examples)


#: Lines of a node's log that tell who recorded the kernel and what went wrong.
TOLD = ("[W ", "[E ", "Tapping kernel", "Following kernel", "publishes again", "left at seq")


def print_node_logs(root: Path, lines: int = 80) -> None:
    """Each node's warnings, errors and changes of role, the last ``lines`` of them."""
    for log in sorted(root.glob("*/daemon.log")):
        told = [
            line
            for line in log.read_text(errors="replace").splitlines()
            if line.startswith(TOLD) or any(t in line for t in TOLD[2:])
        ]
        print(f"--- node {log.parent.name}: {len(told)} lines told, the last {lines}")
        print("\n".join(line[:300] for line in told[-lines:]))
