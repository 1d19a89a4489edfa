"""Every user error: one line on stderr naming file and key, exit code 2, no traceback."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rl_app.cli import main

SHIPPED_CARTPOLE = str(Path(__file__).resolve().parents[1] / "experiments" / "ppo_cartpole.yaml")

GOOD = "algorithm: PPO\nenv: CartPole-v1\ntraining: {lr: 0.001}\nstop: {timesteps: 1000}\n"


QLEARNING = """\
algorithm: QLearning
env: CartPole-v1
training:
  bins: [6, 6, 12, 12]
  low: [-2.4, -3.0, -0.21, -3.5]
  high: [2.4, 3.0, 0.21, 3.5]
stop: {timesteps: 40000}
"""


def sweep(space_line: str, extra: str = "") -> str:
    """GOOD with a one-key sweep section (and ``extra`` lines of it)."""
    return f"{GOOD}sweep:\n  space:\n    {space_line}\n{extra}"


# (experiment file text or None for no file, command line, expected fragments of the message)
CASES = {
    "unknown experiment": (None, ["show", "nope"], ["unknown experiment 'nope'", "available: good"]),
    "near-miss experiment": (None, ["show", "god"], ["did you mean 'good'?"]),
    "relative path": (None, ["show", "../x"], ["must be a name from", "or the path of a .yaml file"]),
    "absolute path": (None, ["show", "/etc/passwd"], ["or the path of a .yaml file"]),
    "missing yaml file": (
        None,
        ["train", "runs/x/best.yaml"],
        ["experiment file 'runs/x/best.yaml' does not"],
    ),
    "yaml syntax": (
        "algorithm: PPO\nenv: [CartPole-v1\n",
        ["show", "bad"],
        ["bad.yaml", "YAML syntax error", "line 3"],
    ),
    "not a mapping": ("- 1\n- 2\n", ["show", "bad"], ["bad.yaml", "must be a mapping"]),
    "unknown key": (
        GOOD.replace("lr:", "lrr:"),
        ["show", "bad"],
        ["training.lrr", "did you mean 'lr'?", "allowed:"],
    ),
    "unknown section": (GOOD + "trainig: {}\n", ["show", "bad"], ["trainig", "did you mean 'training'?"]),
    "wrong type": (
        GOOD.replace("lr: 0.001", "lr: fast"),
        ["show", "bad"],
        ["training.lr", "must be a number", "'fast'"],
    ),
    "negative lr": (
        GOOD.replace("0.001", "-1"),
        ["show", "bad"],
        ["bad.yaml: training.lr: must be a number > 0 or a list (got -1)"],
    ),
    "zero batch": (
        GOOD.replace("lr: 0.001", "train_batch_size_per_learner: 0"),
        ["show", "bad"],
        ["training.train_batch_size_per_learner", "> 0", "got 0"],
    ),
    "bad activation": (
        GOOD + "model: {fcnet_activation: sigmoid}\n",
        ["show", "bad"],
        ["model.fcnet_activation", "'tanh'", "'relu'", "got 'sigmoid'"],
    ),
    "unknown algorithm": (
        GOOD.replace("PPO", "PPX"),
        ["show", "bad"],
        ["algorithm", "did you mean 'PPO'?", "PPO, APPO, IMPALA, DQN, SAC, BC, MARWIL, CQL, IQL, QLearning"],
    ),
    "missing algorithm": (
        "env: CartPole-v1\nstop: {timesteps: 10}\n",
        ["show", "bad"],
        ["bad.yaml: algorithm: required"],
    ),
    "unknown env": (
        GOOD.replace("CartPole-v1", "CartPol-v1"),
        ["show", "bad"],
        ["env.id", "unknown env id", "'CartPole-v1'"],
    ),
    "unknown wrapper": (
        GOOD.replace("env: CartPole-v1", "env: {id: CartPole-v1, wrappers: [time_limt]}"),
        ["show", "bad"],
        ["bad.yaml: env.wrappers[0].name", "unknown wrapper 'time_limt'", "allowed: time_limit"],
    ),
    "wrapper class missing": (
        GOOD.replace("env: CartPole-v1", "env: {id: CartPole-v1, wrappers: ['gymnasium.wrappers:NoSuch']}"),
        ["show", "bad"],
        ["env.wrappers[0].name", "module 'gymnasium.wrappers' has no class 'NoSuch'"],
    ),
    "missing stop": (
        GOOD.replace("stop: {timesteps: 1000}\n", ""),
        ["show", "bad"],
        ["stop", "required key is missing"],
    ),
    "empty stop": (GOOD.replace("{timesteps: 1000}", "{}"), ["show", "bad"], ["stop", "set at least one of"]),
    "bad override": (GOOD, ["show", "bad", "--set", "training.gamma=2"], ["--set training.gamma=2", "<= 1"]),
    "malformed override": (GOOD, ["show", "bad", "--set", "gamma"], ["--set gamma", "KEY=VALUE"]),
    "gpu without gpu": (GOOD + "learners: {device: gpu}\n", ["show", "bad"], ["learners.device", "no GPU"]),
    "sweep bounds": (
        sweep("training.lr: {uniform: [0.1, 0.01]}"),
        ["show", "bad"],
        ["bad.yaml: sweep.space.training.lr: uniform needs low < high (got [0.1, 0.01])"],
    ),
    "sweep value the schema refuses": (
        sweep("training.lr: {uniform: [0, 0.1]}"),
        ["sweep", "bad"],
        ["sweep.space.training.lr: uniform value 0.0 is invalid: training.lr: must be a number > 0"],
    ),
    "sweep unknown key": (
        sweep("training.lrr: {choice: [0.1]}"),
        ["sweep", "bad"],
        ["sweep.space.training.lrr", "did you mean 'lr'?"],
    ),
    "sweep unknown kind": (
        sweep("training.lr: {normal: [0, 1]}"),
        ["show", "bad"],
        ["sweep.space.training.lr.normal: unknown key", "allowed: choice, grid, uniform, loguniform"],
    ),
    "sweep not sweepable": (
        sweep("stop.timesteps: {choice: [10]}"),
        ["sweep", "bad"],
        ["sweep.space.stop.timesteps: cannot be swept (allowed: training.*, model.*, env.config.*, seed)"],
    ),
    "sweep optuna grid": (
        sweep("training.lr: {grid: [0.1, 0.2]}", "  search: optuna\n"),
        ["sweep", "bad"],
        ["sweep.space.training.lr", "search 'optuna' cannot take grid entries"],
    ),
    "sweep pbt on the model": (
        sweep(
            "model.fcnet_hiddens: {choice: [[8], [16]]}",
            "  scheduler: {type: pbt, perturbation_interval: 100}\n",
        ),
        ["sweep", "bad"],
        ["sweep.space.model.fcnet_hiddens", "only training.* keys"],
    ),
    "sweep pbt without interval": (
        sweep("training.lr: {choice: [0.1]}", "  scheduler: {type: pbt}\n"),
        ["sweep", "bad"],
        ["sweep.scheduler", "needs perturbation_interval"],
    ),
    "sweep unknown scheduler": (
        sweep("training.lr: {choice: [0.1]}", "  scheduler: {type: hyperband}\n"),
        ["sweep", "bad"],
        ["sweep.scheduler.type", "one of 'fifo', 'asha' or 'pbt' (got 'hyperband')"],
    ),
    "sweep eval metric without evaluation": (
        sweep("training.lr: {choice: [0.1]}", "  metric: eval_return\n"),
        ["sweep", "bad"],
        ["sweep.metric", "needs evaluation.interval > 0"],
    ),
    "sweep asha without a budget": (
        sweep("training.lr: {choice: [0.1]}", "  scheduler: {type: asha}\n").replace(
            "{timesteps: 1000}", "{return: 100}"
        ),
        ["sweep", "bad"],
        ["sweep.scheduler.max_t", "ASHA needs max_t"],
    ),
    "sweep without a sweep section": (None, ["sweep", "good"], ["good.yaml: has no sweep section"]),
    "sweep resume of nothing": (None, ["sweep", "--resume", "nowhere"], ["sweep 'nowhere' does not exist"]),
    "duplicate key": (
        GOOD.replace("training: {lr: 0.001}", "training:\n  lr: 0.001\n  gamma: 0.9\n  lr: 0.01"),
        ["show", "bad"],
        ["bad.yaml: duplicate key 'lr' at lines 4 and 6"],
    ),
    "duplicate section": (
        GOOD + "stop: {iterations: 3}\n",
        ["show", "bad"],
        ["duplicate key 'stop' at lines 4 and 5"],
    ),
    "extends outside the folder": (
        "extends: ../../somewhere/else\n" + GOOD,
        ["show", "bad"],
        ["bad.yaml: extends: must name an experiment in", "extends cannot reach other folders"],
    ),
    "alias bomb": (
        GOOD
        + "description: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"d{i}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(6)),
        ["show", "bad"],
        ["bad.yaml: aliases expand to more than 10,000 values (an alias bomb?)"],
    ),
    "alias bomb in --set": (
        GOOD,
        [
            "show",
            "bad",
            "--set",
            "description=[&a [x, x, x, x, x, x, x, x, x, x, x], " + "*a, " * 999 + "*a]",
        ],
        ["--set description=", "aliases expand to more than 10,000 values"],
    ),
    "env class missing": (
        GOOD.replace("env: CartPole-v1", "env: broken_envs:NoSuchEnv"),
        ["train", "bad"],
        ["env.id", "module 'broken_envs' has no class 'NoSuchEnv'"],
    ),
    "env module missing": (
        GOOD.replace("env: CartPole-v1", "env: no_such_module:Env"),
        ["train", "bad"],
        ["env.id", "cannot import module 'no_such_module'"],
    ),
    "env constructor raising": (
        GOOD.replace("env: CartPole-v1", "env: {id: 'broken_envs:RaisesInConstructor', config: {level: 7}}"),
        ["train", "bad"],
        [
            "bad.yaml: env: 'broken_envs:RaisesInConstructor'",
            "cannot be created: RuntimeError: no such level: 7",
        ],
    ),
    "env space RLlib cannot take": (
        GOOD.replace("env: CartPole-v1", "env: broken_envs:TextObservations"),
        ["train", "bad"],
        [
            "'broken_envs:TextObservations' its observation space Text(",
            "allowed: Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple",
        ],
    ),
    "env observation part RLlib cannot flatten": (
        GOOD.replace("env: CartPole-v1", "env: spaces_envs:GraphObservations"),
        ["train", "bad"],
        ["'spaces_envs:GraphObservations' its observation space Graph(", "(part ['map']) is not one rl_app"],
    ),
    "env discrete observations counted from one": (
        GOOD.replace("env: CartPole-v1", "env: spaces_envs:CountsFromOne"),
        ["train", "bad"],
        ["its observation space Discrete(4, start=1) starts at 1: RLlib one-hot encodes from 0"],
    ),
    "action mask of the wrong length": (
        GOOD.replace("env: CartPole-v1", "env: spaces_envs:WrongMaskSize"),
        ["train", "bad"],
        [
            "bad.yaml: env: 'spaces_envs:WrongMaskSize' its observation's 'action_mask'",
            "must be a Box or MultiBinary of shape (5,), one entry per action",
        ],
    ),
    "action mask for an algorithm that cannot mask": (
        "algorithm: SAC\nenv: spaces_envs:MaskedGoal\nstop: {iterations: 1}\n",
        ["train", "bad"],
        [
            "bad.yaml: env: an observation with 'action_mask'",
            "masks the actions of PPO, APPO, IMPALA and DQN here, not SAC's",
        ],
    ),
    "lstm for an algorithm without one": (
        "algorithm: DQN\nenv: CartPole-v1\nmodel: {use_lstm: true}\nstop: {iterations: 1}\n",
        ["train", "bad"],
        ["bad.yaml: model.use_lstm: applies to PPO, APPO, IMPALA here, not DQN"],
    ),
    "squared critic loss on RLlib's own SAC learner": (
        "algorithm: SAC\nenv: Pendulum-v1\ntraining: {critic_loss: mse}\nacceleration: off\n"
        "stop: {iterations: 1}\n",
        ["train", "bad"],
        [
            "bad.yaml: training.critic_loss: mse needs rl_app's SAC learner, which this run does not use",
            "(acceleration: off); allowed: huber",
        ],
    ),
    "critic loss for an algorithm without one": (
        GOOD.replace("training: {lr: 0.001}", "training: {critic_loss: mse}"),
        ["show", "bad"],
        ["bad.yaml: training.critic_loss: unknown key (allowed: lr, gamma"],
    ),
    "lstm with orthogonal initialisation": (
        GOOD + "model: {use_lstm: true, ortho_init: true}\n",
        ["train", "bad"],
        ["bad.yaml: model.ortho_init: initialises MLP encoders, not the LSTM of model.use_lstm"],
    ),
    "observation indices outside the observation": (
        GOOD.replace(
            "env: CartPole-v1",
            "env: {id: CartPole-v1, wrappers: [{name: observation_indices, kwargs: {indices: [0, 4]}}]}",
        ),
        ["train", "bad"],
        ["cannot be created: ValueError: observation_indices [0, 4] must be within [0, 3]"],
    ),
    "offline data for discrete observations": (
        "algorithm: BC\nenv: FrozenLake-v1\noffline: {input: data}\nstop: {iterations: 1}\n",
        ["train", "bad"],
        [
            "bad.yaml: env: offline algorithms here learn from Box observations;",
            "FrozenLake-v1's are Discrete(16)",
        ],
    ),
    "multi-agent mapping naming an unknown policy": (
        GOOD.replace("env: CartPole-v1", "env: multi_agent_envs:Meeting")
        + "multi_agent: {policies: [a, b], mapping: {runner: a, 'sc*': nope}}\n",
        ["show", "bad"],
        ["bad.yaml: multi_agent", "mapping 'sc*' names unknown policy 'nope' (allowed: a, b)"],
    ),
    "multi-agent mapping that leaves an agent out": (
        GOOD.replace("env: CartPole-v1", "env: multi_agent_envs:Meeting")
        + "multi_agent: {policies: [a], mapping: {runner: a}}\n",
        ["train", "bad"],
        [
            "bad.yaml: multi_agent: does not fit 'multi_agent_envs:Meeting':",
            "agent 'scout' matches none of the mapping's patterns ('runner')",
        ],
    ),
    "multi-agent policy shared by agents of different spaces": (
        GOOD.replace("env: CartPole-v1", "env: multi_agent_envs:DifferentSpaces"),
        ["train", "bad"],
        ["agents 'runner' and 'scout' both use policy 'shared' but their spaces differ"],
    ),
    "multi-agent section for a single-agent env": (
        GOOD + "multi_agent: {policies: shared}\n",
        ["train", "bad"],
        ["bad.yaml: multi_agent: needs several agents; 'CartPole-v1' is a single-agent env"],
    ),
    "self-play opponent that trains": (
        GOOD.replace("env: CartPole-v1", "env: pettingzoo.classic.tictactoe_v3")
        + "multi_agent: {policies: [me, copy], train: [me, copy],"
        + " self_play: {learner: me, opponent: copy}}\n",
        ["show", "bad"],
        ["bad.yaml: multi_agent", "train: self_play's opponent 'copy' is frozen; it does not learn"],
    ),
    "tabular Q-learning for several agents": (
        QLEARNING.replace("env: CartPole-v1", "env: multi_agent_envs:Meeting"),
        ["train", "bad"],
        ["bad.yaml: multi_agent: QLearning trains one agent here"],
    ),
    "wrappers around a multi-agent env": (
        GOOD.replace("env: CartPole-v1", "env: {id: mpe2.simple_spread_v3, wrappers: [clip_reward]}"),
        ["train", "bad"],
        ["bad.yaml: env: 'mpe2.simple_spread_v3' takes no wrappers: they wrap single-agent Gymnasium envs"],
    ),
    "observation filter for several agents": (
        GOOD.replace("env: CartPole-v1", "env: multi_agent_envs:Meeting")
        + "env_runners: {observation_filter: MeanStdFilter}\n",
        ["train", "bad"],
        ["bad.yaml: env_runners.observation_filter: normalises one agent's observations here"],
    ),
    "unknown PettingZoo module": (
        GOOD.replace("env: CartPole-v1", "env: pettingzoo.classic.tictactoe_v99"),
        ["show", "bad"],
        ["unknown env id 'pettingzoo.classic.tictactoe_v99'", "a PettingZoo env's module"],
    ),
    "env reset of the wrong shape": (
        GOOD.replace("env: CartPole-v1", "env: broken_envs:WrongShape"),
        ["train", "bad"],
        ["reset() returned an observation (shape (5,), dtype float32) outside its observation space"],
    ),
    "env reward not a number": (
        GOOD.replace("env: CartPole-v1", "env: broken_envs:StringReward"),
        ["train", "bad"],
        ["step() returned a reward of type str (expected a number)"],
    ),
    "env step of four": (
        GOOD.replace("env: CartPole-v1", "env: broken_envs:FourTuple"),
        ["train", "bad"],
        ["step() must return (observation, reward, terminated, truncated, info)"],
    ),
    "tabular bins per dimension": (
        QLEARNING.replace("bins: [6, 6, 12, 12]", "bins: [6, 6]")
        .replace("  low: [-2.4, -3.0, -0.21, -3.5]\n", "")
        .replace("  high: [2.4, 3.0, 0.21, 3.5]\n", ""),
        ["train", "bad"],
        ["training.bins", "one bin count per observation dimension (4)"],
    ),
    "tabular unbounded observations": (
        QLEARNING.replace("  low: [-2.4, -3.0, -0.21, -3.5]\n", "").replace(
            "  high: [2.4, 3.0, 0.21, 3.5]\n", ""
        ),
        ["show", "bad"],
        ["training.low", "unbounded", "clipping bounds"],
    ),
    "tabular continuous actions": (
        QLEARNING.replace("CartPole-v1", "Pendulum-v1")
        .replace("[6, 6, 12, 12]", "[6, 6, 6]")
        .replace("[-2.4, -3.0, -0.21, -3.5]", "[-1, -1, -8]")
        .replace("[2.4, 3.0, 0.21, 3.5]", "[1, 1, 8]"),
        ["train", "bad"],
        ["tabular Q-learning needs Discrete actions", "Box"],
    ),
    "tabular sweep": (
        QLEARNING + "sweep:\n  space:\n    training.lr: {uniform: [0.05, 0.2]}\n",
        ["sweep", "bad"],
        ["a sweep runs RLlib algorithms; QLearning is the tabular baseline"],
    ),
    "runs json of nothing": (None, ["runs", "--json", "--runs-dir", "nowhere"], ["runs folder 'nowhere'"]),
    "atari without frameskip 1": (
        "algorithm: PPO\nenv: {id: ALE/Pong-v5, wrappers: [atari]}\nstop: {timesteps: 1000}\n",
        ["train", "bad"],
        ["bad.yaml: env: 'ALE/Pong-v5' cannot be created", "set env.config.frameskip: 1"],
    ),
    "atari wrapper on a non-ALE env": (
        GOOD.replace("env: CartPole-v1", "env: {id: CartPole-v1, wrappers: [atari]}"),
        ["train", "bad"],
        ["the 'atari' wrapper needs an ALE env"],
    ),
    "conv filter without a stride": (
        GOOD + "model: {conv_filters: [[32, 8]]}\n",
        ["show", "bad"],
        ["model.conv_filters[0][2]"],
    ),
    "conv filter with an unknown padding": (
        GOOD + "model: {conv_filters: [[32, 8, 4, full]]}\n",
        ["show", "bad"],
        ["model.conv_filters[0][3]", "'same'", "'valid'", "'full'"],
    ),
    "unknown observation filter": (
        GOOD + "env_runners: {observation_filter: Norm}\n",
        ["train", "bad"],
        ["env_runners.observation_filter", "'MeanStdFilter'", "'Norm'"],
    ),
    "image observations for an algorithm without an image model": (
        "algorithm: SAC\nenv: MinAtar/Breakout-v1\nstop: {timesteps: 1000}\n",
        ["train", "bad"],
        ["algorithm: SAC has no image-input model", "PPO, APPO, IMPALA, DQN or MARWIL"],
    ),
    "evaluate a run without a complete checkpoint": (
        None,
        ["evaluate", "runs/good/20260101-000000"],
        ["run 'runs/good/20260101-000000' has no complete checkpoint"],
    ),
    "export a run without a complete checkpoint": (
        None,
        ["export", "runs/good/20260101-000000", "--format", "onnx"],
        ["has no complete checkpoint"],
    ),
    "serve a run without a complete checkpoint": (
        None,
        ["serve", "runs/good/20260101-000000"],
        ["has no complete checkpoint"],
    ),
    "serve off loopback without a token": (
        None,
        ["serve", "runs/good/20260101-000000", "--host", "0.0.0.0"],
        ["--host 0.0.0.0 is reachable from other machines", "--token-file"],
    ),
    "train into a runs dir that is a file": (
        None,
        ["train", "good", "--runs-dir", "experiments/good.yaml"],
        ["--runs-dir experiments/good.yaml: cannot create run folders there", "is a file, not a folder"],
    ),
    "sweep into a runs dir that cannot be made": (
        sweep("training.lr: {choice: [0.001]}"),
        ["sweep", "bad", "--runs-dir", "/proc/rl_app_runs"],
        ["--runs-dir /proc/rl_app_runs: cannot create run folders there"],
    ),
    "sweep set without a value": (
        sweep("seed: {choice: [1]}"),
        ["sweep", "bad", "--set", "lr"],
        ["--set lr: must be KEY=VALUE"],
    ),
    "sweep storage scheme": (
        sweep("seed: {choice: [1]}"),
        ["sweep", "bad", "--storage", "ftp://host/x"],
        ["unknown scheme 'ftp://'", "s3://"],
    ),
    "submit set without a value": (
        None,
        ["submit", SHIPPED_CARTPOLE, "--set", "lr"],
        ["--set lr: must be KEY=VALUE"],
    ),
    "submit address scheme": (
        None,
        ["submit", SHIPPED_CARTPOLE, "--address", "ftp://127.0.0.1:8265"],
        ["scheme must be http:// or https://"],
    ),
    "submit token file missing": (
        None,
        ["submit", SHIPPED_CARTPOLE, "--token-file", "no-such-token"],
        ["cannot read the cluster token 'no-such-token'"],
    ),
    "jobs logs without an id": (None, ["jobs", "logs"], ["jobs logs needs a JOB_ID"]),
    "runs of a missing folder": (
        None,
        ["runs", "--runs-dir", "no-such-runs"],
        ["runs folder 'no-such-runs' does not exist"],
    ),
    "report of what is not a run": (None, ["report", "experiments"], ["has no progress.csv"]),
    "tracking uri that is a path": (
        None,
        ["train", "good", "--track", "--tracking-uri", "mlruns"],
        ["--tracking-uri: 'mlruns' is not an MLflow tracking URI", "sqlite:///path/mlflow.db"],
    ),
    "sweep tracking uri scheme": (
        sweep("seed: {choice: [1]}"),
        ["sweep", "bad", "--tracking-uri", "ftp://host/x"],
        ["--tracking-uri: 'ftp://host/x' is not an MLflow tracking URI", "schemes: http, https"],
    ),
    "tracking key misspelt": (
        GOOD + "tracking: {mlfow: true}\n",
        ["show", "bad"],
        ["tracking.mlfow", "did you mean 'mlflow'?"],
    ),
    "track of what is not a run": (None, ["track", "experiments"], ["'experiments' is not a run folder"]),
    "offline algorithm without data": (
        "algorithm: BC\nenv: CartPole-v1\nstop: {iterations: 1}\n",
        ["show", "bad"],
        ["bad.yaml: offline.input: BC learns from recorded data", "rl_app record RUN --out DIR"],
    ),
    "offline data for an online algorithm": (
        GOOD + "offline: {input: data}\n",
        ["show", "bad"],
        ["bad.yaml: offline: applies only to the offline algorithms (BC, MARWIL, CQL, IQL), not PPO"],
    ),
    "offline data missing": (
        "algorithm: CQL\nenv: Pendulum-v1\noffline: {input: no-such-recording}\nstop: {iterations: 1}\n",
        ["train", "bad"],
        ["offline.input: 'no-such-recording' does not exist", "rl_app record RUN --out DIR"],
    ),
    "offline data without parquet": (
        "algorithm: BC\nenv: CartPole-v1\noffline: {input: runs}\nstop: {iterations: 1}\n",
        ["train", "bad"],
        ["offline.input: 'runs' holds no .parquet files"],
    ),
    "sweep of an offline algorithm": (
        "algorithm: BC\nenv: CartPole-v1\noffline: {input: runs}\nstop: {iterations: 1}\n"
        "sweep:\n  space:\n    training.lr: {choice: [0.001]}\n",
        ["sweep", "bad"],
        ["sweeps of offline algorithms are not supported yet"],
    ),
    "record into a folder with files": (
        None,
        ["record", "runs/good/20260101-000000", "--out", "runs"],
        ["--out 'runs' is not empty: recordings are never written over"],
    ),
}

# Option values argparse refuses: (command line, expected fragments); exit 2 through SystemExit.
OPTION_CASES = {
    "evaluate zero episodes": (
        ["evaluate", "RUN", "--episodes", "0"],
        ["--episodes", "must be a positive integer"],
    ),
    "evaluate negative workers": (["evaluate", "RUN", "--workers", "-1"], ["--workers", "got '-1'"]),
    "export unknown format": (["export", "RUN", "--format", "pickle"], ["invalid choice: 'pickle'", "onnx"]),
    "serve zero batch": (["serve", "RUN", "--max-batch-size", "0"], ["--max-batch-size", "got '0'"]),
    "serve negative wait": (["serve", "RUN", "--max-wait-ms", "-1"], ["--max-wait-ms", "got '-1'"]),
    "train unknown option": (["train", "good", "--lr", "3"], ["unrecognized arguments: --lr 3"]),
    "sweep zero samples": (["sweep", "good", "--samples", "0"], ["--samples", "must be a positive integer"]),
    "cluster unknown action": (["cluster", "start"], ["invalid choice: 'start'", "'up', 'down'"]),
    "cluster port out of range": (["cluster", "up", "--port", "70000"], ["--port", "1 to 65535"]),
    "cluster negative cpus": (["cluster", "up", "--num-cpus", "-1"], ["--num-cpus", "got '-1'"]),
    "cluster resources not json": (
        ["cluster", "join", "127.0.0.2:6380", "--resources", "x"],
        ["--resources", "got 'x'"],
    ),
    "cluster dashboard port": (["cluster", "up", "--dashboard-port", "x"], ["--dashboard-port", "got 'x'"]),
    "jobs unknown action": (["jobs", "kill"], ["invalid choice: 'kill'", "'list', 'status', 'logs', 'stop'"]),
    "report without a run": (["report"], ["the following arguments are required: RUN"]),
    "evaluate zero video episodes": (
        ["evaluate", "RUN", "--video-episodes", "0"],
        ["--video-episodes", "got '0'"],
    ),
    "serve port out of range": (["serve", "RUN", "--port", "65536"], ["--port", "0 to 65535"]),
    "serve zero replicas": (["serve", "RUN", "--replicas", "0"], ["--replicas", "got '0'"]),
    "serve zero body bytes": (["serve", "RUN", "--max-body-bytes", "0"], ["--max-body-bytes", "got '0'"]),
    "record epsilon above 1": (
        ["record", "RUN", "--out", "x", "--epsilon", "2"],
        ["--epsilon", "must be a number from 0 to 1 (got '2')"],
    ),
    "record zero episodes": (["record", "RUN", "--out", "x", "--episodes", "0"], ["--episodes", "got '0'"]),
    "serve zero ongoing requests": (
        ["serve", "RUN", "--max-ongoing-requests", "0"],
        ["--max-ongoing-requests", "got '0'"],
    ),
}


@pytest.fixture
def existing_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run folder under ./runs (the default runs dir), which no refused command may touch."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "good" / "20260101-000000"
    (run / "checkpoints" / "iter_000001").mkdir(parents=True)
    (run / "checkpoints" / "iter_000001" / "algorithm_state.pkl").write_bytes(b"half a checkpoint")
    (run / "progress.csv").write_text("iteration,timesteps,return_mean\n1,400,21.5\n")
    (run / "config.yaml").write_text(GOOD)
    (run / "status.json").write_text('{"status": "killed"}\n')
    return tmp_path / "runs"


def checksums(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("case", list(CASES))
def test_user_error_is_one_line_exit_2(
    case: str,
    experiments: Path,
    existing_run: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text, argv, fragments = CASES[case]
    (experiments / "good.yaml").write_text(GOOD)
    if text is not None:
        (experiments / "bad.yaml").write_text(text)
    if case == "gpu without gpu":
        monkeypatch.setattr("rl_app.cluster.resources.local_gpu_count", lambda: 0)
    before = sorted(p.name for p in experiments.iterdir())
    runs_before = checksums(existing_run)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("rl_app: error: ")
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert sorted(p.name for p in experiments.iterdir()) == before
    assert checksums(existing_run) == runs_before, "a refused command changed or added files under runs/"


@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_a_refused_option_value_is_one_line_exit_2(
    case: str, experiments: Path, existing_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, fragments = OPTION_CASES[case]
    (experiments / "good.yaml").write_text(GOOD)
    argv = [str(existing_run / "good" / "20260101-000000") if a == "RUN" else a for a in argv]
    runs_before = checksums(existing_run)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.match(rf"rl_app( {argv[0]})?: error: ", err), err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert checksums(existing_run) == runs_before


def test_a_folder_named_like_an_experiment_file_is_named_as_a_folder(
    experiments: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (experiments / "x.yaml").mkdir()
    assert main(["show", "x"]) == 2
    err = capsys.readouterr().err
    assert "x.yaml' is a directory, not an experiment file" in err and "did you mean" not in err
    assert main(["show", str(experiments / "x.yaml")]) == 2
    assert "is a directory, not a YAML file" in capsys.readouterr().err


def test_real_process_prints_no_traceback(experiments: Path) -> None:
    (experiments / "bad.yaml").write_text(GOOD.replace("0.001", "-1"))
    result = subprocess.run(
        [sys.executable, "-m", "rl_app", "train", "bad"],
        capture_output=True,
        text=True,
        env={**os.environ, "RL_APP_EXPERIMENTS_DIR": str(experiments)},
        cwd=experiments.parent,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "rl_app: error: experiments/bad.yaml: training.lr: must be a number > 0 or a list (got -1)"
    ]
    assert not (experiments.parent / "runs").exists(), "a rejected config must not create a run folder"


def test_unknown_command_and_option_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["trian"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
