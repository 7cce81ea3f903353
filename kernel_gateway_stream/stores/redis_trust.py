"""Redis as a boundary between the gateway's nodes and the code in their kernels.

Code in a kernel is untrusted, and it may reach Redis (same machine, same network). What
it could do there with no password: delete transcripts, take leases, and rewrite the
entries the nodes act on. The rules this module serves (see :mod:`..cluster`, which
applies them):

* **Redis asks for a password.** A start of several nodes on a Redis that answers a
  connection that gave no credentials is refused, unless the operator says it is on
  purpose (``ClusterNode.allow_unauthenticated_redis``): :func:`answers_without_credentials`
  asks, on a connection of its own, the question a kernel would.
* **Entries the nodes act on are signed.** Each node's URL (where requests only a
  kernel's recording node serves are forwarded, with the gateway's token) and each
  kernel's directory entry (the connection info every node attaches the kernel by) is
  stored as ``kgs1.<HMAC-SHA256, hex>.<payload>``: the HMAC is over the entry's kind, its
  name (node or kernel id) and the payload, keyed by the cluster secret that only the
  nodes hold (``KGS_CLUSTER_SECRET``). :class:`EntrySigner` signs and checks; an entry
  that does not check is :class:`~..core.errors.UntrustedEntry`, never acted on. A valid
  entry copied to another name does not check (the name is signed); an old valid entry
  written again (a replay) does: Redis's password is what keeps writers out.
* **Redis's password is in no log line, health body or process argument.**
  :func:`redact_url` hides it in both URL forms (``redis://user:password@host`` and
  ``?password=``); ``secrets.wipe_from_arguments`` overwrites it in the process's
  argument block, which ``/proc/<pid>/cmdline`` shows to every local user (Linux).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field
from urllib.parse import quote

from ..core.errors import UntrustedEntry

__all__ = [
    "EntrySigner",
    "answers_without_credentials",
    "password_of",
    "redact_url",
]

_VERSION = b"kgs1"
_HEX_DIGEST = 64

_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?:(?P<user>[^:@/?#]*):)?[^/?#]*@")
_SECRET_PARAMETER = re.compile(r"([?&][^=&#]*(?:pass|secret|token|auth)[^=&#]*=)[^&#]*", re.I)


@dataclass(frozen=True, slots=True)
class EntrySigner:
    """Signs and checks the entries of Redis that the nodes act on (see the module
    docstring). Made by the cluster node from the cluster secret; the store uses it for
    every node and kernel entry it writes or reads."""

    secret: bytes = field(repr=False)

    def _mac(self, kind: str, name: str, payload: bytes) -> bytes:
        message = b"\0".join((_VERSION, kind.encode(), name.encode(), payload))
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest().encode()

    def sign(self, kind: str, name: str, payload: bytes) -> bytes:
        """The entry to store for ``payload`` under ``name`` (a node or a kernel id)."""
        return b".".join((_VERSION, self._mac(kind, name, payload), payload))

    def open(self, kind: str, name: str, entry: bytes | str) -> bytes:
        """The payload of ``entry``, stored under ``name``.

        Raises:
            UntrustedEntry: ``entry`` is not signed with this secret for ``kind`` and
                ``name`` (written by something that does not hold the cluster secret).
        """
        raw = entry.encode() if isinstance(entry, str) else entry
        version, _, rest = raw.partition(b".")
        mac, _, payload = rest.partition(b".")
        if version != _VERSION or len(mac) != _HEX_DIGEST:
            raise UntrustedEntry(f"the {kind} entry of {name!r} is not signed")
        if not hmac.compare_digest(mac, self._mac(kind, name, payload)):
            raise UntrustedEntry(
                f"the {kind} entry of {name!r} has a signature that does not match the "
                "cluster secret"
            )
        return payload


def password_of(url: str) -> str | None:
    """The password ``url`` gives Redis (userinfo or ``?password=``), as redis-py reads it."""
    from redis.connection import parse_url

    try:
        password = parse_url(url).get("password")
    except ValueError:
        return None
    return str(password) if password else None


def redact_url(url: str) -> str:
    """``url`` with no password: its userinfo becomes ``user:***@`` (or ``***@``), the value
    of a ``password=`` (or secret, token, auth) query parameter ``***``, and the password
    itself ``***`` wherever else it is (a password that holds ``/`` or ``?``)."""
    text = _USERINFO.sub(
        lambda m: f"{m['scheme']}{m['user'] + ':' if m['user'] else ''}***@", url, count=1
    )
    text = _SECRET_PARAMETER.sub(r"\1***", text)
    password = password_of(url)
    if password:
        for form in {password, quote(password, safe=""), quote(password)}:
            text = text.replace(form, "***")
    return text


def answers_without_credentials(url: str, probe_key: str, timeout: float = 5.0) -> bool | None:
    """Whether the Redis at ``url`` answers a client that gives no credentials (what code
    in a kernel would be) a read of ``probe_key``: True if it does, False if it asks for
    authentication or refuses the command (an ACL), None if it could not be asked (not
    reachable). Same host, port, database and TLS as ``url``; its username and password
    left out. Called once at start-up by the cluster node."""
    import redis
    from redis.connection import parse_url

    options = parse_url(url)
    options.pop("username", None)
    options.pop("password", None)
    options.update(socket_connect_timeout=timeout, socket_timeout=timeout)
    pool = redis.ConnectionPool(**options)
    client = redis.Redis(connection_pool=pool)
    try:
        client.exists(probe_key)
    except (redis.AuthenticationError, redis.exceptions.NoPermissionError):
        return False
    except redis.ResponseError as error:
        # Any other error is an answer too (about something else).
        return not str(error).startswith(("NOAUTH", "NOPERM", "WRONGPASS"))
    except redis.RedisError:
        return None
    finally:
        client.close()
        pool.disconnect()
    return True
