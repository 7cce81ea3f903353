"""The daemon's CPU per IOPub message in a firehose, without a profiler attached.

    python -m benchmarks.cpu_per_message                # 100,000 x 64 B, v1, 3 rounds
    python -m benchmarks.cpu_per_message --size 4096 --count 10000 --rounds 5

Each round starts the gateway on its defaults (SQLite, in-process broker) and a firehose
kernel, warms it up, then runs the firehose to one client and prints the daemon's user and
system CPU seconds over the run divided by the messages the client got. A fresh daemon per
round: what one run leaves behind (a grown heap, a busy writer) does not bill the next.

To compare two commits on a noisy machine, run this on each in turn, alternating (A, B, A,
B): the machine's speed drifts by more than many changes save.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from .profile import warmed_gateway
from .scenarios import firehose, run_on


async def one_round(count: int, size: int, protocol: str) -> tuple[float, float]:
    """``(µs of daemon CPU per message, seconds)`` of one firehose run."""
    async with warmed_gateway(size, protocol) as (server, kernel_id, _):
        seconds, tallies, cpu, finished = await run_on(
            server, kernel_id, protocol, firehose(count, size), 1, 600
        )
    if not finished:
        raise SystemExit(f"the firehose did not finish: {tallies[0].lines} of {count}")
    return cpu / max(tallies[0].lines, 1) * 1e6, seconds


async def main(count: int, size: int, protocol: str, rounds: int) -> None:
    figures = []
    for number in range(rounds):
        us, seconds = await one_round(count, size, protocol)
        figures.append(us)
        print(f"round {number + 1}: {us:.1f} µs a message ({seconds:.2f} s)", flush=True)
    print(
        f"{count:,} x {size} B, {protocol}, one client: median {statistics.median(figures):.1f}"
        f" µs of daemon CPU a message over {rounds} rounds"
    )


def cli() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--protocol", choices=("v1", "legacy"), default="v1")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.count, args.size, args.protocol, args.rounds))


if __name__ == "__main__":
    cli()
