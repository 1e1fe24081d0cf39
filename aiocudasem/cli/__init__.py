"""The command line: ``aiocudasem {demo,doctor,bench}`` (or ``python -m aiocudasem``).

- ``demo`` (:mod:`.demo`): the producer/consumer pipeline, on the real GPU where there is one
  and on the simulated device otherwise, saying which;
- ``doctor`` (:mod:`.doctor`): what this machine offers;
- ``bench`` (:mod:`.bench`): the side-by-side benchmarks.

Everything here uses the library's public names only.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ("main",)


def _parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="aiocudasem",
        description="CUDA external semaphores and stream completion for async Python.",
    )
    parser.add_argument("--version", action="version", version=f"aiocudasem {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,doctor,bench}")
    demo = sub.add_parser(
        "demo",
        help="run the producer/consumer demo pipeline",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    demo.add_argument(
        "--driver",
        choices=["cuda", "sim"],
        default=None,
        help="the device to run on; by default the real GPU if there is one, else the "
        "simulated device (said so)",
    )
    demo.add_argument(
        "--backend",
        choices=["asyncio", "asyncio+uvloop", "trio"],
        default="asyncio",
        help="the event loop",
    )
    demo.add_argument("--frames", type=int, default=240, help="frames to hand off")
    demo.add_argument("--consumers", type=int, default=4, help="consumer coroutines (1-64)")
    demo.add_argument("--buffers", type=int, default=4, help="pinned frame buffers (1-64)")
    demo.add_argument("--words", type=int, default=16384, help="uint32 words per frame")
    demo.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    sub.add_parser("doctor", help="report what this machine offers: drivers, devices, Vulkan")
    sub.add_parser(
        "bench", help="run the side-by-side benchmarks (aiocudasem bench --help)", add_help=False
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["bench"]:  # everything after "bench" is the benchmark's own
        from .bench import main as bench_main

        return bench_main(args[1:])
    parser = _parser()
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
