"""A synthetic Jupyter kernel that publishes stream output as fast as ZMQ allows.

    python benchmarks/firehose.py -f CONNECTION_FILE

Why: a gateway's own cost per IOPub message is hidden behind the kernel when the kernel is
ipykernel, which tops out near 2,000 stream messages per second (every ``print`` goes
through its output thread, JSON encoding and ``Session.send``). This kernel speaks the
messaging protocol (v5.3) over plain pyzmq and does almost nothing per message, so one core
publishes well over 100,000 small stream messages per second: a gateway in front of it is
the bottleneck, and a benchmark measures the gateway.

It uses only the standard library and pyzmq, because the kernel subprocess may not have this
repository on ``sys.path``. ``install_kernelspec`` writes a kernelspec that runs this file.

The "code" of an ``execute_request`` is ``COUNT SIZE [RATE]``, e.g. ``"100000 64"``:

* ``COUNT`` stream messages (``stdout``) are published on IOPub between ``execute_input``
  and the execution's ``idle`` status, all with the request as parent;
* each ``text`` is exactly ``SIZE`` ASCII bytes (at least 32): ``f"{i} {time.time():.6f} "``
  (the publish index from 0 and the wall clock when it was published), ``x`` padding, and a
  final newline;
* ``RATE`` messages per second (optional, 0 = unlimited) paces them on a schedule, in
  batches of about a millisecond, so the average rate is ``RATE``.

Empty code runs nothing and succeeds. Code that does not parse gets an ``error`` reply (and
an ``error`` message on IOPub). An interrupt (SIGINT, or an ``interrupt_request`` on
control) stops a running firehose within one batch: the reply is then an error with
``ename`` ``KeyboardInterrupt``, as ipykernel answers an interrupted cell, and the kernel
carries on. The IOPub socket has no high-water mark (``SNDHWM=0``, set before ``bind``), so
the kernel never drops a message: a slow subscriber's backlog is held in memory.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import signal
import sys
import threading
import time
import uuid
from binascii import hexlify
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

import zmq

__all__ = ["Kernel", "install_kernelspec", "main", "parse_code"]

PROTOCOL_VERSION = "5.3"
KERNEL_NAME = "firehose"
DELIMITER = b"<IDS|MSG>"
EMPTY_METADATA = b"{}"
MIN_SIZE = 32
BATCH = 256  # messages published between two looks at the control socket, unlimited mode
TICK = 0.001  # seconds between batches when paced
MAX_SLEEP = 0.05  # a paced firehose looks at the control socket at least this often
LINGER_MS = 1000  # how long closing waits for queued replies and output to leave

LANGUAGE_INFO = {
    "name": "firehose",
    "version": "1.0",
    "mimetype": "text/plain",
    "file_extension": ".txt",
}
USAGE = "COUNT SIZE [RATE]: COUNT stream messages of SIZE bytes, at RATE per second (0 = max)"


class CodeError(ValueError):
    """The code of an ``execute_request`` is not ``COUNT SIZE [RATE]``."""


@dataclass(frozen=True)
class Firehose:
    count: int
    size: int
    rate: float  # messages per second; 0 is unlimited


def parse_code(code: str) -> Firehose | None:
    """``COUNT SIZE [RATE]`` as a ``Firehose``; None for empty code; ``CodeError`` otherwise."""
    words = code.split()
    if not words:
        return None
    if len(words) not in (2, 3):
        raise CodeError(f"expected {USAGE}; got {code!r}")
    try:
        count, size = int(words[0]), int(words[1])
        rate = float(words[2]) if len(words) == 3 else 0.0
    except ValueError:
        raise CodeError(f"expected {USAGE}; got {code!r}") from None
    if count < 0:
        raise CodeError(f"COUNT must not be negative; got {count}")
    if not rate >= 0 or rate == float("inf"):
        raise CodeError(f"RATE must be a finite number >= 0; got {words[2]}")
    # The longest prefix is "{COUNT - 1} {time:.6f} " plus the final newline.
    needed = max(MIN_SIZE, len(f"{max(count - 1, 0)} {time.time():.6f} \n") + 1)
    if size < needed:
        raise CodeError(f"SIZE must be at least {needed} for {count} messages; got {size}")
    return Firehose(count, size, rate)


class Signer:
    """HMAC (RFC 2104) with the keyed inner and outer hash states computed once.

    ``hmac.new(key, digestmod=...).copy()`` per message costs more than the hashing itself
    (``HMAC.copy`` is Python code); copying two hashlib objects is C all the way.
    """

    def __init__(self, key: bytes, digest: str) -> None:
        block_size = hashlib.new(digest).block_size
        if len(key) > block_size:
            key = hashlib.new(digest, key).digest()
        key = key.ljust(block_size, b"\0")
        self.inner = hashlib.new(digest, bytes(byte ^ 0x36 for byte in key))
        self.outer = hashlib.new(digest, bytes(byte ^ 0x5C for byte in key))

    def sign(self, *parts: bytes) -> bytes:
        """The hex signature of the concatenated ``parts``, as ``hmac`` would compute it."""
        hasher = self.inner.copy()
        for part in parts:
            hasher.update(part)
        finisher = self.outer.copy()
        finisher.update(hasher.digest())
        return hexlify(finisher.digest())


@dataclass
class Request:
    """A verified incoming message: where it came from, its raw header, and its content."""

    socket: zmq.Socket[bytes]
    identities: list[bytes]
    raw_header: bytes  # sent back verbatim as the parent_header of everything it causes
    header: dict[str, Any]
    content: dict[str, Any]

    @property
    def msg_type(self) -> str:
        msg_type: str = self.header.get("msg_type", "")
        return msg_type


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


class Kernel:
    """The firehose kernel: its sockets, its request handlers and the publishing loop."""

    def __init__(self, connection: dict[str, Any], kernel_id: str) -> None:
        self.kernel_id = kernel_id
        self.session = uuid.uuid4().hex
        self.execution_count = 0
        self.interrupted = False
        self.shutting_down = False
        self._counter = 0  # msg_id suffix: every message sent is f"{session}_{counter}"
        key = str(connection.get("key", "")).encode()
        scheme = str(connection.get("signature_scheme", "hmac-sha256"))
        self._signer = Signer(key, scheme.removeprefix("hmac-")) if key else None

        transport = connection.get("transport", "tcp")
        ip = connection["ip"]

        def url(port: int) -> str:
            return f"tcp://{ip}:{port}" if transport == "tcp" else f"ipc://{ip}-{port}"

        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.shell = self.context.socket(zmq.ROUTER)
        self.control = self.context.socket(zmq.ROUTER)
        self.stdin = self.context.socket(zmq.ROUTER)
        self.iopub = self.context.socket(zmq.PUB)
        # Before bind: every subscriber's queue inherits the listening socket's options.
        self.iopub.setsockopt(zmq.SNDHWM, 0)
        self.heartbeat = self.context.socket(zmq.REP)
        for sock in (self.shell, self.control, self.stdin, self.iopub, self.heartbeat):
            sock.setsockopt(zmq.LINGER, LINGER_MS)
        self.shell.bind(url(connection["shell_port"]))
        self.control.bind(url(connection["control_port"]))
        self.stdin.bind(url(connection["stdin_port"]))
        self.iopub.bind(url(connection["iopub_port"]))
        self.heartbeat.bind(url(connection["hb_port"]))
        self._stop_heartbeat = threading.Event()
        self._heartbeat_thread = threading.Thread(
            target=self._echo_heartbeats, name="heartbeat", daemon=True
        )
        self._topic_prefix = f"kernel.{kernel_id}.".encode()

    # -- signing and sending ------------------------------------------------------------

    def sign(self, *parts: bytes) -> bytes:
        return b"" if self._signer is None else self._signer.sign(*parts)

    def new_header(self, msg_type: str) -> bytes:
        self._counter += 1
        header = {
            "msg_id": f"{self.session}_{self._counter}",
            "msg_type": msg_type,
            "username": KERNEL_NAME,
            "session": self.session,
            "date": utc_now(),
            "version": PROTOCOL_VERSION,
        }
        return json.dumps(header).encode()

    def message(self, msg_type: str, parent: bytes, content: dict[str, Any]) -> list[bytes]:
        """``[<IDS|MSG>, signature, header, parent, metadata, content]``, signed."""
        header = self.new_header(msg_type)
        body = json.dumps(content).encode()
        signature = self.sign(header, parent, EMPTY_METADATA, body)
        return [DELIMITER, signature, header, parent, EMPTY_METADATA, body]

    def reply(self, request: Request, content: dict[str, Any]) -> None:
        msg_type = request.msg_type.removesuffix("_request") + "_reply"
        parts = self.message(msg_type, request.raw_header, content)
        request.socket.send_multipart([*request.identities, *parts])

    def publish(self, msg_type: str, parent: bytes, content: dict[str, Any]) -> None:
        topic = self._topic_prefix + msg_type.encode()
        self.iopub.send_multipart([topic, *self.message(msg_type, parent, content)])

    def status(self, state: str, parent: bytes) -> None:
        self.publish("status", parent, {"execution_state": state})

    # -- receiving ----------------------------------------------------------------------

    def receive(self, sock: zmq.Socket[bytes]) -> Request | None:
        """The next message on ``sock``, or None if it is malformed or badly signed."""
        parts = sock.recv_multipart()
        try:
            split = parts.index(DELIMITER)
        except ValueError:
            return None
        identities, rest = parts[:split], parts[split + 1 :]
        if len(rest) < 5:
            return None
        signature, header, parent, metadata, content = rest[:5]
        if self._signer is not None and not hmac.compare_digest(
            signature, self.sign(header, parent, metadata, content)
        ):
            return None
        try:
            header_dict = json.loads(header)
            content_dict = json.loads(content)
        except ValueError:
            return None
        if not isinstance(header_dict, dict) or not isinstance(content_dict, dict):
            return None
        return Request(sock, identities, header, header_dict, content_dict)

    # -- the request loop ---------------------------------------------------------------

    def serve(self) -> None:
        """Answer requests until a ``shutdown_request``, then close everything."""
        signal.signal(signal.SIGINT, self._on_sigint)
        self._heartbeat_thread.start()
        poller = zmq.Poller()
        for sock in (self.control, self.shell, self.stdin):
            poller.register(sock, zmq.POLLIN)
        try:
            while not self.shutting_down:
                ready = dict(poller.poll())
                if self.control in ready:
                    self.handle_control()
                elif self.shell in ready:
                    request = self.receive(self.shell)
                    if request is not None:
                        self.dispatch(request)
                if self.stdin in ready:
                    self.stdin.recv_multipart()  # no input is ever requested
        finally:
            self.close()

    def handle_control(self) -> None:
        """Every message waiting on the control socket, without blocking."""
        while self.control.poll(0):
            request = self.receive(self.control)
            if request is not None:
                self.dispatch(request)

    def dispatch(self, request: Request) -> None:
        handlers: dict[str, Callable[[Request], None]] = {
            "kernel_info_request": self.kernel_info,
            "execute_request": self.execute,
            "shutdown_request": self.shutdown,
            "interrupt_request": self.interrupt,
            "comm_info_request": self.comm_info,
            "is_complete_request": self.is_complete,
        }
        handler = handlers.get(request.msg_type)
        if handler is None and not request.msg_type.endswith("_request"):
            return
        self.status("busy", request.raw_header)
        try:
            if handler is None:
                self.reply(request, error_content("NotImplementedError", request.msg_type))
            else:
                handler(request)
        finally:
            self.status("idle", request.raw_header)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.interrupted = True

    def _echo_heartbeats(self) -> None:
        while not self._stop_heartbeat.is_set():
            if self.heartbeat.poll(100):
                self.heartbeat.send_multipart(self.heartbeat.recv_multipart())
        self.heartbeat.close()

    def close(self) -> None:
        self._stop_heartbeat.set()
        if self._heartbeat_thread.is_alive():
            self._heartbeat_thread.join()
        else:
            self.heartbeat.close()
        for sock in (self.shell, self.control, self.stdin, self.iopub):
            sock.close()
        self.context.term()

    # -- handlers -----------------------------------------------------------------------

    def kernel_info(self, request: Request) -> None:
        self.reply(
            request,
            {
                "status": "ok",
                "protocol_version": PROTOCOL_VERSION,
                "implementation": KERNEL_NAME,
                "implementation_version": "1.0",
                "language_info": LANGUAGE_INFO,
                "banner": "Firehose: a synthetic kernel for benchmarks. Code: " + USAGE,
                "help_links": [],
            },
        )

    def comm_info(self, request: Request) -> None:
        self.reply(request, {"status": "ok", "comms": {}})

    def is_complete(self, request: Request) -> None:
        self.reply(request, {"status": "complete"})

    def interrupt(self, request: Request) -> None:
        self.interrupted = True
        self.reply(request, {"status": "ok"})

    def shutdown(self, request: Request) -> None:
        self.shutting_down = True
        self.reply(request, {"status": "ok", "restart": bool(request.content.get("restart"))})

    def execute(self, request: Request) -> None:
        self.interrupted = False  # an interrupt while idle interrupts nothing
        self.execution_count += 1
        code = str(request.content.get("code", ""))
        parent = request.raw_header
        self.publish(
            "execute_input", parent, {"code": code, "execution_count": self.execution_count}
        )
        try:
            firehose = parse_code(code)
        except CodeError as error:
            self.fail(request, error_content("ValueError", str(error)))
            return
        if firehose is not None:
            published = self.run(firehose, parent)
            if published < firehose.count:
                evalue = f"interrupted after {published} of {firehose.count} messages"
                self.fail(request, error_content("KeyboardInterrupt", evalue))
                return
        self.reply(
            request,
            {"status": "ok", "execution_count": self.execution_count, "user_expressions": {}},
        )

    def fail(self, request: Request, error: dict[str, Any]) -> None:
        self.publish("error", request.raw_header, {k: v for k, v in error.items() if k != "status"})
        self.reply(request, {**error, "execution_count": self.execution_count})

    # -- the firehose -------------------------------------------------------------------

    def run(self, firehose: Firehose, parent: bytes) -> int:
        """Publish the firehose's stream messages; the number published (fewer if stopped)."""
        count, rate = firehose.count, firehose.rate
        sent = 0
        start = time.perf_counter()
        while sent < count:
            self.handle_control()
            if self.interrupted or self.shutting_down:
                break
            batch_start = time.perf_counter()
            if rate > 0:
                due = min(count, int((batch_start - start) * rate) + 1)  # message i at i / rate
                if due <= sent:
                    time.sleep(min(start + sent / rate - batch_start, MAX_SLEEP))
                    continue
                stop = min(due, sent + BATCH)  # behind schedule: catch up in batches
            else:
                stop = min(count, sent + BATCH)
            self.publish_stream(parent, sent, stop, firehose.size)
            sent = stop
            if rate > 0 and sent < count:
                # Sleep to the next message's due time, but batch at least a tick's worth.
                wake = max(start + sent / rate, batch_start + TICK)
                delay = wake - time.perf_counter()
                if delay > 0:
                    time.sleep(min(delay, MAX_SLEEP))
        return sent

    def publish_stream(self, parent: bytes, first: int, stop: int, size: int) -> None:
        """Stream messages ``first`` to ``stop - 1``: the hot loop, everything precomputed.

        The header is a template with the msg_id counter as the only hole (the date is
        the batch's); the content is a fixed head, the text's prefix, then a slice of the
        padding, which already holds the JSON-escaped newline and the closing quote and
        brace. The text is ASCII without quotes or backslashes, so it needs no escaping.
        The signature is ``Signer.sign`` inlined, and each frame is sent on its own:
        ``send_multipart`` costs about three times as much for seven small frames.
        """
        header_template = (
            '{"msg_id": "%s_%%d", "msg_type": "stream", "username": "%s", "session": "%s", '
            '"date": "%s", "version": "%s"}'
            % (self.session, KERNEL_NAME, self.session, utc_now(), PROTOCOL_VERSION)
        ).encode()
        content_head = b'{"name": "stdout", "text": "'
        padding = b"x" * (size - 1) + b'\\n"}'
        parent_and_metadata = parent + EMPTY_METADATA
        topic = self._topic_prefix + b"stream"
        inner = None if self._signer is None else self._signer.inner
        outer = None if self._signer is None else self._signer.outer
        # zmq.Socket.send only adds DRAFT routing_id/group handling to its Cython base
        # class's send; the base's bound method halves the cost of each frame.
        send = super(zmq.Socket, self.iopub).send
        more = zmq.SNDMORE
        now = time.time
        counter = self._counter
        for i in range(first, stop):
            counter += 1
            header = header_template % counter
            prefix = b"%d %.6f " % (i, now())
            content = content_head + prefix + padding[len(prefix) :]
            if inner is None or outer is None:
                signature = b""
            else:  # Signer.sign, inlined
                hasher = inner.copy()
                hasher.update(header)
                hasher.update(parent_and_metadata)
                hasher.update(content)
                finisher = outer.copy()
                finisher.update(hasher.digest())
                signature = hexlify(finisher.digest())
            send(topic, more)
            send(DELIMITER, more)
            send(signature, more)
            send(header, more)
            send(parent, more)
            send(EMPTY_METADATA, more)
            send(content)
        self._counter = counter


def error_content(ename: str, evalue: str) -> dict[str, Any]:
    return {
        "status": "error",
        "ename": ename,
        "evalue": evalue,
        "traceback": [f"{ename}: {evalue}"],
    }


def install_kernelspec(directory: Path) -> str:
    """Write ``directory/kernels/firehose/kernel.json``; return the kernel name.

    Put ``directory`` on ``JUPYTER_PATH`` (or pass ``directory / "kernels"`` to a
    ``KernelSpecManager``) to find it.
    """
    spec_dir = Path(directory) / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, str(Path(__file__).resolve()), "-f", "{connection_file}"],
        "display_name": "Firehose (benchmark)",
        "language": "firehose",
        "interrupt_mode": "signal",
        "metadata": {},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=2) + "\n")
    return KERNEL_NAME


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-f", "--connection-file", required=True, type=Path)
    args = parser.parse_args(argv)
    connection_file: Path = args.connection_file
    connection = json.loads(connection_file.read_text())
    kernel_id = connection_file.stem.removeprefix("kernel-")
    Kernel(connection, kernel_id).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
