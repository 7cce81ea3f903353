"""What watching one kernel costs with many clients: the server's CPU, the clients' own CPU,
the time until all have everything, and the frames each got.

    python -m benchmarks.fanout_cost                      # 1 and 1,000 clients, 2,000 lines
    python -m benchmarks.fanout_cost --clients 1 100 1000 --messages 2000 --repeats 5
    python -m benchmarks.fanout_cost --clients 1 100 --messages 10000 --size 4096
    python -m benchmarks.fanout_cost --clients 100 --messages 5000 --size 4096 --send-floor

The gateway on its defaults (SQLite, in-process broker) and a firehose kernel; the clients
all live in this process, as in ``python -m benchmarks --only fanout``, whose runs this
repeats with two more figures: this process's CPU (on 2 cores the clients' reading bounds
the time before the server does) and the stream frames per client (what coalescing made of
the lines). Each figure is the median of ``--repeats`` runs on the same sockets.

``--send-floor`` measures, instead of the gateway, what any server pays to copy the same
bytes into that many loopback sockets: one thread sends them in pieces of ``--piece``
bytes (64 KiB by default: about the broker's frames of a 4 KiB flood), a piece to each
socket in turn, while another thread reads and drops them; the sending thread's CPU
(``time.thread_time``) is the figure. Sending N copies of the output costs at least that.

To compare two commits, run this in each tree in turn (A, B, A, B): the daemon it starts
is the package of the directory it runs in.
"""

from __future__ import annotations

import argparse
import asyncio
import selectors
import socket
import statistics
import threading
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


def send_floor(clients: int, total: int, piece: int = 64 * 1024) -> float:
    """CPU seconds one thread spends sending ``total`` bytes to each of ``clients`` loopback
    sockets, ``piece`` bytes to each in turn, while another thread drains them."""
    pairs = []
    for _ in range(clients):
        with socket.create_server(("127.0.0.1", 0)) as server:
            client = socket.create_connection(server.getsockname())
            pairs.append((server.accept()[0], client))
    drain = threading.Thread(target=_drain, args=([client for _, client in pairs],))
    drain.start()
    data = b"x" * piece
    started = time.thread_time()
    try:
        for _ in range(total // piece):
            for sender, _ in pairs:
                sender.sendall(data)
    finally:
        for sender, _ in pairs:
            sender.close()
    used = time.thread_time() - started
    drain.join()
    return used


def _drain(connections: list[socket.socket]) -> None:
    selector = selectors.DefaultSelector()
    for connection in connections:
        connection.setblocking(False)
        selector.register(connection, selectors.EVENT_READ)
    left = len(connections)
    while left:
        for key, _ in selector.select():
            ready = key.fileobj
            assert isinstance(ready, socket.socket)
            try:
                data = ready.recv(1 << 20)
            except BlockingIOError:
                continue
            if not data:
                selector.unregister(ready)
                ready.close()
                left -= 1


def cli() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 1000])
    parser.add_argument("--messages", type=int, default=2_000)
    parser.add_argument("--size", type=int, default=64, help="bytes of each line")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--send-floor", action="store_true", help="see the module docstring")
    parser.add_argument(
        "--piece", type=int, default=64 * 1024, help="--send-floor: bytes of each send"
    )
    args = parser.parse_args()
    if args.send_floor:
        for clients in args.clients:
            total = args.messages * args.size
            runs = [send_floor(clients, total, args.piece) for _ in range(args.repeats)]
            print(
                f"{clients:>5} sockets, {total / 1e6:.1f} MB each: the sending thread's CPU"
                f" {statistics.median(runs):.3f} s (median of {args.repeats})"
            )
        return
    asyncio.run(main(args.clients, args.messages, args.size, args.repeats))


if __name__ == "__main__":
    cli()
