"""A keep-alive HTTP/1.1 load generator on asyncio streams: C connections, each sending one request
after the other, for a fixed time; latency per request, requests/s over all.

Deliberately minimal (no HTTP client library): the client shares the 2 cores with the server,
so every microsecond it spends is one the server does not get; a full client library would
measure itself as much as the server.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np


@dataclass
class LoadResult:
    concurrency: int
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds


def http_request(path: str, body: bytes, token: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def _connection(
    port: int, request: bytes, stop_at: float, latencies: list[float], errors: list[int]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            writer.write(request)
            status, _ = await _read_response(reader)
            latencies.append(time.perf_counter() - started)
            if status != 200:
                errors.append(status)
    finally:
        writer.close()


def _result(concurrency: int, latencies: list[float], errors: list[int], elapsed: float) -> LoadResult:
    ms = np.asarray(latencies) * 1000
    p50, p99 = np.percentile(ms, [50, 99])
    return LoadResult(concurrency, len(latencies), len(errors), elapsed, float(p50), float(p99))


async def run_load(port: int, request: bytes, concurrency: int, seconds: float) -> LoadResult:
    """``concurrency`` connections sending ``request`` back to back for ``seconds``."""
    latencies: list[float] = []
    errors: list[int] = []
    started = time.perf_counter()
    stop_at = started + seconds
    await asyncio.gather(
        *(_connection(port, request, stop_at, latencies, errors) for _ in range(concurrency))
    )
    return _result(concurrency, latencies, errors, time.perf_counter() - started)


async def send_once(port: int, request: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        return await _read_response(reader)
    finally:
        writer.close()


async def run_load_aiohttp(port: int, path: str, body: bytes, concurrency: int, seconds: float) -> LoadResult:
    """The same load from a second, independent client: aiohttp's (its own HTTP parser and
    connection pool, ``concurrency`` keep-alive connections), so that no figure rests on one client."""
    import aiohttp

    latencies: list[float] = []
    errors: list[int] = []
    url = f"http://127.0.0.1:{port}{path}"
    headers = {"content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(stop_at: float) -> None:
            while time.perf_counter() < stop_at:
                began = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    latencies.append(time.perf_counter() - began)
                    if response.status != 200:
                        errors.append(response.status)

        started = time.perf_counter()
        await asyncio.gather(*(worker(started + seconds) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return _result(concurrency, latencies, errors, elapsed)
