"""The LoRA terms of one decode step of HY-MT1.5-1.8B's shapes, float32 against qgemm (`lora.grouped`).

    python -m bench.lora_terms                  # 1 thread, rows 1 and 16, bench/results/lora_terms.{json,md}
    python -m bench.lora_terms --threads 2

What a step of the 1.8B adds on top of its base GEMMs for r=16 adapters on q/k/v/o (bench.hunyuan_cpu's): per layer
the Q/K/V group (2048 → 2048/512/512) and O (2048 → 2048), 32 layers, bfloat16 slots as the 1.8B profile keeps
them; one row on one adapter, and 16 rows over 8 adapters (row i on adapter i mod 8). Each path through
`GroupedLoRA.add_to`, the code the step runs: float32 GEMMs (over fbgemm's base, the compiled step's arithmetic)
or qgemm's 8-bit kernel for both sides (over qgemm's base). Alternated, median of `--rounds` steps each; with one
thread the time is the thread's CPU time, so that other work on the machine does not count.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from .hunyuan_cpu import cpu_line
from .report import write_results

LAYERS, RANK, ADAPTERS = 32, 16, 8
HIDDEN, KV = 2048, 512


class _SlotLayer:
    """What GroupedLoRA reads of a slot layer: A [slots, in, r] and B [slots, r, out], slot 0 the bare backbone."""

    def __init__(self, out: int, gen: torch.Generator) -> None:
        self.a_t = (torch.randn(ADAPTERS + 1, HIDDEN, RANK, generator=gen) * 0.02).to(torch.bfloat16)
        self.b_t = (torch.randn(ADAPTERS + 1, RANK, out, generator=gen) * 0.02).to(torch.bfloat16)


def _clock() -> float:
    return time.thread_time() if torch.get_num_threads() == 1 else time.perf_counter()


def run(threads: int, rounds: int) -> dict[str, Any]:
    from hunyuan_mt import kernels
    from hunyuan_mt.lora.grouped import GroupedLoRA
    from hunyuan_mt.lora.mapping import SlotMapping

    if kernels.qgemm() is None:
        raise SystemExit("the qgemm kernel could not be built here (a C++ compiler and ninja are needed)")
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    mapping = SlotMapping()
    paths: dict[str, list[tuple[Any, Any]]] = {}
    for name, packed in (("float32", False), ("qgemm", True)):
        paths[name] = []
        for _ in range(LAYERS):
            qkv = [_SlotLayer(HIDDEN, gen), _SlotLayer(KV, gen), _SlotLayer(KV, gen)]
            paths[name].append((GroupedLoRA(qkv, [HIDDEN, KV, KV], mapping, packed=packed),
                                GroupedLoRA([_SlotLayer(HIDDEN, gen)], [HIDDEN], mapping, packed=packed)))
    results: dict[str, Any] = {}
    with torch.inference_mode():
        for rows in (1, 16):
            x = torch.randn(rows, HIDDEN, generator=gen)
            y_qkv, y_o = torch.zeros(rows, HIDDEN + 2 * KV), torch.zeros(rows, HIDDEN)
            mapping.set([1 + i % ADAPTERS for i in range(rows)])
            times: dict[str, list[float]] = {name: [] for name in paths}
            for name, groups in paths.items():   # the first step stacks the slots' weights: not timed
                for qkv, o in groups:
                    qkv.add_to(x, y_qkv)
                    o.add_to(x, y_o)
            for _ in range(rounds):
                for name, groups in paths.items():
                    t0 = _clock()
                    for qkv, o in groups:
                        qkv.add_to(x, y_qkv)
                        o.add_to(x, y_o)
                    times[name].append((_clock() - t0) * 1e3)
            results[str(rows)] = {name: {"ms": statistics.median(t), "steps": t} for name, t in times.items()}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lora_terms", description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    results = run(args.threads, args.rounds)
    clock = "thread CPU time" if args.threads == 1 else "wall time"
    lines = [f"`python -m bench.lora_terms{'' if args.threads == 1 else f' --threads {args.threads}'}`", "",
             f"CPU: {cpu_line()}; {args.threads} thread(s); {LAYERS} layers of Q/K/V + O, r={RANK}, bfloat16 slots; "
             f"ms of {clock} per step, median of {args.rounds}", "",
             "| rows | adapters | float32 | qgemm | qgemm ÷ float32 |", "|---|---|---|---|---|"]
    for rows, cell in results.items():
        f32, ours = cell["float32"]["ms"], cell["qgemm"]["ms"]
        lines.append(f"| {rows} | {min(int(rows), ADAPTERS)} | {f32:.1f} | {ours:.1f} | {ours / f32:.2f} |")
    name = "lora_terms" if args.threads == 1 else f"lora_terms-{args.threads}t"
    write_results(name, {"cpu": cpu_line(), "threads": args.threads, "rounds": args.rounds, "results": results},
                  lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
