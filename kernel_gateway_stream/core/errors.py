"""Exceptions raised by kernel_gateway_stream.

The tree::

    GatewayStreamError
    ├── LocalError                 the caller misused us (maps to HTTP 4xx / WS 4xxx)
    │   ├── BadRequest             a parameter is malformed or out of range      (400)
    │   │   ├── SequenceAhead      ``since`` is past the kernel's head           (400)
    │   │   ├── InvalidConnectionInfo  connection info to attach that is not valid (400)
    │   │   ├── InvalidKernelId    a kernel id that is not a canonical UUID        (400)
    │   │   ├── PathOutsideRoot    a kernel's ``path`` outside the server's root   (400)
    │   │   └── KernelNotAnswering a kernel to attach does not answer            (400)
    │   ├── UnknownKernel          no running kernel and no transcript           (404)
    │   ├── UnknownKernelSpec      no kernelspec of that name to start           (404)
    │   ├── UnknownExecution       no execution with that msg_id on the kernel   (404)
    │   ├── MethodNotAllowed       a method the endpoint does not serve          (405)
    │   ├── NoInputPending         input for an execution that is not asking     (409)
    │   ├── ExecutionNotRunning    interrupt of an execution that is not running (409)
    │   ├── KernelNotOwned         restart of a kernel the gateway did not start (409)
    │   ├── KernelExists           attach under the id of a kernel it has        (409)
    │   ├── KernelOnAnotherNode    another node records the kernel; it does not answer (409)
    │   │   └── NodeNotTrusted     that node's entry in Redis is not signed: not forwarded (502)
    │   └── PayloadTooLarge        a request body over the configured limit      (413)
    ├── RemoteError                a peer (kernel or client) sent something invalid
    │   ├── MalformedMessage       bytes or JSON that do not form a message
    │   │   └── InvalidMessage     correctly signed, yet not a message (recorded as a
    │   │                          placeholder, so it keeps its sequence number)
    │   ├── BadSignature           an HMAC that does not match the session key
    │   └── UntrustedEntry         an entry read from Redis not signed with the cluster secret
    ├── StoreUnavailable           the transcript store cannot be opened or written
    │   └── StoreInUse             another process holds the store's lock (one writer)
    ├── UnsafeCluster              several nodes configured without Redis's protections
    └── ClientError                raised by the Python client (kernel_gateway_stream.client)
        ├── AuthenticationError    the gateway refused the token (401/403)
        ├── NotFound               unknown kernel or execution (404)
        ├── KernelDied             the kernel died or restarted during an execution
        ├── GatewayUnreachable     no answer from the gateway, or none again in time
        └── GatewayHTTPError       any other error answer: status and reason

Local errors carry ``status`` (an HTTP status hint) and ``reason`` (short,
machine-readable). Remote errors are raised from the one place that takes input
from that peer, chained with ``from`` to the parser's own exception.
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "BadRequest",
    "BadSignature",
    "ClientError",
    "ExecutionNotRunning",
    "GatewayHTTPError",
    "GatewayStreamError",
    "GatewayUnreachable",
    "InvalidConnectionInfo",
    "InvalidKernelId",
    "InvalidMessage",
    "KernelDied",
    "KernelExists",
    "KernelNotAnswering",
    "KernelNotOwned",
    "KernelOnAnotherNode",
    "KernelStartFailed",
    "LocalError",
    "MalformedMessage",
    "MethodNotAllowed",
    "NoInputPending",
    "NodeNotTrusted",
    "NotFound",
    "PathOutsideRoot",
    "PayloadTooLarge",
    "RemoteError",
    "SequenceAhead",
    "StoreInUse",
    "StoreUnavailable",
    "UnknownExecution",
    "UnknownKernel",
    "UnknownKernelSpec",
    "UnsafeCluster",
    "UntrustedEntry",
    "start_failure",
]


class GatewayStreamError(Exception):
    """Base class of every error this package raises on purpose."""


class LocalError(GatewayStreamError):
    """The caller asked for something we cannot do; safe to show to the caller."""

    status = 400
    reason = "bad_request"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_json(self) -> dict[str, object]:
        """The JSON body of the HTTP error response for this error."""
        return {"reason": self.reason, "message": self.message}


class BadRequest(LocalError):
    """A request parameter is missing, malformed or out of range."""


class SequenceAhead(BadRequest):
    """A client asked to resume after a sequence number the kernel has not reached."""

    reason = "since_ahead_of_head"

    def __init__(self, since: int, head: int) -> None:
        super().__init__(f"since={since} is ahead of the transcript head {head}")
        self.since = since
        self.head = head


class InvalidConnectionInfo(BadRequest):
    """Connection info to attach a kernel by is missing a field or has a bad one."""

    reason = "invalid_connection_info"


class InvalidKernelId(BadRequest):
    """A kernel id a client chose that is not a UUID in its canonical form (ids name
    connection files and keys: the gateway makes them, or takes only UUIDs)."""

    reason = "invalid_kernel_id"


class PathOutsideRoot(BadRequest):
    """A kernel's ``path`` (its working directory) that leads out of the server's root."""

    reason = "path_outside_root"


class KernelNotAnswering(BadRequest):
    """A kernel to attach did not answer a kernel_info_request in time (wrong address,
    ports or key, or it is not running)."""

    reason = "kernel_not_answering"


class KernelNotOwned(LocalError):
    """The gateway cannot restart a kernel it did not start (attached by connection info)."""

    status = 409
    reason = "kernel_not_owned"


class KernelOnAnotherNode(LocalError):
    """Several nodes: the kernel is recorded by another node, which alone shuts it down."""

    status = 409
    reason = "kernel_on_another_node"


class NodeNotTrusted(KernelOnAnotherNode):
    """Several nodes: the entry of the node recording the kernel (its URL, in Redis) is not
    signed with the cluster secret, so the request, which would carry the gateway's token,
    was not forwarded anywhere (something that is not a node wrote the entry)."""

    status = 502
    reason = "node_entry_not_trusted"


class KernelExists(LocalError):
    """A kernel with that id is already known to the gateway."""

    status = 409
    reason = "kernel_exists"


class UnknownKernel(LocalError):
    """No running kernel, and no kept transcript, has this id."""

    status = 404
    reason = "unknown_kernel"

    def __init__(self, kernel_id: str) -> None:
        super().__init__(f"no kernel or transcript with id {kernel_id!r}")
        self.kernel_id = kernel_id


class KernelStartFailed(LocalError):
    """The kernel's start failed (a pending kernel whose process never came up): it is
    ``dead``, with the start's error as its reason. jupyter_server answers 500 too."""

    status = 500
    reason = "kernel_start_failed"


def start_failure(error: BaseException) -> str:
    """A failed kernel start's reason, in words (the error's text, its type if none)."""
    text = str(error).strip() or type(error).__name__
    return text[:500]


class UnknownKernelSpec(LocalError):
    """No kernelspec has this name (or the name is not one a kernelspec can have)."""

    status = 404
    reason = "unknown_kernelspec"


class UnknownExecution(LocalError):
    """No execution with this msg_id is known on the kernel."""

    status = 404
    reason = "unknown_execution"

    def __init__(self, msg_id: str) -> None:
        super().__init__(f"no execution with msg_id {msg_id!r}")
        self.msg_id = msg_id


class NoInputPending(LocalError):
    """Input was sent for an execution that is not waiting for any."""

    status = 409
    reason = "no_input_pending"


class MethodNotAllowed(LocalError):
    """The endpoint exists but does not serve this HTTP method."""

    status = 405
    reason = "method_not_allowed"


class ExecutionNotRunning(LocalError):
    """An interrupt for an execution that is queued or finished: interrupting the kernel
    now would interrupt another execution."""

    status = 409
    reason = "execution_not_running"


class PayloadTooLarge(LocalError):
    """A request body larger than the configured limit."""

    status = 413
    reason = "payload_too_large"


class StoreUnavailable(GatewayStreamError):
    """The transcript store cannot be opened or written (a path that cannot be created,
    a read-only database, ...); raised at start-up, where it stops the start. Also raised
    by a read of a store that cannot be reached for now (Redis restarting), which a replay
    tries again for a while."""


class StoreInUse(StoreUnavailable):
    """Another process (a daemon, or a ``jupyter server`` with the extension) holds the
    store's lock: one gateway per store. Raised at start-up, where it stops the start."""


class UnsafeCluster(GatewayStreamError):
    """Several nodes configured without what makes Redis a boundary against kernel code (a
    cluster secret; a Redis that asks for a password); raised at start-up, where it stops
    the start."""


class ClientError(GatewayStreamError):
    """The Python client could not do what it was asked."""


class GatewayHTTPError(ClientError):
    """The gateway answered with an error; ``status`` and ``reason`` say which."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class AuthenticationError(GatewayHTTPError):
    """The gateway refused the token (401 or 403)."""


class NotFound(GatewayHTTPError):
    """No such kernel or execution (404)."""


class KernelDied(ClientError):
    """The kernel died or restarted before the execution finished."""

    def __init__(self, result: object) -> None:
        super().__init__("the kernel died before the execution finished")
        #: What the execution had produced by then (an ``ExecutionResult``).
        self.result = result


class GatewayUnreachable(ClientError):
    """The gateway could not be reached: a first connection failed, or a dropped event
    stream could not be resumed before the client's give-up deadline."""

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(f"cannot reach the gateway at {url}: {detail}")
        self.url = url
        self.detail = detail


class RemoteError(GatewayStreamError):
    """A peer sent us something that does not follow the protocol."""


class MalformedMessage(RemoteError):
    """Bytes or JSON that do not form a Jupyter message (or a WebSocket frame of one)."""


class InvalidMessage(MalformedMessage):
    """A correctly signed kernel message whose parts do not form a message.

    The kernel vouched for it, so it is not dropped: the Tap records a placeholder
    under its sequence number (DESIGN invariant 1). ``reason`` says what is wrong;
    ``signature`` and ``parts`` are what arrived.
    """

    def __init__(self, reason: str, signature: bytes, parts: list[bytes]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.signature = signature
        self.parts = parts


class BadSignature(RemoteError):
    """A kernel message whose HMAC signature does not match the session key."""


class UntrustedEntry(RemoteError):
    """An entry read from Redis that the nodes would act on (a node's URL, a kernel's
    connection info) is not signed with the cluster secret: something other than a node
    wrote it (see :mod:`..stores.redis_trust`)."""
