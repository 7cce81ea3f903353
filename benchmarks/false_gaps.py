"""How often the gateway in front of an upstream records a gap that is not one.

    python -m benchmarks.false_gaps [--floods 20] [--lines 20000]

The upstream is jupyter_server (rate limit off) whose ``python3`` kernel is started by
kernel_gateway_stream's launcher, an ipykernel whose IOPub never drops: nothing it sends
is lost, so every ``upstream_lost`` gap record the gateway in front writes is false (see
``kernel_gateway_stream/core/upstream_counters.py``). One client of the gateway runs the
flood ``--floods`` times; after the last, the gateway gets longer than its reordering
window's quiet limit to judge what is still pending. Prints the lines each flood
delivered and the gap records, and exits 1 if there is any gap record.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from .scenarios import FLOOD, run_on
from .systems import JUPYTER_SERVER_NO_LIMIT, TOKEN, Server, System

#: Longer than the gateway's quiet window (UpstreamSettings: 10 s by default).
SETTLE_SECONDS = 12.0


def install_lossless(jupyter_path: Path) -> None:
    spec = jupyter_path / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    launcher = "kernel_gateway_stream.kernel_launcher"
    argv = [sys.executable, "-m", launcher, "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Python 3 (lossless)", "language": "python"})
    )


async def gap_records(server: Server, kernel_id: str) -> list[dict[str, object]]:
    gaps: list[dict[str, object]] = []
    since = 0
    while True:
        page = await server.request(
            "GET", f"/api/kernels/{kernel_id}/transcript?since={since}&limit=10000"
        )
        records = page["records"]
        if not records:
            return gaps
        gaps += [r["content"] for r in records if r["msg_type"] == "kernel_gateway_stream_gap"]
        since = records[-1]["seq"]


async def main(floods: int, lines: int) -> int:
    with tempfile.TemporaryDirectory(prefix="kgs-false-gaps-") as directory:
        home = Path(directory)
        install_lossless(home / "jp")
        upstream = Server(JUPYTER_SERVER_NO_LIMIT, home / "upstream", home / "jp")
        await upstream.start()
        front = Server(
            System(
                "kernel_gateway_stream in front",
                "gateway",
                (f"--gateway-url={upstream.base}", f"--GatewayClient.auth_token={TOKEN}"),
            ),
            home / "front",
            home / "jp",
        )
        await front.start()
        try:
            kernel_id = await front.start_kernel()
            delivered = []
            started = time.perf_counter()
            for index in range(floods):
                took, tallies, _, finished = await run_on(
                    front, kernel_id, "v1", FLOOD.format(n=lines), 1, 300
                )
                delivered.append(tallies[0].lines)
                print(f"flood {index + 1}: {tallies[0].lines:,} lines in {took:.1f} s"
                      f"{'' if finished else ' (not finished)'}", flush=True)  # fmt: skip
            await asyncio.sleep(SETTLE_SECONDS)
            gaps = await gap_records(front, kernel_id)
            await front.shutdown_kernel(kernel_id)
        finally:
            await front.stop()
            await upstream.stop()
    complete = sum(1 for count in delivered if count == lines)
    print(
        f"{floods} floods of {lines:,} lines: {complete} complete, "
        f"{len(gaps)} gap records {gaps} in {time.perf_counter() - started:.0f} s"
    )
    return 1 if gaps else 0


def cli() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--floods", type=int, default=20)
    parser.add_argument("--lines", type=int, default=20_000)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.floods, args.lines)))


if __name__ == "__main__":
    cli()
