"""The command line: fast --help, list, show."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rl_app.cli import main


def test_help_imports_neither_ray_nor_torch() -> None:
    code = (
        "import sys, contextlib, io\n"
        "from rl_app.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: main(['--help'])\n"
        "    except SystemExit: pass\n"
        "print(sorted(m for m in ('ray', 'torch', 'gymnasium') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


def test_list_shows_algorithm_env_and_description(shipped: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name, algorithm, env in [
        ("ppo_cartpole", "PPO", "CartPole-v1"),
        ("dqn_cartpole", "DQN", "CartPole-v1"),
        ("sac_pendulum", "SAC", "Pendulum-v1"),
    ]:
        line = next(line for line in out.splitlines() if name in line)
        assert algorithm in line and env in line


def test_show_resolves_defaults_yaml_and_overrides(shipped: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    assert main(["show", "ppo_cartpole", "--set", "training.lr=0.0005"]) == 0
    out = capsys.readouterr().out
    resolved = yaml.safe_load(out)
    assert resolved["training"]["lr"] == pytest.approx(5e-4)  # override
    assert resolved["training"]["num_epochs"] == 20  # from the YAML
    assert resolved["training"]["kl_target"] == pytest.approx(0.01)  # RLlib's default
    assert resolved["model"]["fcnet_hiddens"] == [64, 64]
    assert resolved["checkpoint"] == {"every": 20, "keep": 3, "replay_buffer": True}  # schema default
    assert "# resources on this machine:" in out


def test_the_command_ends_with_its_exit_code_its_output_and_every_exit_handler(
    shipped: Path, tmp_path: Path
) -> None:
    """``rl_app`` ends without the interpreter's teardown, after every exit handler has run."""
    listing = subprocess.run(
        [sys.executable, "-m", "rl_app", "list"], capture_output=True, text=True, timeout=120
    )
    assert listing.returncode == 0 and "ppo_cartpole" in listing.stdout and listing.stdout.endswith("\n")
    refused = subprocess.run(
        [sys.executable, "-m", "rl_app", "train", "nosuch"], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2 and refused.stderr.startswith("rl_app: error: unknown experiment 'nosuch'")
    late_handler = (
        "import atexit, logging, sys\n"
        "from rl_app import cli\n"
        "logging.basicConfig(filename=sys.argv[1])\n"
        "atexit.register(lambda: (print('late handler ran'), logging.warning('logged at exit')))\n"
        "sys.argv = ['rl_app', 'list']\n"
        "cli.run()\n"
    )
    log = tmp_path / "exit.log"
    ran = subprocess.run(
        [sys.executable, "-c", late_handler, str(log)], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0 and ran.stdout.endswith("late handler ran\n")
    assert "logged at exit" in log.read_text()
