"""How often a new subscriber of a busy XPUB gets a message before the publisher has read
its subscription (docs/kernels.md, "a message or two before its notice").

    python -m benchmarks.subscription_race [--trials 3000]

A publisher thread does what the gateway's launcher does before each send: it reads every
subscription queued on its XPUB (``XPUB_VERBOSE``, ``SNDHWM=0``) and answers each with a
``NOTICE``, then sends a ``LIVE`` message; one subscriber stays connected throughout (the
launcher sends only while someone listens). New SUB sockets connect one after another, and
each says which came first. Run twice: libzmq applying subscriptions itself (the launcher's
way), and ``XPUB_MANUAL`` (the publisher applies each after reading it; no subscriber gets
anything before its notice, but see tests/unit/test_launcher_subscriptions.py for why the
launcher cannot use it).
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import cast

import zmq


def run(manual: bool, trials: int) -> int:
    """New subscribers whose first message was not their notice, of ``trials``."""
    context = zmq.Context()
    publisher = context.socket(zmq.XPUB)
    publisher.setsockopt(zmq.SNDHWM, 0)
    publisher.setsockopt(zmq.XPUB_VERBOSE, 1)
    if manual:
        publisher.setsockopt(zmq.XPUB_MANUAL, 1)
    url = f"tcp://127.0.0.1:{publisher.bind_to_random_port('tcp://127.0.0.1')}"
    stay = context.socket(zmq.SUB)
    stay.setsockopt(zmq.SUBSCRIBE, b"")
    stay.connect(url)
    stopped = threading.Event()

    def drain() -> None:
        while not stopped.is_set():
            if stay.poll(10):
                stay.recv_multipart()

    def publish() -> None:
        number = 0
        while not stopped.is_set():
            while cast(int, publisher.get(zmq.EVENTS)) & zmq.POLLIN:
                frame = publisher.recv_multipart(zmq.NOBLOCK)[0]
                if frame[:1] == b"\x01":
                    if manual:
                        publisher.setsockopt(zmq.SUBSCRIBE, frame[1:])
                    publisher.send_multipart([b"NOTICE"])
                elif frame[:1] == b"\x00" and manual:
                    publisher.setsockopt(zmq.UNSUBSCRIBE, frame[1:])
            publisher.send_multipart([b"LIVE", str(number).encode()])
            number += 1

    threads = [threading.Thread(target=drain), threading.Thread(target=publish)]
    for thread in threads:
        thread.start()
    early = 0
    try:
        time.sleep(0.3)
        for _ in range(trials):
            subscriber = context.socket(zmq.SUB)
            subscriber.setsockopt(zmq.SUBSCRIBE, b"")
            subscriber.setsockopt(zmq.LINGER, 0)
            subscriber.setsockopt(zmq.RCVTIMEO, 10_000)
            subscriber.connect(url)
            early += subscriber.recv_multipart()[0] != b"NOTICE"
            subscriber.close()
            time.sleep(0.002)
    finally:
        stopped.set()
        for thread in threads:
            thread.join()
        stay.close(linger=0)
        publisher.close(linger=0)
        context.term()
    return early


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3000)
    arguments = parser.parse_args()
    print(f"libzmq {zmq.zmq_version()}, pyzmq {zmq.__version__}, {arguments.trials} subscribers")
    for manual in (False, True):
        early = run(manual, arguments.trials)
        mode = "XPUB_MANUAL" if manual else "applied by libzmq"
        print(f"  {mode}: {early} got a message before their notice")


if __name__ == "__main__":
    main()
