"""rl_app: named reinforcement-learning experiments on Ray RLlib."""

__version__ = "0.1.0"
