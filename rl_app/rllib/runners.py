"""Remote env runners between iterations: which ones were lost and where, and bringing them back
without making the survivors wait.

RLlib marks a runner unhealthy when a call to it fails, samples from the healthy ones, and at the
start of every iteration pings the unhealthy ones, waiting up to
``env_runner_health_probe_timeout_s`` (30 s by default) for an answer. A runner whose node died
is restarted by Ray only where a CPU is free, so while none is, every iteration would wait out
that ping. Instead RLlib's own ping is made not to wait (:data:`PROBE_TIMEOUT_S`), and this
watch keeps one ping of its own in flight to each lost runner, tagged, collecting the answer
when it comes; a runner that answered is marked healthy, and RLlib's next iteration restores its
state and weights as it restores any runner. With every runner lost there is nothing to sample
with, and the watch waits for the first to answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# RLlib's per-iteration ping of unhealthy runners: answers that are ready count, none is waited for.
PROBE_TIMEOUT_S = 0.0
PING_TAG = "rl_app-ping"


@dataclass(frozen=True)
class RunnerChange:
    """What changed among the remote runners since the last look."""

    lost: dict[int, str]  # runner index -> its node's address (and whether the node is gone)
    back: dict[int, str]  # runner index -> the node it runs on now
    alive: int
    total: int
    kind: str = "env runner"  # or "evaluation runner"

    def describe(self) -> list[str]:
        lines = []
        work = "training" if self.kind == "env runner" else "evaluation"
        if self.lost:
            where = ", ".join(f"runner {i} on {node}" for i, node in sorted(self.lost.items()))
            if self.alive:
                going_on = f"{work} goes on with {self.alive} of {self.total}"
            elif self.kind == "env runner":
                going_on = "training waits for one to come back"
            else:
                going_on = "evaluations are skipped until one comes back"
            lines.append(
                f"lost {len(self.lost)} {self.kind}(s) ({where}); {going_on}, the lost ones come back "
                "when a CPU is free"
            )
        if self.back:
            where = ", ".join(f"runner {i} on {node}" for i, node in sorted(self.back.items()))
            lines.append(f"{self.kind}(s) back ({where}): {self.alive} of {self.total} sampling")
        return lines


def _runner_node(runner: Any) -> tuple[int, str]:
    import ray

    return int(runner.worker_index), str(ray.get_runtime_context().get_node_id())


class RunnerWatch:
    """The remote env runners of one ``EnvRunnerGroup``: :meth:`look` after every iteration."""

    def __init__(self, group: Any, kind: str = "env runner") -> None:
        self.group, self.kind = group, kind
        self.total = group.num_remote_workers() if group is not None else 0
        self.healthy = set(group.healthy_env_runner_ids()) if self.total else set()
        self.node_of: dict[int, str] = {}  # runner index -> node id, as last seen healthy
        self._locate(self.healthy)

    def _locate(self, runners: set[int]) -> None:
        if runners:
            found = self.group.foreach_env_runner(
                _runner_node, remote_worker_ids=sorted(runners), local_env_runner=False, timeout_seconds=30
            )
            self.node_of.update(dict(found))

    def look(self) -> RunnerChange | None:
        """What changed since the last look (None: nothing); keeps a ping in flight to each lost runner."""
        if not self.total:
            return None
        # Answers to the pings of earlier looks: those runners are marked healthy.
        self.group.fetch_ready_async_reqs(tags=PING_TAG, timeout_seconds=0.0, mark_healthy=True)
        healthy = set(self.group.healthy_env_runner_ids())
        lost, back = self.healthy - healthy, healthy - self.healthy
        self.healthy = healthy
        self._ping(set(range(1, self.total + 1)) - healthy)
        if not lost and not back:
            return None
        self._locate(back)
        addresses = _node_addresses()
        return RunnerChange(
            lost={i: _describe_node(self.node_of.get(i), addresses) for i in lost},
            back={i: _describe_node(self.node_of.get(i), addresses) for i in back},
            alive=len(healthy),
            total=self.total,
            kind=self.kind,
        )

    def wait_for_one(self, poll_s: float = 0.5) -> None:
        """With every remote runner lost there is nothing to sample with: ping until one answers
        (RLlib's own ping would have waited its timeout in each iteration)."""
        everyone = set(range(1, self.total + 1))
        while self.total and not self.group.healthy_env_runner_ids():
            self._ping(everyone)
            self.group.fetch_ready_async_reqs(tags=PING_TAG, timeout_seconds=poll_s, mark_healthy=True)

    def _ping(self, down: set[int]) -> None:
        """A ping to each lost runner; RLlib's actor manager keeps at most a few in flight per
        runner and tag, so asking every look piles nothing up."""
        if down:
            self.group.foreach_env_runner_async(
                "ping", tag=PING_TAG, healthy_only=False, remote_worker_ids=sorted(down)
            )

    @property
    def alive(self) -> int:
        return len(self.healthy)


def _node_addresses() -> dict[str, tuple[str, bool]]:
    """Node id -> (address, alive), from Ray's GCS."""
    import ray

    return {node["NodeID"]: (node["NodeManagerAddress"], bool(node["Alive"])) for node in ray.nodes()}


def _describe_node(node_id: str | None, addresses: dict[str, tuple[str, bool]]) -> str:
    if node_id is None or node_id not in addresses:
        return "an unknown node"
    address, alive = addresses[node_id]
    return f"node {address}" if alive else f"node {address}, which is gone"
