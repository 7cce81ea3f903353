"""Item 14: memory under a reconnect storm.

A hundred clients keep dropping and coming back with ``?since=`` (each resumes exactly
where it left off) while a kernel floods. Reported: the daemon went from 75 MiB to 843 MiB
and stayed at 500-709 MiB after the clients left, creeping up storm after storm; this very
test took the code before the fix from 97 MiB to 6 GiB. Where it went: replay pages and
live frames held by every client catching up at once, and a replay slot held by a client
that stopped reading (so every other replay stalled behind it, its client's close unread).
Replays now read bounded pages under a few shared slots and send outside them, with a
deadline; a client catching up holds no live frames; freed heap is given back. What stays
after a storm is allocator fragmentation, not the gateway's objects: no subscriber is left,
and a second storm leaves the daemon no bigger than the first. The test prints the
figures; docs/guarantees.md quotes them.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from tornado.httpclient import AsyncHTTPClient

from benchmarks.firehose import install_kernelspec

from ..integration.daemon import Daemon
from ..integration.waits import wait_until
from ..integration.wsclient import KernelWS
from ..timing import seconds

CLIENTS = 100
#: Seconds a storm lasts. 10 since 2026-12-07 (20 before): the code before the fix above
#: grew by hundreds of MiB a second under it, far past PEAK_MIB within the first seconds.
STORM_SECONDS = 10.0
STORMS = 2
MiB = 1024 * 1024
#: After a storm, the daemon's RSS is at most this many times its baseline (what stays
#: is the allocators' fragmentation: the gateway's own objects are gone, see below).
AFTER_FACTOR = 3.0
#: During it, at most this much above the baseline.
PEAK_MIB = 250
#: A second storm leaves the daemon at most this much bigger than the first did: no creep
#: (a third is run if it is not, and must not grow past the larger of the two).
CREEP = 1.15
#: The daemon's heap-trim interval in this test (seconds; 10 by default), and how many
#: of them to wait for the memory to settle after a storm.
TRIM_INTERVAL = 2.0
SETTLE_TRIMS = 3
#: Lines the kernel prints in a storm: what this machine's daemon records in about 15 s
#: while a hundred clients reconnect (about 10,000 a second), more than a storm lasts.
FLOOD_LINES = 150_000
#: Seconds each client's session is held after it drops (60 by default).
SESSION_GRACE = 3.0


async def health(daemon: Daemon) -> dict[str, Any]:
    """The health body, whatever its status: under a storm on a slow machine the store may
    say it is failing (503: its writer fell behind, and what it dropped is a gap record),
    and what this test reads, the broker's subscribers and sessions, is there all the same."""
    response = await AsyncHTTPClient().fetch(
        daemon.url + "/api/gateway/health", headers=daemon.headers, raise_error=False
    )
    body: dict[str, Any] = json.loads(response.body)
    return body


@dataclass
class StormClient:
    """What one client of the storm saw: the last seq, and (to explain a client that got
    nowhere) its connections, the messages they brought, and how the gateway closed them."""

    last: int
    connections: int = 0
    messages: int = 0
    closes: Counter[tuple[int | None, str | None]] = field(default_factory=Counter)


async def storm_client(
    daemon: Daemon, kernel_id: str, until: float, rng: random.Random, since: int
) -> StormClient:
    """Connect at ``since``, read for a moment, drop, come back with since= the last seq it
    got; return that seq, with what the connections saw."""
    loop = asyncio.get_running_loop()
    seen = StormClient(since)
    while loop.time() < until:
        ws = await daemon.channels(
            kernel_id, protocol=rng.choice(["legacy", "v1"]), since=seen.last
        )
        seen.connections += 1
        read_until = loop.time() + rng.uniform(0.1, 1.0)
        try:
            while loop.time() < read_until:
                message = await ws.receive(timeout=30)
                if message is None:
                    seen.closes[ws.ws.close_code, ws.ws.close_reason] += 1
                    break
                seen.messages += 1
                seq = message["metadata"].get("kernel_gateway_stream", {}).get("seq")
                if seq is not None:
                    assert seq > seen.last, "resume by seq is exact: nothing twice"
                    seen.last = seq
                ws.history.clear()
        finally:
            ws.close()
        await asyncio.sleep(rng.uniform(0.0, 0.5))
    return seen


@pytest.mark.alone  # measures the daemon's memory: no other `alone` test runs meanwhile
async def test_memory_returns_near_its_baseline_after_a_reconnect_storm(
    daemon: Daemon, tmp_path: Path
) -> None:
    install_kernelspec(tmp_path)
    daemon.start(
        f"--GatewayStreamApp.heap_trim_interval={TRIM_INTERVAL}",
        f"--GatewayStreamApp.session_grace={SESSION_GRACE}",
        env={"JUPYTER_PATH": str(tmp_path)},
    )
    await daemon.wait_ready()
    assert daemon.process is not None
    process = psutil.Process(daemon.process.pid)
    kernel_id = await daemon.start_kernel("firehose")
    runner: KernelWS = await daemon.channels(kernel_id, protocol="v1")
    runner.execute("1000 64")
    await runner.until_lines(1000)
    runner.close()
    await asyncio.sleep(1)
    baseline = process.memory_info().rss / MiB
    loop = asyncio.get_running_loop()
    rng = random.Random(8)
    afters = []
    for storm in range(STORMS + 1):
        if storm == STORMS and afters[-1] < CREEP * afters[0]:
            break  # no creep: the extra storm is for a machine that measured noise
        # A flood that outlasts the storm: FLOOD_LINES 200-byte lines as fast as the kernel
        # goes. Not millions: the firehose's IOPub queue has no bound, and the daemon was
        # still reading such a flood minutes after the interrupt, so "after" measured the
        # daemon mid-flood (and varied by 100 MiB with the machine's speed).
        # Started by a client that then leaves (one that stayed without reading would hold
        # its queue, a live client's memory, until the daemon cut it off).
        head = (await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?limit=1"))["head"]
        starter = await daemon.channels(kernel_id, protocol="v1")
        starter.execute(f"{FLOOD_LINES} 200")

        async def flood_started(head: int = head) -> bool:
            page = await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?limit=1")
            return bool(page["head"] > head)

        await wait_until(flood_started, "the flood's first records")
        starter.close()
        peak = baseline

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, process.memory_info().rss / MiB)
                await asyncio.sleep(0.25)

        # Every storm starts where the flood is, and each client resumes from where it left
        # off: so every storm replays alike (from 0, each would replay the whole transcript,
        # which grows, and every storm would be bigger than the one before).
        start = (await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?limit=1"))["head"]
        # The storm's clock starts once its clients are about to: timed from before the
        # read above, a storm whose read waited (on a loaded machine) could end before a
        # client connected.
        until = loop.time() + STORM_SECONDS
        sampler = asyncio.ensure_future(sample())
        clients = [
            asyncio.ensure_future(
                storm_client(daemon, kernel_id, until, random.Random(rng.random()), start)
            )
            for _ in range(CLIENTS)
        ]
        seen = await asyncio.gather(*clients)
        stuck = [client for client in seen if client.last <= start]
        assert not stuck, f"{len(stuck)} clients got nothing past seq {start}: {stuck[:3]}"
        await daemon.fetch(f"/api/kernels/{kernel_id}/interrupt", method="POST", body="")
        # What the daemon had not read of the flood when the kernel was interrupted is
        # still coming: what is measured below is the daemon once it has recorded the
        # flood's end, not the daemon still reading its tail (which made "after" vary by
        # 100 MiB from run to run, with the machine's speed).

        async def flood_ended() -> bool:
            model = await daemon.fetch(f"/api/kernels/{kernel_id}")
            return bool(model["execution_state"] == "idle")

        await wait_until(flood_ended, "the interrupted flood's idle", 120)
        # Every client has left: nothing of theirs is kept (no subscriber, no replay).
        deadline = loop.time() + seconds(30)
        while (await health(daemon))["components"]["broker"]["subscribers"]:
            assert loop.time() < deadline, "subscribers outlived their clients"
            await asyncio.sleep(0.5)
        # Each connection named a new session, held for the client's return for the grace
        # period (SESSION_GRACE here): once it is over, nothing of theirs is held either.
        while (await health(daemon))["components"]["broker"]["sessions_away"]:
            assert loop.time() < deadline, "sessions outlived their grace period"
            await asyncio.sleep(0.5)
        # Freed memory goes back to the system at the gateway's next heap trim (every
        # TRIM_INTERVAL seconds here): the figure is the settled one, the lowest over a few
        # trim intervals, so that two storms compare like with like (not one before its
        # trim and one after).
        deadline = loop.time() + SETTLE_TRIMS * TRIM_INTERVAL + seconds(2)
        after = process.memory_info().rss / MiB
        while loop.time() < deadline:
            await asyncio.sleep(0.5)
            after = min(after, process.memory_info().rss / MiB)
        sampler.cancel()
        store = (await health(daemon))["components"]
        print(
            f"reconnect storm {storm + 1}: store {store.get('store', {}).get('state')}, "
            f"baseline {baseline:.0f} MiB, peak {peak:.0f} MiB, "
            f"after {after:.0f} MiB ({after / baseline:.2f} x baseline)"
        )
        assert peak - baseline < PEAK_MIB
        assert after < AFTER_FACTOR * baseline
        afters.append(after)
    # Fragmentation settles differently from run to run on a busy machine: a second storm
    # over the bound gets a third, which must not grow past the larger of the two before
    # (a real creep grows every time).
    limit = CREEP * (afters[0] if len(afters) == STORMS else max(afters[:-1]))
    assert afters[-1] < limit, f"memory creeps from storm to storm: {afters}"
