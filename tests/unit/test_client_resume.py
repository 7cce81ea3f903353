"""When and where the client resumes an event stream, driven as the clients drive it, with
``now`` and the jitter passed in: no event loop, no sockets."""

from __future__ import annotations

import json

import pytest

from kernel_gateway_stream.client import GatewayHTTPError, GatewayUnreachable, NotFound
from kernel_gateway_stream.client.resume import Backoff, Reconnect, ResumableStream

URL = "http://gateway.test"
ENDS = frozenset({"kernel_shutdown"})


def sse(event: str, data: object, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def opened(since: int | None = None, backoff: Backoff | None = None) -> ResumableStream:
    """A stream whose first connection the gateway has answered."""
    stream = ResumableStream("/s", since, ends_with=ENDS, backoff=backoff or Backoff())
    stream.connect()
    stream.answered(200, b"")
    return stream


def test_backoff_doubles_up_to_its_cap_with_equal_jitter() -> None:
    backoff = Backoff(first_delay=0.1, max_delay=1.0)
    assert [backoff.delay(attempt, 0.999999) for attempt in range(1, 7)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    )
    assert [backoff.delay(attempt, 0.0) for attempt in range(1, 7)] == pytest.approx(
        [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]
    )
    assert backoff.delay(10_000, 0.5) == pytest.approx(0.75)  # no overflow


def test_a_first_connection_that_fails_fails_at_once() -> None:
    stream = ResumableStream("/s", None, ends_with=ENDS, backoff=Backoff())
    stream.connect()
    with pytest.raises(GatewayUnreachable) as unreachable:
        stream.failed(URL, ConnectionRefusedError(111, "Connection refused"))
    assert str(unreachable.value) == (
        "cannot reach the gateway at http://gateway.test: "
        "ConnectionRefusedError: [Errno 111] Connection refused"
    )
    assert isinstance(unreachable.value.__cause__, ConnectionRefusedError)


def test_an_error_answer_is_raised_not_retried() -> None:
    stream = ResumableStream("/s", None, ends_with=ENDS, backoff=Backoff())
    stream.connect()
    with pytest.raises(NotFound):
        stream.answered(404, b'{"reason": "unknown_kernel", "message": "no"}')
    with pytest.raises(GatewayHTTPError):
        stream.answered(503, b"")  # before the gateway ever answered


def test_resumes_after_the_last_id_with_last_event_id() -> None:
    stream = opened(since=3)
    assert stream.connect()["Last-Event-ID"] == "3"
    stream.answered(200, b"")
    events = stream.feed(sse("stream", {"n": 4}, 4) + sse("stream", {"n": 5}, 5))
    assert [event.id for event in events] == [4, 5]
    stream.failed(URL, OSError("reset"))
    reconnect = stream.reconnect(URL, now=100.0, jitter=0.5)
    assert reconnect == Reconnect(
        "/s", 1, pytest.approx(0.075), 5, "lost the connection (OSError: reset)"
    )
    assert stream.connect()["Last-Event-ID"] == "5"


def test_an_outage_backs_off_then_gives_up_at_the_deadline() -> None:
    stream = opened(backoff=Backoff(first_delay=1.0, max_delay=4.0, give_up_after=10.0))
    stream.failed(URL, OSError("reset"))
    now, delays = 50.0, []

    def retry() -> None:
        nonlocal now
        delay = stream.reconnect(URL, now, jitter=0.999999).delay
        delays.append(delay)
        now += delay
        stream.connect()
        stream.failed(URL, ConnectionRefusedError("refused"))

    for _ in range(4):
        retry()
    with pytest.raises(GatewayUnreachable) as gave_up:
        retry()
    assert delays == pytest.approx([1.0, 2.0, 4.0, 3.0], abs=1e-3)  # the last: the deadline
    assert (
        "gave up after 4 retries in 10.0 s; lost the connection (ConnectionRefusedError: refused)"
        in str(gave_up.value)
    )


def test_max_attempts_also_ends_an_outage() -> None:
    stream = opened(backoff=Backoff(max_attempts=2))
    for _ in range(2):
        stream.failed(URL, OSError("reset"))
        stream.reconnect(URL, 0.0, 0.0)
    with pytest.raises(GatewayUnreachable):
        stream.reconnect(URL, 0.0, 0.0)


def test_progress_ends_an_outage() -> None:
    """An event (or a keep-alive comment) starts the count again: a stream that works for
    an hour and then drops is not given up at once."""
    stream = opened(backoff=Backoff(first_delay=1.0, give_up_after=10.0))
    stream.failed(URL, OSError("reset"))
    assert stream.reconnect(URL, 0.0, 0.999999).attempt == 1
    stream.connect()
    stream.answered(200, b"")
    stream.feed(b": keepalive\n\n")
    stream.failed(URL, OSError("reset"))
    reconnect = stream.reconnect(URL, 3600.0, 0.999999)
    assert (reconnect.attempt, reconnect.delay) == (1, pytest.approx(1.0))


def test_an_answered_stream_that_only_fails_again_keeps_counting() -> None:
    """A 200 alone is no progress: a gateway that answers and hangs up at once is still
    given up on at the deadline."""
    stream = opened(backoff=Backoff(give_up_after=5.0))
    stream.failed(URL, OSError("reset"))
    stream.reconnect(URL, 0.0, 0.0)
    stream.connect()
    stream.answered(200, b"")
    stream.feed(b"")
    with pytest.raises(GatewayUnreachable):
        stream.reconnect(URL, 6.0, 0.0)


def test_slow_consumer_resumes_at_once_from_last_seq() -> None:
    stream = opened(since=0)
    chunk = sse("stream", {}, 7) + sse("slow_consumer", {"reason": "x", "last_seq": 9}) + b"junk"
    events = stream.feed(chunk)
    assert [event.event for event in events] == ["stream"]  # the control event is kept back
    assert stream.connection_over
    assert not stream.finished
    assert stream.reconnect(URL, 0.0, 0.5) == Reconnect(
        "/s", 0, 0.0, 9, "the gateway dropped the stream as too slow a reader (slow_consumer)"
    )


@pytest.mark.parametrize(
    ("since", "chunk", "attempt", "resume_after"),
    [
        pytest.param(4, sse("slow_consumer", {"reason": "x", "last_seq": 4}), 1, 4,
                     id="slow_consumer with nothing delivered backs off"),
        pytest.param(0, sse("stream", {}, 3) + sse("gateway_shutdown", {"last_seq": 3}), 1, 3,
                     id="gateway_shutdown resumes after a pause"),
        pytest.param(10, sse("gateway_shutdown", {"reason": "x", "last_seq": 2}), 1, 10,
                     id="a last_seq behind the cursor does not move it back"),
        pytest.param(0, sse("gateway_shutdown", {"last_seq": 7}), 1, 7,
                     id="a last_seq ahead (a filtered stream) moves it on"),
    ],
)  # fmt: skip
def test_control_events(since: int, chunk: bytes, attempt: int, resume_after: int) -> None:
    stream = opened(since=since)
    stream.feed(chunk)
    reconnect = stream.reconnect(URL, 0.0, 0.0)
    assert (reconnect.attempt, reconnect.since) == (attempt, resume_after)
    assert stream.connect()["Last-Event-ID"] == str(resume_after)


def test_kernel_shutdown_is_delivered_and_ends_the_stream() -> None:
    stream = opened(since=0)
    events = stream.feed(sse("stream", {}, 1) + sse("kernel_shutdown", {}) + sse("x", {}, 2))
    assert [(event.event, event.id) for event in events] == [
        ("stream", 1),
        ("kernel_shutdown", 1),  # the id persists (no id field of its own)
    ]
    assert stream.finished


def test_an_unknown_final_event_is_delivered_and_the_stream_resumed() -> None:
    stream = opened(since=0)
    events = stream.feed(sse("stream", {}, 1) + sse("gateway_moving", {"last_seq": 1}))
    assert [event.event for event in events] == ["stream", "gateway_moving"]
    assert not stream.finished
    reconnect = stream.reconnect(URL, 0.0, 0.0)  # the gateway ended the response
    assert (reconnect.attempt, reconnect.since) == (1, 1)


def test_a_proxy_error_while_resuming_is_retried() -> None:
    stream = opened()
    stream.failed(URL, OSError("reset"))
    stream.reconnect(URL, 0.0, 0.0)
    stream.connect()
    stream.answered(503, b"Service Unavailable")
    assert stream.connection_over
    assert "HTTP 503" in stream.reconnect(URL, 0.1, 0.0).reason


def test_an_event_whose_data_is_not_json_is_an_error() -> None:
    stream = opened()
    with pytest.raises(Exception, match="not JSON"):
        stream.feed(b"event: stream\ndata: {nope\n\n")


def test_a_server_error_at_the_same_place_ends_the_stream_instead_of_looping() -> None:
    """The gateway failing on what a resume replays: three connections in a row end with
    ``server_error`` after seq 5, and the stream fails with a clear 500, not for ever."""
    stream = opened(since=0)
    failure = sse("server_error", {"reason": "server_error", "last_seq": 5, "message": "boom"})
    events = stream.feed(sse("stream", {}, 5) + failure)
    assert [event.event for event in events] == ["stream"]  # the control event is kept back
    for attempt in (1, 2):
        reconnect = stream.reconnect(URL, float(attempt), 0.0)  # the gateway closed it
        assert (reconnect.since, reconnect.reason) == (5, "the gateway failed (boom)")
        assert reconnect.attempt == attempt
        stream.connect()
        stream.answered(200, b"")
        assert stream.feed(failure) == []
    with pytest.raises(GatewayHTTPError) as raised:
        stream.reconnect(URL, 3.0, 0.0)
    assert (raised.value.status, raised.value.reason) == (500, "server_error")
    assert "after seq 5: boom" in str(raised.value)


def test_a_server_error_that_moves_on_is_resumed() -> None:
    """Each failure further on (progress in between) counts afresh."""
    stream = opened(since=0)
    for seq in range(1, 6):
        stream.feed(sse("stream", {}, seq) + sse("server_error", {"message": "x"}))
        stream.reconnect(URL, float(seq), 0.0)
        stream.connect()
        stream.answered(200, b"")
    assert stream.cursor == 5


def test_a_server_error_followed_by_the_last_event_ends_the_stream_normally() -> None:
    """The execute API's summary that could not be written whole: ``server_error`` then
    ``done``; the stream is over, with ``done`` delivered."""
    stream = ResumableStream("/e", 0, ends_with=frozenset({"done"}), backoff=Backoff())
    stream.connect()
    stream.answered(200, b"")
    events = stream.feed(sse("server_error", {"message": "x"}) + sse("done", {"status": "ok"}, 9))
    assert [event.event for event in events] == ["done"]
    assert stream.finished


@pytest.mark.parametrize("status", [400, 404, 409, 500, 501])
def test_an_error_answer_on_a_resumed_stream_is_raised_at_once(status: int) -> None:
    stream = opened(since=0)
    stream.failed(URL, OSError("reset"))
    stream.reconnect(URL, 0.0, 0.0)
    stream.connect()
    with pytest.raises(GatewayHTTPError) as raised:
        stream.answered(status, b'{"reason": "r", "message": "m"}')
    assert raised.value.status == status
