"""How the IOPub source takes one message off its socket (``zmq_kernel._receive``), on a real
PUB and XSUB pair: every frame as sent, in order; the small ones copied out as bytes; a
content or buffer frame past :data:`ZERO_COPY_FROM` kept as a view of libzmq's buffer (held
once); identities before the delimiter and a message without one taken as they are (the
intake judges them); ``zmq.Again`` when nothing is queued, so the reader stops there."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from kernel_gateway_stream.core.messages import DELIMITER
from kernel_gateway_stream.kernels.zmq_kernel import ZERO_COPY_FROM, _receive


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    context = zmq.Context()
    publisher = context.socket(zmq.PUB)
    subscriber = context.socket(zmq.XSUB)
    address = f"inproc://receive-{id(context)}"
    publisher.bind(address)
    subscriber.connect(address)
    subscriber.send(b"\x01")
    # The subscription reaches the PUB socket when it next processes its commands.
    deadline = time.monotonic() + 10
    while True:
        publisher.send_multipart([b"probe"])
        if subscriber.poll(10):
            subscriber.recv_multipart()
            break
        assert time.monotonic() < deadline, "the subscription never arrived"
    yield publisher, subscriber
    publisher.close(linger=0)
    subscriber.close(linger=0)
    context.term()


def received(subscriber: zmq.Socket[bytes]) -> list[bytes | memoryview]:
    assert subscriber.poll(10_000), "nothing arrived"
    return _receive(subscriber.recv)


def test_small_frames_come_as_bytes_in_order(pair: tuple[zmq.Socket[bytes], ...]) -> None:
    publisher, subscriber = pair
    sent = [b"kernel.x.stream", DELIMITER, b"sig", b"{}", b"{}", b"{}", b'{"text":"1"}', b"buf"]
    publisher.send_multipart(sent)
    frames = received(subscriber)
    assert frames == sent
    assert all(type(frame) is bytes for frame in frames)


def test_a_large_content_or_buffer_is_a_view_and_a_large_header_is_copied(
    pair: tuple[zmq.Socket[bytes], ...],
) -> None:
    publisher, subscriber = pair
    big = ZERO_COPY_FROM + 1
    header, content, buffer = b"h" * big, b"c" * big, b"b" * big
    sent = [DELIMITER, b"sig", header, b"{}", b"{}", content, b"small", buffer]
    publisher.send_multipart(sent)
    frames = received(subscriber)
    assert [bytes(frame) for frame in frames] == sent
    kinds = [type(frame) for frame in frames]
    assert kinds == [bytes, bytes, bytes, bytes, bytes, memoryview, bytes, memoryview]
    exactly = [DELIMITER, b"sig", b"{}", b"{}", b"{}", b"x" * ZERO_COPY_FROM]
    publisher.send_multipart(exactly)
    assert all(type(frame) is bytes for frame in received(subscriber))


def test_identities_and_messages_without_a_delimiter_are_taken_whole(
    pair: tuple[zmq.Socket[bytes], ...],
) -> None:
    publisher, subscriber = pair
    big = b"x" * (ZERO_COPY_FROM + 1)
    # Before the delimiter nothing is known to be content: every frame is copied.
    for sent in ([b"a", b"b", big, DELIMITER, b"s", b"h", b"p", b"m", big], [big, big], [b""]):
        publisher.send_multipart(sent)
        frames = received(subscriber)
        assert [bytes(frame) for frame in frames] == sent
    assert type(frames[0]) is bytes


def test_an_empty_socket_raises_again_and_the_next_message_is_read_whole(
    pair: tuple[zmq.Socket[bytes], ...],
) -> None:
    publisher, subscriber = pair
    with pytest.raises(zmq.Again):
        _receive(subscriber.recv)
    publisher.send_multipart([DELIMITER, b"s", b"h", b"p", b"m", b"c"])
    publisher.send_multipart([DELIMITER, b"s2", b"h", b"p", b"m", b"c"])
    assert received(subscriber)[1] == b"s"
    assert _receive(subscriber.recv)[1] == b"s2"
    with pytest.raises(zmq.Again):
        _receive(subscriber.recv)
