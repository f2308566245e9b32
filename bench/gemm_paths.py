"""torch's three float32 CPU GEMM paths at the shapes of the demo's decode step (the float32 row of BENCHMARKS.md's step table).

    python -m bench.gemm_paths                    # 2 threads, bench/results/gemm_paths.{json,md}

The compiled float32 step (decode/compiled.py, `AotFunction(freeze=True)`) runs each base linear through oneDNN on
a weight packed at compile time. This bench times the alternatives on the same shapes, each through torch's Python
op as the eager step calls them: `torch.mm` (MKL's sgemm on the plain weight), oneDNN's `_linear_pointwise` on a
packed weight (ours), and MKL's packed GEMM (`_mkl_linear`, packed for the row count). Shapes: rows 1, 8, 32, 64
against the demo's projections (d_model 384: Q/K/V 1152, out 384, fc1 1024, fc2 1024 → 384, logits 8012). µs per
call, the median of 7 rounds of `--calls` calls, after each path's product is checked against `x @ Wᵀ`. Random
weights: the speed of a GEMM does not depend on the values.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch

from .report import write_results

SHAPES = ((384, 1152, "Q, K, V"), (384, 384, "out"), (384, 1024, "fc1"), (1024, 384, "fc2"), (384, 8012, "logits"))
ROWS = (1, 8, 32, 64)


def _time(fn: Callable[[], Any], calls: int) -> float:
    for _ in range(20):
        fn()
    rounds = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
    return round(statistics.median(rounds), 1)


def measure(rows: int, k: int, n: int, calls: int) -> dict[str, float | None]:
    weight, x = torch.randn(n, k), torch.randn(rows, k)
    plain = weight.t()
    onednn = torch.ops.mkldnn._reorder_linear_weight(weight, None)
    paths: dict[str, Callable[[], torch.Tensor]] = {
        "mm": lambda: torch.mm(x, plain),
        "onednn_packed": lambda: torch.ops.mkldnn._linear_pointwise(x, onednn, None, "none", [], ""),
    }
    if torch.backends.mkl.is_available():
        mkl = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
        paths["mkl_packed"] = lambda: torch.ops.mkl._mkl_linear(x, mkl, weight, None, rows)
    reference = x @ weight.t()
    for name, fn in paths.items():
        # A faster path is worth nothing if it computes something else.
        if not torch.allclose(fn(), reference, rtol=1e-4, atol=1e-3):
            raise AssertionError(f"{name} does not compute x @ weightᵀ for {rows} × {k} → {n}")
    out: dict[str, float | None] = {"mkl_packed": None}
    out.update({name: _time(fn, calls) for name, fn in paths.items()})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gemm_paths", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        cells = [{"rows": m, "k": k, "n": n, "projection": name, **measure(m, k, n, args.calls)}
                 for k, n, name in SHAPES for m in ROWS]
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"# float32 GEMM paths at the decode step's shapes ({date}, `python -m bench.gemm_paths`)", "",
             f"{args.threads} threads, µs per call (median of 7 × {args.calls}), CPU capability "
             f"{torch.backends.cpu.get_cpu_capability()}.", "",
             "| rows × in → out | projection | torch.mm (MKL) | oneDNN packed (ours) | MKL packed | GFLOP/s (ours) |",
             "|---|---|---|---|---|---|"]
    for c in cells:
        gflops = 2 * c["rows"] * c["k"] * c["n"] / (c["onednn_packed"] * 1e3)
        mkl = "–" if c["mkl_packed"] is None else f"{c['mkl_packed']:.1f}"
        lines.append(f"| {c['rows']} × {c['k']} → {c['n']} | {c['projection']} | {c['mm']:.1f} | "
                     f"{c['onednn_packed']:.1f} | {mkl} | {gflops:.0f} |")
    write_results("gemm_paths", {"date": date, "threads": args.threads, "calls": args.calls, "cells": cells}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
