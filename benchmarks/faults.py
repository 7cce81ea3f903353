"""A seeded schedule of faults over three nodes on Redis (``--only faults``): the fault
harness of the test suite (tests/faults/harness.py) at full length.

    python -m benchmarks --only faults --seed 1 --faults 50
    python -m benchmarks --only faults --faults 3 --fault-kinds owner_pause --sqlite-faults 0

Pauses and SIGKILLs of the owner and of followers, pauses, SIGKILLs and empty restarts of
Redis, a node cut from Redis or blackholed, one at a time, while a kernel floods numbered
lines in bursts and a client on every node records what it gets. Prints the checker's
counts per kind of fault (forks, reused seqs, silent loss, understated gaps, executions
that never end, health ok while a node could not write, and the lines lost) as a table;
one row per kind in ``report.json``. Then ``--sqlite-faults`` more on one node on SQLite:
its database replaced by an empty file, pauses and SIGKILLs. Needs ``redis-server`` (it
starts its own, on a port of its own; never the shared one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import scenarios as sc

Row = dict[str, Any]


async def faults(
    home: Path, seed: int, count: int, sqlite_count: int, kinds: list[str] | None = None
) -> tuple[list[Row], str]:
    """The rows (one per kind of fault, then one for the whole run, for each of the two
    runs: three nodes on Redis, then one node on SQLite) and the tables; ``kinds``, when
    given, the only kinds of the three-node run (to reproduce one)."""
    # The harness lives with the tests, on their helpers (daemons, redis-server, clients).
    from tests.faults.harness import Options
    from tests.faults.schedule import KINDS, SQLITE_KINDS

    options = Options(seed=seed, faults=count, kinds=tuple(kinds or KINDS))
    rows, text = await _one(home / "faults", "3 nodes on Redis", options)
    if sqlite_count:
        options = Options(seed=seed, faults=sqlite_count, kinds=SQLITE_KINDS, sqlite=True)
        more_rows, more_text = await _one(home / "faults-sqlite", "1 node on SQLite", options)
        rows, text = rows + more_rows, text + more_text
    return rows, text


async def _one(where: Path, label: str, options: Any) -> tuple[list[Row], str]:
    from tests.faults.harness import COLUMNS, run, table

    outcome = await run(where, options)
    rows = []
    for kind, counts in [*sorted(outcome.report.by_kind.items()), ("all", outcome.report.total)]:
        rows.append(
            sc.row(
                "faults",
                f"kernel_gateway_stream, {label}",
                kind,
                **{name: getattr(counts, name) for name, _ in COLUMNS},
            )
        )
    rows[-1]["seconds"] = outcome.seconds
    rows[-1]["lines"] = outcome.lines
    text = (
        f"\n#### faults, {label}: seed {options.seed}, {len(outcome.steps)} faults, "
        f"{outcome.seconds:.0f} s, {outcome.bursts} bursts, {outcome.lines:,} lines\n\n"
        f"{table(outcome.report)}\n\n"
        f"gap records in the transcript: {dict(outcome.gaps)}\n"
        f"client closes: {dict(outcome.closes)}\n"
        + "".join(f"{note}\n" for note in outcome.notes)
        + "".join(f"  {example}\n" for example in outcome.report.examples)
    )
    return rows, text
