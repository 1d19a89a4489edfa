"""``rl_app serve --ray-serve``: the same policy and API as a Ray Serve deployment, for scale.

The policy file travels to the replicas inside the deployment's arguments (Ray's object store),
so replicas on other machines of a cluster need no shared disk. Batching is ``@serve.batch``;
the request and response format is :mod:`rl_app.serve.protocol`'s, answers equal the
lightweight server's.
"""

from __future__ import annotations

import json
import signal
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from rl_app.errors import UserError
from rl_app.serve.app import ServeSettings
from rl_app.serve.policy import SPEC, ServedPolicy, load_served_policy
from rl_app.serve.protocol import (
    JSON,
    RequestError,
    act_response,
    check_content_type,
    chosen_actions,
    health_body,
    parse_act_request,
    unauthorized,
)
from rl_app.serve.server import policy_source, read_token

APP_NAME = "rl_app"


@serve.deployment
class PolicyDeployment:
    """One replica: the exported policy, loaded from the bytes it was deployed with."""

    def __init__(self, spec: dict[str, Any], file: str, data: bytes, settings: dict[str, Any]) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="rl_app-replica-")
        folder = Path(self._folder.name)
        (folder / SPEC).write_text(json.dumps(spec))
        (folder / file).write_bytes(data)
        self.policy = load_served_policy(folder)
        self.settings = ServeSettings(**settings)
        batched: Any = self.act_batch  # @serve.batch's wrapper, which typing sees as the plain method
        batched.set_max_batch_size(self.settings.max_batch_size)
        batched.set_batch_wait_timeout_s(self.settings.max_wait_ms / 1000)

    @serve.batch(max_batch_size=256, batch_wait_timeout_s=0.0)
    async def act_batch(self, batches: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray | None]]:
        actions, dist_inputs = self.policy.infer(np.concatenate(batches) if len(batches) > 1 else batches[0])
        bounds = np.cumsum([len(batch) for batch in batches])[:-1]
        split_dist = [None] * len(batches) if dist_inputs is None else np.split(dist_inputs, bounds)
        return list(zip(np.split(actions, bounds), split_dist, strict=True))

    async def __call__(self, request: Request) -> Response:
        path, method = request.url.path.rstrip("/"), request.method
        try:
            if (method, path) == ("GET", "/v1/health"):
                return Response(health_body(self.policy), media_type=JSON)
            if error := unauthorized(request.headers.get("authorization", ""), self.settings.token):
                raise error
            if (method, path) == ("GET", "/v1/metadata"):
                return Response(
                    json.dumps({**self.policy.metadata(), "ray_serve": True}).encode(), media_type=JSON
                )
            if (method, path) != ("POST", "/v1/act"):
                raise RequestError(404, "path", f"{method} {path}: not found", "http_404")
            check_content_type(request.headers.get("content-type", ""))
            body_bytes = await request.body()
            if len(body_bytes) > self.settings.max_body_bytes:
                message = f"above the limit of {self.settings.max_body_bytes} bytes"
                raise RequestError(413, "body", message, "body_limit")
            parsed = parse_act_request(
                body_bytes, self.policy.observations, self.settings.max_batch_size, self.policy.sampling
            )
        except RequestError as error:
            return Response(error.body(), status_code=error.status, media_type=JSON)
        actions, dist_inputs = await self.act_batch(parsed.observations)
        actions = chosen_actions(parsed, actions, dist_inputs, self.policy)
        answer = act_response(
            actions, self.policy.name, self.policy.spec.get("iteration"), parsed.deterministic
        )
        return Response(answer, media_type=JSON)


def deploy_policy(
    policy: ServedPolicy,
    settings: ServeSettings,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    replicas: int = 1,
    max_replicas: int | None = None,
    max_ongoing_requests: int = 256,
) -> None:
    """Deploy ``policy`` on the Ray this process is connected to, HTTP on ``host:port``."""
    data = (policy.folder / policy.file).read_bytes()
    scaling: dict[str, Any] = (
        {"autoscaling_config": {"min_replicas": replicas, "max_replicas": max_replicas}}
        if max_replicas and max_replicas > replicas
        else {"num_replicas": replicas}
    )
    # Replicas reserve no CPU: a policy this small shares cores with the proxy, and on a small
    # machine a reservation per replica would leave none for training beside it.
    deployment = PolicyDeployment.options(  # type: ignore[attr-defined]
        max_ongoing_requests=max_ongoing_requests, ray_actor_options={"num_cpus": 0}, **scaling
    )
    serve.start(http_options={"host": host, "port": port})
    serve.run(
        deployment.bind(policy.spec, policy.file, data, asdict(settings)),
        name=APP_NAME,
        route_prefix="/",
        blocking=False,
    )


def serve_on_ray(
    location: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    token_file: Path | None = None,
    fmt: str | None = None,
    settings: ServeSettings | None = None,
    replicas: int = 1,
    max_replicas: int | None = None,
    max_ongoing_requests: int = 256,
    address: str | None = None,
    runs_root: Path = Path("runs"),
    allow_version_mismatch: bool = False,
) -> None:
    """Deploy the policy at ``location`` on Ray Serve and serve until Ctrl-C or SIGTERM."""
    from rl_app.cluster.session import ray_session

    token = read_token(token_file, host)
    settings = ServeSettings(**{**asdict(settings or ServeSettings()), "token": token})
    with policy_source(location, fmt, runs_root, allow_version_mismatch) as source:
        policy = source()
        if isinstance(policy, dict):
            names = ", ".join(policy)
            raise UserError(
                f"{location} holds several agents' policies ({names}): serve them with `rl_app serve` "
                "(Ray Serve here deploys one; name one folder, e.g. export/<policy>)"
            )
        stop = threading.Event()
        with ray_session(address):
            for signum in (signal.SIGINT, signal.SIGTERM):  # after Ray's start, which installs its own
                signal.signal(signum, lambda *_: stop.set())
            try:
                deploy_policy(
                    policy,
                    settings,
                    host=host,
                    port=port,
                    replicas=replicas,
                    max_replicas=max_replicas,
                    max_ongoing_requests=max_ongoing_requests,
                )
                scale = f"{replicas}-{max_replicas}" if max_replicas else str(replicas)
                print(
                    f"Serving {policy.name} (iteration {policy.spec.get('iteration')}, {policy.file}) on Ray "
                    f"Serve at http://{host}:{port} ({scale} replicas, max batch {settings.max_batch_size}"
                    f"{', bearer token required' if token else ''})",
                    flush=True,
                )
                stop.wait()
            finally:
                serve.shutdown()
