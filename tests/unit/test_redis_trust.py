"""The pure parts of the Redis boundary: entry signatures and URL redaction."""

from __future__ import annotations

import pytest

from kernel_gateway_stream.core.errors import UntrustedEntry
from kernel_gateway_stream.stores.redis_trust import EntrySigner, password_of, redact_url

SIGNER = EntrySigner(b"a-cluster-secret-of-the-test")


def test_a_signed_entry_opens_to_its_payload() -> None:
    entry = SIGNER.sign("node", "node-a", b"http://10.0.0.5:8888/")
    assert SIGNER.open("node", "node-a", entry) == b"http://10.0.0.5:8888/"
    assert SIGNER.open("node", "node-a", entry.decode()) == b"http://10.0.0.5:8888/"


@pytest.mark.parametrize(
    ("kind", "name", "entry"),
    [
        # Written by something without the secret: a bare URL, a made-up signature.
        ("node", "node-a", b"http://127.0.0.1:9/"),
        ("node", "node-a", b"kgs1." + b"0" * 64 + b".http://127.0.0.1:9/"),
        # A valid entry with its payload changed, moved to another name or kind.
        ("node", "node-a", SIGNER.sign("node", "node-a", b"http://a/").replace(b"//a", b"//b")),
        ("node", "node-b", SIGNER.sign("node", "node-a", b"http://a/")),
        ("kernel", "node-a", SIGNER.sign("node", "node-a", b"http://a/")),
        # Signed with another secret.
        ("node", "node-a", EntrySigner(b"another secret").sign("node", "node-a", b"http://a/")),
    ],
)
def test_an_entry_not_signed_for_its_kind_and_name_does_not_open(
    kind: str, name: str, entry: bytes
) -> None:
    with pytest.raises(UntrustedEntry):
        SIGNER.open(kind, name, entry)


def test_the_secret_is_not_in_the_signers_repr() -> None:
    assert "a-cluster-secret" not in repr(SIGNER)


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("redis://:pw-1234@host:6379/0", "redis://***@host:6379/0"),
        ("redis://gateway:pw-1234@host:6379/0", "redis://gateway:***@host:6379/0"),
        ("rediss://host:6379/0?password=pw-1234", "rediss://host:6379/0?password=***"),
        ("redis://host/0?db=1&password=pw-1234&x=1", "redis://host/0?db=1&password=***&x=1"),
        ("unix:///run/redis.sock?password=pw-1234", "unix:///run/redis.sock?password=***"),
        ("redis://gateway:pw%2F12@host/0", "redis://gateway:***@host/0"),
        ("redis://host:6379/0", "redis://host:6379/0"),
    ],
)
def test_a_redis_password_is_redacted_in_either_url_form(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted
    password = password_of(url)
    assert password is None or password not in redact_url(url)
