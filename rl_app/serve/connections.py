"""The connection limits a public endpoint needs, on uvicorn: a read timeout, a connection cap and a
bounded shutdown.

uvicorn 0.55 bounds none of them. It waits for a request's headers and body for as long as the
client likes, accepts every connection the kernel hands it, and on SIGTERM waits for every
half-received request to finish arriving. A slow client can therefore hold descriptors without end
and decide when the server stops. ``LimitedHttpToolsProtocol`` extends uvicorn's httptools protocol
through its parser callbacks, and ``BoundedShutdownServer`` replaces ``Server.shutdown``; both are
written against the uvicorn pinned in requirements*.txt, and tests/test_serve_limits.py holds them to
it with real sockets.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from uvicorn import Server
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rl_app.errors import UserError

if TYPE_CHECKING:
    from rl_app.serve.app import ServeMetrics

# Descriptors kept back from connections: the listener, the policy file, logs, onnxruntime's and
# the event loop's own.
RESERVED_DESCRIPTORS = 64
# Connections past the limit are held just long enough to answer 503 (or /v1/health); at most this
# many at once, so that they too stay within the descriptor limit.
MAX_OVERFLOW = 256
OVERFLOW_READ_TIMEOUT_S = 1.0
HEALTH_PATH = "/v1/health"


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a client may take and how many may be connected at once."""

    read_timeout_s: float = 10.0  # a request's headers and body, from its first byte
    keep_alive_timeout_s: int = 30  # an idle connection between requests
    shutdown_timeout_s: float = 5.0  # requests being computed at SIGTERM finish within this
    max_connections: int | None = None  # None: sized from the descriptor limit


def descriptor_limit() -> int:
    """The process's open-file limit, its soft limit first raised to the hard one (as Go's runtime
    does): a server's connections are descriptors, and the default 1,024 is a shell's, not its."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return int(soft)


def overflow_for(descriptors: int) -> int:
    return max(8, min(MAX_OVERFLOW, descriptors // 8))


def most_connections(descriptors: int) -> int:
    """The most connections ``descriptors`` open files leave room for, beside the reserve and the
    connections being refused."""
    return max(1, descriptors - RESERVED_DESCRIPTORS - overflow_for(descriptors))


@dataclass
class ConnectionBook:
    """Counts shared by every connection of one server."""

    max_connections: int
    max_overflow: int
    admitted: int = 0
    overflow: int = 0
    cut_while_receiving: int = 0


def _json_error(status: int, reason: str, field: str, message: str, extra: bytes = b"") -> bytes:
    body = json.dumps({"error": f"{field}: {message}", "field": field}).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n".encode()
        + f"content-length: {len(body)}\r\n".encode()
        + extra
        + b"connection: close\r\n\r\n"
        + body
    )


def _over_limit_app(app: Any, book: ConnectionBook, metrics: ServeMetrics) -> Any:
    """The ASGI app a connection past the limit is served by: /v1/health as usual (an orchestrator's
    probe must not fail because clients are many), 503 with Retry-After for everything else."""
    body = json.dumps(
        {"error": f"server: at its limit of {book.max_connections} connections; retry", "field": "server"}
    ).encode()

    async def over_limit(
        scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]
    ) -> None:
        if scope["type"] == "http" and scope["path"] == HEALTH_PATH:
            await app(scope, receive, send)
            return
        metrics.refused_connections.labels("503").inc()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", b"1"),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return over_limit


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a read deadline per request, a connection cap, and a
    shutdown that drops requests still arriving instead of waiting for them.

    Subclassed per server by ``limited_protocol`` (the limits, book and metrics are class fields:
    uvicorn builds one protocol per connection from the class it is given).
    """

    limits: ConnectionLimits
    book: ConnectionBook
    metrics: ServeMetrics
    over_limit_app: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None
        self._admitted = False  # counted in book.admitted (else book.overflow, or not at all)
        self._overflowing = False
        self._receiving = False  # a request's first byte has come, its last not yet

    # Connection lifetime
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        book = self.book
        if book.admitted < book.max_connections:
            book.admitted += 1
            self._admitted = True
        elif book.overflow < book.max_overflow:
            book.overflow += 1
            self._overflowing = True
            self.app = self.over_limit_app
        else:  # past the overflow too: the descriptor goes back at once
            self.metrics.refused_connections.labels("closed").inc()
            self.transport = transport
            transport.abort()
            return
        super().connection_made(transport)
        self.metrics.open_connections.inc()
        self._arm_read_deadline(self._read_timeout())  # the first request's headers

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_read_deadline()
        if self._admitted or self._overflowing:
            if self._admitted:
                self.book.admitted -= 1
            else:
                self.book.overflow -= 1
            self._admitted = self._overflowing = False
            self.metrics.open_connections.dec()
            super().connection_lost(exc)

    def _read_timeout(self) -> float:
        if self._overflowing:
            return min(self.limits.read_timeout_s, OVERFLOW_READ_TIMEOUT_S)
        return self.limits.read_timeout_s

    # Parser callbacks: a request is timed from its first byte to its last
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._receiving = True
        if self._read_deadline is None:
            self._arm_read_deadline(self._read_timeout())

    def on_message_complete(self) -> None:
        self._receiving = False
        self._disarm_read_deadline()
        super().on_message_complete()

    def _arm_read_deadline(self, seconds: float) -> None:
        self._disarm_read_deadline()
        self._read_deadline = self.loop.call_later(seconds, self._read_timed_out)

    def _disarm_read_deadline(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _answering(self) -> bool:
        """Whether the app has begun this request's answer (then only closing is left)."""
        return self._headers_done() and self.cycle.response_started

    def _headers_done(self) -> bool:
        """Whether the request being received has all its headers (uvicorn then made its cycle)."""
        return self.cycle is not None and self.cycle.scope is self.scope

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if self.transport.is_closing():
            return
        what = "body" if self._headers_done() else "headers"
        self.metrics.read_timeouts.labels(what).inc()
        if self._receiving and not self._answering():
            seconds = self._read_timeout()
            message = f"the request's {what} did not arrive within the read timeout of {seconds:g} s"
            self.transport.write(_json_error(408, "Request Timeout", "body", message))
        self.transport.close()  # a connection that never sent a byte is closed without a word

    def shutdown(self) -> None:
        """Called by the server at SIGTERM: a request still arriving is answered 503 and its
        connection closed, one being computed finishes, an idle connection closes."""
        if not self._receiving:
            super().shutdown()
            return
        self.book.cut_while_receiving += 1
        self.cut()

    def cut(self) -> None:
        """End the request in progress with 503 (unless its answer has begun) and close."""
        if not self._answering():
            self.transport.write(
                _json_error(503, "Service Unavailable", "server", "shutting down; retry elsewhere")
            )
        if self.cycle is not None:
            self.cycle.disconnected = True  # the app's own answer, if it comes, is not sent
        self.transport.close()


def connection_book(wanted: int | None) -> ConnectionBook:
    """The counts of a server taking ``wanted`` connections at once (None: as many as the open-file
    limit leaves room for); a one-line error when that limit leaves no room for ``wanted``."""
    descriptors = descriptor_limit()
    most = most_connections(descriptors)
    if wanted is not None and wanted > most:
        raise UserError(
            f"--max-connections {wanted}: the limit of {descriptors} open files leaves room for at most "
            f"{most} (raise it with 'ulimit -n')"
        )
    return ConnectionBook(max_connections=wanted or most, max_overflow=overflow_for(descriptors))


def limited_protocol(
    limits: ConnectionLimits, book: ConnectionBook, metrics: ServeMetrics, app: Any
) -> type[LimitedHttpToolsProtocol]:
    """A protocol class for one server (uvicorn's ``Config(http=...)``), counting in ``book``."""
    fields = {
        "limits": limits,
        "book": book,
        "metrics": metrics,
        "over_limit_app": staticmethod(_over_limit_app(app, book, metrics)),
    }
    return type("ServerHttpToolsProtocol", (LimitedHttpToolsProtocol,), fields)


class _CancelledRequestFilter(logging.Filter):
    """uvicorn logs a request cancelled at the shutdown deadline as an application error with a
    traceback; the shutdown's own line already counts it."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, asyncio.CancelledError)


@dataclass(frozen=True)
class ShutdownReport:
    dropped: int  # requests still arriving at the signal
    unfinished: int  # requests still being computed at the deadline
    seconds: float

    @property
    def cut(self) -> int:
        return self.dropped + self.unfinished

    def line(self, timeout_s: float) -> str:
        if not self.cut:
            return f"stopped in {self.seconds:.2f} s: no request cut"
        parts = []
        if self.dropped:
            parts.append(f"{self.dropped} still arriving")
        if self.unfinished:
            parts.append(f"{self.unfinished} unfinished after the {timeout_s:g} s shutdown timeout")
        return f"stopped in {self.seconds:.2f} s: {self.cut} request(s) cut ({', '.join(parts)})"


class BoundedShutdownServer(Server):
    """uvicorn's server with a shutdown that ends within ``shutdown_timeout_s`` whatever clients do."""

    def __init__(self, config: Any, book: ConnectionBook, shutdown_timeout_s: float) -> None:
        super().__init__(config)
        self.book = book
        self.shutdown_timeout_s = shutdown_timeout_s
        self.report: ShutdownReport | None = None

    async def shutdown(self, sockets: Any = None) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        deadline = started + self.shutdown_timeout_s
        state = self.server_state
        while (state.connections or state.tasks) and loop.time() < deadline and not self.force_exit:
            await asyncio.sleep(0.02)
        unfinished = list(state.tasks)
        for connection in list(state.connections):
            if isinstance(connection, LimitedHttpToolsProtocol):
                connection.cut()
        if unfinished:
            quiet = _CancelledRequestFilter()
            logging.getLogger("uvicorn.error").addFilter(quiet)
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)
            logging.getLogger("uvicorn.error").removeFilter(quiet)
        if not self.force_exit:
            await self.lifespan.shutdown()
        self.report = ShutdownReport(self.book.cut_while_receiving, len(unfinished), loop.time() - started)
