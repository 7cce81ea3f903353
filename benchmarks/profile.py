"""Where the gateway's CPU goes per IOPub message: py-spy on the daemon during a firehose.

    python -m benchmarks.profile                      # 200,000 x 64 B, v1, one client
    python -m benchmarks.profile --count 20000 --size 4096 --protocol legacy
    python -m benchmarks.profile --native --top 12    # and the C functions samples end in

Starts the gateway on its defaults (SQLite, in-process broker), a firehose kernel
(benchmarks/firehose.py) and one WebSocket client that runs the firehose, while ``py-spy
record --gil`` samples the daemon (every thread, only while it holds the GIL: py-spy's
default mode counts a thread waiting in ``select`` or on a lock as busy). Each sampled stack
is put in one stage by the innermost frame a rule of :data:`STAGES` knows; the table gives
each stage's share of the samples and that share of the daemon's CPU time per message
(psutil's user + system seconds over the run, divided by the messages). Needs ``py-spy``
(``pip install py-spy``) and the rights to trace the daemon (root, or ptrace allowed).

``--native`` unwinds C frames too, and adds a table of the C functions the samples end in,
each with the line of Python that called it: a cost a Python profile pins on an innocent
line (``asyncio.get_running_loop()`` is one C call, and spent 8 % of the daemon's CPU in
``getpid()``) is named there.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from .firehose import install_kernelspec
from .scenarios import firehose, run_on
from .systems import GATEWAY, Server

#: ``(stage, needles)``: a frame ``function (file:line)`` matching any needle (a substring)
#: puts the stack in that stage; the innermost matching frame decides.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SQLite writer thread", ("sqlite_writer.py",)),
    ("ZMQ receive", ("_receive (", "_pull (")),
    ("HMAC and replay check", ("Signer.sign (", "Signer.verify (", "DigestHistory.seen (")),
    ("JSON and field peeks", ("_plain_object", "_object (", "peek_stream", "_peek_parent")),
    ("record building", ("from_parts", "__init__ (<string>", "Sequencer.assign (", "_verified (")),
    ("store append", ("pending.py", "append (kernel_gateway_stream/stores")),
    ("coalescing and frames", ("coalescer.py", "frames.py")),
    ("encoding for clients", ("wire.py",)),
    ("fan-out and subscribers", ("broker/",)),
    ("tornado WebSocket and IOStream", ("tornado/websocket.py", "tornado/iostream.py")),
    ("activity, metrics, observers", ("activity.py", "metrics.py", "_published (")),
    ("recorder", ("recording/recorder.py",)),
    ("IOPub source", ("zmq_kernel.py",)),
    ("event loop", ("asyncio/", "tornado/")),
)


def stage_of(stack: str) -> str:
    """The stage of one collapsed stack (``frame;frame;...``, outermost first)."""
    for frame in reversed(stack.split(";")):
        for stage, needles in STAGES:
            if any(needle in frame for needle in needles):
                return stage
    return "other"


def samples(raw: str) -> Iterator[tuple[list[str], int]]:
    """``(frames, count)`` of each sample line of py-spy's ``--format raw`` output, frames
    outermost first."""
    for line in raw.splitlines():
        stack, _, number = line.rpartition(" ")
        if stack and number.isdigit():
            yield stack.split(";"), int(number)


def breakdown(raw: str) -> collections.Counter[str]:
    """Samples per stage, from py-spy's ``--format raw`` output."""
    counts: collections.Counter[str] = collections.Counter()
    for frames, number in samples(raw):
        counts[stage_of(";".join(frames))] += number
    return counts


def innermost(raw: str, depth: int) -> collections.Counter[str]:
    """Samples per chain of the ``depth`` innermost frames of the gateway's own code (or of
    the stack's innermost frames when none is the gateway's)."""
    counts: collections.Counter[str] = collections.Counter()
    for frames, number in samples(raw):
        own = [i for i, frame in enumerate(frames) if "kernel_gateway_stream/" in frame]
        end = own[-1] + 1 if own else len(frames)
        counts[" ← ".join(reversed(frames[max(0, end - depth) : end]))] += number
    return counts


def native_leaves(raw: str) -> collections.Counter[str]:
    """Samples per C function a stack ends in (a frame with no Python file), with the
    innermost Python frame that called it."""
    counts: collections.Counter[str] = collections.Counter()
    for frames, number in samples(raw):
        if ".py:" in frames[-1]:
            continue
        python = [frame for frame in frames if ".py:" in frame]
        caller = python[-1] if python else "no Python frame"
        counts[f"{frames[-1].split(' (')[0]} ← {caller}"] += number
    return counts


def table(counts: collections.Counter[str], cpu_us: float) -> str:
    total = sum(counts.values()) or 1
    rows = ["| stage | µs per message | share |", "|---|---|---|"]
    for stage, samples in counts.most_common():
        share = samples / total
        rows.append(f"| {stage} | {share * cpu_us:.1f} | {100 * share:.0f} % |")
    rows.append(f"| **all (daemon CPU per message)** | **{cpu_us:.1f}** | {total} samples |")
    return "\n".join(rows)


@contextlib.asynccontextmanager
async def warmed_gateway(size: int, protocol: str) -> AsyncIterator[tuple[Server, str, Path]]:
    """The gateway on its defaults with a firehose kernel, warmed up (the first execution
    pays imports and connection set-up): ``(server, kernel_id, home)``, stopped after."""
    with tempfile.TemporaryDirectory() as home_name:
        home = Path(home_name)
        install_kernelspec(home / "jp")
        server = Server(GATEWAY, home / "gateway", home / "jp")
        await server.start()
        try:
            kernel_id = await server.start_kernel("firehose")
            await run_on(server, kernel_id, protocol, firehose(2_000, size), 1, 60)
            yield server, kernel_id, home
        finally:
            await server.stop()


async def profile(
    count: int, size: int, protocol: str, rate: int, top: int, native: bool = False
) -> str:
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        sys.exit("py-spy is not installed: pip install py-spy")
    async with warmed_gateway(size, protocol) as (server, kernel_id, home):
        assert server.process is not None
        out = home / "profile.txt"
        spy = subprocess.Popen(
            [py_spy, "record", "--gil", *(["--native"] if native else []), "--format", "raw",
             "--rate", "250", "--pid", str(server.process.pid), "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        await asyncio.sleep(1.0)  # py-spy attaches
        seconds, tallies, cpu, finished = await run_on(
            server, kernel_id, protocol, firehose(count, size, rate), 1, 600
        )
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
        lines = tallies[0].lines
        raw = out.read_text()
        counts = breakdown(raw)
    head = (
        f"{count:,} x {size} B, {protocol}, one client: {lines:,} messages in {seconds:.2f} s,"
        f" daemon CPU {cpu:.2f} s{'' if finished else ' (not finished)'}"
    )
    cpu_us = cpu / max(lines, 1) * 1e6
    text = head + "\n\n" + table(counts, cpu_us)
    if top:
        frames = innermost(raw, 2)
        total = sum(frames.values()) or 1
        text += "\n\n| innermost frames of the gateway's code | µs per message |\n|---|---|\n"
        text += "\n".join(
            f"| {chain} | {samples / total * cpu_us:.1f} |"
            for chain, samples in frames.most_common(top)
        )
    if native:
        leaves = native_leaves(raw)
        total = sum(counts.values()) or 1
        text += "\n\n| C function the sample ends in ← its Python caller | µs per message |\n"
        text += "|---|---|\n" + "\n".join(
            f"| {leaf} | {samples / total * cpu_us:.1f} |"
            for leaf, samples in leaves.most_common(top or 12)
        )
    return text


def cli() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--protocol", choices=("v1", "legacy"), default="v1")
    parser.add_argument("--rate", type=int, default=0, help="messages a second (0: no limit)")
    parser.add_argument("--top", type=int, default=0, help="also the N costliest frames")
    parser.add_argument(
        "--native", action="store_true", help="unwind C frames too, and name the C functions"
    )
    args = parser.parse_args()
    print(
        asyncio.run(profile(args.count, args.size, args.protocol, args.rate, args.top, args.native))
    )


if __name__ == "__main__":
    cli()
