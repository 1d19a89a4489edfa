"""The RLlib boundary: the only package that imports ``ray.rllib``.

- ``config``: experiment -> ``AlgorithmConfig`` (env registered through the one env factory), the
  Resources line's word on RLlib, the resolved settings
- ``algorithm``: build, save, restore, warm start, re-seed, by RLlib's public component names;
  a checkpoint's module and observation filter read back
- ``results``: our per-iteration metrics, read by RLlib's metric constants
- ``env_runner``: RLlib's env runner with rl_app's env-failure limit and run-time reseeding
- ``runners``: remote env runners lost and brought back between iterations
- ``catalog``: the model choices (orthogonal init, SAC's concatenated critic, SAC's tanh mode)
- ``distributions``: deterministic actions and the squashed Gaussian's log-std bounds
- ``pixels``: modules that take image observations as the env makes them
- ``replay``: the replay buffer's sampling RNG (seeded, checkpointed)
- ``accel``: rl_app's faster parts, one plan deciding which run, one adapter holding the private
  RLlib names they use

Where RLlib offers no public switch, the workaround lives in one of these modules with a
comment naming the RLlib version and the behaviour it works around.
"""
