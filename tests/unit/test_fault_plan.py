"""tests/faults/schedule.py: one seed, one schedule, every kind in each round."""

from __future__ import annotations

from tests.faults.schedule import KINDS, SQLITE_KINDS, plan


def test_one_seed_gives_one_schedule_and_another_seed_another() -> None:
    assert plan(7, 20) == plan(7, 20)
    assert plan(7, 20) != plan(8, 20)


def test_each_round_has_every_kind_once() -> None:
    steps = plan(3, 2 * len(KINDS))
    for start in (0, len(KINDS)):
        assert sorted(s.kind for s in steps[start : start + len(KINDS)]) == sorted(KINDS)


def test_durations_and_roles_follow_the_options() -> None:
    steps = plan(1, 30, shortest=1.0, longest=2.0, settle=(0.5, 0.6), kinds=SQLITE_KINDS)
    assert all(1.0 <= s.duration <= 2.0 and 0.5 <= s.settle <= 0.6 for s in steps)
    # On one node every fault is on the owner.
    assert all(s.on_owner for s in steps)
    followers = [s for s in plan(1, 30) if KINDS[s.kind] == "follower"]
    assert followers
    assert not any(s.on_owner for s in followers)
