"""`python -m hunyuan_mt bench`: the benchmark (code in the top-level `bench/` folder, not part of the package)."""

from __future__ import annotations

import argparse
import sys

from .config import PROJECT_ROOT


def _bench_run():
    # bench/ sits beside the package in the project root; make it importable however the CLI was started.
    if str(PROJECT_ROOT) not in sys.path:
        sys.path.insert(0, str(PROJECT_ROOT))
    from bench import run

    return run


def run(args: argparse.Namespace) -> int:
    return _bench_run().run(args)


def register(subparsers: argparse._SubParsersAction) -> None:
    bench_run = _bench_run()
    parser = subparsers.add_parser(
        "bench", help="benchmark ours against the baselines (B0/B1/B2); results in bench/results/",
        description=(bench_run.__doc__ or "").split("\n")[0])
    bench_run.add_arguments(parser)
    parser.set_defaults(handler=run)
