"""Command line: ``python -m aiocudasem {demo,doctor,bench}``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aiocudasem", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the producer/consumer demo pipeline")
    demo.add_argument(
        "--driver",
        choices=["cuda", "sim"],
        default=None,
        help="default: the real GPU if there is one, else the simulated device (said so)",
    )
    demo.add_argument("--backend", choices=["asyncio", "asyncio+uvloop", "trio"], default="asyncio")
    demo.add_argument("--frames", type=int, default=240)
    demo.add_argument("--consumers", type=int, default=4)
    demo.add_argument("--buffers", type=int, default=4)
    demo.add_argument("--words", type=int, default=16384)

    sub.add_parser("doctor", help="report what this machine offers: drivers, devices, Vulkan")

    bench = sub.add_parser("bench", help="run the benchmarks (see benchmarks/)")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="passed to benchmarks/run.py")

    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["bench"]:  # everything after "bench" belongs to benchmarks/run.py
        from ._doctor import run_benchmarks

        return run_benchmarks(args[1:])
    ns = parser.parse_args(args)
    if ns.command == "demo":
        from ._demo import main as demo_main

        return demo_main(ns.driver, ns.backend, ns.frames, ns.consumers, ns.buffers, ns.words)
    if ns.command == "doctor":
        from ._doctor import main as doctor_main

        return doctor_main()
    return 2  # pragma: no cover - "bench" is dispatched above


if __name__ == "__main__":
    sys.exit(main())
