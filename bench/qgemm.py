"""Our 8-bit and 4-bit GEMM (`hunyuan_mt/kernels/qgemm.cpp`) against fbgemm on HY-MT1.5-1.8B's linear layers, as
a decode step meets them.

    python -m bench.qgemm                      # 2 threads, bench/results/qgemm.{json,md}
    python -m bench.qgemm --isa avx2           # the kernel's AVX2 path on this CPU (HMT_QGEMM_ISA)

One "step" multiplies `--layers` layers' fused projections in order (hidden 2048, FFN 6144, 16/4 heads of 128:
Q/K/V 2048 → 3072, O 2048 → 2048, gate/up 2048 → 12288, down 6144 → 2048), then the output projection 2048 →
120,818: 1.79 GB of int8 at 32 layers, more than the CPU's caches (an L3 of a few hundred MB on a server part
holds a few layers, never the step), so the weights come from memory as in the service. Per kernel and row
count: ms per step (the median of `--rounds`), the rate its weights were read at (GB/s), and the ratio to
fbgemm's step. Each kernel's product is checked against float32 `x @ Wᵀ` of its dequantized weight first.
Random weights: a GEMM's speed does not depend on the values.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import torch

from .hunyuan_cpu import cpu_line
from .report import write_results

SHAPES = ((2048, 3072), (2048, 2048), (2048, 12288), (6144, 2048))
HEAD = (2048, 120818)
ROWS = (1, 4, 16, 64)
KINDS = ("fbgemm", "qgemm 8-bit", "qgemm 4-bit")


def _build(kind: str, inner: int, out: int, gen: torch.Generator) -> Any:
    from hunyuan_mt.quant import fbgemm as int8_fbgemm, packed as int8_packed

    w = torch.randn(out, inner, generator=gen) * 0.02
    if kind == "fbgemm":
        return int8_fbgemm.FbgemmLinear.from_float(w, None)
    return (int8_packed.PackedLinear if kind == "qgemm 8-bit" else int8_packed.Packed4Linear).from_float(w, None)


def _bytes(layer: Any) -> int:
    if hasattr(layer, "packed"):
        return layer.packed.numel() + layer.scales.numel() * 4
    return layer.in_features * layer.out_features


def _check(layer: Any, gen: torch.Generator) -> None:
    x = torch.randn(3, layer.in_features, generator=gen)
    w, _ = layer.dequantized()
    ref = x @ w.t()
    err = float((layer(x) - ref).norm() / ref.norm())
    if err > 0.02:
        sys.exit(f"{layer!r}: relative error {err:.3f} against float32 of its own weight")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--isa", choices=("native", "avx2", "scalar"), default="native")
    parser.add_argument("--out", default="qgemm")
    args = parser.parse_args(argv)
    if args.isa != "native":
        os.environ["HMT_QGEMM_ISA"] = args.isa  # read once, when the kernel first runs
    torch.set_num_threads(args.threads)
    from hunyuan_mt.quant import packed as int8_packed

    if not int8_packed.available():
        sys.exit("the qgemm kernel could not be built here")
    rows = [int(r) for r in args.rows.split(",")]
    gen = torch.Generator().manual_seed(0)
    results: dict[str, dict[int, float]] = {}
    sizes: dict[str, int] = {}
    for kind in KINDS:  # one kind's weights at a time: 1.8 GB each at 32 layers
        layers = [_build(kind, i, o, gen) for _ in range(args.layers) for i, o in SHAPES] + [_build(kind, *HEAD, gen)]
        for layer in (layers[0], layers[-1]):
            _check(layer, gen)
        sizes[kind] = sum(_bytes(layer) for layer in layers)
        results[kind] = {}
        for m in rows:
            xs = {i: torch.randn(m, i, generator=gen) for i in {2048, 6144}}

            def step() -> None:
                for layer in layers:
                    layer.matmul(xs[layer.in_features])

            step()
            times = []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                step()
                times.append((time.perf_counter() - t0) * 1e3)
            results[kind][m] = statistics.median(times)
            print(f"{kind}, {m} rows: {results[kind][m]:.1f} ms", file=sys.stderr, flush=True)
        del layers
    lines = [f"`python -m bench.qgemm{''.join(' ' + a for a in (argv if argv is not None else sys.argv[1:]))}`", "",
             f"CPU: {cpu_line()}; {args.threads} threads; qgemm's path: {int8_packed.isa()}; torch "
             f"{torch.__version__}; {args.layers} layers + the output projection; ms per step, median of "
             f"{args.rounds} (GB/s of weights read)", "",
             "| rows | " + " | ".join(f"{k} ({sizes[k] / 1e9:.2f} GB)" for k in KINDS)
             + " | 8-bit ÷ fbgemm | 4-bit ÷ fbgemm |",
             "|---|---|---|---|---|---|"]
    for m in rows:
        cells = [f"{results[k][m]:.1f} ({sizes[k] / results[k][m] / 1e6:.1f})" for k in KINDS]
        f = results["fbgemm"][m]
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {results['qgemm 8-bit'][m] / f:.2f} | "
                     f"{results['qgemm 4-bit'][m] / f:.2f} |")
    if 1 in rows and 16 in rows:
        lines.append("")
        lines.append("16-row step ÷ 1-row step: " + ", ".join(
            f"{k} {results[k][16] / results[k][1]:.2f}×" for k in KINDS))
    macs = sum(i * o for i, o in SHAPES) * args.layers + HEAD[0] * HEAD[1]  # a row's, whatever the bits
    lines.append("")
    lines.append("Multiply-adds per second, the step's weights from memory: " + "; ".join(
        f"{m} rows " + ", ".join(f"{k} {m * macs / results[k][m] / 1e6:.0f}" for k in KINDS) for m in rows)
        + " GMAC/s")
    write_results(args.out, {"cpu": cpu_line(), "threads": args.threads, "isa": int8_packed.isa(),
                             "layers": args.layers, "bytes": sizes,
                             "ms": {k: {str(m): round(v, 2) for m, v in r.items()} for k, r in results.items()}},
                  lines)


if __name__ == "__main__":
    main()
