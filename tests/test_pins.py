"""One source of truth for pins: requirements*.txt; everything else agrees with it."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import yaml
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]


def pins(path: Path) -> dict[str, Requirement]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    requirements = [Requirement(line) for line in lines if line]
    return {r.name.lower(): r for r in requirements}


def test_required_pins_are_exact() -> None:
    runtime = pins(REPO / "requirements.txt")
    assert str(runtime["ray"].specifier) == "==2.60.0"
    assert runtime["ray"].extras == {"rllib", "tune", "default", "serve"}
    assert str(runtime["torch"].specifier) == "==2.13.0"
    extras = {
        **pins(REPO / "requirements-envs.txt"),
        **pins(REPO / "requirements-dev.txt"),
        **pins(REPO / "requirements-bench.txt"),
    }
    for name, requirement in {**runtime, **extras, **pins(REPO / "requirements-notebook.txt")}.items():
        assert re.fullmatch(r"==[\w.]+", str(requirement.specifier)), f"{name} is not pinned exactly"


def test_the_inference_pins_are_a_subset_of_the_runtime_pins() -> None:
    runtime, serving = pins(REPO / "requirements.txt"), pins(REPO / "requirements-serve.txt")
    assert {"onnxruntime", "starlette", "uvicorn", "numpy"} <= set(serving)
    assert not {"ray", "torch", "gymnasium"} & set(serving), "the inference set must stay light"
    for name, requirement in serving.items():
        assert name in runtime and str(runtime[name]) == str(requirement), f"{name}: {requirement} vs runtime"


def test_gymnasium_pin_is_the_one_ray_pins() -> None:
    ray_requires = [Requirement(r) for r in metadata.requires("ray") or []]
    ray_gymnasium = next(r for r in ray_requires if r.name == "gymnasium")
    ours = pins(REPO / "requirements.txt")["gymnasium"]
    pinned_version = str(ours.specifier).removeprefix("==")
    assert ray_gymnasium.specifier.contains(pinned_version), (ray_gymnasium, ours)


def test_environment_yml_installs_from_the_pin_files() -> None:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    dependencies = env["dependencies"]
    assert "python=3.11" in dependencies
    pip_section = next(d["pip"] for d in dependencies if isinstance(d, dict))
    assert {"-r requirements.txt", "-r requirements-envs.txt", "-r requirements-dev.txt"} <= set(pip_section)
    # No package is pinned here a second time, where it could drift.
    assert [line for line in pip_section if not line.startswith("-")] == []


def test_pyproject_reads_dependencies_from_requirements() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "dependencies" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]
    assert dynamic["dependencies"]["file"] == ["requirements.txt"]
    assert dynamic["optional-dependencies"]["envs"]["file"] == ["requirements-envs.txt"]
    assert project["project"]["scripts"]["rl_app"] == "rl_app.cli:run"


def test_installed_versions_match_pins() -> None:
    runtime = {**pins(REPO / "requirements.txt"), **pins(REPO / "requirements-envs.txt")}
    for name, requirement in runtime.items():
        installed = metadata.version(name)
        assert requirement.specifier.contains(installed.split("+")[0]), f"{name} {installed} vs {requirement}"


def test_make_setups_editable_install_prints_nothing() -> None:
    """Its own line of the Makefile, run again here (without build isolation: no download)."""
    import subprocess
    import sys

    makefile = (REPO / "Makefile").read_text().splitlines()
    (line,) = [text.strip() for text in makefile if text.strip().endswith("--no-deps -e .")]
    command = f"{line.replace('$(BIN)/python', sys.executable)} --no-build-isolation"
    result = subprocess.run(command, shell=True, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == ""


def test_the_mlflow_ui_is_the_tracking_clients_version() -> None:
    """The UI's server migrates the database the client writes: one schema, one version."""
    client = pins(REPO / "requirements.txt")["mlflow-skinny"]
    (ui,) = pins(REPO / "requirements-mlflow-ui.txt").values()
    assert ui.name == "mlflow" and str(ui.specifier) == str(client.specifier)
