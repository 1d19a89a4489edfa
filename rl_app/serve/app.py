"""The inference HTTP API as a Starlette app: act, health, metadata, metrics, reload.

Every failure a request can cause is answered with a 4xx and a one-line JSON error naming the
field; nothing a client sends reaches past the handler that parses it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from rl_app.errors import UserError, error_detail
from rl_app.serve.batching import DynamicBatcher
from rl_app.serve.policy import ServedPolicy
from rl_app.serve.protocol import (
    JSON,
    ActRequest,
    RequestError,
    act_request,
    act_response,
    check_content_type,
    check_json_size,
    chosen_actions,
    health_body,
    parse_act_request,
    peek_request,
    unauthorized,
)


@dataclass(frozen=True)
class ServeSettings:
    """Limits and batching of one server; the limits are always on."""

    max_batch_size: int = 256  # rows per model call, and the most one request may send
    max_wait_ms: float = 0.0
    max_body_bytes: int = 4 * 1024 * 1024
    token: str | None = None  # required as ``Authorization: Bearer`` on everything but health


class ServeMetrics:
    """Prometheus metrics of one server, in its own registry."""

    def __init__(self) -> None:
        disable_created_metrics()  # scrapers need counts, not a timestamp series per label set
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "rl_app_serve_requests", "HTTP requests answered", ["route", "status"], registry=self.registry
        )
        self.bad_requests = Counter(
            "rl_app_serve_bad_requests", "requests refused, by reason", ["reason"], registry=self.registry
        )
        self.latency = Histogram(
            "rl_app_serve_act_latency_seconds",
            "time from receiving an /v1/act request to its answer",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=self.registry,
        )
        self.batch_rows = Histogram(
            "rl_app_serve_batch_rows",
            "observations per model call",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=self.registry,
        )
        self.reloads = Counter("rl_app_serve_reloads", "policy reloads", ["result"], registry=self.registry)
        self.iteration = Gauge(
            "rl_app_serve_policy_iteration", "training iteration served", registry=self.registry
        )
        self.open_connections = Gauge(
            "rl_app_serve_open_connections", "client connections open now", registry=self.registry
        )
        self.read_timeouts = Counter(
            "rl_app_serve_read_timeouts",
            "connections closed because a request's headers or body did not arrive in time",
            ["stage"],
            registry=self.registry,
        )
        self.refused_connections = Counter(
            "rl_app_serve_refused_connections",
            "connections past --max-connections: answered 503, or closed at once past the overflow",
            ["answer"],
            registry=self.registry,
        )


def _error(error: RequestError, metrics: ServeMetrics, route: str) -> Response:
    metrics.bad_requests.labels(error.reason).inc()
    metrics.requests.labels(route, str(error.status)).inc()
    return Response(error.body(), status_code=error.status, media_type=JSON)


class PolicyService:
    """The policy being served, its batcher, and the reload that swaps it."""

    def __init__(
        self,
        policy: ServedPolicy,
        settings: ServeSettings,
        reload_policy: Callable[[], ServedPolicy] | None = None,
        log: Callable[[str], None] = print,
        metrics: ServeMetrics | None = None,
    ) -> None:
        self.policy = policy
        self.settings = settings
        self.reload_policy = reload_policy
        self.log = log
        self.metrics = metrics or ServeMetrics()
        self.metrics.iteration.set(float(policy.spec.get("iteration") or 0))
        self.batcher = DynamicBatcher(
            lambda: self.policy,
            settings.max_batch_size,
            settings.max_wait_ms / 1000,
            on_batch=self.metrics.batch_rows.observe,
        )
        self._reload_lock = asyncio.Lock()

    async def reload(self, fresh: ServedPolicy | None = None) -> tuple[int, dict[str, Any]]:
        """Load the source again (or take ``fresh``, loaded already); swap it in if its spaces
        match. (HTTP status, JSON answer)."""
        if fresh is None and self.reload_policy is None:
            return NO_SOURCE
        async with self._reload_lock:
            if fresh is None:
                assert self.reload_policy is not None
                try:
                    fresh = await asyncio.to_thread(self.reload_policy)
                except Exception as exc:
                    return _reload_failed(exc, self.metrics, self.log)
            if fresh.spaces() != self.policy.spaces():
                self.metrics.reloads.labels("refused").inc()
                message = "reload: the new policy's observation or action space differs; kept the old one"
                self.log(message)
                return 409, {"error": message}
            old, self.policy = self.policy, fresh  # batches already running finish on ``old``
            self.metrics.iteration.set(float(fresh.spec.get("iteration") or 0))
            self.metrics.reloads.labels("ok").inc()
            self.log(f"reloaded: {fresh.name} iteration {fresh.spec.get('iteration')} ({fresh.file})")
            return 200, {
                "reloaded": True,
                "previous_iteration": old.spec.get("iteration"),
                **fresh.metadata(),
            }

    def parse(self, body: bytes) -> tuple[PolicyService, ActRequest]:
        """The checked request in ``body``, for this service (a ``policy`` field is an unknown one)."""
        policy = self.policy
        return self, parse_act_request(
            body, policy.observations, self.settings.max_batch_size, policy.sampling
        )

    def health(self) -> bytes:
        return health_body(self.policy)

    def describe(self) -> dict[str, Any]:
        return self.policy.metadata()

    def start(self) -> None:
        self.batcher.start()

    async def stop(self) -> None:
        await self.batcher.stop()


NO_SOURCE = 409, {"error": "reload: this server was started without a source to reload"}


def _reload_failed(
    exc: Exception, metrics: ServeMetrics, log: Callable[[str], None]
) -> tuple[int, dict[str, Any]]:
    """The answer to a reload whose source failed to load: 409 for a user error, else 500."""
    metrics.reloads.labels("failed").inc()
    detail = str(exc) if isinstance(exc, UserError) else error_detail(exc)
    log(f"reload failed, still serving the previous policy: {detail}")
    return (409 if isinstance(exc, UserError) else 500), {"error": f"reload: {detail}"}


class PolicyGroup:
    """Several agents' policies served together (an export of ``policies.json``): each request
    names the policy it asks, ``{"policy": "learner", "observations": [...]}``. A reload loads the
    source once and hands each service its policy."""

    def __init__(
        self,
        services: dict[str, PolicyService],
        reload_policies: Callable[[], dict[str, ServedPolicy]] | None = None,
    ) -> None:
        self.services, self.reload_policies = services, reload_policies
        first = next(iter(services.values()))
        self.settings, self.metrics, self.log = first.settings, first.metrics, first.log  # shared
        self._reload_lock = asyncio.Lock()

    def parse(self, body: bytes) -> tuple[PolicyService, ActRequest]:
        """The service of the policy the request names, and the checked request; a RequestError for
        a missing or unknown policy. The body is parsed once, after the size check of any policy,
        then held to the named policy's bounds."""
        names, max_rows = list(self.services), self.settings.max_batch_size
        request = peek_request(body, [s.policy.observations for s in self.services.values()], max_rows)
        name = request.pop("policy", None)
        if name is None:
            raise RequestError(
                422, "policy", f"missing; this server serves {', '.join(names)}", "missing_field"
            )
        if name not in self.services:
            raise RequestError(422, "policy", f"{name!r} is not one of: {', '.join(names)}", "unknown_policy")
        service = self.services[name]
        policy = service.policy
        check_json_size(body, policy.observations, max_rows)
        return service, act_request(request, policy.observations, max_rows, policy.sampling)

    def health(self) -> bytes:
        policies = {name: s.policy.spec.get("iteration") for name, s in self.services.items()}
        return json.dumps({"status": "ok", "policies": policies}).encode()

    def describe(self) -> dict[str, Any]:
        return {"policies": {name: s.policy.metadata() for name, s in self.services.items()}}

    def start(self) -> None:
        for service in self.services.values():
            service.start()

    async def stop(self) -> None:
        for service in self.services.values():
            await service.stop()

    async def reload(self) -> tuple[int, dict[str, Any]]:
        """Reload every policy; the first failure's status, else 200 with each one's answer."""
        if self.reload_policies is None:
            return NO_SOURCE
        async with self._reload_lock:
            try:
                loaded = await asyncio.to_thread(self.reload_policies)
                missing = [name for name in self.services if name not in loaded]
                if missing:
                    raise UserError(f"the reloaded source has no policy '{missing[0]}'")
            except Exception as exc:
                return _reload_failed(exc, self.metrics, self.log)
            answers = {}
            for name, service in self.services.items():
                status, answer = await service.reload(loaded[name])
                if status != 200:
                    return status, {"error": f"{name}: {answer.get('error')}"}
                answers[name] = answer
            return 200, {"reloaded": True, "policies": answers}


def _refused(request: Request, token: str | None, metrics: ServeMetrics, route: str) -> Response | None:
    """The 401 answer for a request without the right bearer token; None for one with it."""
    error = unauthorized(request.headers.get("authorization", ""), token)
    return None if error is None else _error(error, metrics, route)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, "body", f"{declared} bytes above the limit of {limit}", "body_limit")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, "body", f"above the limit of {limit} bytes", "body_limit")
        chunks.append(chunk)
    return b"".join(chunks)


def build_app(service: PolicyService | PolicyGroup) -> Starlette:
    """The ASGI app serving ``service``; start-up and shut-down run its batchers."""
    settings, metrics = service.settings, service.metrics

    async def act(request: Request) -> Response:
        started = time.perf_counter()
        if refused := _refused(request, settings.token, metrics, "act"):
            return refused
        try:
            check_content_type(request.headers.get("content-type", ""))
            body = await _read_body(request, settings.max_body_bytes)
            target, parsed = service.parse(body)
        except RequestError as error:
            return _error(error, metrics, "act")
        except ClientDisconnect:
            return Response(status_code=499)
        try:
            actions, dist_inputs, used = await target.batcher.submit(parsed.observations)
            actions = chosen_actions(parsed, actions, dist_inputs, used)
        except Exception as exc:  # the model failed on a checked batch: the server's fault
            metrics.requests.labels("act", "500").inc()
            body = json.dumps({"error": f"policy: {error_detail(exc)}", "field": "policy"}).encode()
            return Response(body, status_code=500, media_type=JSON)
        answer = act_response(actions, used.name, used.spec.get("iteration"), parsed.deterministic)
        metrics.requests.labels("act", "200").inc()
        metrics.latency.observe(time.perf_counter() - started)
        return Response(answer, media_type=JSON)

    async def health(request: Request) -> Response:
        metrics.requests.labels("health", "200").inc()
        return Response(service.health(), media_type=JSON)

    async def metadata(request: Request) -> Response:
        if refused := _refused(request, settings.token, metrics, "metadata"):
            return refused
        metrics.requests.labels("metadata", "200").inc()
        limits = {"max_batch_size": settings.max_batch_size, "max_body_bytes": settings.max_body_bytes}
        body = {**service.describe(), "limits": limits, "max_wait_ms": settings.max_wait_ms}
        return Response(json.dumps(body).encode(), media_type=JSON)

    async def prometheus(request: Request) -> Response:
        if refused := _refused(request, settings.token, metrics, "metrics"):
            return refused
        metrics.requests.labels("metrics", "200").inc()
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def reload(request: Request) -> Response:
        if refused := _refused(request, settings.token, metrics, "reload"):
            return refused
        status, body = await service.reload()
        metrics.requests.labels("reload", str(status)).inc()
        return Response(json.dumps(body).encode(), status_code=status, media_type=JSON)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        service.start()
        try:
            yield
        finally:
            await service.stop()

    routes = [
        Route("/v1/act", act, methods=["POST"]),
        Route("/v1/health", health, methods=["GET"]),
        Route("/v1/metadata", metadata, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/v1/reload", reload, methods=["POST"]),
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        error = RequestError(status, "path", f"{request.method} {request.url.path}: {exc}", f"http_{status}")
        return _error(error, metrics, "other")

    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
