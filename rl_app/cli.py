"""Command line: parse arguments, dispatch to one capability, report user errors in one line.

Importing this module imports neither Ray nor torch, so ``rl_app --help`` is fast.
"""

from __future__ import annotations

import argparse
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

    train = commands.add_parser("train", help="train an experiment")
    train.add_argument("experiment", metavar="EXP", help="experiment name (see 'rl_app list')")
    _add_overrides(train)
    train.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)")
    train.add_argument(
        "--runs-dir", type=Path, default=Path("runs"), help="where run folders go (default: runs)"
    )
    train.add_argument("--verbose", action="store_true", help="show Ray's and RLlib's own logs")
    return parser


def _cmd_list(args: argparse.Namespace) -> int:
    from rl_app.commands import list_experiments

    list_experiments()
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from rl_app.commands import show_experiment

    show_experiment(args.experiment, args.overrides)
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from rl_app.train import train

    summary = train(
        args.experiment, args.overrides, address=args.address, runs_root=args.runs_dir, verbose=args.verbose
    )
    return EXIT_INTERRUPTED if summary.status == "interrupted" else 0


COMMANDS = {"list": _cmd_list, "show": _cmd_show, "train": _cmd_train}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UserError as exc:
        print(f"rl_app: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("rl_app: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
