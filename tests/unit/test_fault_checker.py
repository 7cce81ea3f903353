"""tests/faults/checker.py on synthetic histories: each broken rule is found, a clean
history gives zeros."""

from __future__ import annotations

import json

from tests.faults.checker import (
    Burst,
    Closed,
    Delivery,
    Event,
    Fault,
    Gap,
    HealthSample,
    History,
    Outage,
    check,
)

RUN = "run-1"
IDLE = json.dumps({"execution_state": "idle"}, sort_keys=True)


def line(seq: int, number: int, at: float = 0.0) -> Delivery:
    return Delivery(seq, seq, "stream", RUN, f"{number}\n", at)


def idle(seq: int) -> Delivery:
    return Delivery(seq, seq, "status", RUN, IDLE)


#: The kernel printed lines 0..9 at times 0..9 (one a second).
BURST = Burst(RUN, 0, 10, 0.0, 10.0)
FAULTS = [Fault("owner_pause", "a", 4.5, 6.0)]


def clean_transcript() -> History:
    return History("transcript", (*(line(seq, seq - 1) for seq in range(1, 11)), idle(11)))


def merged(first: int, last: int, at: float = 0.0) -> Delivery:
    text = "".join(f"{seq - 1}\n" for seq in range(first, last + 1))
    return Delivery(first, last, "stream", RUN, text, at)


def test_a_clean_run_counts_nothing() -> None:
    transcript = clean_transcript()
    # One client got it all in merged frames, one was closed and resumed.
    one = History("a", (merged(1, 4), merged(5, 10), idle(11)))
    two = History("b", (*transcript.events[:3], Closed(1001, "gateway_shutdown"),
                        *transcript.events[3:]))  # fmt: skip
    report = check([one, two], transcript, [BURST], FAULTS)
    assert report.total.broken() == {}, report.examples
    assert report.total.lines_lost == report.total.lines_missing_on_clients == 0
    assert report.total.never_ended_on_clients == 0
    assert report.by_kind["owner_pause"].faults == 1


def test_a_fork_is_found() -> None:
    transcript = clean_transcript()
    # The paused owner numbered line 5 as seq 5 for its client; the transcript has line 4.
    events = list(transcript.events)
    events[4] = line(5, 5, at=5.0)
    report = check([History("a", tuple(events))], transcript, [BURST], FAULTS)
    assert report.total.forks == 1
    assert report.by_kind["owner_pause"].forks == 1


def test_a_seq_with_nothing_in_the_transcript_is_a_fork() -> None:
    transcript = History("transcript", clean_transcript().events[:-1])
    client = History("a", (*transcript.events, Delivery(11, 11, "stream", RUN, "99\n")))
    assert check([client], transcript, [BURST]).total.forks == 1


def test_a_reused_seq_is_found() -> None:
    transcript = clean_transcript()
    # Seq 7 reached client a as line 6 and client b as other output.
    other = Delivery(7, 7, "stream", "later", "after\n", 7.0)
    b_events = [*transcript.events[:6], other, *transcript.events[7:]]
    report = check(
        [History("a", transcript.events), History("b", tuple(b_events))],
        transcript,
        [BURST],
        FAULTS,
    )
    assert report.total.reused_seqs == 1
    # Frames merged differently over the same lines are no reuse.
    report = check(
        [History("a", transcript.events), History("c", (merged(1, 5), merged(6, 10), idle(11)))],
        transcript,
        [BURST],
    )
    assert report.total.reused_seqs == 0


def test_merges_that_meet_on_a_record_without_a_whole_line_are_no_reuse() -> None:
    """The kernel sent a line's newline as a message of its own (seq 5: "\n"): one client
    got it at the end of a merged frame, another at the start of the next. Both frames are
    what the transcript holds, so no two claims on seq 5 differ (a fault run counted it as
    a reused seq: the two frames have no line in common)."""
    events = [line(seq, seq - 1) for seq in range(1, 5)]
    events += [Delivery(5, 5, "stream", RUN, "\n"), *(line(s, s - 2) for s in range(6, 11))]
    transcript = History("transcript", (*events, idle(11)))
    texts = [e.payload for e in events]
    a = History("a", (Delivery(1, 5, "stream", RUN, "".join(texts[:5])), *events[5:], idle(11)))
    b = History("b", (*events[:4], Delivery(5, 10, "stream", RUN, "".join(texts[4:])), idle(11)))
    report = check([a, b], transcript, [Burst(RUN, 0, 9, 0.0, 9.0)])
    assert report.total.broken() == {}, report.examples
    # The same two frames with the transcript lost (Redis forgot it) cannot be told apart
    # from a reuse: counted.
    lost = History("transcript", ())
    assert check([a, b], lost, []).total.reused_seqs == 1


def test_a_silent_loss_is_found() -> None:
    transcript = clean_transcript()
    # The client skipped seqs 6 and 7 (lines 5, 6) with no gap.
    events = [e for e in transcript.events if not (isinstance(e, Delivery) and e.seq in (6, 7))]
    report = check([History("a", tuple(events))], transcript, [BURST], FAULTS)
    assert report.total.silent_loss == 2
    assert report.by_kind["owner_pause"].silent_loss == 2
    assert report.total.lines_missing_on_clients == 2
    # The same with a gap record between: loss, not silent.
    with_gap = [*events[:5], Gap(6, 7, "owner_lost"), *events[5:]]
    report = check([History("a", tuple(with_gap))], transcript, [BURST], FAULTS)
    assert report.total.silent_loss == 0
    assert report.total.lines_missing_on_clients == 2


def test_a_silent_loss_in_the_transcript_is_found() -> None:
    # Lines 3..5 were never recorded and the numbering went on (seqs 4.. hold lines 6..).
    events = (*(line(s, s - 1) for s in range(1, 4)), *(line(s, s + 2) for s in range(4, 8)))
    transcript = History("transcript", (*events, idle(8)))
    report = check([], transcript, [BURST])
    assert report.total.silent_loss == 3
    assert report.total.lines_lost == 3


def test_an_understated_gap_is_found() -> None:
    # Lines 2..8 lost behind a gap of one number that gives no count.
    events = (line(1, 0), line(2, 1), Gap(3, 3, "owner_lost"), line(4, 9), idle(5))
    transcript = History("transcript", events)
    report = check([History("a", events)], transcript, [BURST])
    assert report.total.understated_gaps == 2  # the transcript's and the client's
    assert report.total.lines_lost == 7
    assert report.total.silent_loss == 0
    # The same gap saying how many were lost, or that it does not know: not understated.
    for lost in (7, -1):
        events = (line(1, 0), line(2, 1), Gap(3, 3, "owner_lost", lost), line(4, 9), idle(5))
        transcript = History("transcript", events)
        assert check([History("a", events)], transcript, [BURST]).total.understated_gaps == 0


def test_an_execution_that_never_ends_is_found() -> None:
    transcript = History("transcript", clean_transcript().events[:-1])
    client = History("a", clean_transcript().events)
    report = check([client, History("b", transcript.events)], transcript, [BURST])
    assert report.total.never_ended == 1
    assert report.total.never_ended_on_clients == 1


def test_an_execution_lost_whole_behind_a_gap_is_not_one_that_never_ends() -> None:
    # Redis forgot everything of the burst (its busy, lines and idle): the transcript has
    # a gap where all of it was, and nothing that shows it running.
    faults = [Fault("redis_restart", "redis", 17.0, 18.0)]
    lost = History("transcript", (Gap(1, 11, "store_lost", at=17.5),))
    report = check([], lost, [BURST], faults)
    assert report.total.never_ended == 0
    assert report.by_kind["redis_restart"].lost_whole == 1
    assert report.total.lines_lost == 10
    # Without the gap, the same burst is silent loss and an execution that never ended.
    report = check([], History("transcript", ()), [BURST], faults)
    assert report.total.never_ended == 1
    assert report.total.lost_whole == 0
    # With a line of it left, it shows running: it never ended.
    some = History("transcript", (Gap(1, 9, "store_lost", at=17.5), line(10, 9)))
    report = check([], some, [BURST], faults)
    assert (report.total.never_ended, report.total.lost_whole) == (1, 0)


def test_a_delivery_the_transcript_holds_as_a_gap_is_counted_apart() -> None:
    transcript = History("transcript", (*clean_transcript().events[:5], Gap(6, 6, "store_lost"),
                                        *clean_transcript().events[6:]))  # fmt: skip
    report = check([History("a", clean_transcript().events)], transcript, [BURST])
    assert report.total.delivered_not_durable == 1
    assert report.total.forks == 0


def test_health_ok_while_a_node_could_not_write_is_found() -> None:
    outages = [Outage("a", 10.0, 20.0, "node_cut"), Outage("*", 30.0, 40.0, "redis_pause")]
    samples = [
        HealthSample("a", 10.5, "ok"),  # within the grace
        HealthSample("a", 12.0, "ok"),  # found
        HealthSample("b", 12.0, "ok"),  # b could write
        HealthSample("a", 15.0, "degraded"),
        HealthSample("c", 35.0, "ok"),  # found
    ]
    report = check([], clean_transcript(), [BURST], health=samples, outages=outages, grace=1.0)
    assert report.total.health_ok_while_failing == 2
    assert report.by_kind["node_cut"].health_ok_while_failing == 1


def test_lines_behind_a_gap_count_for_the_fault_that_made_the_gap() -> None:
    # Lines 0..4, printed before any fault, lost behind a gap recorded during the second.
    faults = [Fault("owner_kill", "a", 1.0, 2.0), Fault("redis_kill", "redis", 7.0, 8.0)]
    events: tuple[Event, ...] = (
        Gap(1, 5, "store_lost", at=7.5),
        *(line(s, s - 1) for s in range(6, 11)),
        idle(11),
    )
    report = check([], History("transcript", events), [BURST], faults)
    assert report.by_kind["redis_kill"].lines_lost == 5
    assert report.by_kind["owner_kill"].lines_lost == 0


def test_lines_behind_several_gaps_count_for_the_one_that_says_the_most() -> None:
    # A takeover's gap of one seq (during owner_pause), then Redis forgot lines 0..7 (its
    # gaps around an idle it had kept): the missing run is Redis's, not the takeover's.
    faults = [Fault("owner_pause", "a", 1.0, 2.0), Fault("redis_restart", "redis", 7.0, 8.0)]
    events: tuple[Event, ...] = (
        Gap(1, 1, "owner_lost", at=1.5),
        Gap(2, 8, "store_lost", at=7.5),
        *(line(s, s - 1) for s in range(9, 11)),
        idle(11),
    )
    report = check([], History("transcript", events), [BURST], faults)
    assert report.by_kind["redis_restart"].lines_lost == 8
    assert report.by_kind["owner_pause"].lines_lost == 0


def test_an_end_lost_in_a_gap_counts_for_the_fault_that_made_the_gap() -> None:
    faults = [Fault("owner_kill", "a", 1.0, 2.0), Fault("redis_kill", "redis", 17.0, 18.0)]
    # The burst ended at 10 (during owner_kill); its idle is in a gap recorded at 17.5.
    events: tuple[Event, ...] = (
        *(line(s, s - 1) for s in range(1, 11)),
        Gap(11, 11, "store_lost", at=17.5),
    )
    report = check([], History("transcript", events), [BURST], faults)
    assert report.by_kind["redis_kill"].never_ended == 1
    assert "owner_kill" not in report.by_kind or not report.by_kind["owner_kill"].never_ended


def test_what_was_durable_before_redis_forgot_it_is_still_checked() -> None:
    before = clean_transcript()
    # Redis restarted empty: everything is one gap now.
    after = History("transcript", (Gap(1, 11, "store_lost", at=20.0),))
    events = list(before.events)
    events[3] = line(4, 77, at=3.0)
    report = check([History("a", tuple(events))], after, [BURST], earlier=[before])
    assert report.total.forks == 1
    assert report.total.delivered_not_durable == 0
    # And a seq that was durable as one thing and then as another is a reused seq.
    rewritten = History("transcript", (*before.events[:3], line(4, 77), *before.events[4:]))
    report = check([], rewritten, [BURST], earlier=[before])
    assert report.total.reused_seqs == 1
