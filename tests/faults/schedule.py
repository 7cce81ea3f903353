"""The fault harness's seeded schedule: which fault, on which role, for how long, and how
long the cluster runs whole before the next one. Pure: one seed, one schedule.

Faults run one at a time, each healed before the next begins, so that every finding can
be put down to one kind of fault (tests/faults/checker.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["KINDS", "ROLES", "SQLITE_KINDS", "Step", "plan"]

#: Every kind, and the role it applies to: ``owner`` is the node holding the kernel's lease
#: when the fault begins, ``follower`` another node, ``node`` either, picked by the seed.
KINDS: dict[str, str] = {
    "owner_pause": "owner",  # SIGSTOP, then SIGCONT
    "follower_pause": "follower",
    "owner_kill": "owner",  # SIGKILL of the daemon alone (its kernel runs on), then a start
    "follower_kill": "follower",
    "redis_pause": "redis",  # SIGSTOP of redis-server, then SIGCONT
    "redis_kill": "redis",  # SIGKILL of redis-server, down a while, started again empty
    "redis_restart": "redis",  # SIGTERM and an immediate start: empty (it keeps nothing)
    "node_cut": "node",  # the node's proxy to Redis resets every connection
    "node_blackhole": "node",  # the node's proxy to Redis passes no byte
}
#: Only in a run of one node on SQLite (``Options.sqlite``): nodes on Redis keep no file.
SQLITE_REPLACED = "sqlite_replaced"
#: The kinds of a run of one node on SQLite (its only node is the owner).
SQLITE_KINDS = (SQLITE_REPLACED, "owner_pause", "owner_kill")
#: Every kind's role.
ROLES = {**KINDS, SQLITE_REPLACED: "sqlite"}


@dataclass(frozen=True, slots=True)
class Step:
    kind: str
    #: For ``node`` faults: an owner (True) or a follower.
    on_owner: bool
    #: Seconds the fault lasts (a pause, a cut, the time a killed process stays down).
    duration: float
    #: Seconds the cluster runs whole after it, before the next fault.
    settle: float


def plan(
    seed: int,
    count: int,
    *,
    shortest: float = 0.5,
    longest: float = 4.0,
    settle: tuple[float, float] = (1.0, 3.0),
    kinds: tuple[str, ...] = tuple(KINDS),
) -> list[Step]:
    """``count`` faults drawn from ``kinds`` with ``random.Random(seed)``: each kind in
    turn in a shuffled order (so a short schedule has every kind), durations between
    ``shortest`` and ``longest`` (the nodes' lease lasts 2 s: some pauses outlive it)."""
    chance = random.Random(seed)
    steps: list[Step] = []
    order: list[str] = []
    while len(steps) < count:
        if not order:
            order = list(kinds)
            chance.shuffle(order)
        kind = order.pop()
        steps.append(
            Step(
                kind,
                ROLES[kind] != "follower" and (ROLES[kind] != "node" or chance.random() < 0.5),
                round(chance.uniform(shortest, longest), 2),
                round(chance.uniform(*settle), 2),
            )
        )
    return steps
