"""Command line: parse arguments, dispatch to one capability, report user errors in one line.

Importing this module imports neither Ray nor torch, so ``rl_app --help`` is fast.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from rl_app import __version__
from rl_app.errors import UserError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line on stderr with exit code 2, like every other user error."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="overrides",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one setting, validated like the YAML (repeatable), e.g. --set training.lr=3e-4",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rl_app", description="Train named RLlib experiments from experiments/*.yaml.")
    parser.add_argument("--version", action="version", version=f"rl_app {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    commands.add_parser("list", help="list the shipped experiments")

    show = commands.add_parser("show", help="print an experiment's fully resolved config")
    show.add_argument("experiment", metavar="EXP", help="experiment name (see 'rl_app list')")
    _add_overrides(show)

    train = commands.add_parser("train", help="train an experiment, or resume a run")
    train.add_argument(
        "experiment",
        metavar="EXP",
        nargs="?",
        help="experiment name (see 'rl_app list') or .yaml file; optional with --resume",
    )
    _add_overrides(train)
    train.add_argument("--resume", metavar="RUN", help="continue run RUN (folder or storage URI)")
    train.add_argument(
        "--force-config", action="store_true", help="resume even if the config differs from the run's"
    )
    train.add_argument("--init-from", metavar="CHECKPOINT", help="start from another run's policy weights")
    _add_version_mismatch(train)
    train.add_argument("--storage", metavar="URI", help="mirror the run folder here (path, s3://, gs://)")
    train.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)")
    _add_cluster_token(train)
    _add_runs_dir(train)
    _add_tracking(train)
    train.add_argument("--verbose", action="store_true", help="show Ray's and RLlib's own logs")

    sweep = commands.add_parser("sweep", help="Ray Tune sweep over an experiment's sweep: section")
    sweep.add_argument(
        "experiment", metavar="EXP", nargs="?", help="experiment name or .yaml file; optional with --resume"
    )
    _add_overrides(sweep)
    sweep.add_argument("--samples", type=_positive_int, help="trials to sample (sets sweep.num_samples)")
    sweep.add_argument(
        "--resume", metavar="SWEEP", help="continue the sweep in folder (or storage URI) SWEEP"
    )
    sweep.add_argument("--storage", metavar="URI", help="trials and checkpoints go here (path, s3://, gs://)")
    sweep.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)")
    _add_cluster_token(sweep)
    _add_runs_dir(sweep)
    _add_tracking(sweep)
    sweep.add_argument("--verbose", action="store_true", help="show Ray's, Tune's and RLlib's own logs")

    cluster = commands.add_parser(
        "cluster", help="Ray nodes on this machine: up/down a head, join/leave as a worker (token auth)"
    )
    cluster.add_argument("action", choices=("up", "down", "join", "leave"))
    cluster.add_argument("head", nargs="?", metavar="HEAD", help="join: the head's GCS address, HOST:PORT")
    cluster.add_argument("--port", type=_port, default=6380, help="up: GCS port (default 6380)")
    cluster.add_argument("--dashboard-port", type=_port, default=8265, help="up: Jobs API (default 8265)")
    cluster.add_argument("--num-cpus", type=_non_negative_int, help="CPUs the node offers (default: all)")
    cluster.add_argument(
        "--num-gpus", type=_non_negative_int, help="join: GPUs the node offers (default: all)"
    )
    cluster.add_argument("--resources", type=_resources, help='join: custom resources as JSON, {"name": 1}')
    cluster.add_argument("--token-file", help="join: the cluster's token (default: $RAY_AUTH_TOKEN, or up's)")
    cluster.add_argument(
        "--bind",
        help="the node's address (up: default 127.0.0.1, loopback only, no workers; any other address "
        "takes workers and exposes Ray's ports there; join: default Ray's choice; leave: that node only)",
    )

    submit = commands.add_parser("submit", help="run training (or --sweep) on a Ray cluster as a Ray Job")
    submit.add_argument("experiment", metavar="EXP", help="experiment name or .yaml file")
    _add_overrides(submit)
    submit.add_argument("--sweep", action="store_true", help="submit 'rl_app sweep EXP' instead of train")
    submit.add_argument("--no-wait", action="store_true", help="return after submitting (no log streaming)")
    submit.add_argument("--storage", metavar="URI", help="where the job writes its run folder (s3://, ...)")
    submit.add_argument("--runs-dir", help="run folders on the cluster (default: ./runs, absolute)")
    _add_job_target(submit)

    jobs = commands.add_parser("jobs", help="list, inspect, follow or stop Ray Jobs")
    jobs.add_argument("action", choices=("list", "status", "logs", "stop"))
    jobs.add_argument("job_id", metavar="JOB_ID", nargs="?", help="the job (not for list)")
    jobs.add_argument("--follow", action="store_true", help="logs: keep streaming until the job ends")
    jobs.add_argument("--json", action="store_true", help="list: print the jobs as JSON (for scripts)")
    _add_job_target(jobs)

    record = commands.add_parser(
        "record", help="play a trained (or random) policy and write its episodes for offline learning"
    )
    record.add_argument("run", metavar="RUN", help="run folder, checkpoint or storage URI of a run")
    record.add_argument("--out", type=Path, required=True, help="new folder for the Parquet rows")
    record.add_argument("--episodes", type=_positive_int, default=100)
    record.add_argument(
        "--epsilon", type=_fraction, default=0.0, help="probability of a random action instead (default 0)"
    )
    record.add_argument("--random", action="store_true", help="random actions only (RUN names the env)")
    record.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    _add_runs_dir(record)

    track = commands.add_parser("track", help="log a run folder to MLflow (what the server lacks)")
    track.add_argument("run", metavar="RUN", help="run folder")
    track.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="MLflow server (default: the run's, else $MLFLOW_TRACKING_URI, else ./mlruns)",
    )

    runs = commands.add_parser("runs", help="list runs: experiment, env, status, best return, checkpoint")
    _add_runs_dir(runs)
    runs.add_argument("--json", action="store_true", help="print the runs as JSON (for scripts)")

    report = commands.add_parser("report", help="reward-curve PNGs of runs, and a comparison of several")
    report.add_argument("runs", metavar="RUN", nargs="+", help="run folders")
    report.add_argument(
        "--out", type=Path, help="comparison PNG (default: RUNS_FOLDER/reports/<timestamp>/comparison.png)"
    )

    evaluate = commands.add_parser("evaluate", help="run a trained policy deterministically")
    evaluate.add_argument("run", metavar="RUN", help="run folder, checkpoint or storage URI of a run")
    evaluate.add_argument("--episodes", type=_positive_int, default=10)
    evaluate.add_argument("--workers", type=_positive_int, default=1, help="parallel Ray workers")
    evaluate.add_argument("--video", action="store_true", help="record mp4s of the first episodes")
    evaluate.add_argument(
        "--video-episodes",
        type=_positive_int,
        default=3,
        metavar="N",
        help="with --video: how many episodes to record (default 3)",
    )
    evaluate.add_argument("--explore", action="store_true", help="sample actions instead of greedy")
    evaluate.add_argument("--seed", type=int, default=1000, help="seed of the first episode")
    evaluate.add_argument(
        "--random-policy",
        action="append",
        default=[],
        metavar="POLICY",
        help="several agents: POLICY's agents act at random (repeatable): a learner against a random player",
    )
    evaluate.add_argument("--verbose", action="store_true", help="show Ray's, RLlib's and torch's own logs")
    _add_version_mismatch(evaluate)
    _add_runs_dir(evaluate)

    export = commands.add_parser("export", help="write the policy as TorchScript or ONNX")
    export.add_argument("run", metavar="RUN", help="run folder, checkpoint or storage URI of a run")
    export.add_argument("--format", choices=("torchscript", "onnx"), default="torchscript")
    export.add_argument("--out", type=Path, help="output folder (default: RUN/export)")
    export.add_argument("--verbose", action="store_true", help="show RLlib's and torch's own logs")
    _add_version_mismatch(export)
    _add_runs_dir(export)

    serve = commands.add_parser("serve", help="answer HTTP requests with a trained policy's actions")
    serve.add_argument(
        "policy", metavar="POLICY", help="export folder (policy.json), or a run folder, checkpoint or URI"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument(
        "--port", type=_port_or_zero, default=8000, help="port (default 8000; 0 picks a free one)"
    )
    serve.add_argument("--token-file", type=Path, help="API token clients send as a bearer token")
    serve.add_argument(
        "--format", choices=("onnx", "torchscript"), help="which export to load (default onnx)"
    )
    serve.add_argument(
        "--max-batch-size", type=_positive_int, default=256, help="rows per model call and per request"
    )
    serve.add_argument(
        "--max-wait-ms", type=_non_negative_float, default=0.0, help="hold a batch this long to fill it"
    )
    serve.add_argument("--max-body-bytes", type=_positive_int, default=4 * 1024 * 1024)
    serve.add_argument(
        "--read-timeout",
        type=_positive_float,
        help="seconds a request's headers and body may take to arrive (default 10; then 408)",
    )
    serve.add_argument(
        "--keep-alive-timeout",
        type=_positive_int,
        help="seconds an idle connection stays open between requests (default 30)",
    )
    serve.add_argument(
        "--max-connections",
        type=_positive_int,
        help="connections at once; past it 503 (default: the open-file limit less a reserve)",
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=_non_negative_float,
        help="on SIGTERM, seconds requests being computed may take to finish (default 5)",
    )
    serve.add_argument(
        "--ray-serve", action="store_true", help="deploy on Ray Serve (local Ray or RAY_ADDRESS)"
    )
    serve.add_argument("--replicas", type=_positive_int, default=1, help="with --ray-serve: replicas")
    serve.add_argument(
        "--max-replicas", type=_positive_int, help="with --ray-serve: autoscale from --replicas up to this"
    )
    serve.add_argument(
        "--max-ongoing-requests", type=_positive_int, default=256, help="with --ray-serve: per replica"
    )
    serve.add_argument("--address", help="with --ray-serve: a Ray cluster (default: $RAY_ADDRESS or local)")
    _add_version_mismatch(serve)
    _add_runs_dir(serve)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {text!r})") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {text!r})")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0 (got {text!r})")
    return value


def _resources(text: str) -> dict[str, float]:
    import json

    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
        for k, v in value.items()
    ):
        raise argparse.ArgumentTypeError(f"expected a JSON object of names to amounts >= 0, got {text!r}")
    return {k: float(v) for k, v in value.items()}


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1 (got {text!r})")
    return value


def _port(text: str, lowest: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not lowest <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number, {lowest} to 65535 (got {text!r})")
    return value


def _port_or_zero(text: str) -> int:
    return _port(text, lowest=0)


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _add_cluster_token(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--token-file",
        help="with --address: the cluster's auth token (default: $RAY_AUTH_TOKEN, or cluster up's)",
    )


def _add_version_mismatch(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-version-mismatch",
        action="store_true",
        help="load a checkpoint written with another Ray version anyway (RLlib may fail to restore it)",
    )


def _add_job_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address", help="the cluster's dashboard, http://HOST:8265 (default: the one 'cluster up' started)"
    )
    parser.add_argument(
        "--token-file", help="the cluster's auth token (default: $RAY_AUTH_TOKEN, or cluster up's)"
    )


def _add_tracking(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--track", action="store_true", help="log to MLflow (as tracking.mlflow: true)")
    parser.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="MLflow server, http://HOST:PORT (default: $MLFLOW_TRACKING_URI, else ./mlruns next to runs/)",
    )


def _add_runs_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runs-dir", type=Path, default=Path("runs"), help="where run folders go (default: runs)"
    )


def _cmd_list(args: argparse.Namespace) -> int:
    from rl_app.console.commands import list_experiments

    list_experiments()
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from rl_app.console.commands import show_experiment

    show_experiment(args.experiment, args.overrides)
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from rl_app.training.run import train

    summary = train(
        args.experiment,
        args.overrides,
        resume=args.resume,
        force_config=args.force_config,
        allow_version_mismatch=args.allow_version_mismatch,
        init_from=args.init_from,
        storage=args.storage,
        address=args.address,
        token_file=args.token_file,
        runs_root=args.runs_dir,
        track=args.track,
        tracking_uri=args.tracking_uri,
        verbose=args.verbose,
    )
    return EXIT_INTERRUPTED if summary.status == "interrupted" else 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from rl_app.sweep.run import run_sweep

    overrides = [*args.overrides, *([f"sweep.num_samples={args.samples}"] if args.samples else [])]
    summary = run_sweep(
        args.experiment,
        overrides,
        resume=args.resume,
        storage=args.storage,
        address=args.address,
        token_file=args.token_file,
        runs_root=args.runs_dir,
        track=args.track,
        tracking_uri=args.tracking_uri,
        verbose=args.verbose,
    )
    return EXIT_INTERRUPTED if summary.status == "interrupted" else 0


def _cmd_cluster(args: argparse.Namespace) -> int:
    from rl_app.cluster import nodes

    if args.head is not None and args.action != "join":
        raise UserError(f"cluster {args.action} takes no head address (only join does)")
    if args.action == "up":
        state = nodes.cluster_up(
            port=args.port,
            dashboard_port=args.dashboard_port,
            num_cpus=args.num_cpus,
            bind=args.bind or nodes.LOOPBACK,
        )
        print(f"Ray head node up: jobs at {state.address}, ray.init(address='{state.gcs_address}')")
        print(f"Token auth on; token in {state.token_file} (mode 0600). Stop it with: rl_app cluster down")
        if state.node_ip == nodes.LOOPBACK:
            print("Loopback only: no worker node can join (rl_app cluster up --bind ADDR takes them)")
        else:
            print(
                f"Workers join with: rl_app cluster join {state.gcs_address} --token-file {state.token_file}"
            )
        print(f"Listening:\n{nodes.describe_listeners(state)}")
    elif args.action == "join":
        if args.head is None:
            raise UserError("cluster join needs the head's GCS address: rl_app cluster join HOST:PORT")
        state = nodes.cluster_join(
            args.head,
            bind=args.bind,
            num_cpus=args.num_cpus,
            num_gpus=args.num_gpus,
            resources=args.resources,
            token_file=args.token_file,
        )
        print(f"Worker node {state.node_ip} joined the cluster at {state.gcs_address}")
        print(f"Listening:\n{nodes.describe_listeners(state)}")
        print(f"Stop it with: rl_app cluster leave --bind {state.node_ip} (or cluster down)")
    elif args.action == "leave":
        stopped = nodes.cluster_leave(bind=args.bind)
        print(f"Stopped the {stopped} processes of the worker node(s) joined from here")
    else:
        print(f"Stopped the {nodes.cluster_down()} processes of the local cluster")
    return 0


def _cmd_submit(args: argparse.Namespace) -> int:
    from rl_app.cluster.jobs import submit

    _, status = submit(
        args.experiment,
        args.overrides,
        sweep=args.sweep,
        address=args.address,
        token_file=args.token_file,
        runs_dir=args.runs_dir,
        storage=args.storage,
        wait=not args.no_wait,
    )
    return 1 if status in ("FAILED", "STOPPED") else 0


def _cmd_jobs(args: argparse.Namespace) -> int:
    from rl_app.cluster import jobs

    if args.action == "list":
        jobs.list_jobs(args.address, args.token_file, as_json=args.json)
        return 0
    if not args.job_id:
        raise UserError(f"jobs {args.action} needs a JOB_ID (see rl_app jobs list)")
    if args.action == "status":
        jobs.job_status(args.job_id, args.address, args.token_file)
    elif args.action == "logs":
        jobs.job_logs(args.job_id, args.address, args.token_file, follow_logs=args.follow)
    else:
        jobs.stop_job(args.job_id, args.address, args.token_file)
    return 0


def _cmd_record(args: argparse.Namespace) -> int:
    from rl_app.policy.record import record

    record(
        args.run,
        args.out,
        episodes=args.episodes,
        epsilon=args.epsilon,
        random_policy=args.random,
        seed=args.seed,
        runs_root=args.runs_dir,
    )
    return 0


def _cmd_track(args: argparse.Namespace) -> int:
    from rl_app.tracking.run import track_run

    return track_run(Path(args.run), args.tracking_uri)


def _cmd_runs(args: argparse.Namespace) -> int:
    from rl_app.console.commands import list_runs

    list_runs(args.runs_dir, as_json=args.json)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from rl_app.console.plots import report_runs

    report_runs([Path(r) for r in args.runs], args.out)
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from rl_app.policy.evaluate import evaluate

    evaluate(
        args.run,
        episodes=args.episodes,
        workers=args.workers,
        video=args.video,
        video_episodes=args.video_episodes,
        explore=args.explore,
        seed=args.seed,
        runs_root=args.runs_dir,
        verbose=args.verbose,
        allow_version_mismatch=args.allow_version_mismatch,
        random_policies=tuple(args.random_policy),
    )
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from rl_app.policy.export import export_policy

    export_policy(
        args.run,
        args.format,
        args.out,
        runs_root=args.runs_dir,
        verbose=args.verbose,
        allow_version_mismatch=args.allow_version_mismatch,
    )
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from rl_app.serve.app import ServeSettings

    settings = ServeSettings(
        max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms, max_body_bytes=args.max_body_bytes
    )
    common = {
        "host": args.host,
        "port": args.port,
        "token_file": args.token_file,
        "fmt": args.format,
        "settings": settings,
        "runs_root": args.runs_dir,
        "allow_version_mismatch": args.allow_version_mismatch,
    }
    connection_settings = {
        "read_timeout_s": args.read_timeout,
        "keep_alive_timeout_s": args.keep_alive_timeout,
        "shutdown_timeout_s": args.shutdown_timeout,
        "max_connections": args.max_connections,
    }
    given = {key: value for key, value in connection_settings.items() if value is not None}
    if args.ray_serve:
        if given:
            flag = "--" + next(iter(given)).removesuffix("_s").replace("_", "-")
            raise UserError(f"{flag} is the lightweight server's; Ray Serve keeps its own (drop --ray-serve)")
        from rl_app.serve.ray_serve import serve_on_ray

        scale = {"replicas": args.replicas, "max_replicas": args.max_replicas}
        serve_on_ray(
            args.policy,
            **common,
            **scale,
            max_ongoing_requests=args.max_ongoing_requests,
            address=args.address,
        )
    else:
        from rl_app.serve.connections import ConnectionLimits
        from rl_app.serve.server import serve

        report = serve(args.policy, **common, limits=ConnectionLimits(**given))
        return 1 if report is not None and report.cut else 0
    return 0


COMMANDS = {
    "list": _cmd_list,
    "show": _cmd_show,
    "train": _cmd_train,
    "sweep": _cmd_sweep,
    "cluster": _cmd_cluster,
    "submit": _cmd_submit,
    "jobs": _cmd_jobs,
    "runs": _cmd_runs,
    "track": _cmd_track,
    "record": _cmd_record,
    "report": _cmd_report,
    "evaluate": _cmd_evaluate,
    "export": _cmd_export,
    "serve": _cmd_serve,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UserError as exc:
        print(f"rl_app: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        print(f"rl_app: interrupted{f' ({exc})' if str(exc) else ''}", file=sys.stderr)
        return EXIT_INTERRUPTED


_exit_code: int | None = None


@atexit.register  # registered as this module loads, before torch or Ray: it runs after their handlers
def _end_without_teardown() -> None:
    """After every other exit handler: end the process without the interpreter's teardown, which
    frees the objects torch, Ray and RLlib made one by one."""
    if _exit_code is None:  # not the command (a test or a notebook importing this module)
        return
    logging.shutdown()  # its own exit handler may be older than this one, so never reached
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing to add
            stream.flush()
    os._exit(_exit_code)


def run() -> None:
    """The ``rl_app`` command."""
    global _exit_code
    code = main()
    # Python's last garbage collection at exit walks every object torch, Ray and RLlib
    # created (~0.5-1 s after a training run); frozen objects are skipped.
    gc.freeze()
    _exit_code = code
    raise SystemExit(code)
