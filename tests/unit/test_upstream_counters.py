"""The upstream kernel's message counter (kernel_gateway_stream.core.upstream_counters):
pure, time passed in."""

from __future__ import annotations

from kernel_gateway_stream.core.upstream_counters import (
    CounterWatch,
    Lost,
    missed_while_away,
    parse_counter,
)

KEY = "5f0c1c0e-8d63a1f2b0e94c59a1b2c3d4_4242"


def mid(n: int) -> str:
    return f"{KEY}_{n}"


def adopt(counters: CounterWatch, n: int, at: float = 0.0, key: str = KEY) -> None:
    """The kernel's reply numbered ``n`` to a request of the gateway's, then an IOPub
    message (standing for its status): its counter is watched from there."""
    counters.sent("nudge")
    counters.saw(f"{key}_{n}", at, parent_msg_id="nudge", iopub=False)
    counters.saw(f"{key}_{n}", at, parent_msg_id="nudge", execution_state="busy")


def watch(**options: float) -> CounterWatch:
    return CounterWatch(window=1.0, settle=2, quiet_window=5.0, **options)  # type: ignore[arg-type]


def test_both_forms_of_jupyter_client_ids_and_no_others() -> None:
    assert parse_counter("a1b2c3d4-e5f6_1234_17") == ("a1b2c3d4-e5f6_1234", 17)
    assert parse_counter("a1b2c3d4-e5f6a7b8_17") == ("a1b2c3d4-e5f6a7b8", 17)
    assert parse_counter("0f8e4a7c9d6b4e2a8f1c3b5d7e9a1c3e") is None
    assert parse_counter("x_1") is None


def test_numbers_in_any_order_within_the_window_are_no_loss() -> None:
    counters = watch()
    for n, at in ((0, 0.0), (2, 0.1), (1, 0.5), (4, 0.6), (3, 0.9), (5, 0.95), (6, 1.0)):
        counters.saw(mid(n), at)
    assert counters.poll(10.0) is None
    assert counters.pending == 0


def test_a_number_missing_past_the_window_and_settle_is_lost() -> None:
    counters = watch()
    adopt(counters, 0, 0.0)
    counters.saw(mid(5), 0.1)  # 1..4 missing
    assert counters.poll(0.5) is None  # inside the window
    assert counters.poll(2.0) is None  # past it, but too few messages since
    counters.saw(mid(6), 2.0)
    counters.saw(mid(7), 2.0)
    assert counters.poll(2.0) == Lost(4, False, 1, 4, ((1, 4),))
    assert counters.pending == 0


def test_a_quiet_kernel_is_judged_after_the_quiet_window() -> None:
    counters = watch()
    adopt(counters, 0, 0.0)
    counters.saw(mid(3), 0.0)
    assert counters.next_deadline() == 5.0
    assert counters.poll(4.9) is None
    assert counters.poll(5.0) == Lost(2, False, 1, 2, ((1, 2),))
    assert counters.next_deadline() is None


def test_a_late_number_splits_its_hole() -> None:
    counters = watch()
    adopt(counters, 0, 0.0)
    counters.saw(mid(10), 0.0)
    counters.saw(mid(5), 0.2)
    assert counters.pending == 8
    assert counters.poll(6.0) == Lost(8, False, 1, 9, ((1, 4), (6, 9)))


def test_another_clients_request_explains_one_number_between_its_busy_and_idle() -> None:
    counters = watch()
    adopt(counters, 0, 0.0)
    # jupyter_server's own kernel_info_request: busy (1), its reply to it (2), idle (3).
    counters.saw(mid(1), 0.0, parent_msg_id="theirs", parent_msg_type="kernel_info_request",
                 execution_state="busy")  # fmt: skip
    counters.saw(mid(3), 0.0, parent_msg_id="theirs", parent_msg_type="kernel_info_request",
                 execution_state="idle")  # fmt: skip
    assert counters.poll(6.0) is None
    # Two numbers missing in another request's span: the reply, and one lost (exactly).
    counters.saw(mid(4), 6.0, parent_msg_id="again", parent_msg_type="complete_request",
                 execution_state="busy")  # fmt: skip
    counters.saw(mid(7), 6.0, parent_msg_id="again", parent_msg_type="complete_request",
                 execution_state="idle")  # fmt: skip
    assert counters.poll(12.0) == Lost(1, False, 5, 6, ((5, 6),))


def test_the_gateways_own_requests_explain_nothing() -> None:
    counters = watch()
    adopt(counters, 0)
    counters.sent("ours")
    counters.saw(mid(1), 0.0, parent_msg_id="ours", execution_state="busy")
    counters.saw(mid(3), 0.0, parent_msg_id="ours", execution_state="idle")
    assert counters.poll(6.0) == Lost(1, False, 2, 2, ((2, 2),))


def test_holes_in_another_clients_execution_are_an_upper_bound() -> None:
    counters = watch()
    adopt(counters, 0)
    counters.saw(mid(1), 0.0, parent_msg_id="run", parent_msg_type="execute_request",
                 execution_state="busy")  # fmt: skip
    counters.saw(mid(6), 0.0)  # still running: its idle has not come
    assert counters.poll(6.0) == Lost(3, True, 2, 5, ((2, 5),))


def test_replies_overtaking_iopub_reveal_no_hole_and_are_no_hole() -> None:
    counters = watch()
    adopt(counters, 0, 0.0)
    counters.saw(mid(4000), 0.0, iopub=False)  # an execute_reply ahead of queued output
    counters.saw(mid(1), 3.0)
    counters.saw(mid(2), 3.0)
    assert counters.poll(20.0) is None
    for n in range(3, 4000):
        counters.saw(mid(n), 21.0)
    counters.saw(mid(4001), 21.0)  # its idle: 4000 came already
    counters.saw(mid(4003), 21.0)  # 4002, on shell or IOPub, never comes
    assert counters.poll(40.0) == Lost(1, False, 4002, 4002, ((4002, 4002),))


def test_a_late_start_other_sessions_and_a_reset_lose_nothing() -> None:
    counters = watch()
    adopt(counters, 100)  # the gateway came late: 0..99 are not its to judge
    counters.saw(mid(101), 0.0)
    # The upstream server's own notices, numbered by its session (shared with its other
    # connections): not the kernel's counter.
    counters.saw("f00dfeed-0000_55_7", 0.1)
    counters.saw("f00dfeed-0000_55_19", 0.1)
    # The kernel restarted: a new session, watched once it answers the gateway.
    adopt(counters, 3, 0.1, key="a1b2c3d4-0000_77")
    counters.saw("a1b2c3d4-0000_77_4", 0.1)
    assert counters.poll(10.0) is None
    counters.saw("a1b2c3d4-0000_77_6", 10.0)
    counters.reset()  # the connection dropped: its own gap record says so
    assert counters.poll(30.0) is None
    assert counters.pending == 0


def test_holes_past_the_bound_are_judged_at_once() -> None:
    counters = watch(max_holes=2)
    adopt(counters, 0)
    for n in (2, 4, 6):
        counters.saw(mid(n), 0.0)
    assert counters.next_deadline() == 0.0
    assert counters.poll(0.0) == Lost(1, False, 1, 1, ((1, 1),))
    assert counters.pending == 2


def test_holes_wait_while_late_numbers_still_fill_them() -> None:
    counters = watch()
    adopt(counters, 0)
    counters.saw(mid(1000), 0.0)  # a held backlog: 1..999 come later, behind 1000
    for n in range(1001, 1100):
        counters.saw(mid(n), 0.5)
    for n in range(1, 500):
        counters.saw(mid(n), 4.0)  # still filling, past the window and the settle count
    assert counters.poll(4.5) is None
    assert counters.next_deadline() == 5.0
    for n in range(500, 990):
        counters.saw(mid(n), 9.0)
    assert counters.poll(9.5) is None  # filled half a second ago
    assert counters.poll(10.0) == Lost(10, False, 990, 999, ((990, 999),))


def test_a_hole_below_an_idle_is_judged_after_the_window_alone_and_holds_the_idle() -> None:
    counters = watch()
    adopt(counters, 0, 0.0)
    counters.sent("run")  # a client's execution, sent through the gateway
    counters.saw(mid(5), 0.0)  # 1..4 missing
    counters.saw(mid(6), 0.2, parent_msg_id="run", execution_state="idle")
    # The idle waits for the judgement of the numbers below it, not for those above it.
    assert counters.holds(mid(6))
    assert not counters.holds(mid(1))
    assert counters.next_deadline() == 1.0  # the window, not the quiet window
    assert counters.poll(0.9) is None
    assert counters.poll(1.0) == Lost(4, False, 1, 4, ((1, 4),))
    assert not counters.holds(mid(6))


def test_a_late_number_below_an_idle_fills_its_closed_hole() -> None:
    counters = watch()
    adopt(counters, 0, 0.0)
    counters.sent("run")
    counters.saw(mid(3), 0.0, parent_msg_id="run", execution_state="idle")  # 1, 2 missing
    counters.saw(mid(1), 0.3, iopub=False)  # the execute_reply, late on shell
    assert counters.holds(mid(3))
    counters.saw(mid(2), 0.4)
    assert not counters.holds(mid(3))
    assert counters.poll(10.0) is None


def test_judge_below_judges_at_the_next_poll_and_keeps_the_holes_above() -> None:
    counters = watch()
    adopt(counters, 0, 0.0)
    counters.sent("run")
    counters.saw(mid(3), 0.0, parent_msg_id="run", execution_state="idle")  # 1, 2 missing
    counters.saw(mid(6), 0.0)  # 4, 5 missing
    counters.judge_below(mid(3))
    assert counters.poll(0.0) == Lost(2, False, 1, 2, ((1, 2),))
    assert counters.pending == 2
    assert not counters.holds(mid(3))
    assert not counters.holds("not-a-counted-id")


def test_an_idle_whose_busy_came_before_the_counter_was_watched_explains_one_number() -> None:
    # The upstream's own nudge on control: its busy before the gateway's reply adopted the
    # counter, its reply (to the upstream) and idle after.
    counters = watch()
    counters.saw(mid(0), 0.0, parent_msg_id="upstream-nudge", execution_state="busy")
    adopt(counters, 1, 0.0)
    counters.saw(
        mid(3),
        0.1,
        parent_msg_id="upstream-nudge",
        parent_msg_type="kernel_info_request",
        execution_state="idle",
    )  # 2, the upstream's reply, never comes here
    counters.saw(mid(4), 0.2)
    counters.saw(mid(5), 0.3)
    assert counters.poll(10.0) is None
    # Another such idle, with two numbers missing below it: one is explained, one lost.
    counters.saw(mid(8), 10.0, parent_msg_id="other", execution_state="idle")
    assert counters.poll(20.0) == Lost(1, False, 6, 7, ((6, 7),))


def test_status_messages_that_come_before_the_reply_that_adopts_the_counter_count() -> None:
    counters = watch()
    counters.sent("nudge")
    counters.saw(mid(12), 0.0, parent_msg_id="nudge", execution_state="busy")
    counters.saw(mid(14), 0.0, parent_msg_id="nudge", execution_state="idle")
    counters.saw(mid(13), 0.0, parent_msg_id="nudge", iopub=False)  # the reply: adopted
    counters.saw(mid(15), 0.1)
    counters.saw(mid(16), 0.1)
    counters.saw(mid(17), 0.1)
    assert counters.poll(10.0) is None
    assert counters.pending == 0


def test_numbers_before_the_first_iopub_message_of_a_watched_counter_are_not_lost() -> None:
    # After a restart the upstream's subscription to the new process lags: the first
    # nudge's reply (7) comes, its statuses (6, 8) never do; the next nudge's all come.
    counters = watch()
    counters.sent("nudge")
    counters.saw(mid(7), 0.0, parent_msg_id="nudge", iopub=False)
    counters.sent("again")
    counters.saw(mid(9), 1.0, parent_msg_id="again", execution_state="busy")
    counters.saw(mid(10), 1.0, parent_msg_id="again", iopub=False)
    counters.saw(mid(11), 1.0, parent_msg_id="again", execution_state="idle")
    assert counters.poll(20.0) is None
    # From the first IOPub message on, a missing number is a hole as ever.
    counters.saw(mid(13), 20.0)
    assert counters.poll(40.0) == Lost(1, False, 12, 12, ((12, 12),))


def test_missed_while_away_counts_every_number_not_received_up_to_the_first_after() -> None:
    """A kernel re-attached after a restart of the gateway: what it numbered between the
    last message recorded and the first one received after is at most that many."""
    known = [f"{KEY}_{n}" for n in range(100)]  # jupyter_client counts from 0
    assert missed_while_away(known, f"{KEY}_100") == 0
    assert missed_while_away(known, f"{KEY}_150") == 50
    # A number below the highest that had not arrived yet (ipykernel numbers in two
    # threads) is counted too: an upper bound, never less than what was missed.
    assert missed_while_away([k for k in known if not k.endswith("_98")], f"{KEY}_150") == 51
    # ... but only near the highest: older holes (replies to other clients) are not.
    sparse = [f"{KEY}_{n}" for n in range(1, 5001, 2)]
    assert missed_while_away(sparse, f"{KEY}_5001", window=10) == 6  # 4990, 4992 ... 5000


def test_missed_while_away_cannot_tell_across_sessions_or_forms() -> None:
    known = [f"{KEY}_{n}" for n in range(1, 11)]
    assert missed_while_away(known, "another-session-key_5") is None  # restarted meanwhile
    assert missed_while_away(known, "not-numbered") is None
    assert missed_while_away([], f"{KEY}_3") is None
    assert missed_while_away(known, f"{KEY}_7") is None  # below what it had
