"""User-facing errors: the CLI prints them as one line and exits with code 2."""

from __future__ import annotations


class UserError(Exception):
    """An error caused by the user's input, reported without a traceback."""

    exit_code = 2


class ConfigError(UserError):
    """A problem with an experiment file or override, naming where it is."""

    def __init__(self, source: str, message: str, key: str | None = None) -> None:
        self.source = source
        self.key = key
        self.message = message
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {message}")


class EnvFailedError(UserError):
    """An environment that kept failing in ``step()`` or ``reset()``: the run stops, with its error."""

    exit_code = 1


class EnvRunnersLostError(UserError):
    """Remote env runners crashed more often than the experiment allows: the run stops."""

    exit_code = 1


def first_line(exc: BaseException, default: str | None = None) -> str:
    """The first line of an exception's message (libraries' messages run to many lines).

    An empty message gives ``default``, or the exception's class name when none is given.
    """
    text = str(exc).strip()
    if text:
        return text.splitlines()[0]
    return type(exc).__name__ if default is None else default


def error_detail(exc: BaseException) -> str:
    """A library failure for a one-line error: its first line, at most 300 characters."""
    return first_line(exc, default="no details")[:300]
