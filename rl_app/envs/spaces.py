"""Observation spaces beyond a flat Box: which ones rl_app trains on, how they are described in
JSON (checkpoints, ``policy.json``), and how one observation becomes the flat vector the model takes.

RLlib's default models take a Box. Anything else (Discrete, MultiDiscrete, MultiBinary, and Dict or
Tuple of those and of Boxes) is flattened by RLlib's ``FlattenObservations`` connector in training:
Discrete values one-hot, MultiDiscrete values one-hot per entry, Boxes raveled, the parts of a Dict
in sorted key order and of a Tuple in order, all float32. :func:`flatten` does the same from a
space's JSON description, in numpy alone, so evaluation, export and a server without Ray give the
model what training gave it (tests/test_spaces.py holds them equal to RLlib's).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# What a description's "type" can be; a Box is the model's input as it is.
FLATTENED = ("Discrete", "MultiDiscrete", "MultiBinary", "Dict", "Tuple")
SUPPORTED_OBSERVATIONS = ("Box", *FLATTENED)


def describe(space: Any) -> dict[str, Any]:
    """A JSON description of a gymnasium space: enough to check an observation and flatten it."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": np.asarray(space.nvec).tolist(),
            "start": np.asarray(space.start).tolist(),
        }
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "shape": list(space.shape)}
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": str(space.dtype),
            "low": [float(v) if np.isfinite(v) else None for v in np.ravel(space.low)],
            "high": [float(v) if np.isfinite(v) else None for v in np.ravel(space.high)],
        }
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {key: describe(part) for key, part in space.spaces.items()}}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [describe(part) for part in space.spaces]}
    return {"type": type(space).__name__, "repr": repr(space)}


def flattened_description(space: Any) -> dict[str, Any] | None:
    """:func:`describe` of an observation space RLlib flattens for the model; None for a Box, which
    the model takes as it is."""
    import gymnasium as gym

    return None if isinstance(space, gym.spaces.Box) else describe(space)


def unsupported_part(space: Any, where: str = "") -> str | None:
    """Why rl_app cannot train on observations of ``space`` (naming the part of a Dict or Tuple,
    e.g. ``['map']``), or None when it can."""
    import gymnasium as gym

    subject = f"{space} (part {where})" if where else f"{space}"
    if isinstance(space, gym.spaces.Box | gym.spaces.MultiBinary):
        return None
    if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
        # RLlib's one-hot counts from 0 whatever the space's start.
        if np.any(np.asarray(space.start) != 0):
            return f"{subject} starts at {space.start}: RLlib one-hot encodes from 0"
        return None
    if isinstance(space, gym.spaces.Dict):
        parts = ((f"{where}[{key!r}]", part) for key, part in space.spaces.items())
    elif isinstance(space, gym.spaces.Tuple):
        parts = ((f"{where}[{index}]", part) for index, part in enumerate(space.spaces))
    else:
        allowed = ", ".join(SUPPORTED_OBSERVATIONS)
        return f"{subject} is not one rl_app trains on (allowed: {allowed})"
    for name, part in parts:
        found = unsupported_part(part, name)
        if found:
            return found
    return None


MASK_KEY = "action_mask"


def is_masked(observation_space: Any) -> bool:
    """Whether observations of this space carry an action mask (a Dict with ``action_mask``)."""
    import gymnasium as gym

    return isinstance(observation_space, gym.spaces.Dict) and MASK_KEY in observation_space.spaces


def mask_problem(observation_space: Any, action_space: Any) -> str | None:
    """Why the ``action_mask`` of ``observation_space`` cannot mask actions of ``action_space``
    (their kind, the mask's size or its place in the flattened row), or None."""
    import gymnasium as gym

    mask = observation_space[MASK_KEY]
    if not isinstance(action_space, gym.spaces.Discrete):
        return f"masks Discrete actions only, not {action_space}"
    n = int(action_space.n)
    if not isinstance(mask, gym.spaces.Box | gym.spaces.MultiBinary) or tuple(mask.shape) != (n,):
        return f"must be a Box or MultiBinary of shape ({n},), one entry per action; it is {mask}"
    before = sorted(key for key in observation_space.spaces if key < MASK_KEY)
    if before:
        return (
            f"must come first in sorted key order (RLlib flattens a Dict so); {before[0]!r} sorts before it"
        )
    return None


# The action spaces RLlib's default models, our evaluation and our export all take.
SUPPORTED_ACTIONS = ("Box", "Discrete")


def spaces_problem(observation_space: Any, action_space: Any) -> str | None:
    """Why rl_app cannot train on an env (or an agent) of these spaces, as the end of a sentence
    about it ("its observation space ..."), or None."""
    import gymnasium as gym

    problem = unsupported_part(observation_space)
    if problem:
        return f"its observation space {problem}"
    if not isinstance(action_space, gym.spaces.Box | gym.spaces.Discrete):
        return (
            f"its action space {action_space} is not one RLlib's default models take "
            f"(allowed: {', '.join(SUPPORTED_ACTIONS)})"
        )
    if is_masked(observation_space):
        problem = mask_problem(observation_space, action_space)
        if problem:
            return f"its observation's '{MASK_KEY}' {problem}"
    return None


def is_flattened(description: dict[str, Any]) -> bool:
    """Whether observations of this space reach the model flattened (anything but a Box)."""
    return description.get("type") in FLATTENED


def flat_size(description: dict[str, Any]) -> int:
    """The length of a flattened observation of this space."""
    kind = description["type"]
    if kind == "Discrete":
        return int(description["n"])
    if kind == "MultiDiscrete":
        return int(np.sum(description["nvec"]))
    if kind in ("Box", "MultiBinary"):
        return int(np.prod(description["shape"]))
    return sum(flat_size(part) for part in _parts(description))


def _parts(description: dict[str, Any]) -> list[dict[str, Any]]:
    spaces = description["spaces"]
    return [spaces[key] for key in sorted(spaces)] if description["type"] == "Dict" else list(spaces)


def _one_hot(values: np.ndarray, depth: int) -> np.ndarray:
    return (values[..., None] == np.arange(depth)).astype(np.float32)


def flatten(description: dict[str, Any], obs: Any) -> np.ndarray:
    """One observation of the described space as RLlib's ``FlattenObservations`` gives it to the
    model: a float32 vector of :func:`flat_size`. ValueError naming the part that does not fit."""
    kind = description["type"]
    if kind in ("Dict", "Tuple"):
        if kind == "Dict":
            if not isinstance(obs, dict):
                raise ValueError(f"expected an object with keys {sorted(description['spaces'])}")
            missing = sorted(set(description["spaces"]) - set(obs))
            if missing:
                raise ValueError(f"missing key(s) {missing}")
            items = [obs[key] for key in sorted(description["spaces"])]
        else:
            if not isinstance(obs, list | tuple) or len(obs) != len(description["spaces"]):
                raise ValueError(f"expected a list of {len(description['spaces'])} parts")
            items = list(obs)
        return np.concatenate(
            [flatten(part, item) for part, item in zip(_parts(description), items, strict=True)]
        )
    values = np.asarray(obs)
    if kind == "Discrete":
        if values.shape != () or values.dtype.kind not in "biu" or not 0 <= values < description["n"]:
            raise ValueError(f"expected an integer in [0, {description['n'] - 1}]")
        return _one_hot(values.astype(np.int64), int(description["n"]))
    if kind == "MultiDiscrete":
        nvec = np.asarray(description["nvec"])
        if (
            values.shape != nvec.shape
            or values.dtype.kind not in "biu"
            or np.any((values < 0) | (values >= nvec))
        ):
            raise ValueError(f"expected {nvec.size} integers below {nvec.tolist()}")
        return np.concatenate(
            [_one_hot(v, int(n)) for v, n in zip(values.ravel(), nvec.ravel(), strict=True)]
        )
    if values.shape != tuple(description["shape"]) or values.dtype.kind not in "biuf":
        raise ValueError(f"expected numbers of shape {tuple(description['shape'])}")
    return values.astype(np.float32).ravel()


def box_bounds(description: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A Box description's low and high as float64 arrays of its shape (None: unbounded)."""
    shape = tuple(int(n) for n in description["shape"])
    low, high = (
        np.array([bound if v is None else v for v in description[key]], dtype=np.float64).reshape(shape)
        for key, bound in (("low", -np.inf), ("high", np.inf))
    )
    return low, high


def space_from_description(description: dict[str, Any]) -> Any:
    """The gymnasium space a :func:`describe` output describes."""
    import gymnasium as gym

    kind = description["type"]
    if kind == "Discrete":
        return gym.spaces.Discrete(description["n"], start=description.get("start", 0))
    if kind == "MultiDiscrete":
        return gym.spaces.MultiDiscrete(description["nvec"], start=description.get("start"))
    if kind == "MultiBinary":
        shape = description["shape"]
        return gym.spaces.MultiBinary(shape[0] if len(shape) == 1 else shape)
    if kind == "Box":
        dtype = np.dtype(description["dtype"])
        low, high = box_bounds(description)
        return gym.spaces.Box(low.astype(dtype), high.astype(dtype), low.shape, dtype=dtype)
    if kind == "Dict":
        return gym.spaces.Dict(
            {key: space_from_description(part) for key, part in description["spaces"].items()}
        )
    if kind == "Tuple":
        return gym.spaces.Tuple([space_from_description(part) for part in description["spaces"]])
    raise ValueError(f"no space for a description of type {kind!r}")


def nesting_depth(description: dict[str, Any]) -> int:
    """How deep one observation of this space nests as JSON (a number: 0, a vector: 1)."""
    kind = description["type"]
    if kind in ("Dict", "Tuple"):
        return 1 + max((nesting_depth(part) for part in _parts(description)), default=0)
    if kind == "Discrete":
        return 0
    if kind == "MultiDiscrete":
        return len(np.shape(description["nvec"]))
    return len(description["shape"])


def value_count(description: dict[str, Any]) -> int:
    """How many numbers one observation of this space holds as JSON."""
    kind = description["type"]
    if kind in ("Dict", "Tuple"):
        return sum(value_count(part) for part in _parts(description))
    if kind == "Discrete":
        return 1
    if kind == "MultiDiscrete":
        return int(np.size(description["nvec"]))
    return int(np.prod(description["shape"]))
