"""``rl_app record``: episodes of a trained (or random) policy written as Parquet that RLlib's offline
API reads (``offline.input`` of BC, MARWIL, CQL, IQL), one row per transition in RLlib's columns.

The rows carry ``eps_id`` and ``t`` so an episode can be put back together, and ``manifest.json``
says which env, policy and exploration made them and what the episodes returned.
"""

from __future__ import annotations

import math
import statistics
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from rl_app.console.tables import output_console, warner
from rl_app.errors import UserError
from rl_app.runs.files import write_json

MANIFEST = "manifest.json"
DATA_FILE = "episodes.parquet"


@dataclass
class Recording:
    folder: Path
    episodes: int
    transitions: int
    returns: list[float]


def _flat(value: Any) -> list[float] | float | int:
    import numpy as np

    array = np.asarray(value)
    if array.ndim == 0:
        return array.item()
    return [float(x) for x in array.reshape(-1)]


def record(
    location: str,
    out: Path,
    *,
    episodes: int,
    epsilon: float = 0.0,
    random_policy: bool = False,
    seed: int = 0,
    runs_root: Path = Path("runs"),
    console: Console | None = None,
) -> Recording:
    """Play ``episodes`` with the policy at ``location`` (each action random with probability
    ``epsilon``; all random with ``random_policy``) and write them to ``out``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rl_app.envs import make_env
    from rl_app.policy.evaluate import checkpoint_env
    from rl_app.policy.module import load_policy
    from rl_app.rllib.offline import transition_columns
    from rl_app.runs.remote import open_checkpoint

    if not 0.0 <= epsilon <= 1.0:
        raise UserError(f"--epsilon must be within [0, 1] (got {epsilon:g})")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out '{out}' is not empty: recordings are never written over")
    console = console or output_console()
    checkpoint, info = open_checkpoint(location, runs_root, warn=warner(console))
    env_spec = checkpoint_env(checkpoint, info.env)
    policy: Any = None if random_policy else load_policy(checkpoint)
    env = make_env(env_spec, evaluation=True)
    if len(env.observation_space.shape or ()) > 1:
        raise UserError(
            f"record: {info.env}'s observations are images {env.observation_space.shape}; "
            "recording takes flat observations"
        )
    rng = np.random.default_rng(seed)
    env.action_space.seed(seed)
    columns = transition_columns()
    rows: dict[str, list[Any]] = {name: [] for name in columns}
    returns: list[float] = []
    what = (
        "a random policy"
        if random_policy
        else f"{checkpoint}" + (f", epsilon {epsilon:g}" if epsilon else "")
    )
    console.print(f"Recording {episodes} episodes of {info.env} with {what}")
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            if policy is not None:
                policy.reset()
            eps_id, total, t, done = uuid.uuid4().hex, 0.0, 0, False
            while not done:
                explore = random_policy or rng.random() < epsilon
                # The policy sees every step, so a recurrent one's memory follows the episode.
                chosen = None if policy is None else policy.act(obs)
                action = env.action_space.sample() if explore or chosen is None else chosen
                next_obs, reward, terminated, truncated, _ = env.step(action)
                for name, value in zip(
                    columns,
                    (
                        eps_id,
                        t,
                        _flat(obs),
                        _flat(action),
                        float(reward),
                        _flat(next_obs),
                        terminated,
                        truncated,
                    ),
                    strict=True,
                ):
                    rows[name].append(value)
                total += float(reward)
                obs, t, done = next_obs, t + 1, terminated or truncated
            returns.append(total)
    finally:
        env.close()
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(rows), out / DATA_FILE)
    write_json(
        out / MANIFEST,
        {
            "env": env_spec.model_dump(mode="json", exclude_none=True),
            "algorithm": info.algorithm,
            "policy": "random" if random_policy else str(checkpoint),
            "epsilon": 1.0 if random_policy else epsilon,
            "episodes": episodes,
            "transitions": len(rows[columns[1]]),
            "return_mean": statistics.fmean(returns),
            "return_std": statistics.pstdev(returns),
            "returns": returns,
            "seed": seed,
            "recorded_at": datetime.now(UTC).isoformat(),
        },
    )
    mean, transitions = (statistics.fmean(returns) if returns else math.nan), len(rows[columns[1]])
    console.print(
        f"Wrote {transitions:,} transitions of {episodes} episodes (mean return {mean:.1f}) to {out}"
    )
    return Recording(out, episodes, transitions, returns)


def check_recording(location: str, env_spec: Any, source: str) -> None:
    """Refuse, in one line naming ``offline.input``, a recording that is missing, empty, not in
    RLlib's columns, or of spaces other than the env's."""
    import gymnasium as gym
    import numpy as np
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    from rl_app.envs import action_space, observation_space
    from rl_app.errors import ConfigError, error_detail
    from rl_app.runs.storage import is_uri

    def refuse(message: str) -> ConfigError:
        return ConfigError(source, f"'{location}' {message}", key="offline.input")

    obs_space = observation_space(env_spec)
    if not isinstance(obs_space, gym.spaces.Box):
        # RLlib's offline path would need its FlattenObservations as a learner connector too.
        message = f"offline algorithms here learn from Box observations; {env_spec.id}'s are {obs_space}"
        raise ConfigError(source, message, key="env")
    try:
        fs, path = (
            pafs.FileSystem.from_uri(location) if is_uri(location) else (pafs.LocalFileSystem(), location)
        )
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            raise FileNotFoundError(path)
        # As Ray Data reads it: the .parquet files under the folder (manifest.json aside).
        found = fs.get_file_info(pafs.FileSelector(path, recursive=True))
        files = sorted(f.path for f in found if f.is_file and f.path.endswith(".parquet"))
        if not files:
            raise refuse("holds no .parquet files (record some: rl_app record RUN --out DIR)")
        first = ds.dataset(files, filesystem=fs, format="parquet").head(1)
    except FileNotFoundError:
        raise refuse("does not exist (record one: rl_app record RUN --out DIR)") from None
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise refuse(f"is not a Parquet recording ({error_detail(exc)})") from None
    if first.num_rows == 0:
        raise refuse("holds no transitions (an empty recording)")
    missing = [
        c for c in ("obs", "actions", "rewards", "new_obs", "terminateds") if c not in first.column_names
    ]
    if missing:
        raise refuse(
            f"lacks the column(s) {', '.join(missing)} of RLlib's offline format (rl_app record writes them)"
        )
    row = first.to_pylist()[0]
    act_space = action_space(env_spec)
    obs_size = int(np.prod(obs_space.shape)) if obs_space.shape else 1
    recorded_obs = np.asarray(row["obs"]).size
    if recorded_obs != obs_size:
        raise refuse(
            f"has observations of {recorded_obs} values; {env_spec.id}'s have {obs_size} {obs_space}: "
            "recorded on another env?"
        )
    action = np.asarray(row["actions"])
    if isinstance(act_space, gym.spaces.Discrete):
        if action.size != 1 or not np.issubdtype(action.dtype, np.integer):
            raise refuse(f"has actions {row['actions']!r}; {env_spec.id}'s are integers of {act_space}")
    elif isinstance(act_space, gym.spaces.Box) and action.size != int(np.prod(act_space.shape)):
        raise refuse(f"has actions of {action.size} values; {env_spec.id}'s are {act_space}")
