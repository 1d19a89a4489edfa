"""Docker images, compose file and KubeRay manifests: lint, pins, entry points, resources (no Docker here)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_pins import pins

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
DOCKERFILES = sorted(DOCKER.glob("Dockerfile*"))
TRAINING_IMAGES = [DOCKER / "Dockerfile", DOCKER / "Dockerfile.cuda"]
RAY_VERSION = str(pins(REPO / "requirements.txt")["ray"].specifier).removeprefix("==")


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def stage(dockerfile: Path, name: str | None) -> list[tuple[str, str]]:
    """The instructions of one build stage (``None``: the last one, which ``docker build`` builds)."""
    stages: list[list[tuple[str, str]]] = []
    for instruction in instructions(dockerfile):
        if instruction[0] == "FROM":
            stages.append([])
        stages[-1].append(instruction)
    if name is None:
        return stages[-1]
    return next(s for s in stages if s[0][1].endswith(f" AS {name}"))


def stage_names(dockerfile: Path) -> list[str]:
    return [
        args.rsplit(" AS ", 1)[1]
        for kind, args in instructions(dockerfile)
        if kind == "FROM" and " AS " in args
    ]


def sshd_settings(path: Path) -> dict[str, str]:
    """sshd_config as sshd reads it: keywords case-insensitive, the first value of each wins."""
    settings: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, value = line.split(None, 1)
            settings.setdefault(keyword.lower(), value.strip())
    return settings


def test_there_is_a_cpu_a_cuda_and_an_inference_image() -> None:
    assert [p.name for p in DOCKERFILES] == ["Dockerfile", "Dockerfile.cuda", "Dockerfile.inference"]


def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    result = subprocess.run([hadolint, *map(str, DOCKERFILES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", TRAINING_IMAGES, ids=lambda p: p.name)
def test_images_install_from_the_pin_file_and_run_rl_app_as_non_root(dockerfile: Path) -> None:
    steps = instructions(dockerfile)
    copies = [args for kind, args in steps if kind == "COPY"]
    assert "requirements.txt requirements-envs.txt ./" in copies
    installs = [args for kind, args in steps if kind == "RUN" and "pip install" in args]
    # The dev images train every shipped experiment: Atari, MuJoCo and MinAtar included.
    assert any("-r requirements.txt -r requirements-envs.txt" in args for args in installs)
    # No package pinned a second time in the image, where it could drift from requirements.txt.
    assert not any(re.search(r"pip install[^&]*\b[\w-]+==", args) for args in installs)
    index = "whl/cpu" if dockerfile.name == "Dockerfile" else "whl/cu"
    assert any(index in args for args in installs)
    final = stage(dockerfile, None)
    for name in stage_names(dockerfile):  # every target ends as a non-root user
        users = [args for kind, args in stage(dockerfile, name) if kind == "USER"] or [
            args for kind, args in stage(dockerfile, "base") if kind == "USER"
        ]
        assert users and users[-1].isdigit() and int(users[-1]) > 0, (name, users)
    assert ("ENTRYPOINT", '["rl_app"]') in final
    assert any("rl_app --help" in args for kind, args in steps if kind == "RUN")  # installed and starts


def test_the_inference_image_is_multi_stage_light_non_root_and_health_checked() -> None:
    dockerfile = DOCKER / "Dockerfile.inference"
    steps = instructions(dockerfile)
    assert stage_names(dockerfile) == ["build", "serve"]
    installs = [args for kind, args in steps if kind == "RUN" and "pip install" in args]
    assert any("-r requirements-serve.txt" in args for args in installs)
    assert not any("-r requirements.txt" in args or "torch" in args for args in installs)
    assert any("--no-deps ." in args for args in installs)  # the package, not the training pins
    assert not any(re.search(r"pip install[^&]*\b[\w-]+==", args) for args in installs)
    final = stage(dockerfile, "serve")
    copied = [args for kind, args in final if kind == "COPY"]
    assert "--from=build /opt/venv /opt/venv" in copied and "${POLICY} /policy" in copied
    assert (DOCKER / "inference").is_dir()  # the default POLICY: a placeholder to mount over
    users = [args for kind, args in final if kind == "USER"]
    assert users and users[-1].isdigit() and int(users[-1]) > 0
    health = next(args for kind, args in final if kind == "HEALTHCHECK")
    assert "/v1/health" in health
    assert ("ENTRYPOINT", '["rl_app", "serve"]') in final
    command = next(args for kind, args in final if kind == "CMD")
    assert "--token-file" in command and "0.0.0.0" in command  # all interfaces only with a token


def test_the_entry_point_exists_in_the_package() -> None:
    import tomllib

    script = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["rl_app"]
    module, _, function = script.partition(":")
    result = subprocess.run(
        [sys.executable, "-c", f"import {module}; assert callable({module}.{function})"], timeout=60
    )
    assert result.returncode == 0


def test_jupyter_target_exposes_notebook_and_tensorboard_ports() -> None:
    jupyter = stage(DOCKER / "Dockerfile", "jupyter")
    exposed = {port for kind, args in jupyter if kind == "EXPOSE" for port in args.split()}
    assert {"8888", "6006"} <= exposed
    assert any("requirements-notebook.txt" in args for kind, args in jupyter if kind == "RUN")
    assert all(str(r.specifier).startswith("==") for r in pins(REPO / "requirements-notebook.txt").values())


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def containers(pod_template: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod_template["spec"]["containers"])


def test_raycluster_manifest() -> None:
    (cluster,) = load_all(DOCKER / "k8s" / "raycluster.yaml")
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["kind"] == "RayCluster"
    spec = cluster["spec"]
    assert spec["rayVersion"] == RAY_VERSION
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    assert set(groups) == {"cpu", "gpu"}
    pods = [spec["headGroupSpec"]["template"], *(g["template"] for g in groups.values())]
    for pod in pods:
        for container in containers(pod):
            assert container["image"].split(":")[1].startswith(f"0.1.0-ray{RAY_VERSION}-"), container["image"]
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][kind])
            env = {e["name"]: e for e in container["env"]}
            assert env["RAY_AUTH_MODE"]["value"] == "token"
            assert "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"]
            assert any(m["mountPath"] == "/dev/shm" for m in container["volumeMounts"])
    gpu = containers(groups["gpu"]["template"])[0]
    assert gpu["image"].endswith("-cuda") and gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert groups["gpu"]["minReplicas"] == 0  # optional: scaled up only when asked for
    for group in groups.values():  # workers on spot/preemptible nodes
        pod = group["template"]["spec"]
        assert "cloud.google.com/gke-spot" in pod["nodeSelector"]
        assert any(t["key"] == "cloud.google.com/gke-spot" for t in pod["tolerations"])


def test_rayjob_manifest_trains_with_checkpoints_on_storage() -> None:
    (job,) = load_all(DOCKER / "k8s" / "rayjob.yaml")
    (cluster,) = load_all(DOCKER / "k8s" / "raycluster.yaml")
    assert job["kind"] == "RayJob"
    assert job["spec"]["clusterSelector"]["ray.io/cluster"] == cluster["metadata"]["name"]
    entrypoint = job["spec"]["entrypoint"].split()
    assert entrypoint[:3] == ["rl_app", "train", "ppo_cartpole"]
    assert (REPO / "experiments" / "ppo_cartpole.yaml").is_file()
    assert entrypoint[entrypoint.index("--storage") + 1].startswith("s3://")
    submitter = containers(job["spec"]["submitterPodTemplate"])[0]
    assert f"ray{RAY_VERSION}" in submitter["image"] and submitter["resources"]["limits"]


def test_compose_cluster_keeps_the_jobs_api_on_the_hosts_loopback() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"head", "worker"}
    assert services["head"]["ports"] == ["127.0.0.1:8265:8265"]
    assert "--address=head:6379" in services["worker"]["command"]
    for service in services.values():
        assert f"ray{RAY_VERSION}" in service["image"]
        assert service["environment"]["RAY_AUTH_MODE"] == "token"
        assert service["shm_size"]


@pytest.mark.parametrize("dockerfile", TRAINING_IMAGES, ids=lambda p: p.name)
def test_ssh_target_allows_keys_only_no_root_and_makes_host_keys_at_first_start(dockerfile: Path) -> None:
    ssh = stage(dockerfile, "ssh")
    copied = next(args for kind, args in ssh if kind == "COPY" and "sshd_config" in args)
    assert copied.split()[:2] == ["docker/sshd_config", "docker/ssh-entrypoint.sh"]
    settings = sshd_settings(DOCKER / "sshd_config")
    assert settings["passwordauthentication"] == "no" and settings["kbdinteractiveauthentication"] == "no"
    assert settings["permitemptypasswords"] == "no" and settings["pubkeyauthentication"] == "yes"
    assert settings["permitrootlogin"] == "no" and settings["allowusers"] == "rl"
    assert settings["authorizedkeysfile"] == "/home/rl/.ssh/authorized_keys"  # mounted at run time
    # No host key in the image: the package's are deleted, none is generated at build time ...
    runs = " ".join(args for kind, args in instructions(dockerfile) if kind == "RUN")
    assert "rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_*" in runs and "ssh-keygen" not in runs
    # ... the entry point makes the one sshd_config names, at the container's first start.
    entrypoint = (DOCKER / "ssh-entrypoint.sh").read_text()
    host_key = settings["hostkey"]
    folder, name = host_key.rsplit("/", 1)
    assert (
        f"keys={folder}" in entrypoint and f'ssh-keygen -q -t ed25519 -N "" -f "$keys/{name}"' in entrypoint
    )
    assert ("ENTRYPOINT", '["/opt/rl_app/docker/ssh-entrypoint.sh"]') in ssh and ("EXPOSE", "2222") in ssh
    assert (DOCKER / "ssh-entrypoint.sh").stat().st_mode & 0o111
    assert stage(dockerfile, None)[0][1].endswith(" AS runtime")  # plain `docker build` is still rl_app
