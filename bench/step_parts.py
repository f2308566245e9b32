"""Where a decode step of the Hunyuan family goes on this CPU, part by part: the base GEMMs, the LoRA terms,
attention, the rest of the step's tensor work, and the Python around it.

    python -m bench.step_parts --preset hy-mt1.5-1.8b                     # int8, the kernel auto picks, 1 and 16 rows
    python -m bench.step_parts --preset hy-mt1.5-1.8b --kernels fbgemm,qgemm --quantization int8
    python -m bench.step_parts --preset mid --rows 1,4,16                 # a smaller model, in seconds

bench.hunyuan_cpu's random model of the preset's shapes with its 8 random adapters attached (bfloat16 slots, as
the 1.8B profile keeps them), eager as the 1.8B profile runs. A running batch of `rows` rows over the 8 adapters
(row i on adapter i mod 8) decodes `--steps` steps after a 60-token prompt each; the steps are timed (median), and
`--profile` more are run under torch.profiler, whose CPU time per op is summed into the parts below. The kernels
(qgemm, fbgemm's op) are parts of their own; everything torch runs inside `apply_lora`/`add_low_rank` is LoRA;
`hmt_cpu::decode_attention` is attention; every other op is "other ops", and the step's wall time less the ops' time
(on the engine's thread) is "Python and dispatch". Medians and shares, one process per kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from hunyuan_mt.config import PROJECT_ROOT

from .hunyuan_cpu import PAIRS, WORK, build, cpu_line, prompt
from .report import write_results

PARTS = ("base GEMM", "LoRA", "attention", "other ops", "Python and dispatch")


def _part(name: str, stack: tuple[str, ...]) -> str:
    # LoRA first: over qgemm's base the LoRA terms run in qgemm too (lora.grouped), and count as LoRA.
    if any("lora" in frame for frame in stack):
        return "LoRA"
    if name in ("hmt_cpu::qgemm", "hmt::fbgemm_linear", "hmt_cpu::fbgemm_linear", "aten::_int_mm") \
            or "linear_with_input_q_dq_qweight_dq_output_fp32" in name:
        return "base GEMM"
    if name == "hmt_cpu::decode_attention":
        return "attention"
    return "other ops"


def _worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from hunyuan_mt.adapters.cache import AdapterCache
    from hunyuan_mt.adapters.registry import AdapterRegistry
    from hunyuan_mt.adapters.request import Pair
    from hunyuan_mt.runtime.backbone import Backbone
    from hunyuan_mt.config import CacheConfig, GenerationConfig, ModelConfig
    from hunyuan_mt.decode import Sequence, TokenPicker
    from hunyuan_mt.decode import dense
    from hunyuan_mt.lora import grouped

    folder = WORK / args.preset
    model_dir, adapters = folder / "model", folder / "adapters"
    backbone = Backbone.load_uncached(ModelConfig(path=str(model_dir), warmup=False, quantization=args.quantization,
                                                  int8_kernel=args.kernel, cpu_threads=args.threads,
                                                  compile="false"))
    registry = AdapterRegistry(adapters, backbone.spec)
    registry.scan()
    cache = AdapterCache(backbone, registry, CacheConfig(adapters_dir=str(adapters), slots=len(PAIRS), pinned=[],
                                                         slot_dtype="bfloat16"))
    cache.start()
    held = cache.lease([Pair.parse(p) for p in PAIRS])
    slots = list(held.__enter__().slots)
    picker = TokenPicker.for_model(backbone.model, GenerationConfig(), None, encoder_decoder=False)
    vocab = backbone.model.config.vocab_size

    # The LoRA arithmetic is found by its Python frames: wrap its two entry points in a profiler label.
    for module, name in ((dense, "apply_lora"), (dense, "add_low_rank"), (grouped, "apply_lora"),
                         (grouped, "add_low_rank")):
        original = getattr(module, name, None)
        if original is None or getattr(original, "_labelled", False):
            continue

        def labelled(*a: Any, __f: Any = original, **k: Any) -> Any:
            with record_function("lora"):
                return __f(*a, **k)

        labelled._labelled = True  # type: ignore[attr-defined]
        setattr(module, name, labelled)

    out: dict[str, Any] = {"kernel": backbone.int8_kernel, "quantization": args.quantization}
    for rows in args.rows:
        batch = backbone.new_batch(GenerationConfig())
        batch.picker = picker
        seqs = [Sequence(i, tuple(prompt(args.prompt, vocab, seed=i)), slots[i % len(slots)], 10_000)
                for i in range(rows)]
        with backbone.model_lock, torch.inference_mode():
            batch.add(seqs)
            for _ in range(3):
                batch.step()
            walls = []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                batch.step()
                walls.append((time.perf_counter() - t0) * 1e3)
            with profile(activities=[ProfilerActivity.CPU], with_stack=False) as prof:
                for _ in range(args.profile):
                    with record_function("step"):
                        batch.step()
        parts = dict.fromkeys(PARTS, 0.0)
        step_ms = 0.0
        events = prof.events()
        # Self CPU time of each op on the decoding thread, attributed to the labels it runs under.
        for e in events:
            if e.name == "step":
                step_ms += e.cpu_time_total / 1e3
        for e in events:
            if e.name in ("step", "lora"):
                continue
            stack = []
            parent = e.cpu_parent
            while parent is not None:
                stack.append(parent.name)
                parent = parent.cpu_parent
            if not stack or stack[-1] != "step":
                continue
            if any(p not in ("step", "lora") for p in stack):
                continue  # counted within its top-level op
            parts[_part(e.name, tuple(stack))] += e.cpu_time_total / 1e3
        ops_ms = sum(parts.values())
        parts["Python and dispatch"] = max(0.0, step_ms - ops_ms)
        out[str(rows)] = {"step_ms": statistics.median(walls), "steps": walls,
                          "parts_ms": {k: round(v / args.profile, 2) for k, v in parts.items()},
                          "profiled_step_ms": round(step_ms / args.profile, 2)}
        print(f"{backbone.int8_kernel} {rows} rows: {statistics.median(walls):.1f} ms a step; "
              + ", ".join(f"{k} {v / args.profile:.1f}" for k, v in parts.items()), file=sys.stderr, flush=True)
    held.__exit__(None, None, None)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.step_parts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="hy-mt1.5-1.8b")
    parser.add_argument("--quantization", default="int8", choices=("int8", "int4"))
    parser.add_argument("--kernels", default="auto", help="comma-separated: auto, fbgemm, qgemm (int8)")
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--prompt", type=int, default=60)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--profile", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kernel", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.rows = [int(r) for r in str(args.rows).split(",")]
    if args.worker:
        print(json.dumps(_worker(args)))
        return 0
    build(args.preset, WORK / args.preset)
    results: dict[str, Any] = {"cpu": cpu_line(), "preset": args.preset, "quantization": args.quantization,
                               "threads": args.threads, "by_kernel": {}}
    kernels = ["qgemm"] if args.quantization == "int4" else args.kernels.split(",")
    for kernel in kernels:
        cmd = [sys.executable, "-m", "bench.step_parts", "--worker", "--preset", args.preset, "--quantization",
               args.quantization, "--kernel", kernel, "--rows", ",".join(map(str, args.rows)), "--prompt",
               str(args.prompt), "--steps", str(args.steps), "--profile", str(args.profile), "--threads",
               str(args.threads)]
        from hunyuan_mt.host.cpu import with_intel_openmp

        env = with_intel_openmp(dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
        done = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)
        sys.stderr.write(done.stderr[-2000:])
        if done.returncode != 0:
            return done.returncode
        results["by_kernel"][kernel] = json.loads(done.stdout.strip().splitlines()[-1])
    lines = [f"`python -m bench.step_parts --preset {args.preset} --quantization {args.quantization} --kernels "
             f"{args.kernels} --rows {','.join(map(str, args.rows))}`", "",
             f"CPU: {results['cpu']}; {args.threads} threads; eager step, bfloat16 slots, 8 adapters attached, row i "
             f"on adapter i mod 8; a step's median of {args.steps}, its parts from {args.profile} profiled steps (ms)",
             "", "| kernel | rows | step | " + " | ".join(PARTS) + " |", "|---|---|---|" + "---|" * len(PARTS)]
    for kernel, r in results["by_kernel"].items():
        for rows in args.rows:
            cell = r[str(rows)]
            lines.append(f"| {r['kernel']} ({kernel}) | {rows} | {cell['step_ms']:.1f} | "
                         + " | ".join(f"{cell['parts_ms'][p]:.1f}" for p in PARTS) + " |")
    write_results(f"step_parts-{args.preset}-{args.quantization}", results, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
