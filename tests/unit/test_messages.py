"""Kernel messages: decoding signed ZMQ frames, peeking routing fields, keeping raw parts.

Invariants 2 and 8: the raw JSON parts are kept byte for byte (nothing re-encoded on the
way to the transcript), and bad input raises a clear RemoteError, never anything else.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

import pytest
from helpers import (
    header_bytes,
    make_message,
    make_parts,
    signed_frames,
    stream,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from jupyter_client.session import Session

from kernel_gateway_stream.core.errors import (
    BadSignature,
    InvalidMessage,
    MalformedMessage,
    RemoteError,
)
from kernel_gateway_stream.core.messages import (
    INVALID_MSG_TYPE,
    KernelMessage,
    Signer,
    _object,
    _plain_object,
    decode_zmq_message,
    dumps_json,
    dumps_stream_content,
    invalid_placeholder,
    peek_stream,
    split_identities,
)

KEY = b"a-session-key"
HEADER_STREAM = json.dumps({"msg_id": "m1", "msg_type": "stream"}).encode()


def test_decode_stream_message_peeks_routing_fields_and_keeps_raw_parts() -> None:
    """Invariant 2: decoding keeps every part byte for byte and peeks only routing fields."""
    parts = make_parts(
        "stream",
        {"name": "stderr", "text": "héllo\n"},
        parent_msg_id="exec-1",
        metadata={"m": 1},
        msg_id="out-1",
    )
    message = decode_zmq_message(signed_frames(parts, KEY), Signer(KEY))

    assert message.msg_type == "stream"
    assert message.msg_id == "out-1"
    assert message.parent_msg_id == "exec-1"
    assert message.stream_name == "stderr"
    assert message.text == "héllo\n"
    assert message.is_stream is True
    assert message.parts() == parts
    assert (
        message.raw_header,
        message.raw_parent_header,
        message.raw_metadata,
        message.raw_content,
    ) == tuple(parts)
    assert message.buffers == ()
    assert message.size == sum(len(part) for part in parts)
    assert message.content() == {"name": "stderr", "text": "héllo\n"}
    assert message.header()["msg_id"] == "out-1"


def test_decode_keeps_buffers_and_identities_are_split_off() -> None:
    """Invariant 2: binary buffers after the content are kept, in order, unsigned."""
    buffers = (b"\x00\x01binary", b"", b"\xff" * 3)
    parts = make_parts("display_data", {"data": {}}, "exec-2", msg_id="d-1", buffers=buffers)
    frames = signed_frames(parts, KEY, identities=(b"id-a", b"id-b"))

    identities, rest = split_identities(frames)
    message = decode_zmq_message(frames, Signer(KEY))

    assert identities == [b"id-a", b"id-b"]
    assert rest[1:] == parts
    assert message.buffers == buffers
    assert message.parts() == parts
    assert message.stream_name is None
    assert message.text is None
    assert message.is_stream is False
    assert message.size == sum(len(part) for part in parts)


def test_decode_reads_what_jupyter_client_session_sends() -> None:
    """Invariant 2: frames serialized and signed by jupyter_client's Session decode as sent."""
    session = Session(key=KEY)
    parent = session.msg_header("execute_request")
    msg = session.msg("stream", content={"name": "stdout", "text": "1\n2\n"}, parent=parent)
    frames = session.serialize(msg, ident=b"stream.stdout")

    message = decode_zmq_message(frames, Signer(KEY))

    assert message.msg_id == msg["header"]["msg_id"]
    assert message.parent_msg_id == parent["msg_id"]
    assert message.stream_name == "stdout"
    assert message.text == "1\n2\n"
    assert message.parts() == frames[3:]


def test_signer_signs_like_jupyter_client_session() -> None:
    """Invariant 8: our HMAC is the messaging spec's (the one jupyter_client computes)."""
    parts = make_parts("status", {"execution_state": "busy"}, "exec-3")
    assert Signer(KEY).sign(parts) == Session(key=KEY).sign(parts)
    assert Signer(KEY).sign(parts) == signed_frames(parts, KEY)[2]


def test_bad_signature_is_rejected() -> None:
    """Invariant 8: a signature that does not match the session key raises BadSignature."""
    parts = make_parts("status", {"execution_state": "idle"}, "exec-4")
    frames = signed_frames(parts, b"another-key")
    with pytest.raises(BadSignature, match="signature does not match"):
        decode_zmq_message(frames, Signer(KEY))


def test_tampered_content_is_rejected() -> None:
    """Invariant 8: changing a signed part after signing raises BadSignature."""
    parts = make_parts("stream", {"name": "stdout", "text": "a"}, "exec-5")
    frames = signed_frames(parts, KEY)
    frames[-1] = json.dumps({"name": "stdout", "text": "b"}).encode()
    with pytest.raises(BadSignature):
        decode_zmq_message(frames, Signer(KEY))


def test_buffers_are_not_signed() -> None:
    """Invariant 8: as in the spec, only the four JSON parts are signed, not buffers."""
    parts = make_parts("display_data", {"data": {}}, "exec-6", buffers=(b"one",))
    frames = signed_frames(parts, KEY)
    frames[-1] = b"two"
    assert decode_zmq_message(frames, Signer(KEY)).buffers == (b"two",)


def test_empty_key_disables_verification() -> None:
    """Invariant 8: with an empty key (signing off, as in Session) any signature passes."""
    parts = make_parts("status", {"execution_state": "idle"}, "exec-7", msg_id="s-7")
    frames = signed_frames(parts, b"")
    assert frames[2] == b""
    assert Signer(b"").sign(parts) == b""
    frames[2] = b"whatever"
    assert decode_zmq_message(frames, Signer(b"")).msg_id == "s-7"


def test_missing_delimiter_is_malformed() -> None:
    """Invariant 8: frames without <IDS|MSG> raise MalformedMessage."""
    parts = make_parts("status", {"execution_state": "idle"})
    frames = [frame for frame in signed_frames(parts, KEY) if frame != b"<IDS|MSG>"]
    with pytest.raises(MalformedMessage, match="delimiter"):
        decode_zmq_message(frames, Signer(KEY))


@pytest.mark.parametrize("kept", [0, 1, 2, 3, 4])
def test_too_few_frames_is_malformed(kept: int) -> None:
    """Invariant 8: fewer than a signature and four parts raise MalformedMessage."""
    parts = make_parts("status", {"execution_state": "idle"})
    frames = signed_frames(parts, KEY)[: 2 + kept]
    with pytest.raises(MalformedMessage, match=f"got {kept} frames"):
        decode_zmq_message(frames, Signer(KEY))


@pytest.mark.parametrize(
    ("raw_header", "match"),
    [
        (b"not json", "header is not valid JSON"),
        (b"\xff\xfe", "header is not valid JSON"),
        (b"[1, 2]", "header is not a JSON object"),
        (b'{"msg_id": "x"}', "msg_type"),
        (b'{"msg_type": "status"}', "msg_id"),
        (b'{"msg_type": 5, "msg_id": "x"}', "msg_type"),
    ],
)
def test_bad_header_is_malformed(raw_header: bytes, match: str) -> None:
    """Invariant 8: a header that is not JSON, not an object or lacks msg_type/msg_id
    raises MalformedMessage (after the signature check passed)."""
    parts = [raw_header, b"{}", b"{}", b"{}"]
    with pytest.raises(MalformedMessage, match=match):
        decode_zmq_message(signed_frames(parts, KEY), Signer(KEY))


def test_malformed_errors_are_remote_errors_chained_to_the_parser() -> None:
    """Invariant 8: parse failures are RemoteErrors chained with ``from`` to the cause."""
    with pytest.raises(MalformedMessage) as caught:
        KernelMessage.from_parts([b"{", b"{}", b"{}", b"{}"])
    assert isinstance(caught.value, RemoteError)
    assert isinstance(caught.value.__cause__, ValueError)


def test_from_parts_needs_four_parts() -> None:
    """Invariant 8: fewer than four parts raise MalformedMessage."""
    with pytest.raises(MalformedMessage, match="at least 4 parts, got 3"):
        KernelMessage.from_parts([header_bytes("status"), b"{}", b"{}"])


@pytest.mark.parametrize(
    ("metadata", "content"),
    [
        pytest.param(b"[]", b"{}", id="metadata-array"),
        pytest.param(b"not json", b"{}", id="metadata-not-json"),
        pytest.param(b"{}", b"not json", id="content-not-json"),
    ],
)
def test_from_parts_rejects_parts_that_are_not_json_objects(
    metadata: bytes, content: bytes
) -> None:
    """Invariant 8: from_parts' contract says a part that is not a JSON object raises
    MalformedMessage. A message accepted here is later spliced verbatim into the legacy
    JSON every client receives (encode_legacy), so it must be refused at decode."""
    with pytest.raises(MalformedMessage):
        KernelMessage.from_parts([header_bytes("status"), b"{}", metadata, content])


def test_parent_msg_id_is_peeked() -> None:
    """Routing: the parent's msg_id is peeked; an empty or id-less parent gives None."""
    header = header_bytes("status")
    assert make_message("status", {}, parent_msg_id="p-9").parent_msg_id == "p-9"
    assert make_message("status", {}).parent_msg_id is None
    assert KernelMessage.from_parts([header, b'{"msg_id": 3}', b"{}", b"{}"]).parent_msg_id is None
    for parent in (b"[]", b"", b"null", b'"x"'):
        with pytest.raises(MalformedMessage, match="parent_header"):
            KernelMessage.from_parts([header, parent, b"{}", b"{}"])


def test_repair_keeps_a_kernels_output_and_makes_every_part_valid_json() -> None:
    """Invariant 8: what a kernel sends is repaired, not pasted raw: a parent header or
    metadata that is not an object becomes {}, NaN/Infinity become null, and the output
    itself (the stream text) is kept."""
    header = header_bytes("stream")
    content = b'{"name": "stdout", "text": "kept\\n"}'
    for parent in (b"", b"[]", b"null", b"{", b"[" * 5000 + b"]" * 5000):
        message = KernelMessage.from_parts([header, parent, b"7", content], repair=True)
        assert (message.raw_parent_header, message.raw_metadata) == (b"{}", b"{}")
        assert (message.parent_msg_id, message.text) == (None, "kept\n")
    odd = KernelMessage.from_parts(
        [header, b'{"msg_id": "p", "x": NaN}', b'{"m": -Infinity}', b'{"v": Infinity}'],
        repair=True,
    )
    for part in odd.parts():
        json.loads(part, parse_constant=lambda name: pytest.fail(f"{name} written"))
    assert odd.parent_msg_id == "p"
    assert odd.content() == {"v": None}
    assert json.loads(odd.raw_metadata) == {"m": None}


def test_header_or_content_that_is_not_an_object_cannot_be_repaired() -> None:
    """Invariant 8: without a header or a content object there is no message; the error
    says which part is wrong, even for JSON nested deeper than the parser goes."""
    header = header_bytes("display_data")
    for parts, what in (
        ([b"[]", b"{}", b"{}", b"{}"], "header"),
        ([header, b"{}", b"{}", b"[1]"], "content"),
        ([header, b"{}", b"{}", b'{"a":' * 100000 + b"1" + b"}" * 100000], "content"),
        ([header, b"{}", b"{}", b'{"t": "\xff"}'], "content"),
    ):
        with pytest.raises(MalformedMessage, match=what):
            KernelMessage.from_parts(parts, repair=True)


def test_a_signed_message_that_is_not_a_message_becomes_a_placeholder() -> None:
    """Invariants 1 and 8: a correctly signed message whose content is not an object is
    not dropped: decoding says so with InvalidMessage, and its placeholder (same bytes,
    same msg_id) keeps its slot and says what was wrong. A bad signature stays refused."""
    parts = [header_bytes("stream"), b"{}", b"{}", b"[1, 2]"]
    frames = signed_frames(parts, KEY)
    with pytest.raises(InvalidMessage) as raised:
        decode_zmq_message(frames, Signer(KEY))
    placeholder = invalid_placeholder(raised.value, date="2026-01-01T00:00:00Z", session="s")
    assert placeholder.msg_type == INVALID_MSG_TYPE
    size = sum(map(len, parts))
    assert placeholder.content() == {"reason": "content is not a JSON object", "size": size}
    again = invalid_placeholder(raised.value, date="", session="")
    assert again.msg_id == placeholder.msg_id
    assert placeholder.msg_id.startswith("invalid-")
    with pytest.raises(BadSignature):
        decode_zmq_message(signed_frames(parts, b"another key"), Signer(KEY))


def test_stream_without_string_name_and_text_is_not_a_stream() -> None:
    """Invariant 6: only a stream message with string name and text is coalescable."""
    odd = make_message("stream", {"name": "stdout", "text": ["a", "b"]})
    assert (odd.stream_name, odd.text, odd.is_stream) == (None, None, False)
    assert stream("stdout", "").is_stream is True
    with pytest.raises(MalformedMessage, match="content is not valid JSON"):
        KernelMessage.from_parts([header_bytes("stream"), b"{}", b"{}", b"{oops"])


def test_signer_rejects_schemes_that_are_not_hmac() -> None:
    """Invariant 8: a signature scheme other than hmac-<digest> is refused up front."""
    for scheme in ("sha256", "hmac", "hmac-", "rsa-sha256", ""):
        with pytest.raises(ValueError, match="unsupported signature scheme"):
            Signer(KEY, scheme)


def test_signer_rejects_unknown_digest_up_front() -> None:
    """Invariant 8: an hmac scheme naming a digest hashlib lacks is refused when the Signer
    is built (as jupyter_client's Session refuses it), not on the first message."""
    with pytest.raises(ValueError, match="nosuchdigest"):
        Signer(KEY, "hmac-nosuchdigest")


def test_signer_supports_other_digests() -> None:
    """Invariant 8: hmac-sha512 signs and verifies like Session with that scheme."""
    parts = make_parts("status", {"execution_state": "idle"})
    signer = Signer(KEY, "hmac-sha512")
    signature = signer.sign(parts)
    assert signature == Session(key=KEY, signature_scheme="hmac-sha512").sign(parts)
    assert len(signature) == 128
    signer.verify(signature, parts)
    with pytest.raises(BadSignature):
        signer.verify(Signer(KEY).sign(parts), parts)


@pytest.mark.parametrize("digest", ["sha256", "sha512", "sha1", "md5", "sha3_256"])
@pytest.mark.parametrize("key_bytes", [1, 36, 64, 65, 128, 129, 500])
def test_signer_is_hmac_for_every_digest_and_key_length(digest: str, key_bytes: int) -> None:
    """Invariant 8: keys shorter than, as long as and longer than the digest's block (a
    longer key is hashed first, RFC 2104) sign as hmac.new and jupyter_client do."""
    key = bytes(range(256)) * 2
    key = key[:key_bytes]
    parts = make_parts("status", {"execution_state": "idle"})
    expected = hmac.new(key, b"".join(parts[:4]), digest).hexdigest().encode()
    assert Signer(key, f"hmac-{digest}").sign(parts) == expected
    assert expected == Session(key=key, signature_scheme=f"hmac-{digest}").sign(parts)


def test_synthesize_builds_a_gateway_message() -> None:
    """Invariant 1: messages the gateway publishes itself are ordinary KernelMessages."""
    message = KernelMessage.synthesize(
        "status",
        {"execution_state": "restarting"},
        msg_id="gw-1",
        date="2024-05-06T07:08:09Z",
        session="gw-session",
    )
    assert message.msg_type == "status"
    assert message.msg_id == "gw-1"
    assert message.parent_msg_id is None
    assert message.header() == {
        "msg_id": "gw-1",
        "msg_type": "status",
        "username": "kernel_gateway_stream",
        "session": "gw-session",
        "date": "2024-05-06T07:08:09Z",
        "version": "5.3",
    }
    assert message.raw_parent_header == b"{}"
    assert message.raw_metadata == b"{}"
    assert message.content() == {"execution_state": "restarting"}
    assert message.buffers == ()
    assert message.is_stream is False


def test_synthesize_stream_is_a_stream_and_honours_username() -> None:
    """Invariant 6: a synthesized stream message is coalescable like a kernel's."""
    message = KernelMessage.synthesize(
        "stream",
        {"name": "stderr", "text": "notice\n"},
        msg_id="gw-2",
        date="2024-05-06T07:08:09Z",
        session="gw-session",
        username="ops",
    )
    assert (message.stream_name, message.text) == ("stderr", "notice\n")
    assert message.header()["username"] == "ops"


@pytest.mark.parametrize(
    "text", ["", "plain\n", 'quote " and \\ backslash', "é✓😀", "\x00\x1f control", "a\r\nb"]
)
@pytest.mark.parametrize("ascii_only", [True, False])
def test_stream_text_read_by_the_scanner_is_the_parsed_text(text: str, ascii_only: bool) -> None:
    """The stream fast path reads exactly what a full JSON parse reads."""
    content = json.dumps({"name": "stderr", "text": text}, ensure_ascii=ascii_only).encode()
    assert peek_stream(content) == ("stderr", text)
    message = KernelMessage.from_parts([HEADER_STREAM, b"{}", b"{}", content])
    assert (message.stream_name, message.text) == ("stderr", text)


@pytest.mark.parametrize(
    "content",
    [
        b'{"text": "a", "name": "stdout"}',
        b'{"name": "stdout", "text": "a", "extra": "b"}',
        b'{"name": "stdout", "text": "a\x01"}',
        b'{"name": "other", "text": "a"}',
        b'{"name": "stdout", "text": "\\u12"}',
    ],
)
def test_other_stream_layouts_are_parsed_in_full(content: bytes) -> None:
    """Anything but the usual layout goes to the full parse, which validates it."""
    assert peek_stream(content) is None


def test_dumps_json_writes_text_as_is_and_escapes_only_what_utf8_cannot_hold() -> None:
    """Invariant 8: re-encoded text (a merged stream, a normalized event) is valid UTF-8
    JSON even when a kernel sent a lone surrogate, which parses to a str UTF-8 refuses."""
    assert dumps_json({"text": "héllo"}) == '{"text": "héllo"}'.encode()
    lone = json.loads('"a\\ud800b"')
    encoded = dumps_json({"text": lone})
    assert encoded.decode("utf-8") == '{"text": "a\\ud800b"}'
    assert json.loads(encoded) == {"text": lone}


_JSON_TEXT = st.one_of(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=8), children, max_size=4)
        ),
        max_leaves=12,
    ).map(lambda value: json.dumps(value).encode()),
    st.sampled_from(
        [
            b'{"a": NaN}',
            b'{"a": -Infinity}',
            b'{"a": 1e999}',
            b'{"a": "\\ud800"}',
            b'{"a": "\xff"}',
            b'{"a": 1, "a": 2}',
            b'{"a": 123456789012345678901234567890}',
            b"\xef\xbb\xbf{}",
            b"[1]",
            b"{",
            b"",
        ]
    ),
    st.binary(max_size=16),
)


@settings(max_examples=200, deadline=None)
@given(_JSON_TEXT)
def test_the_fast_header_parse_takes_only_what_the_full_check_takes_as_it_is(raw: bytes) -> None:
    """The header's fast path (orjson) returns an object only where the strict check
    returns the same object from the same bytes, kept as they are: it never lets through
    what the check refuses or would rewrite (NaN, infinities, not UTF-8)."""
    fast = _plain_object(raw)
    if fast is None:
        return
    kept, full = _object(raw, "header", repair=True)
    assert kept is raw
    assert fast == _past_64_bits_as_float(full)


def _past_64_bits_as_float(value: Any) -> Any:
    """``value`` with every integer orjson reads as a float (past 64 bits) a float."""
    if isinstance(value, dict):
        return {key: _past_64_bits_as_float(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_past_64_bits_as_float(item) for item in value]
    if type(value) is int and not -(2**63) <= value < 2**64:
        return float(value)
    return value


@settings(max_examples=300)
@given(st.sampled_from(["stdout", "stderr", "é"]), st.text())
def test_stream_content_is_strict_utf8_json_of_the_same_text(name: str, text: str) -> None:
    """A merged frame's content (encoded with orjson, or the standard library for a lone
    surrogate orjson refuses) parses, strictly, back to the same name and text."""
    content = dumps_stream_content(name, text)
    assert json.loads(content.decode("utf-8")) == {"name": name, "text": text}


def test_stream_content_escapes_a_lone_surrogate() -> None:
    content = dumps_stream_content("stdout", "a\ud800b")
    assert b"\\ud800" in content
    assert json.loads(content) == {"name": "stdout", "text": "a\ud800b"}
