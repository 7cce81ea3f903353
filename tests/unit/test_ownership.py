"""The role switch of a kernel's recorder (core/ownership.py): the table, with no event loop."""

from __future__ import annotations

import itertools

import pytest

from kernel_gateway_stream.core.ownership import TRANSITIONS, Action, Event, Ownership, Role


def test_a_recorder_starts_as_owner_or_follower_only() -> None:
    assert Ownership(Role.OWNER).records
    assert Ownership(Role.FOLLOWER).follows
    for role in (Role.HANDING_OVER, Role.CLOSED):
        with pytest.raises(ValueError, match="starts as owner or follower"):
            Ownership(role)


def test_a_follower_that_takes_the_lease_reads_the_kernel_itself() -> None:
    ownership = Ownership(Role.FOLLOWER)
    assert ownership.handle(Event.LEASE_TAKEN) == (Action.START_READING,)
    assert ownership.role is Role.OWNER
    assert ownership.records
    assert not ownership.follows


def test_an_owner_that_loses_the_lease_follows_the_bus_again() -> None:
    ownership = Ownership(Role.OWNER)
    assert ownership.handle(Event.LEASE_LOST) == (
        Action.STOP_READING,
        Action.UNHOOK,
        Action.FOLLOW,
    )
    assert ownership.follows
    assert not ownership.closed


def test_an_owner_records_the_end_before_it_stops_reading_and_tells_the_fan_out_last() -> None:
    ownership = Ownership(Role.OWNER)
    actions = ownership.handle(Event.CLOSED)
    assert actions[0] is Action.RECORD_END
    assert actions.index(Action.STOP_READING) > 0
    assert actions[-1] is Action.CLOSE_FANOUT
    assert Action.END_TRANSCRIPT in actions
    assert ownership.role is Role.CLOSED
    assert ownership.closed


def test_a_follower_records_nothing_of_the_end_the_owner_recorded() -> None:
    ownership = Ownership(Role.FOLLOWER)
    actions = ownership.handle(Event.CLOSED)
    assert Action.RECORD_END not in actions
    assert Action.END_TRANSCRIPT not in actions
    assert actions == (Action.SETTLE, Action.CLOSE_FANOUT)


def test_a_handed_over_kernel_is_closed_without_a_record_and_stops_when_the_gateway_does() -> None:
    ownership = Ownership(Role.OWNER)
    assert ownership.handle(Event.RELEASED) == (Action.STOP_READING, Action.UNHOOK)
    assert ownership.role is Role.HANDING_OVER
    assert ownership.closed
    assert not ownership.records
    assert ownership.handle(Event.LEASE_LOST) == ()  # late: nothing to stop any more
    assert ownership.handle(Event.CLOSED) == ()
    assert ownership.role is Role.CLOSED


def test_an_event_without_a_row_changes_nothing() -> None:
    for role, event in itertools.product(Role, Event):
        if (role, event) in TRANSITIONS:
            continue
        ownership = Ownership(Role.OWNER)
        ownership.role = role
        assert ownership.handle(event) == ()
        assert ownership.role is role


def test_closed_is_final_and_every_other_role_can_be_stopped_and_closed() -> None:
    assert not [key for key in TRANSITIONS if key[0] is Role.CLOSED]
    for role in (Role.OWNER, Role.FOLLOWER, Role.HANDING_OVER):
        assert TRANSITIONS[(role, Event.STOPPED)].role is Role.CLOSED
        assert TRANSITIONS[(role, Event.CLOSED)].role is Role.CLOSED


def test_only_an_owner_can_be_released_or_lose_its_lease_and_only_a_follower_take_one() -> None:
    assert {role for role, event in TRANSITIONS if event is Event.RELEASED} == {Role.OWNER}
    assert {role for role, event in TRANSITIONS if event is Event.LEASE_LOST} == {Role.OWNER}
    assert {role for role, event in TRANSITIONS if event is Event.LEASE_TAKEN} == {Role.FOLLOWER}
