"""Invariant 8, as a property: whatever a kernel sends, if it is correctly signed, what
the gateway writes about it is valid JSON and valid SSE, on every surface.

Kernels run untrusted code, and that code holds the session key: it can sign anything.
Each example is a message of odd but signed parts (empty, not objects, NaN, lone
surrogates, control characters, deep nesting, line breaks in names), decoded the way the
Tap decodes it (a placeholder when it is not a message at all), turned into frames alone
and merged, and written in every format the gateway has: legacy JSON, v1, SSE, the
execute API's events and the transcript's JSON.
"""

from __future__ import annotations

import json
from typing import Any

from helpers import signed_frames
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kernel_gateway_stream.core.errors import InvalidMessage
from kernel_gateway_stream.core.frames import Frame, merge_runs
from kernel_gateway_stream.core.messages import (
    KernelMessage,
    Record,
    Signer,
    decode_zmq_message,
    invalid_placeholder,
)
from kernel_gateway_stream.core.wire import Protocol, decode_v1, encode_record_json

KEY = b"kernel-key"


def _strict(raw: bytes) -> Any:
    """Parse as a browser would: UTF-8 and RFC 8259 only."""
    return json.loads(raw.decode("utf-8"), parse_constant=_refuse)


def _refuse(name: str) -> Any:
    raise AssertionError(f"{name} is not JSON")


_texts = st.text(
    alphabet=st.characters(codec=None, exclude_categories=()), max_size=20
) | st.sampled_from(["\ud800", "a\udfffb", "\x00\x1f", "\r\n", "\u2028", "é✓\U0001f600"])
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_texts, inner, max_size=3),
    max_leaves=8,
)


def _dump(value: Any) -> bytes:
    try:
        return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    except (ValueError, UnicodeEncodeError):
        return json.dumps(value).encode()


_odd_parts = st.one_of(
    st.just(b""),
    st.just(b"{}"),
    st.sampled_from([b"null", b"[]", b"3", b'"x"', b"{", b"{}}", b"\xff\xfe", b'{"a": NaN}']),
    st.just(b"[" * 3000 + b"]" * 3000),
    _json_values.map(_dump),
    st.dictionaries(_texts, _json_values, max_size=4).map(_dump),
    st.binary(max_size=30),
)
_msg_types = st.sampled_from(["stream", "status", "display_data", "error"]) | _texts


#: What a parent header and a content can be. Built once, not in every draw: a strategy
#: made inside ``odd_messages`` was made again for every example, and Hypothesis worked
#: out again, each time, what it can draw (most of this test's time, once).
_parents = st.one_of(
    _odd_parts,
    st.builds(lambda i: _dump({"msg_id": i, "msg_type": "execute_request"}), _texts),
)
_contents = st.one_of(
    _odd_parts,
    st.builds(lambda n, t: _dump({"name": n, "text": t}), _texts, _texts),
    st.builds(
        lambda t: b'{"name": "stdout", "text": "' + t.encode("utf-8", "replace") + b'"}',
        _texts,
    ),
)
_buffers = st.lists(st.binary(max_size=8), max_size=1)


@st.composite
def odd_messages(draw: Any) -> list[bytes]:
    """The four JSON parts (and maybe a buffer) of a message a kernel could sign."""
    header: dict[str, Any] = {"msg_id": draw(_texts), "msg_type": draw(_msg_types)}
    if draw(st.booleans()):
        header["date"] = draw(_json_values)
    # The header as drawn, or an odd part in its place (half the time each).
    raw_header = _dump(header) if draw(st.booleans()) else draw(_odd_parts)
    parent = draw(_parents)
    content = draw(_contents)
    buffers = draw(_buffers)
    return [raw_header, parent, draw(_odd_parts), content, *buffers]


def decode_as_the_tap_does(parts: list[bytes]) -> KernelMessage:
    try:
        return decode_zmq_message(signed_frames(parts, KEY), Signer(KEY))
    except InvalidMessage as error:
        return invalid_placeholder(error, date="2026-01-01T00:00:00Z", session="gateway")


def assert_valid_everywhere(frame: Frame, record: Record) -> None:
    legacy, binary = frame.encode(Protocol.LEGACY)
    if binary:  # [count][offsets...][JSON][buffers...], 32-bit big-endian
        count = int.from_bytes(legacy[:4], "big")
        offsets = [int.from_bytes(legacy[4 * i : 4 * i + 4], "big") for i in range(1, count + 1)]
        _strict(legacy[offsets[0] : offsets[1] if count > 1 else len(legacy)])
    else:
        assert _strict(legacy)["header"]["msg_type"] == frame.message.msg_type
    channel, parts = decode_v1(frame.encode(Protocol.V1)[0])
    assert channel == "iopub"
    for part in parts[:4]:
        assert isinstance(_strict(part), dict)
    for protocol in (Protocol.SSE, Protocol.EXECUTION):
        event = frame.encode(protocol)[0]
        if not event:
            continue  # not an event of the execute API
        assert event.endswith(b"\n\n")
        assert event.count(b"\n\n") == 1
        fields: dict[bytes, list[bytes]] = {}
        for line in event[:-2].split(b"\n"):
            name, _, value = line.partition(b": ")
            fields.setdefault(name, []).append(value)
        assert set(fields) <= {b"id", b"event", b"data"}
        assert len(fields[b"event"]) == 1
        assert len(fields.get(b"id", [])) <= 1
        assert fields[b"id"] == [str(frame.last_seq).encode()]
        _strict(b"\n".join(fields[b"data"]))
    transcript = _strict(encode_record_json(record))
    assert transcript["seq"] == record.seq


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(odd_messages(), min_size=1, max_size=4))
# Found by Hypothesis: a header that is a bare Infinity (or NaN) was "repaired" to null.
@example(batch=[[b"Infinity", b"", b"", b""]])
@example(batch=[[b"NaN", b"{}", b"{}", b"{}"]])
def test_whatever_a_kernel_signs_the_gateway_writes_valid_json(batch: list[list[bytes]]) -> None:
    """Invariants 1 and 8: every signed message keeps a slot (a placeholder if need be),
    and every frame made of it, alone or merged with its neighbours, encodes to valid
    JSON in every protocol, and to exactly one SSE event with the right id."""
    records = [
        Record("k", seq, float(seq), decode_as_the_tap_does(parts))
        for seq, parts in enumerate(batch, start=1)
    ]
    frames = [Frame.from_record(record) for record in records]
    for frame, record in zip(frames, records, strict=True):
        assert_valid_everywhere(frame, record)
    for merged in merge_runs(frames, 1 << 20):
        assert merged.first_seq is not None
        assert_valid_everywhere(merged, records[merged.first_seq - 1])
