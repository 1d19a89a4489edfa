"""Hyperparameter sweeps on Ray Tune: the search space (``space``), Tune's wiring (``tuner``), the
outcome (``results``) and ``rl_app sweep`` itself (``run``). Each trial is a
:class:`rl_app.training.trial.ExperimentTrial`."""
