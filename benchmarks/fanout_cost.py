"""What watching one kernel costs with many clients: the server's CPU, the clients' own CPU,
the time until all have everything, and the frames each got.

    python -m benchmarks.fanout_cost                      # 1 and 1,000 clients, 2,000 lines
    python -m benchmarks.fanout_cost --clients 1 100 1000 --messages 2000 --repeats 5
    python -m benchmarks.fanout_cost --clients 1 100 --messages 10000 --size 4096

The gateway on its defaults (SQLite, in-process broker) and a firehose kernel; the clients
all live in this process, as in ``python -m benchmarks --only fanout``, whose runs this
repeats with two more figures: this process's CPU (on 2 cores the clients' reading bounds
the time before the server does) and the stream frames per client (what coalescing made of
the lines). Each figure is the median of ``--repeats`` runs on the same sockets.

To compare two commits, run this in each tree in turn (A, B, A, B): the daemon it starts
is the package of the directory it runs in.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from .profile import warmed_gateway
from .scenarios import connect_many, firehose
from .wsclient import Tally, follow_all


async def main(counts: list[int], messages: int, size: int, repeats: int) -> None:
    async with warmed_gateway(size, "v1") as (server, kernel_id, _):
        for clients in counts:
            sockets = await connect_many(server.port, kernel_id, "v1", clients)
            try:
                warm = sockets[0].execute(firehose(200, size))
                await follow_all([(ws, Tally(warm)) for ws in sockets], 60)
                runs = []
                for _ in range(repeats):
                    cpu, mine = server.cpu_seconds(), time.process_time()
                    started = time.perf_counter()
                    msg_id = sockets[0].execute(firehose(messages, size))
                    tallies = [Tally(msg_id) for _ in sockets]
                    finished = await follow_all(list(zip(sockets, tallies, strict=True)), 60)
                    if not finished or min(t.lines for t in tallies) != messages:
                        raise SystemExit(f"{clients} clients: not every client got every line")
                    ended = max(t.done_at or time.perf_counter() for t in tallies)
                    runs.append(
                        (
                            ended - started,
                            server.cpu_seconds() - cpu,
                            time.process_time() - mine,
                            statistics.mean(t.frames for t in tallies),
                        )
                    )
            finally:
                for ws in sockets:
                    ws.close()
            seconds, server_cpu, client_cpu, frames = (
                statistics.median(run[i] for run in runs) for i in range(4)
            )
            print(
                f"{clients:>5} clients, {messages:,} x {size} B: {seconds:.3f} s until all had"
                f" them,"
                f" server CPU {server_cpu:.3f} s, clients' CPU {client_cpu:.3f} s,"
                f" {frames:.1f} stream frames a client (median of {repeats})",
                flush=True,
            )
            await asyncio.sleep(1.0)


def cli() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 1000])
    parser.add_argument("--messages", type=int, default=2_000)
    parser.add_argument("--size", type=int, default=64, help="bytes of each line")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.clients, args.messages, args.size, args.repeats))


if __name__ == "__main__":
    cli()
