"""Run folders on S3 through pyarrow.fs, against a real S3-compatible server on 127.0.0.1 (moto)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import SMALL_PPO, local_ray

from rl_app.errors import UserError
from rl_app.runs.storage import StorageError, list_dirs, open_storage
from rl_app.training.run import train

REPO = Path(__file__).resolve().parents[1]
BUCKET = "rl-app-test"


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    """moto in server mode on loopback, with IAM authentication on: wrong keys are refused."""
    import boto3
    from moto import settings as moto_settings
    from moto.core.responses import ActionAuthenticatorMixin
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        # Authenticate every request after the first few, which create the user and its key.
        # (The server runs in this process, so its settings are set directly.)
        moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = 3
        ActionAuthenticatorMixin.request_count = 0
        admin = {"endpoint_url": endpoint, "region_name": "us-east-1"}
        admin_keys = {"aws_access_key_id": "admin", "aws_secret_access_key": "admin"}
        iam = boto3.client("iam", **admin, **admin_keys)
        iam.create_user(UserName="trainer")
        iam.put_user_policy(
            UserName="trainer",
            PolicyName="all",
            PolicyDocument='{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}',
        )
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        credentials = {
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
        }
        boto3.client(
            "s3",
            **admin,
            aws_access_key_id=credentials["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"],
        ).create_bucket(Bucket=BUCKET)
        yield credentials
    finally:
        server.stop()
        moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = float("inf")


@pytest.fixture(scope="module")
def ray_session(s3: dict[str, str]) -> Iterator[None]:
    """A small Ray whose workers hold the S3 keys (sweep trials upload their own checkpoints)."""
    with local_ray(s3):
        yield


@pytest.fixture
def aws(s3: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in s3.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RL_APP_EXPERIMENTS_DIR", str(REPO / "experiments"))
    return s3


@pytest.mark.ray
def test_train_to_s3_then_resume_on_an_empty_disk(
    aws: dict[str, str], ray_session: None, tmp_path: Path
) -> None:
    uri = f"s3://{BUCKET}/team/runs"
    first = train(
        "ppo_cartpole",
        [*SMALL_PPO, "stop.iterations=2", "checkpoint.every=1"],
        storage=uri,
        runs_root=tmp_path / "laptop",
    )
    storage = open_storage(uri)
    assert list_dirs(storage, "ppo_cartpole") == [first.run_dir.name]
    assert list_dirs(storage, "ppo_cartpole", first.run_dir.name, "checkpoints") == [
        "iter_000001",
        "iter_000002",
    ]
    shutil.rmtree(tmp_path / "laptop")  # the machine is gone

    run_uri = f"{uri}/ppo_cartpole/{first.run_dir.name}"
    resumed = train(None, ["stop.iterations=3"], resume=run_uri, runs_root=tmp_path / "other")
    assert resumed.status == "finished" and resumed.iterations == 3
    assert resumed.run_dir == tmp_path / "other" / "ppo_cartpole" / first.run_dir.name
    remote = list_dirs(storage, "ppo_cartpole", first.run_dir.name, "checkpoints")
    assert "iter_000003" in remote

    from rl_app.policy.evaluate import evaluate

    report = evaluate(run_uri, episodes=2, runs_root=tmp_path / "third")
    assert report["iteration"] == 3


@pytest.mark.ray
def test_sweep_to_s3_then_resume_it_from_the_uri_on_an_empty_disk(
    aws: dict[str, str], ray_session: None, tmp_path: Path
) -> None:
    from rl_app.sweep.run import run_sweep

    uri = f"s3://{BUCKET}/team/sweeps"
    overrides = [*SMALL_PPO, "sweep.num_samples=2", "sweep.stop={timesteps: 800}", "checkpoint.every=1"]
    summary = run_sweep("ppo_cartpole", overrides, storage=uri, runs_root=tmp_path / "laptop")
    assert [r.status for r in summary.trials] == ["finished", "finished"]
    stamp = summary.sweep_dir.name
    storage = open_storage(uri)
    assert sorted(list_dirs(storage, "ppo_cartpole", stamp)) == sorted(
        f"trial_{r.trial}" for r in summary.trials
    )
    for row in summary.trials:  # checkpoints were uploaded by the trial actors themselves
        assert row.checkpoint.startswith(f"{uri}/ppo_cartpole/{stamp}/trial_{row.trial}/checkpoint_")
        checkpoint = row.checkpoint.removeprefix(f"{uri}/")
        assert storage.fs.get_file_info(f"{storage.root}/{checkpoint}/rl_app_checkpoint.json").size > 0
    for report in ("results.csv", "curves.png", "ppo_cartpole_best.yaml", "sweep.json"):
        assert storage.fs.get_file_info(storage.path("ppo_cartpole", stamp, report)).size > 0
    shutil.rmtree(tmp_path / "laptop")  # the machine is gone

    again = run_sweep(None, resume=f"{uri}/ppo_cartpole/{stamp}", runs_root=tmp_path / "other")
    assert again.status == "finished"
    assert [(r.trial, r.iterations) for r in again.trials] == [
        (r.trial, r.iterations) for r in summary.trials
    ]
    assert (tmp_path / "other" / "ppo_cartpole" / stamp / "results.csv").is_file()


def test_wrong_credentials_are_refused(aws: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(StorageError, match="credentials refused"):
        open_storage(f"s3://{BUCKET}/runs")


def test_missing_bucket_is_refused(aws: dict[str, str]) -> None:
    with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist"):
        open_storage("s3://no-such-bucket/runs")


def test_unreachable_endpoint_fails_fast(aws: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(StorageError, match="unreachable"):
        open_storage(f"s3://{BUCKET}/runs")


def test_unknown_scheme_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RL_APP_EXPERIMENTS_DIR", str(REPO / "experiments"))
    with pytest.raises(UserError, match=r"unknown scheme 'ftp://' \(allowed: a local path"):
        train("ppo_cartpole", ["stop.iterations=1"], storage="ftp://host/runs", runs_root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_local_storage_path_mirrors_the_run(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "mirror"))
    assert storage.is_local and storage.root == str((tmp_path / "mirror").resolve())


@pytest.mark.ray
def test_storage_outage_mid_run_training_goes_on_and_the_copy_catches_up(
    aws: dict[str, str], ray_session: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The S3 endpoint goes away after two checkpoints and comes back three checkpoints later."""
    import io

    from moto.server import ThreadedMotoServer
    from rich.console import Console

    from rl_app.cluster.nodes import free_port
    from rl_app.runs.checkpoints import list_checkpoints
    from rl_app.runs.remote import RunMirror

    port = free_port()
    servers = [ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)]
    servers[0].start()  # the same in-process S3 (bucket, keys) on an endpoint this test can stop
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    real_sync = RunMirror.sync
    syncs: list[bool] = []

    def sync_through_an_outage(self: RunMirror, *names: str, **kwargs: object) -> bool:
        if len(syncs) == 2:  # before the 3rd checkpoint's upload: the endpoint goes away
            servers[-1].stop()
        if len(syncs) == 5:  # before the 6th: it is back
            servers.append(ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False))
            servers[-1].start()
        syncs.append(real_sync(self, *names, **kwargs))  # type: ignore[arg-type]
        return syncs[-1]

    monkeypatch.setattr(RunMirror, "sync", sync_through_an_outage)
    output = io.StringIO()
    overrides = [*SMALL_PPO, "stop.iterations=8", "checkpoint.every=1", "checkpoint.keep=2"]
    uri = f"s3://{BUCKET}/outage"
    try:
        summary = train(
            "ppo_cartpole",
            overrides,
            storage=uri,
            runs_root=tmp_path / "laptop",
            console=Console(file=output, width=300),
        )
    finally:
        servers[-1].stop()
    printed = output.getvalue()
    assert summary.status == "finished" and summary.iterations == 8, printed
    assert syncs == [True, True, False, False, False, True, True, True, True], syncs  # 8 checkpoints + end
    assert printed.count("training goes on locally") == 1, printed
    assert "caught up after 3 failed syncs" in printed, printed
    local = [p.name for p in list_checkpoints(summary.run_dir)]
    assert local[-1] == "iter_000008"
    # The copy holds exactly what is kept locally: missed uploads made, missed prunes applied.
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws["AWS_ENDPOINT_URL"])
    assert list_dirs(open_storage(uri), "ppo_cartpole", summary.run_dir.name, "checkpoints") == local
