"""RLlib 2.60's action distributions for sampling, as plain tensor operations.

RLlib samples through distribution objects (its ``TorchCategorical`` / ``TorchSquashedGaussian``
wrapping torch's ``Categorical`` / ``Normal``), built anew on every call. These functions run the
same operations on the same torch RNG, in the same order (for the training pass: the order in which
a tensor's uses are recorded is the order in which backward sums their gradients), so that what
they draw and the log-probabilities they give are RLlib's to the bit (tests/test_sampling.py,
tests/test_adapter.py). bench/README.md has what they save.
"""

from __future__ import annotations

import math

import torch
from ray.rllib.utils.numpy import SMALL_NUMBER

from rl_app.rllib.distributions import LOG_STD_BOUNDS, squash

LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))


def sample_categorical(
    logits: torch.Tensor, with_logp: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``TorchCategorical.from_logits(logits)``'s ``sample()`` and ``logp()`` (None without ``with_logp``)."""
    normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = torch.nn.functional.softmax(normalized, dim=-1)
    actions = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, True).T.reshape(probs.shape[:-1])
    if not with_logp:
        return actions, None
    return actions, normalized.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def _normal(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``TorchSquashedGaussian.from_logits``' location and scale, as torch's ``Normal`` keeps them."""
    loc, log_std = logits.chunk(2, dim=-1)
    scale = torch.clamp(log_std, *LOG_STD_BOUNDS).exp()
    loc, scale = torch.broadcast_tensors(loc, scale)  # Normal's broadcast_all
    return loc, scale


def _log_prob_of_squashed(unsquashed: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``TorchSquashedGaussian``'s log-probability: ``Normal.log_prob`` summed, less the tanh Jacobian."""
    var = scale**2
    log_scale = scale.log()
    logp = (-((unsquashed - loc) ** 2) / (2 * var) - log_scale - LOG_SQRT_2PI).sum(-1)
    jacobian = 2.0 * (math.log(2.0) - unsquashed - torch.nn.functional.softplus(-2.0 * unsquashed))
    return logp - jacobian.sum(-1)


def draw_squashed_gaussian(logits: torch.Tensor, reparameterized: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``TorchSquashedGaussian.from_logits(logits)``'s ``rsample_and_logp()`` (or, not
    reparameterized, ``sample_and_logp()``): SAC's training pass."""
    loc, scale = _normal(logits)
    if reparameterized:
        unsquashed = loc + torch.empty(loc.shape, dtype=loc.dtype, device=loc.device).normal_() * scale
    else:
        with torch.no_grad():
            unsquashed = torch.normal(loc, scale)
    return squash(unsquashed), _log_prob_of_squashed(unsquashed, loc, scale)


def sample_squashed_gaussian(
    logits: torch.Tensor, with_logp: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``TorchSquashedGaussian.from_logits(logits)``'s ``sample()`` and ``logp()`` of what it drew
    (read back through ``atanh`` of the clipped action, as RLlib's runner does; None without
    ``with_logp``): the runner's draw."""
    loc, scale = _normal(logits)
    with torch.no_grad():
        actions = squash(torch.normal(loc, scale))
    if not with_logp:
        return actions, None
    rescaled = (actions - -1.0) / 2.0 * 2.0 - 1.0  # TorchSquashedGaussian's unsquashing to [-1, 1]
    unsquashed = torch.atanh(torch.clamp(rescaled, -1.0 + SMALL_NUMBER, 1.0 - SMALL_NUMBER))
    return actions, _log_prob_of_squashed(unsquashed, loc, scale)
