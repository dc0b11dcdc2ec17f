"""The API stays available under a crowd: 200 honest clients, 250 idle connections and slow-header
(slowloris) connections for 30 s against a real `hangd serve --replay`, over loopback.

Health checks and authenticated requests must never be refused (503); idle and slow connections
are closed by hangd and come back, as an attacker's would. The figures (p99 of /incidents and
/healthz, hangd's RSS before and after, counts) go to a JSON file: HANGD_LOAD_RESULTS names it,
else it lands in the test's tmp dir; the test prints them."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path

import pytest

from ..conftest import TRACES
from ..served import serve

pytestmark = pytest.mark.slow  # 30 s of crowd against a real server by design

DURATION_S = 30.0
HONEST = 200
IDLE = 250
SLOW = 20
TOKEN = "load-test-token"
PATHS = [("/incidents", True), ("/healthz", False), ("/incidents?status=open", True), ("/readyz", False),
         ("/jobs", True)]
SCRAPE_EVERY_S = 1.0  # a Prometheus scraping /metrics, more often than any would


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def _request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, auth: bool) -> int:
    head = f"GET {path} HTTP/1.1\r\nHost: hangd\r\n" + (f"Authorization: Bearer {TOKEN}\r\n" if auth else "") + "\r\n"
    writer.write(head.encode())
    await writer.drain()
    status = await reader.readline()
    if not status:
        raise ConnectionError("closed")
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "content-length":
            length = int(value)
    await reader.readexactly(length)
    return int(status.split()[1])


async def _crowd(port: int) -> dict[str, object]:
    deadline = time.monotonic() + DURATION_S
    lat: dict[str, list[float]] = {p: [] for p, _ in [*PATHS, ("/metrics", True)]}
    statuses: dict[str, dict[int, int]] = {p: {} for p in lat}
    counts = {"honest_reconnects": 0, "honest_errors": 0, "idle_closed_by_hangd": 0, "slow_closed_by_hangd": 0}

    async def honest(i: int) -> None:
        rng = random.Random(i)
        conn = None
        while time.monotonic() < deadline:
            try:
                if conn is None:
                    conn = await asyncio.open_connection("127.0.0.1", port)
                path, auth = rng.choice(PATHS)
                t0 = time.perf_counter()
                code = await asyncio.wait_for(_request(*conn, path, auth), 30)
                lat[path].append(time.perf_counter() - t0)
                statuses[path][code] = statuses[path].get(code, 0) + 1
                await asyncio.sleep(rng.uniform(0, 0.05))
            except TimeoutError:  # first: TimeoutError is an OSError too
                counts["honest_errors"] += 1
                conn = None
            except (ConnectionError, asyncio.IncompleteReadError, OSError):
                counts["honest_reconnects"] += 1
                conn = None

    async def scraper() -> None:
        conn = None
        while time.monotonic() < deadline:
            try:
                conn = conn or await asyncio.open_connection("127.0.0.1", port)
                t0 = time.perf_counter()
                code = await asyncio.wait_for(_request(*conn, "/metrics", True), 30)
                lat["/metrics"].append(time.perf_counter() - t0)
                statuses["/metrics"][code] = statuses["/metrics"].get(code, 0) + 1
            except (ConnectionError, asyncio.IncompleteReadError, OSError):
                counts["honest_errors"] += 1
                conn = None
            await asyncio.sleep(SCRAPE_EVERY_S)

    async def idle() -> None:  # connects, sends nothing, reconnects when hangd drops it
        while time.monotonic() < deadline:
            try:
                r, w = await asyncio.open_connection("127.0.0.1", port)
                left = deadline - time.monotonic()
                if await asyncio.wait_for(r.read(1), max(0.1, left)) == b"":
                    counts["idle_closed_by_hangd"] += 1
                w.close()
            except OSError:  # TimeoutError included
                pass

    async def slow() -> None:  # request headers one line a second, never finished
        while time.monotonic() < deadline:
            try:
                r, w = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.2)
                continue
            w.write(b"GET /healthz HTTP/1.1\r\nHost: hangd\r\n")
            n = 0
            # closed by hangd however this client learns it: end of stream seen in a read, seen
            # between reads (a busy loop may run the read's timeout before the end-of-stream
            # callback), or a reset on the next write
            closed = False
            while time.monotonic() < deadline and not closed:
                try:
                    w.write(f"X-Slow-{n}: {'a' * 10}\r\n".encode())
                    n += 1
                    await w.drain()
                    closed = await asyncio.wait_for(r.read(1), 1.0) == b""
                except TimeoutError:  # first: TimeoutError is an OSError too
                    closed = r.at_eof()
                except OSError:
                    closed = True
            counts["slow_closed_by_hangd"] += closed
            w.close()

    tasks = [asyncio.create_task(idle()) for _ in range(IDLE)] + [asyncio.create_task(slow()) for _ in range(SLOW)]
    await asyncio.sleep(1.0)  # the idle and slow connections are in place before the honest crowd comes
    tasks += [asyncio.create_task(honest(i)) for i in range(HONEST)] + [asyncio.create_task(scraper())]
    await asyncio.gather(*tasks)
    return {"latency": lat, "statuses": statuses, "counts": counts}


def _p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(len(xs) * q))] * 1000, 1) if xs else float("nan")


def test_api_stays_available_under_a_crowd(tmp_path, served):
    s = serve(tmp_path, "--replay", str(TRACES / "nccl_stall"), "--speed", "1", env={"HANGD_TOKEN": TOKEN})
    served.append(s)
    rss_before = _rss(s.proc.pid)
    res = asyncio.run(_crowd(int(s.url.rsplit(":", 1)[1])))
    rss_after = _rss(s.proc.pid)
    lat, statuses, counts = res["latency"], res["statuses"], res["counts"]  # type: ignore[index]
    out = {
        "duration_s": DURATION_S, "honest_clients": HONEST, "idle_connections": IDLE, "slow_header_connections": SLOW,
        "requests": {p: len(v) for p, v in lat.items()},
        "statuses": {p: {str(k): n for k, n in v.items()} for p, v in statuses.items()},
        "incidents_p50_ms": _p(lat["/incidents"], 0.5), "incidents_p99_ms": _p(lat["/incidents"], 0.99),
        "healthz_p50_ms": _p(lat["/healthz"], 0.5), "healthz_p99_ms": _p(lat["/healthz"], 0.99),
        "metrics_p50_ms": _p(lat["/metrics"], 0.5), "metrics_p99_ms": _p(lat["/metrics"], 0.99),
        "rss_before_bytes": rss_before, "rss_after_bytes": rss_after, **counts,
    }
    dest = Path(os.environ.get("HANGD_LOAD_RESULTS") or tmp_path / "load.json")
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    refused = {p: v.get(503, 0) for p, v in statuses.items()}
    assert sum(refused.values()) == 0, refused
    assert all(set(v) <= {200} for v in statuses.values()), statuses
    assert counts["honest_errors"] == 0 and counts["honest_reconnects"] == 0, counts
    assert all(len(v) >= 20 for v in lat.values()), out["requests"]
    # hangd closed the idle and the never-finished connections itself, more than once each
    assert counts["idle_closed_by_hangd"] >= IDLE and counts["slow_closed_by_hangd"] >= SLOW, counts
    assert s.get("/healthz").status_code == 200
