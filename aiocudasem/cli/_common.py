"""What the commands share: the help layout, the exit statuses, the choice of driver and the
errors the command line reports in its own words."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import DRIVER_ENV, Driver, DriverUnavailableError, get_driver

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

#: The command worked.
EXIT_OK = 0
#: The command failed (for example, the GPU it was asked to use cannot be used).
EXIT_FAILED = 1
#: Bad command line or environment: an unknown option or value, or an invalid $AIOCUDASEM_DRIVER.
EXIT_USAGE = 2
#: The output pipe was closed before the command finished (``aiocudasem doctor | head -1``):
#: the command stops quietly with the status a shell reports for a program killed by SIGPIPE.
EXIT_CLOSED_PIPE = 141

DRIVERS = ("cuda", "sim")

#: The package that each event loop of ``--backend`` needs beyond anyio.
_LOOP_PACKAGES = {"trio": "trio", "asyncio+uvloop": "uvloop"}


def missing_loop(backend: str) -> str | None:
    """Why the event loop ``backend`` (``asyncio``, ``asyncio+uvloop`` or ``trio``) cannot run
    here, in the command line's words, or None if it can."""
    package = _LOOP_PACKAGES.get(backend)
    if package is None or importlib.util.find_spec(package) is not None:
        return None
    return (
        f"the {backend} event loop needs {package}, which is not installed: pip install {package}"
    )


def exit_statuses(
    failure: str = "failure (for example, the GPU asked for cannot be used)",
    usage: str = f"bad command line, or ${DRIVER_ENV} neither cuda nor sim",
) -> str:
    """The help's list of exit statuses, to fit 80 columns; ``failure`` and ``usage`` say what
    1 and 2 mean for a command."""
    return f"""\
exit status:
  {EXIT_OK}    success
  {EXIT_FAILED}    {failure}
  {EXIT_USAGE}    {usage}
  {EXIT_CLOSED_PIPE}  the output pipe was closed early (as by | head); it stops quietly"""


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, except that a failed write of its help, usage or error message raises
    (argparse ignores it) so that a closed output pipe ends ``--help`` with the same exit
    status as any other command."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        if message:
            (file or sys.stderr).write(message)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows each option's default, except where there is none to show (``None``, ``""``,
    flags), and keeps the line breaks of descriptions and epilogs (write them wrapped)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default == "" or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


class CommandError(Exception):
    """A failure the command line reports in one line, without a traceback, and exits with
    ``status``."""

    def __init__(self, message: str, status: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.status = status


def driver_choice(flag: str | None) -> tuple[str | None, str | None]:
    """The driver the user chose and how, as ``(name, source)``: ``--driver`` first, then a
    non-empty ``$AIOCUDASEM_DRIVER``; ``(None, None)`` if neither. Raises :class:`CommandError`
    (status 2) if the variable names no driver."""
    if flag is not None:
        return flag, f"--driver {flag}"
    raw = os.environ.get(DRIVER_ENV, "")
    value = raw.strip()
    if not value:
        return None, None
    if value not in DRIVERS:
        raise CommandError(bad_env_message(raw), EXIT_USAGE)
    return value, f"{DRIVER_ENV}={value}"


def bad_env_message(raw: str, *, flag: bool = True) -> str:
    """What is wrong with ``$AIOCUDASEM_DRIVER`` set to ``raw``; ``flag``: the command takes
    ``--driver``, which would override it."""
    override = " (or pass --driver cuda or --driver sim, which takes precedence)" if flag else ""
    return f"{DRIVER_ENV}={raw!r} names no driver: set it to cuda or sim, or unset it{override}"


def open_driver(flag: str | None, *, fallback: Callable[[str], None] | None = None) -> Driver:
    """The driver to run on: the one chosen by ``--driver`` or ``$AIOCUDASEM_DRIVER``, which is
    honoured or the command fails; with no choice, ``cuda``, or, if ``fallback`` is given and
    CUDA cannot be used, the simulated device, after telling ``fallback`` why.

    Raises :class:`CommandError` if the chosen driver cannot be used, saying how to pick the
    simulated device on the command line."""
    name, source = driver_choice(flag)
    if name is None and fallback is not None:
        try:
            return get_driver("cuda")
        except DriverUnavailableError as exc:
            fallback(f"no usable CUDA GPU: {exc.reason}")
            fallback(
                "falling back to the SIMULATED device; pass --driver cuda (or set "
                f"{DRIVER_ENV}=cuda) to insist on a GPU"
            )
            return get_driver("sim")
    try:
        return get_driver(name or "cuda")
    except DriverUnavailableError as exc:
        raise CommandError(unusable_message(exc, source)) from exc


def unusable_message(exc: DriverUnavailableError, source: str | None) -> str:
    """The command line's wording of the library's :class:`DriverUnavailableError`, whose
    message speaks Python (``driver='sim'``)."""
    asked = f"{source} asks for the real GPU, but " if source else ""
    how = "pass --driver sim"
    if not (source and source.startswith("--")):
        how += f" or set {DRIVER_ENV}=sim"
    return (
        f"{asked}the CUDA driver cannot be used: {exc.reason}. To run on the simulated device "
        f"instead, {how}."
    )


def is_closed_pipe(exc: BaseException) -> bool:
    """Whether ``exc`` is a write to a closed pipe: a :class:`BrokenPipeError`, or a group of
    them (a task that printed, under an event loop's task group)."""
    if isinstance(exc, BrokenPipeError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(is_closed_pipe(e) for e in exc.exceptions)
    return False


def silence_stdout() -> None:
    """Point standard output at the null device, so that the interpreter's last flush of what
    is still buffered cannot fail again on the closed pipe."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(fd, 1)
    finally:
        os.close(fd)
