"""The RLlib boundary: the only package that imports ``ray.rllib``.

- ``config``: experiment -> ``AlgorithmConfig`` (env registered through the one env factory)
- ``algorithm``: build, save, restore, warm start, re-seed, by RLlib's public component names
- ``results``: our per-iteration metrics, read by RLlib's metric constants
- ``env_runner``: our ``SingleAgentEnvRunner`` subclass (reset seeding)
- ``sampling``: our batched sampler (an env runner class), chosen where it fits
- ``offpolicy``: the array replay buffer and DQN/SAC's training step over it, chosen where it fits
- ``replay``: the replay buffer's sampling RNG (seeded, checkpointed)
- ``logs``: RLlib's and Ray's log levels

Where RLlib offers no public switch, the workaround lives in one of these modules with a
comment naming the RLlib version and the behaviour it works around.
"""
