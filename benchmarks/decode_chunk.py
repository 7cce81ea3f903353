"""What a replay pays per stored record to turn it back into a record, alone:

    python -m benchmarks.decode_chunk

A chunk of 300 stream records of a 64-byte line (as the firehose's records are stored)
decoded again and again by ``core.records.decode_chunk``, which a replay's reader thread
runs for every chunk it reads: microseconds per record, the median of five rounds.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid

from kernel_gateway_stream.core.messages import KernelMessage, Record
from kernel_gateway_stream.core.records import ParentHeader, decode_chunk, encode_record


def main(records: int = 300, rounds: int = 2000) -> float:
    parent = ParentHeader(
        json.dumps({"msg_id": "p", "msg_type": "execute_request"}).encode(), "p", "execute_request"
    )
    chunk = []
    for seq in range(1, records + 1):
        header = {"msg_id": uuid.uuid4().hex, "msg_type": "stream", "date": "2026-11-29T00:00:00Z"}
        content = {"name": "stdout", "text": f"{seq} {'x' * 60}\n"}
        message = KernelMessage.from_parts(
            [json.dumps(header).encode(), parent.raw, b"{}", json.dumps(content).encode()]
        )
        chunk.append(encode_record(Record("k", seq, time.time(), message, 1), 1))
    data = b"".join(chunk)
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(rounds):
            decode_chunk(data, "k", lambda _: parent)
        timings.append((time.perf_counter() - started) / rounds / records * 1e6)
    return statistics.median(timings)


if __name__ == "__main__":
    print(f"decode_chunk: {main():.2f} µs a record (median of 5 rounds)")
