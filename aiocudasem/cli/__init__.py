"""The command line: ``aiocudasem {demo,doctor,bench}`` (or ``python -m aiocudasem``).

- ``demo`` (:mod:`.demo`): the producer/consumer pipeline, on the device chosen by ``--driver``
  or ``$AIOCUDASEM_DRIVER`` (the command fails if that device cannot be used); with no choice,
  on the real GPU where there is one and on the simulated device otherwise, saying which;
- ``doctor`` (:mod:`.doctor`): what this machine offers;
- ``bench`` (:mod:`.bench`): the side-by-side benchmarks.

``aiocudasem -V`` (``--version``) prints the version; ``aiocudasem`` alone prints the help.
Both exit with status 0.

Errors are reported in one line on standard error, in the command line's terms (``--driver
sim``, where the library's own messages say ``driver='sim'``). Exit statuses: 0 success, 1
failure, 2 a bad command line or ``$AIOCUDASEM_DRIVER``, and 141 when the output pipe is closed
before the command finishes (``aiocudasem doctor | head -1``): the command then stops quietly,
with the status a shell reports for a program killed by SIGPIPE.

Everything here uses the library's public names only.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._common import (
    DRIVERS,
    EXIT_CLOSED_PIPE,
    ArgumentParser,
    CommandError,
    HelpFormatter,
    exit_statuses,
    is_closed_pipe,
    silence_stdout,
)

__all__ = ("main",)

COMMANDS = ("demo", "doctor", "bench")

# Help text with line breaks of its own is wrapped to fit 80 columns.
_DRIVER_ENV_HELP = """\
environment:
  AIOCUDASEM_DRIVER  cuda (the real GPU) or sim (the simulated device), used
                     when --driver is not given. Unset, the library uses cuda,
                     and the demo falls back to the simulated device when there
                     is no usable GPU, saying so."""


def _parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = ArgumentParser(
        prog="aiocudasem",
        description="CUDA external semaphores and stream completion for async Python.",
        epilog=f"{_DRIVER_ENV_HELP}\n\n{exit_statuses()}",
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "-V",
        "--version",
        action="version",
        version=f"aiocudasem {__version__}",
        help="print the version and exit",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, title="commands", metavar="{demo,doctor,bench}"
    )
    demo = sub.add_parser(
        "demo",
        help="run the producer/consumer demo pipeline",
        description="""\
Run the producer/consumer pipeline: a producer thread hands frames to consumer
coroutines through timeline semaphores, the GPU checks every frame, and the
demo reports the hand-off latency. On a GPU the producer is Vulkan; on the
simulated device it is a host thread.""",
        epilog=f"{_DRIVER_ENV_HELP}\n\n{exit_statuses()}",
        formatter_class=HelpFormatter,
    )
    demo.add_argument(
        "--driver",
        choices=DRIVERS,
        default=None,
        help="cuda: the real GPU, sim: the simulated device (default: $AIOCUDASEM_DRIVER if "
        "set; else the real GPU if there is a usable one, else the simulated device, said so). "
        "A GPU chosen here or by $AIOCUDASEM_DRIVER is used or the demo fails (status 1)",
    )
    demo.add_argument(
        "--backend",
        choices=["asyncio", "asyncio+uvloop", "trio"],
        default="asyncio",
        help="the event loop",
    )
    demo.add_argument("--frames", type=int, default=240, help="frames to hand off (at least 1)")
    demo.add_argument("--consumers", type=int, default=4, help="consumer coroutines (1-64)")
    demo.add_argument("--buffers", type=int, default=4, help="pinned frame buffers (1-64)")
    demo.add_argument("--words", type=int, default=16384, help="uint32 words per frame")
    demo.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    sub.add_parser(
        "doctor",
        help="report what this machine offers: drivers, devices, Vulkan",
        description="""\
Report what this machine offers: package versions, the C notifier, the CUDA
devices and the module loading mode, the Vulkan device, and the default
driver.""",
        epilog=exit_statuses(
            failure="a problem in the configuration (an invalid $AIOCUDASEM_DRIVER),\n"
            "       also named on stderr; no GPU or no Vulkan is reported, not a problem",
            usage="bad command line",
        ),
        formatter_class=HelpFormatter,
    )
    sub.add_parser(
        "bench", help="run the side-by-side benchmarks (aiocudasem bench --help)", add_help=False
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``) and return its exit status
    (see the module's docstring)."""
    args = sys.argv[1:] if argv is None else list(argv)
    command = args[0] if args and args[0] in COMMANDS else None
    try:
        try:
            status = _run(args)
        except CommandError as exc:
            sys.stdout.flush()
            prog = f"aiocudasem {command}" if command else "aiocudasem"
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return exc.status
        except SystemExit:
            sys.stdout.flush()  # argparse's --help, --version and usage errors end here
            raise
        # Output still buffered meets a closed pipe here, not in the interpreter's last flush.
        sys.stdout.flush()
    except BaseException as exc:
        if not is_closed_pipe(exc):
            raise
        silence_stdout()
        return EXIT_CLOSED_PIPE
    return status


def _run(args: list[str]) -> int:
    if args[:1] == ["bench"]:  # everything after "bench" is the benchmark's own
        from .bench import main as bench_main

        return bench_main(args[1:])
    parser = _parser()
    if not args:  # the first thing a new user types: what there is to run, not an error
        parser.print_help()
        return 0
    ns = parser.parse_args(args)
    if ns.command == "demo":
        from .demo import DemoParams
        from .demo import main as demo_main

        try:
            params = DemoParams(
                frames=ns.frames,
                consumers=ns.consumers,
                buffers=ns.buffers,
                words=ns.words,
                device=ns.device,
            )
        except ValueError as exc:
            parser.error(f"demo: {exc}")
        return demo_main(ns.driver, ns.backend, params)
    from .doctor import main as doctor_main

    return doctor_main()
