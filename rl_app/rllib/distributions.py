"""What rl_app takes from RLlib's action distributions outside training: the deterministic action,
the bounds of a squashed Gaussian's log-std (the server samples with them, without RLlib), and
distribution inputs that an exported file computes for any batch size.

One place departs from RLlib on purpose: the deterministic action of a squashed Gaussian
(:func:`deterministic_actions`, :class:`SquashedGaussian`). RLlib 2.60's
``TorchSquashedGaussian.to_deterministic()`` returns the *unsquashed* mean, which its action
connector then clips to the bounds; the policy was trained with tanh squashing, so its mode is
tanh(mean), as in the SAC paper, SB3 and CleanRL. Every deterministic action rl_app takes (the env
runners' evaluation, ``rl_app evaluate``, the exports and so the server) comes from here.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.core.distribution.torch.torch_distribution import TorchDeterministic, TorchSquashedGaussian
from ray.rllib.core.models.torch.heads import TorchFreeLogStdMLPHead
from ray.rllib.utils.numpy import MAX_LOG_NN_OUTPUT, MIN_LOG_NN_OUTPUT

# The log-std a squashed Gaussian clamps its outputs to (RLlib's MIN/MAX_LOG_NN_OUTPUT).
LOG_STD_BOUNDS = (MIN_LOG_NN_OUTPUT, MAX_LOG_NN_OUTPUT)


def squash(unsquashed: torch.Tensor) -> torch.Tensor:
    """RLlib's ``TorchSquashedGaussian`` squashing to its default bounds [-1, 1]: tanh, rescaled, clipped."""
    return torch.clamp(((torch.tanh(unsquashed) + 1.0) / 2.0) * 2.0 + -1.0, -1.0, 1.0)


def deterministic_actions(dist_class: Any, dist_inputs: torch.Tensor) -> torch.Tensor:
    """The deterministic actions of RLlib distribution class ``dist_class`` for ``dist_inputs``:
    RLlib's ``to_deterministic().sample()`` (the argmax of a categorical, the mean of a diagonal
    Gaussian), but tanh(mean) for a squashed Gaussian, in [-1, 1] as its samples are."""
    if isinstance(dist_class, type) and issubclass(dist_class, TorchSquashedGaussian):
        loc, _ = dist_inputs.chunk(2, dim=-1)
        return squash(loc)
    return dist_class.from_logits(dist_inputs).to_deterministic().sample()


class SquashedGaussian(TorchSquashedGaussian):
    """RLlib's squashed Gaussian whose deterministic value is its samples' mode, tanh(mean) (see the
    module docstring): SAC's inference distribution, so RLlib's own action connector picks it too."""

    def to_deterministic(self) -> TorchDeterministic:
        loc: torch.Tensor = self.loc  # type: ignore[assignment]  # RLlib types it float | Any
        return TorchDeterministic(loc=squash(loc))


def with_batch_free_log_std_heads(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` (changed in place) with each free log-std head as :class:`BatchFreeLogStdHead`,
    for tracing into an export; the outputs are the same."""
    from rl_app.rllib.accel.adapter import BatchFreeLogStdHead  # the adapter's imports: export only

    for parent in list(module.modules()):
        if isinstance(parent, BatchFreeLogStdHead):  # wrapped already
            continue
        for name, child in list(parent.named_children()):
            if isinstance(child, TorchFreeLogStdMLPHead):
                setattr(parent, name, BatchFreeLogStdHead(child))
    return module
