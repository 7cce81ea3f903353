"""``kgs``: run code on a gateway's kernels, follow their output, export transcripts.

    kgs run -c "print('hi')"                 # on a new kernel, shut down afterwards
    kgs run --kernel ID script.py            # on a running kernel
    kgs follow ID --since 120                # like tail -f, from a sequence number
    kgs export ID --format jsonl > out.jsonl
    kgs kernels

Connection: ``--url`` (``$KGS_URL``, default http://127.0.0.1:8888) and ``--token``
(``$KGS_TOKEN`` or ``$JUPYTER_TOKEN``).

Exit status: 0 when the code succeeded, 1 on an error in it, 2 on a usage error (a file
to run that cannot be read), 3 if the kernel died or the gateway could not be reached (or
refused the request), and 128 + the signal's number when
stopped by one: 130 for Ctrl-C (SIGINT), 143 for SIGTERM, 129 for SIGHUP (a closed
terminal). In ``run``, Ctrl-C interrupts the kernel and waits for the execution to end; a
second Ctrl-C stops waiting. A kernel that ``run`` started is shut down however it ends,
unless ``--keep`` (SIGKILL cannot be caught: then it is left running). Output to a pipe
closed early (``kgs follow ID | head -1``) ends the command quietly, with 0, as other
Unix tools do.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import signal
import sys
from typing import Any

from .client import ClientError, Event, GatewayClient, Reconnect
from .core.marks import GAP_MSG_TYPE, LIFECYCLE_MSG_TYPE

__all__ = ["main"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_GATEWAY, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: The signals that stop ``kgs`` (after it has shut down a kernel it started).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kgs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="gateway URL (default: $KGS_URL or http://127.0.0.1:8888)")
    parser.add_argument("--token", help="API token (default: $KGS_TOKEN or $JUPYTER_TOKEN)")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run code or a file, with live output")
    run.add_argument("file", nargs="?", help="a Python file to run ('-' for standard input)")
    run.add_argument("-c", "--code", help="code to run instead of a file")
    run.add_argument("--kernel", help="a running kernel's id (default: start a new one)")
    run.add_argument("--keep", action="store_true", help="do not shut a new kernel down")
    run.add_argument("--timeout", type=float, help="interrupt after so many seconds")
    follow = commands.add_parser("follow", help="print a kernel's output as it comes")
    follow.add_argument("kernel")
    follow.add_argument("--since", type=int, help="start after this sequence number")
    export = commands.add_parser("export", help="write a kernel's transcript")
    export.add_argument("kernel")
    export.add_argument("--format", choices=("text", "jsonl"), default="text")
    export.add_argument("--since", type=int, default=0, help="after this sequence number")
    export.add_argument("--parent", help="only this execution's records")
    commands.add_parser("kernels", help="list running kernels")
    return parser


class Stopper:
    """Turns the stop signals into a cancellation of the command's task, once.

    ``kgs run`` takes SIGINT over (:meth:`on_sigint`): the first interrupts the kernel.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[int]) -> None:
        self.loop = loop
        self.task = task
        #: The signal that stopped the command, if one did.
        self.signal: int | None = None
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, self.stop, signum)

    def stop(self, signum: int) -> None:
        if self.signal is None:
            self.signal = signum
            self.task.cancel()

    def on_sigint(self, handler: Any) -> None:
        """Call ``handler()`` on SIGINT instead of stopping."""
        self.loop.add_signal_handler(signal.SIGINT, handler)

    def remove(self) -> None:
        for signum in STOP_SIGNALS:
            self.loop.remove_signal_handler(signum)


async def _run(client: GatewayClient, args: argparse.Namespace, stopper: Stopper) -> int:
    if args.code is not None:
        code = args.code
    elif args.file in (None, "-"):
        code = sys.stdin.read()
    else:
        code = args.source  # read by main(), before any connection
    if args.kernel is not None:
        return await _execute(client, args.kernel, code, args, stopper)
    kernel_id = await _start_kernel(client, args.keep)
    try:
        return await _execute(client, kernel_id, code, args, stopper)
    finally:
        if args.keep:
            _say(f"kgs: kernel {kernel_id} kept")
        else:
            await client.shutdown(kernel_id)


async def _start_kernel(client: GatewayClient, keep: bool) -> str:
    """A new kernel's id. A signal that comes while it starts still gets it shut down."""
    starting = asyncio.ensure_future(client.start_kernel())
    try:
        return await asyncio.shield(starting)
    except asyncio.CancelledError:
        with contextlib.suppress(ClientError, asyncio.CancelledError):
            kernel_id = await starting
            if keep:
                _say(f"kgs: kernel {kernel_id} kept")
            else:
                await client.shutdown(kernel_id)
        raise


async def _execute(
    client: GatewayClient, kernel_id: str, code: str, args: argparse.Namespace, stopper: Stopper
) -> int:
    interrupted = False
    pending: set[asyncio.Future[None]] = set()

    def on_sigint() -> None:
        nonlocal interrupted
        if interrupted:  # a second Ctrl-C: stop waiting
            stopper.stop(signal.SIGINT)
            return
        interrupted = True
        _say("kgs: interrupting the kernel (Ctrl-C again to stop waiting)")
        task = asyncio.ensure_future(client.interrupt(kernel_id))
        pending.add(task)
        task.add_done_callback(interrupt_done)

    def interrupt_done(task: asyncio.Future[None]) -> None:
        pending.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None and stopper.signal is None:  # not when kgs is stopping anyway
            _say(f"kgs: could not interrupt the kernel: {error}")

    stopper.on_sigint(on_sigint)
    result = await client.execute(
        kernel_id,
        code,
        on_stdout=lambda text: _write(sys.stdout, text),
        on_stderr=lambda text: _write(sys.stderr, text),
        on_output=_print_output,
        input=_ask if sys.stdin.isatty() else None,
        timeout=args.timeout,
    )
    if result.status == "ok":
        return EXIT_OK
    if result.status == "interrupted" or interrupted:
        return EXIT_INTERRUPTED
    return EXIT_ERROR


def _write(stream: Any, text: str) -> None:
    stream.write(text)
    stream.flush()


def _say(line: str) -> None:
    """One line on standard error; nothing if it is gone (a closed terminal)."""
    with contextlib.suppress(OSError):
        _write(sys.stderr, line + "\n")


def _print_output(event: Event) -> None:
    if event.event == "error":
        _write(sys.stderr, "\n".join(event.data["traceback"]) + "\n")
    else:
        _write(sys.stdout, str(event.data["data"].get("text/plain", "")) + "\n")


def _ask(prompt: str, password: bool) -> str:
    return getpass.getpass(prompt) if password else input(prompt)


def _reconnecting(reconnect: Reconnect) -> None:
    where = "the start" if reconnect.since is None else f"seq {reconnect.since}"
    when = f"in {reconnect.delay:.1f} s" if reconnect.delay else "now"
    _say(f"kgs: {reconnect.reason}; reconnecting {when}, resuming after {where}")


async def _follow(client: GatewayClient, args: argparse.Namespace, _: Stopper) -> int:
    # Closed here, not by the loop's shutdown: output to a closed pipe raises in the body,
    # and the stream must end before the client does.
    events = client.stream(args.kernel, args.since)
    async with contextlib.aclosing(events):  # type: ignore[type-var]
        return await _print_events(events)


async def _print_events(events: Any) -> int:
    async for event in events:
        if event.event == "stream":
            content = event.data["content"]
            _write(sys.stderr if content["name"] == "stderr" else sys.stdout, content["text"])
        elif event.event == "kernel_shutdown":
            _say("kgs: the kernel shut down")
        else:
            notice = _notice(event.event, event.data.get("content"))
            if notice:
                _say(f"kgs: {notice}")
    return EXIT_OK


def _notice(event: str, content: Any) -> str | None:
    """What ``kgs follow`` says on stderr of a record that is not output: the kernel's
    lives (a restart begins a new one), and what the transcript could not keep."""
    if not isinstance(content, dict):
        return None
    reason = content.get("reason")
    because = f" ({reason})" if isinstance(reason, str) and reason else ""
    if event == "status" and content.get("execution_state") == "restarting":
        epoch = content.get("epoch")
        life = f": life {epoch} begins" if isinstance(epoch, int) else ""
        return f"the kernel restarted{because}{life}"
    if event == "status" and content.get("execution_state") == "dead":
        return f"the kernel is gone{because}"
    if event == GAP_MSG_TYPE:
        lost = content.get("lost")
        first, last = content.get("first_seq"), content.get("last_seq")
        if isinstance(lost, int) and lost > 0:
            what = f"{lost} messages lost"
        elif "lost" in content and lost is None:
            what = "output may be missing"
        else:
            what = f"seq {first}..{last} could not be kept"
        return f"{what} here{because}"
    if event == LIFECYCLE_MSG_TYPE and content.get("event") in ("unreachable", "reachable"):
        return f"the kernel is {content['event']}{because}"
    return None


async def _export(client: GatewayClient, args: argparse.Namespace, _: Stopper) -> int:
    if args.format == "text":
        text = await client.transcript_text(args.kernel, since=args.since, parent=args.parent)
        _write(sys.stdout, text)
        return EXIT_OK
    since = args.since
    while True:
        page = await client.transcript(args.kernel, since=since, limit=10000, parent=args.parent)
        for record in page["records"]:
            sys.stdout.write(json.dumps(record) + "\n")
        if not page["records"]:
            return EXIT_OK
        since = page["next_since"]


async def _kernels(client: GatewayClient, *_: Any) -> int:
    for kernel in await client.list_kernels():
        print(f"{kernel['id']}  {kernel['name']}  {kernel.get('execution_state', '')}")
    return EXIT_OK


COMMANDS = {"run": _run, "follow": _follow, "export": _export, "kernels": _kernels}


async def _main(args: argparse.Namespace) -> int:
    task = asyncio.current_task()
    assert task is not None
    stopper = Stopper(asyncio.get_running_loop(), task)
    try:
        async with GatewayClient(args.url, args.token, on_reconnect=_reconnecting) as client:
            return await COMMANDS[args.command](client, args, stopper)
    except asyncio.CancelledError:
        if stopper.signal is None:
            raise
        return 128 + stopper.signal
    except ClientError as error:  # KernelDied, GatewayUnreachable, an HTTP error
        _say(f"kgs: {error}")
        return EXIT_GATEWAY
    except BrokenPipeError:  # the reader of our output is gone (| head): not an error
        _discard_stdout()
        return EXIT_OK
    finally:
        stopper.remove()


def _discard_stdout() -> None:
    """Point standard output at /dev/null, so that the interpreter's last flush of what is
    buffered for a closed pipe does not print a BrokenPipeError at exit."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "run" and args.code is None and args.file not in (None, "-"):
        try:
            with open(args.file, encoding="utf-8") as source:
                args.source = source.read()
        except (OSError, UnicodeDecodeError) as error:
            why = getattr(error, "strerror", None) or str(error)
            _say(f"kgs: cannot read {args.file}: {why}")
            return EXIT_USAGE
    try:
        status = asyncio.run(_main(args))
        sys.stdout.flush()
    except KeyboardInterrupt:  # Ctrl-C before the handlers were in place, or after
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the last flush, to a reader that is gone
        _discard_stdout()
        return EXIT_OK
    return status


if __name__ == "__main__":
    sys.exit(main())
