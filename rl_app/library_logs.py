"""Ray's, RLlib's, Tune's and torch's own messages: out of our output, into the run's ``rl_app.log``.

They print deprecation notices and banners on every start that are not for our users.
Without ``--verbose`` their warnings go to a log file in the run (or sweep, or evaluation)
folder once it exists, errors still reach stderr, and Python warnings go with them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import warnings
from collections import deque
from collections.abc import Iterator
from pathlib import Path

LOG_FILE = "rl_app.log"
# Loggers that Ray and torch give console handlers of their own (children of these that
# have handlers are found at capture time); "py.warnings" carries Python's warnings, "mujoco"
# MuJoCo's (rl_app.envs.factory routes them there).
LIBRARY_LOGGERS = ("ray", "torch", "py.warnings", "mujoco")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# A line of Ray's C++ log ("[2026-12-06 20:21:47,583 E 1913 1913] core_worker.cc:2465: ...").
NATIVE_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [DIWEF] \d+ \d+\] ")
# The one such line kept off the console (see native_lines_to_log).
KNOWN_NATIVE_NOISE = "has constructor arguments in the object store"


class _LibraryHandler(logging.Handler):
    """Holds the latest records until a log file is set, then writes each one there."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.pending: deque[logging.LogRecord] = deque(maxlen=1000)
        self.file: logging.FileHandler | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.file is None:
            self.pending.append(record)
        else:
            self.file.emit(record)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is now, not the one there when this module was imported."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


_HANDLER = _LibraryHandler()
_capturing = False  # capture_library_logs() was called: not --verbose
_ERRORS = _StderrHandler()
_ERRORS.setLevel(logging.ERROR)
_ERRORS.setFormatter(logging.Formatter("%(name)s: %(message)s"))


def capture_library_logs() -> None:
    """Route the libraries' loggers to the log file (errors also to stderr). Call it again after
    importing Ray or RLlib: each adds a console handler of its own when first imported."""
    global _capturing
    _capturing = True
    logging.captureWarnings(True)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", module="gymnasium")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's own trial tables; rl_app prints its own
    known = logging.root.manager.loggerDict
    names = {
        *LIBRARY_LOGGERS,
        *(
            name
            for name, logger in known.items()
            if name.startswith(tuple(f"{root}." for root in LIBRARY_LOGGERS))
            and isinstance(logger, logging.Logger)
            and logger.handlers
        ),
    }
    for name in names:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if handler not in (_HANDLER, _ERRORS):
                logger.removeHandler(handler)
        if name in LIBRARY_LOGGERS:
            for handler in (_HANDLER, _ERRORS):
                if handler not in logger.handlers:
                    logger.addHandler(handler)
            logger.propagate = False
            logger.setLevel(logging.WARNING)
        else:  # e.g. RLlib's logger: its records go on to Ray's, and so to ours
            logger.propagate = True


@contextlib.contextmanager
def native_lines_to_log() -> Iterator[None]:
    """While the block runs, Ray's C++ line about actor arguments in the object store goes to the
    library log; everything else written to this process's stderr passes through as it comes.

    RLlib passes every remote env runner its config as an object-store reference and asks for
    restarts, which the core worker reports as an error line per runner made (Ray issue 53727:
    a restart would fail once that object is lost; the driver holds it for the algorithm's life).
    Without :func:`capture_library_logs` (``--verbose``) nothing is redirected."""
    if not _capturing:
        yield
        return
    with contextlib.suppress(ValueError, OSError):
        sys.stderr.flush()
    console = os.dup(2)
    reading, writing = os.pipe()
    os.dup2(writing, 2)
    os.close(writing)
    native = logging.getLogger("ray.core_worker")

    def sort_lines() -> None:
        with os.fdopen(reading, "rb") as lines:
            for line in lines:
                text = line.decode(errors="replace").rstrip("\n")
                if NATIVE_LINE.match(text) and KNOWN_NATIVE_NOISE in text:
                    native.warning(text)
                else:
                    os.write(console, line)

    sorter = threading.Thread(target=sort_lines, name="rl_app-native-stderr", daemon=True)
    sorter.start()
    try:
        yield
    finally:
        with contextlib.suppress(ValueError, OSError):
            sys.stderr.flush()
        os.dup2(console, 2)  # the pipe's last writer closed: the sorter reads to its end
        sorter.join(timeout=5)
        if not sorter.is_alive():  # else a child kept the pipe open: the sorter still writes there
            os.close(console)


def capture_rllib_logs() -> None:
    """:func:`capture_library_logs` for commands that load a policy without starting Ray:
    import RLlib first (it adds a console handler when imported), then capture."""
    import rl_app.rllib.algorithm  # noqa: F401

    capture_library_logs()


def write_library_logs(folder: Path) -> Path:
    """From now on (and what was held so far) the libraries' messages go to ``folder/rl_app.log``."""
    path = folder / LOG_FILE
    if _HANDLER.file is None or Path(_HANDLER.file.baseFilename) != path.resolve():
        file = logging.FileHandler(path, delay=True)
        file.setFormatter(logging.Formatter(FORMAT))
        previous, _HANDLER.file = _HANDLER.file, file
        if previous is not None:
            previous.close()
    while _HANDLER.pending:
        _HANDLER.file.emit(_HANDLER.pending.popleft())
    return path


def library_log_note(folder: Path) -> str | None:
    """Where the libraries' messages of this command went, when there were any."""
    path = folder / LOG_FILE
    if _HANDLER.file is not None:
        _HANDLER.file.flush()
    if path.is_file() and path.stat().st_size > 0:
        return f"Ray's and RLlib's own messages: {path} (--verbose shows them here)"
    return None
