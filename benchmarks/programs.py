"""What a program using the execute API sees: interrupt latency and print-to-callback time.

    python -m benchmarks.programs            # 10 interrupts per loop kind, 500 timed prints
    python -m benchmarks.programs --quick

The gateway runs as a real subprocess on 127.0.0.1; the measurements go through the public
Python client (``kernel_gateway_stream.client``). Interrupt latency is from the interrupt
request until the execution's ``done`` event says ``interrupted``. Print-to-callback is from
the kernel's ``time.time()`` just before a flushed print to the moment ``on_stdout`` runs
with it, on the same machine clock; one print every 10 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kernel_gateway_stream.client import GatewayClient

from .systems import GATEWAY, TOKEN, Server

LOOPS = {
    "sleep loop": "import time\nwhile True:\n    time.sleep(0.01)",
    "pure-Python loop": "x = 0\nwhile True:\n    x += 1",
}


async def interrupt_latency(client: GatewayClient, kernel_id: str, code: str) -> float:
    msg_id = await client.start_execution(kernel_id, code)
    events = client.execution_events(kernel_id, msg_id)
    async for event in events:
        if event.event == "status" and event.data["execution_state"] == "busy":
            break
    await asyncio.sleep(0.3)
    asked = time.perf_counter()
    await client.interrupt_execution(kernel_id, msg_id)
    async for event in events:
        if event.event == "done":
            assert event.data["status"] == "interrupted", event.data
            return time.perf_counter() - asked
    raise RuntimeError("no done event")


async def print_to_callback(client: GatewayClient, kernel_id: str, prints: int) -> list[float]:
    delays: list[float] = []

    partial = ""

    def on_stdout(text: str) -> None:
        # A print may arrive in two pieces (its text, then its newline): whole lines only.
        nonlocal partial
        now = time.time()
        text = partial + text
        cut = text.rfind("\n") + 1
        partial = text[cut:]
        for line in text[:cut].splitlines():
            delays.append(now - float(line))

    code = (
        f"import time\nfor _ in range({prints}):\n"
        "    print(time.time(), flush=True)\n    time.sleep(0.01)"
    )
    await client.execute(kernel_id, code, on_stdout=on_stdout)
    return delays


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def main(repeats: int, prints: int, output: Path) -> None:
    with tempfile.TemporaryDirectory() as home:
        server = Server(GATEWAY, Path(home) / "gateway", Path(home) / "jupyter")
        await server.start()
        try:
            client = GatewayClient(f"http://127.0.0.1:{server.port}", TOKEN)
            kernel_id = await client.start_kernel()
            await client.execute(kernel_id, "print('warm')")
            report: dict[str, Any] = {
                "machine": {"cores": os.cpu_count(), "python": platform.python_version()}
            }
            print(f"{os.cpu_count()} cores, Python {platform.python_version()}")
            for name, code in LOOPS.items():
                latencies = [
                    await interrupt_latency(client, kernel_id, code) for _ in range(repeats)
                ]
                report[f"interrupt {name}"] = latencies
                print(
                    f"interrupt, {name:17} median {statistics.median(latencies) * 1000:7.1f} ms"
                    f"   max {max(latencies) * 1000:7.1f} ms   ({repeats} runs)"
                )
            delays = await print_to_callback(client, kernel_id, prints)
            report["print to callback"] = delays
            print(
                f"print to callback       p50 {percentile(delays, 0.5) * 1000:7.2f} ms"
                f"   p99 {percentile(delays, 0.99) * 1000:7.2f} ms   ({len(delays)} prints)"
            )
            await client.shutdown(kernel_id)
            await client.aclose()
        finally:
            await server.stop()
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2))
    print(f"JSON: {output}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="3 interrupts, 100 prints")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/programs.json"))
    args = parser.parse_args()
    repeats, prints = (3, 100) if args.quick else (10, 500)
    asyncio.run(main(repeats, prints, args.output))


if __name__ == "__main__":
    cli()
