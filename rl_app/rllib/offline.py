"""What RLlib's offline API reads: the columns of a recorded transition (``OfflinePreLearner``)."""

from __future__ import annotations


def transition_columns() -> tuple[str, ...]:
    """RLlib's names of a transition's columns, in the order ``rl_app record`` writes them."""
    from ray.rllib.core.columns import Columns

    return (
        Columns.EPS_ID,
        Columns.T,
        Columns.OBS,
        Columns.ACTIONS,
        Columns.REWARDS,
        Columns.NEXT_OBS,
        Columns.TERMINATEDS,
        Columns.TRUNCATEDS,
    )
