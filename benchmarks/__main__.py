"""Side by side: this gateway, jupyter_server (defaults and rate limit off) and
jupyter_kernel_gateway, in one run, on one machine, with the same client code and kernels.

    python -m pip install -e ".[bench]" && python -m benchmarks            # about 10 minutes
    python -m benchmarks --quick                                          # about 2 minutes
    python -m benchmarks --only latency fanout --systems kernel_gateway_stream
    python -m benchmarks --only faults --seed 1 --faults 50                # about 6 minutes
    python -m benchmarks --only kernel_start                               # about 2 minutes

Prints Markdown tables (each scenario, then the targets with the ratios measured) and
writes everything, every run included, to ``benchmarks/results/report.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import resource
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jupyter_server
import zmq

from . import faults, idle_floor, nodes, pool
from . import scenarios as sc
from .firehose import install_kernelspec
from .systems import SYSTEMS, Server, System

SCENARIOS = (
    "loss",
    "throughput",
    "fanout",
    "latency",
    "idle_memory",
    "transcript",
    "catchup",
    "upstream",
    "nodes",
    "faults",
    "kernel_start",
)
#: Scenarios that start servers of their own, not one per system.
OWN_SERVERS = {"upstream", "nodes", "faults", "kernel_start"}
Row = dict[str, Any]


async def run_system(system: System, home: Path, plan: sc.Plan, only: set[str]) -> list[Row]:
    server = Server(system, home / system.kind / str(len(list(home.glob("*/*")))), home / "jp")
    await server.start()
    rows: list[Row] = []

    async def step(name: str, work: Callable[[], Awaitable[Row | list[Row]]]) -> None:
        if name not in only:
            return
        started = time.perf_counter()
        result = await work()
        rows.extend(result if isinstance(result, list) else [result])
        print(f"  {system.name}: {name} done in {time.perf_counter() - started:.1f} s", flush=True)

    try:
        # First, on a fresh process: later scenarios leave freed heap that new connections
        # would reuse without growing the RSS, which would flatter every system.
        await step("idle_memory", lambda: sc.idle_memory(server, plan))
        for protocol in system.protocols:
            await step("loss", lambda p=protocol: sc.loss(server, p, plan))  # type: ignore[misc]
        for protocol in system.protocols:
            await step("throughput", lambda p=protocol: sc.throughput(server, p, plan))  # type: ignore[misc]
        await step("fanout", lambda: sc.fanout(server, plan))
        for protocol in system.protocols:
            await step("latency", lambda p=protocol: sc.latency(server, p, plan))  # type: ignore[misc]
        if system.ours:
            await step("transcript", lambda: sc.transcript(server, plan))
        await step("catchup", lambda: sc.catchup(server, plan))
    finally:
        await server.stop()
    return rows


async def run_references(plan: sc.Plan, only: set[str]) -> list[Row]:
    rows: list[Row] = []
    if "loss" in only:
        rows.append(await sc.loss_direct(plan))
    if "throughput" in only:
        rows += await sc.throughput_floor(plan)
    if "latency" in only:
        rows.append(await sc.latency_direct(plan))
    if "idle_memory" in only:
        rows.append(await idle_floor.measure(plan.idle_clients))
    print("  references done", flush=True)
    return rows


def find(rows: list[Row], scenario: str, system: str, case: str | None = None) -> Row | None:
    for candidate in rows:
        same = candidate["scenario"] == scenario and candidate["system"] == system
        if same and (case is None or candidate["case"] == case):
            return candidate
    return None


def workload(item: Row) -> str:
    """A throughput row's workload without its protocol: "100,000 x 64 B"."""
    case: str = item["case"]
    return case.rsplit(", ", 1)[0]


def add_ratios(rows: list[Row]) -> None:
    """Each row against its reference: the same scenario's physical limit, or (fan-out)
    the same system with one client."""
    direct = find(rows, "loss", "direct ZMQ (jupyter_client)")
    latency_direct = find(rows, "latency", "direct ZMQ (jupyter_client)")
    idle = find(rows, "idle_memory", idle_floor.SYSTEM)
    for item in rows:
        scenario = item["scenario"]
        if scenario == "loss" and direct and item is not direct:
            item["x_direct"] = item["seconds"] / direct["seconds"]
        elif scenario == "throughput" and item["system"] != sc.FLOOR:
            size = workload(item)
            floor = next(
                (r for r in rows if r["system"] == sc.FLOOR and workload(r) == size),
                None,
            )
            if floor:
                item["x_floor"] = item["messages_per_second"] / floor["messages_per_second"]
                item["cpu_x_floor"] = item["us_per_message"] / floor["us_per_message"]
        elif scenario == "fanout" and item.get("seconds"):
            # Against one client of the same series (same message size).
            suffix = item["case"].partition(",")[2]
            one = find(
                rows, "fanout", item["system"], "1 clients" + (f",{suffix}" if suffix else "")
            )
            if one and one.get("seconds"):
                item["x_one_client"] = item["seconds"] / one["seconds"]
            if one and one.get("cpu_seconds") and item.get("cpu_seconds") is not None:
                item["cpu_x_one_client"] = item["cpu_seconds"] / one["cpu_seconds"]
        elif scenario == "idle_memory" and idle and item is not idle:
            item["kib_over_floor"] = item["kib_per_client"] - idle["kib_per_client"]
        elif scenario == "latency" and latency_direct and item is not latency_direct:
            item["added_p50_ms"] = item["p50_ms"] - latency_direct["p50_ms"]
            item["added_p99_ms"] = item["p99_ms"] - latency_direct["p99_ms"]


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.0f}"
        return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


COLUMNS = {
    "loss": ["seconds", "x_direct", "cpu_seconds", "lines", "loss_percent"],
    "throughput": [
        "messages_per_second",
        "megabytes_per_second",
        "x_floor",
        "us_per_message",
        "cpu_x_floor",
        "seconds",
        "loss_percent",
        "frames",
        "cpu_seconds",
        "note",
    ],
    "fanout": [
        "seconds",
        "x_one_client",
        "cpu_seconds",
        "us_per_message",
        "cpu_x_one_client",
        "client_cpu_seconds",
        "min_lines",
        "complete_clients",
        "note",
    ],
    "latency": ["p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms", "lines", "frames"],
    "upstream": [
        "seconds",
        "x_alone",
        "lines",
        "loss_percent",
        "gap_records",
        "lost_in_gaps",
        "finished",
    ],
    "kernel_start": [
        "starts",
        "taken_from_pool",
        "answer_p50_ms",
        "p50_ms",
        "p95_ms",
        "max_ms",
        "x_cold",
        "kernel_cpu_p50_ms",
        "idle_pooled_kernel_mib",
    ],
    "nodes": [
        "p50_ms",
        "p99_ms",
        "added_p50_ms",
        "added_p99_ms",
        "seconds",
        "x_one_node",
        "cpu_seconds",
        "cpu_x_one_node",
        "server_us_per_message",
        "lines",
        "complete_clients",
        "lease_taken_seconds",
        "execution_after_kill_seconds",
    ],
    "idle_memory": [
        "clients",
        "rss_before_mib",
        "rss_after_mib",
        "kib_per_client",
        "kib_over_floor",
        "live_clients",
        "note",
    ],
    "transcript": [
        "records",
        "records_per_second",
        "first_record_ms",
        "seconds",
        "cpu_seconds",
        "max_unwritten",
        "disk_per_output_byte",
        "note",
    ],
    "catchup": ["seconds", "backlog", "missed", "note"],
}


def tables(rows: list[Row]) -> str:
    out = []
    for scenario, columns in COLUMNS.items():
        chosen = [r for r in rows if r["scenario"] == scenario]
        if not chosen:
            continue
        out.append(f"\n#### {scenario}\n")
        out.append("| system | case | " + " | ".join(columns) + " |")
        out.append("|---|---|" + "---|" * len(columns))
        for item in chosen:
            cells = [fmt(item.get(column)) for column in columns]
            out.append(f"| {item['system']} | {item['case']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def targets(rows: list[Row]) -> list[Row]:
    """The issue's targets, each with what this run measured."""
    ours = "kernel_gateway_stream"
    checks: list[Row] = []

    def check(name: str, measured: float | None, met: bool | None, how: str) -> None:
        checks.append({"target": name, "measured": measured, "met": met, "how": how})

    for pooled in (r for r in rows if r["scenario"] == "kernel_start" and "pooled" in r["case"]):
        check(
            f"{pooled['case'].split(',')[0]} pooled start p50 <= 50 ms",
            pooled["p50_ms"],
            pooled["p50_ms"] <= 50,
            "POST /api/kernels to print(1)'s output",
        )
    loss_rows = [r for r in rows if r["scenario"] == "loss" and r["system"] == ours]
    if loss_rows:
        worst = max(r["loss_percent"] for r in loss_rows)
        check("loss 0% for every client", worst, worst == 0, "worst loss %, both protocols")
        ratio = max(r.get("x_direct", math.nan) for r in loss_rows)
        check("loss-scenario time <= 1.05 x direct ZMQ", ratio, ratio <= 1.05, "worst protocol")
    for case_size in sorted({workload(r) for r in rows if r["scenario"] == "throughput"}):
        mine = [
            r
            for r in rows
            if r["scenario"] == "throughput" and r["system"] == ours and workload(r) == case_size
        ]
        if not mine:
            continue
        rate = min(r["messages_per_second"] for r in mine)
        check(f"firehose {case_size}: >= 10,000 msg/s", rate, rate >= 10_000, "slower protocol")
        peer = [
            r
            for r in rows
            if r["scenario"] == "throughput"
            and r["system"] == "jupyter_server (limit off)"
            and workload(r) == case_size
        ]
        if peer:
            ratio = rate / peer[0]["messages_per_second"]
            check(
                f"firehose {case_size}: >= 5 x jupyter_server (limit off)",
                ratio,
                ratio >= 5,
                "our slower protocol / theirs",
            )
        floor = min((r.get("x_floor", math.nan) for r in mine), default=math.nan)
        check(
            f"firehose {case_size}: >= 1.0 x the floor loop's rate",
            floor,
            floor >= 1.0,
            "slower protocol",
        )
    hundred = find(rows, "fanout", ours, "100 clients")
    if hundred and hundred.get("x_one_client"):
        ratio = hundred["x_one_client"]
        check("fan-out to 100 <= 1.5 x one client", ratio, ratio <= 1.5, "time until all done")
    thousand = find(rows, "fanout", ours, "1000 clients")
    if thousand and thousand.get("x_one_client"):
        ratio = thousand["x_one_client"]
        check("fan-out to 1000 <= 2 x one client", ratio, ratio <= 2, "time until all done")
    if thousand and thousand.get("cpu_x_one_client"):
        ratio = thousand["cpu_x_one_client"]
        check("fan-out to 1000: server CPU <= 2 x one client's", ratio, ratio <= 2, "CPU seconds")
    idle = find(rows, "idle_memory", ours)
    replay = next(
        (
            r
            for r in rows
            if r["scenario"] == "transcript"
            and r["system"] == ours
            and r["case"].startswith("replay")
        ),
        None,
    )
    # The earlier targets, then issue 23's, for the same two rows.
    for tag, kib, per_client, rate, first_ms in (
        ("", 32, "subscriber", 100_000, 50),
        ("(23) ", 12, "client", 1_000_000, 5),
    ):
        if idle:
            value = idle["kib_per_client"]
            what = f"{tag}idle memory <= {kib} KiB per {per_client}"
            check(what, value, value <= kib, idle["case"])
        if replay:
            value = replay["records_per_second"]
            what = f"{tag}replay >= {rate:,} records/s"
            check(what, value, value >= rate, replay["case"])
            value = replay["first_record_ms"]
            check(f"{tag}replay first record <= {first_ms} ms", value, value <= first_ms, "ms")
    writer = next(
        (r for r in rows if r["scenario"] == "transcript" and r["case"].startswith("writer")),
        None,
    )
    if writer:
        rate = writer["records_per_second"]
        check("transcript writer >= 100,000 records/s", rate, rate >= 100_000, writer["case"])
    ratios = [r["disk_per_output_byte"] for r in rows if "disk_per_output_byte" in r]
    if ratios:
        worst = max(ratios)
        check("bytes on disk <= 1.5 x output", worst, worst <= 1.5, "worst of 64 B, 1 KiB, 64 KiB")
    lat = [r for r in rows if r["scenario"] == "latency" and r["system"] == ours]
    if lat and "added_p50_ms" in lat[0]:
        p50 = max(r["added_p50_ms"] for r in lat)
        p99 = max(r["added_p99_ms"] for r in lat)
        check("added latency p50 < 2 ms", p50, p50 < 2, "ms over direct ZMQ, worse protocol")
        check("added latency p99 < 10 ms", p99, p99 < 10, "ms over direct ZMQ, worse protocol")
    issue_23(rows, check)
    return checks


def issue_23(rows: list[Row], check: Callable[[str, float | None, bool | None, str], None]) -> None:
    """Issue 23's table, each figure against its target (where this run measured it)."""
    ours = "kernel_gateway_stream"
    peer = "jupyter_server (limit off)"
    for case_size, most_us, most_x in (("100,000 x 64 B", 12, 0.12), ("10,000 x 4096 B", 20, 0.2)):
        mine = [
            r
            for r in rows
            if r["scenario"] == "throughput" and r["system"] == ours and workload(r) == case_size
        ]
        if not mine:
            continue
        worst = max(r["us_per_message"] for r in mine)
        how = "server CPU per message, one client, worse protocol"
        check(f"(23) firehose {case_size}: <= {most_us} us a message", worst, worst <= most_us, how)
        theirs = [
            r
            for r in rows
            if r["scenario"] == "throughput" and r["system"] == peer and workload(r) == case_size
        ]
        if theirs and theirs[0].get("us_per_message"):
            ratio = worst / theirs[0]["us_per_message"]
            check(
                f"(23) firehose {case_size}: CPU <= {most_x} x jupyter_server (limit off)",
                ratio,
                ratio <= most_x,
                how,
            )
    latencies = [r for r in rows if r["scenario"] == "latency" and "added_p99_ms" in r]
    lat = [r for r in latencies if r["system"] == ours]
    if lat:
        p99 = max(r["added_p99_ms"] for r in lat)
        check("(23) added latency p99 <= 1 ms", p99, p99 <= 1, "ms over direct ZMQ, worse protocol")
        peers = [r["added_p99_ms"] for r in latencies if r["system"] != ours]
        if peers:
            best = min(peers)
            check(
                "(23) added latency p99 below every peer's",
                p99 - best,
                p99 < best,
                f"ms: ours minus the best peer's ({best:.3f} ms)",
            )
    for redis in (r for r in rows if r["scenario"] == "nodes" and r["system"] == nodes.ON_REDIS):
        if redis.get("cpu_x_one_node") is None:
            continue
        ratio = redis["cpu_x_one_node"]
        what = redis["case"].removesuffix(", 1 client")
        check(
            f"(23) one node on Redis, {what}: CPU per message <= 1.15 x in-process",
            ratio,
            ratio <= 1.15,
            "one client",
        )
    wide = next(
        (
            r
            for r in rows
            if r["scenario"] == "fanout"
            and r["system"] == ours
            and r["case"] == "100 clients, 4096 B"
        ),
        None,
    )
    if wide and wide.get("cpu_x_one_client"):
        ratio = wide["cpu_x_one_client"]
        check(
            f"(23) fan-out to {wide['case']}: server CPU <= 2 x one client's",
            ratio,
            ratio <= 2,
            f"{wide['expected']:,} messages",
        )


def target_table(checks: list[Row]) -> str:
    out = ["\n#### targets\n", "| target | measured | met | how |", "|---|---|---|---|"]
    for item in checks:
        out.append(
            f"| {item['target']} | {fmt(item['measured'])} | {fmt(item['met'])} | {item['how']} |"
        )
    return "\n".join(out)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    plan = sc.QUICK if args.quick else sc.FULL
    # The fault schedule runs only when asked for: it measures no speed.
    only = set(args.only or SCENARIOS) - ({"faults"} if not args.only else set())
    chosen = [s for s in SYSTEMS if not args.systems or s.name in args.systems]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # The peer is imported here, not at the top: the suite's unit tests import this module
    # and install the test extra alone, which does not bring jupyter_kernel_gateway.
    import kernel_gateway

    started = time.perf_counter()
    machine = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "jupyter_server": jupyter_server.__version__,
        "jupyter_kernel_gateway": kernel_gateway.__version__,
        "libzmq": zmq.zmq_version(),
    }
    print(f"{'quick' if args.quick else 'full'} run; {machine}", flush=True)
    with tempfile.TemporaryDirectory(prefix="kgs-bench-") as directory:
        home = Path(directory)
        install_kernelspec(home / "jp")
        os.environ["JUPYTER_PATH"] = str(home / "jp")
        rows = await run_references(plan, only)
        for system in chosen if only - OWN_SERVERS else ():
            rows += await run_system(system, home, plan, only)
        if "upstream" in only:
            rows += await sc.upstream(home, plan)
            print("  upstream done", flush=True)
        if "nodes" in only:
            rows += await nodes.nodes(home, plan)
            print("  nodes done", flush=True)
        if "kernel_start" in only:
            rows += await pool.kernel_start(home, starts=5 if args.quick else 20)
            print("  kernel_start done", flush=True)
        fault_table = ""
        if "faults" in only:
            found, fault_table = await faults.faults(
                home, args.seed, args.faults, args.sqlite_faults, args.fault_kinds
            )
            rows += found
            print("  faults done", flush=True)
    add_ratios(rows)
    checks = targets(rows)
    elapsed = time.perf_counter() - started
    text = tables(rows) + "\n" + target_table(checks) + fault_table
    print(text)
    print(
        f"\n{elapsed / 60:.1f} minutes; {machine['cores']} cores, Python {machine['python']}, "
        f"jupyter_server {machine['jupyter_server']}, jupyter_kernel_gateway "
        f"{machine['jupyter_kernel_gateway']}"
    )
    report = {
        "plan": vars(plan) if hasattr(plan, "__dict__") else str(plan),
        "machine": machine,
        "minutes": elapsed / 60,
        "rows": rows,
        "targets": checks,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str))
    print(f"JSON: {args.output}")
    return report


def cli() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, about 2 minutes")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, help="run these scenarios")
    parser.add_argument("--systems", nargs="+", choices=[s.name for s in SYSTEMS])
    parser.add_argument("--seed", type=int, default=1, help="the fault schedule's seed")
    parser.add_argument("--faults", type=int, default=50, help="how many faults it has")
    parser.add_argument(
        "--sqlite-faults", type=int, default=10, help="then how many on one node on SQLite"
    )
    parser.add_argument(
        "--fault-kinds", nargs="+", help="only these kinds (tests/faults/schedule.py KINDS)"
    )
    parser.add_argument(
        "--output", type=Path, default=Path("benchmarks/results/report.json"), help="JSON report"
    )
    asyncio.run(main(parser.parse_args()))


if __name__ == "__main__":
    cli()
