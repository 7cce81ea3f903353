"""``kgs``: run code on a gateway's kernels, follow their output, export transcripts.

    kgs run -c "print('hi')"                 # on a new kernel, shut down afterwards
    kgs run --kernel ID script.py            # on a running kernel
    kgs follow ID --since 120                # like tail -f, from a sequence number
    kgs export ID --format jsonl > out.jsonl
    kgs kernels

Connection: ``--url`` (``$KGS_URL``, default http://127.0.0.1:8888) and ``--token``
(``$KGS_TOKEN`` or ``$JUPYTER_TOKEN``). ``run`` exits 0 when the code succeeded, 1 on an
error, 130 when interrupted (Ctrl-C interrupts the kernel) and 3 if the kernel died or the
gateway could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import signal
import sys
from typing import Any

from .client import ClientError, GatewayClient, KernelDied

__all__ = ["main"]

EXIT_OK, EXIT_ERROR, EXIT_GATEWAY, EXIT_INTERRUPTED = 0, 1, 3, 130


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
    export.add_argument("--since", type=int, default=0)
    export.add_argument("--parent", help="only this execution's records")
    commands.add_parser("kernels", help="list running kernels")
    return parser


async def _run(client: GatewayClient, args: argparse.Namespace) -> int:
    if args.code is not None:
        code = args.code
    elif args.file in (None, "-"):
        code = sys.stdin.read()
    else:
        with open(args.file, encoding="utf-8") as source:
            code = source.read()
    kernel_id = args.kernel or await client.start_kernel()
    loop = asyncio.get_running_loop()
    interrupted = False

    pending: set[asyncio.Future[None]] = set()

    def on_sigint() -> None:
        nonlocal interrupted
        interrupted = True
        task = asyncio.ensure_future(client.interrupt(kernel_id))
        pending.add(task)
        task.add_done_callback(pending.discard)

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    try:
        result = await client.execute(
            kernel_id,
            code,
            on_stdout=lambda text: _write(sys.stdout, text),
            on_stderr=lambda text: _write(sys.stderr, text),
            on_output=_print_output,
            input=_ask if sys.stdin.isatty() else None,
            timeout=args.timeout,
        )
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        if args.kernel is None and not args.keep:
            await client.shutdown(kernel_id)
    if result.status == "ok":
        return EXIT_OK
    if result.status == "interrupted" or interrupted:
        return EXIT_INTERRUPTED
    return EXIT_ERROR


def _write(stream: Any, text: str) -> None:
    stream.write(text)
    stream.flush()


def _print_output(event: Any) -> None:
    if event.event == "error":
        _write(sys.stderr, "\n".join(event.data["traceback"]) + "\n")
    else:
        _write(sys.stdout, str(event.data["data"].get("text/plain", "")) + "\n")


def _ask(prompt: str, password: bool) -> str:
    return getpass.getpass(prompt) if password else input(prompt)


async def _follow(client: GatewayClient, args: argparse.Namespace) -> int:
    async for event in client.stream(args.kernel, args.since):
        if event.event == "stream":
            content = event.data["content"]
            _write(sys.stderr if content["name"] == "stderr" else sys.stdout, content["text"])
    return EXIT_OK


async def _export(client: GatewayClient, args: argparse.Namespace) -> int:
    if args.format == "text":
        _write(sys.stdout, await client.transcript_text(args.kernel, parent=args.parent))
        return EXIT_OK
    since = args.since
    while True:
        page = await client.transcript(args.kernel, since=since, limit=10000, parent=args.parent)
        for record in page["records"]:
            sys.stdout.write(json.dumps(record) + "\n")
        if not page["records"]:
            return EXIT_OK
        since = page["next_since"]


async def _kernels(client: GatewayClient, _: argparse.Namespace) -> int:
    for kernel in await client.list_kernels():
        print(f"{kernel['id']}  {kernel['name']}  {kernel.get('execution_state', '')}")
    return EXIT_OK


COMMANDS = {"run": _run, "follow": _follow, "export": _export, "kernels": _kernels}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    async def go() -> int:
        async with GatewayClient(args.url, args.token) as client:
            return await COMMANDS[args.command](client, args)

    try:
        return asyncio.run(go())
    except KernelDied as error:
        print(f"kgs: {error}", file=sys.stderr)
        return EXIT_GATEWAY
    except ClientError as error:
        print(f"kgs: {error}", file=sys.stderr)
        return EXIT_GATEWAY
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
