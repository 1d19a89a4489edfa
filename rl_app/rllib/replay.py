"""The replay buffer's sampling RNG: seeded, saved and restored.

Workaround for RLlib 2.60: its episode replay buffers draw minibatches (and n-steps)
from ``np.random.default_rng(None)``, which ``config.seed`` does not reach and the
buffer's ``get_state()`` leaves out. Without this a DQN or SAC run samples different
minibatches every time it is started, and a resumed run draws other minibatches than
the uninterrupted one would have drawn.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from rl_app.errors import error_detail
from rl_app.runs.checkpoints import CheckpointError

REPLAY_BUFFER = "replay_buffer.pkl"
BUFFER_RNG = "rl_app_rng_state"  # our key in the pickled buffer state


def _buffer(algo: Any) -> Any:
    return getattr(algo, "local_replay_buffer", None)


def seed_replay_buffer(algo: Any, seed: int | None) -> None:
    """Give the algorithm's replay buffer (if any) a sampling RNG seeded with ``seed``."""
    import numpy as np

    buffer = _buffer(algo)
    if buffer is not None and seed is not None and hasattr(buffer, "rng"):
        buffer.rng = np.random.default_rng(seed)


def save_replay_buffer(algo: Any, folder: Path) -> None:
    """``folder/replay_buffer.pkl``: the buffer's contents and its sampling RNG (no file without a buffer)."""
    buffer = _buffer(algo)
    if buffer is None:
        return
    rng = getattr(buffer, "rng", None)
    state = {**buffer.get_state(), BUFFER_RNG: rng.bit_generator.state if rng is not None else None}
    with (folder / REPLAY_BUFFER).open("wb") as handle:
        pickle.dump(state, handle, protocol=pickle.HIGHEST_PROTOCOL)


def restore_replay_buffer(algo: Any, folder: Path) -> None:
    """Refill the algorithm's buffer and its RNG from ``folder/replay_buffer.pkl``, when both exist."""
    buffer_file = folder / REPLAY_BUFFER
    buffer = _buffer(algo)
    if buffer is None or not buffer_file.is_file():
        return
    try:
        with buffer_file.open("rb") as handle:
            state = pickle.load(handle)
        rng_state = state.pop(BUFFER_RNG, None)
        buffer.set_state(state)
        if rng_state is not None and hasattr(buffer, "rng"):
            buffer.rng.bit_generator.state = rng_state
    except Exception as exc:
        raise CheckpointError(f"replay buffer '{buffer_file}' is corrupt: {error_detail(exc)}") from None
