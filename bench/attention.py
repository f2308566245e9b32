"""The compiled decode step as shipped, with the CPU attention kernel, against the same step without a part of it.

    python -m bench.attention                             # against attention as tensor operations
    python -m bench.attention --against float32-cache     # against the kernel over keys/values kept in float32
    python -m bench.attention --against python-fbgemm     # against int8 layers calling fbgemm through Python
    python -m bench.attention --every 10 --calls 20

The service runs as shipped (compiled step, int8 and a float16 cache where the profile picks them) and translates
`bench.peer`'s 600 sentences (one pair) once; every `--every`-th compiled decode step is captured with its inputs
(caches copied). Each captured step is then run by two compiled packages in the same process, alternating: the
shipped one, whose attention is `hmt_cpu::decode_attention` (hunyuan_mt/kernels), and the baseline: one built
without the kernel (`kvcache._attend`, tensor operations over every column of the batch's cache, kept in float32:
the step before the kernel), or the kernel over the same caches widened to float32, or the shipped step with its int8
layers calling fbgemm through Python (`hmt::fbgemm_linear`) instead of from C++ (`hmt_cpu::fbgemm_linear`, the
same fbgemm call). Reported per step: rows, cache
columns, the share of them the rows do not mask, milliseconds per step (medians of `--rounds` rounds of `--calls`
calls each) and the ratio; and whether the two give the same next tokens. Results:
bench/results/attention.{json,md} (attention-<baseline>.* for the other baselines).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from .peer import _service, sentences, workload
from .report import write_results


def capture(every: int) -> tuple[Any, list[dict[str, Any]]]:
    """The service (still open) and the compiled steps of one 600-sentence run, every `every`-th."""
    import torch

    from hunyuan_mt.decode import compiled

    texts, _ = workload(sentences())
    service = _service(None)
    service.wait_ready(600)
    service.translate_batch(texts[:32], "en", "es")
    steps: list[dict[str, Any]] = []
    count = 0
    call = compiled.CompiledStep.__call__

    def spy(self: Any, ids: Any, pos: Any, mask: Any, cmask: Any, k: Any, v: Any, ck: Any, cv: Any, model: Any,
            lora: Any) -> Any:
        nonlocal count
        count += 1
        if count % every == 0:
            copies = [[t.clone() for t in store] for store in (k, v, ck, cv)]
            steps.append({"step": self, "args": (ids.clone(), pos.clone(), mask.clone(), cmask.clone(), *copies,
                                                 model, lora),
                          "rows": ids.shape[0], "columns": mask.shape[-1], "source": cmask.shape[-1],
                          "self_seen": float((mask == 0).float().mean()),
                          "source_seen": float((cmask == 0).float().mean())})
        return call(self, ids, pos, mask, cmask, k, v, ck, cv, model, lora)

    compiled.CompiledStep.__call__ = spy
    try:
        with torch.inference_mode():
            service.translate_batch(texts, "en", "es")
    finally:
        compiled.CompiledStep.__call__ = call
    return service, steps


def compare(steps: list[dict[str, Any]], rounds: int, calls: int, against: str) -> list[dict[str, Any]]:
    """Each step by the shipped package and by the baseline's (`against`): "tensor-ops", the attention written
    out over every column; "float32-cache", the kernel over keys and values kept in float32; "python-fbgemm", the
    int8 layers' GEMM called through Python."""
    import torch

    from hunyuan_mt.decode import compiled
    from hunyuan_mt.quant.fbgemm import FbgemmBase

    python_op = torch.ops.hmt.fbgemm_linear
    moved: list[Any] = []

    def through_python(obj: Any) -> Any:
        if isinstance(obj, FbgemmBase):
            moved.append(obj.op)
            return obj._replace(op=python_op)
        return type(obj)(through_python(x) for x in obj) if isinstance(obj, (tuple, list)) else obj

    plain: dict[int, Any] = {}
    rows = []
    for s in steps:
        shipped, args = s["step"], s["args"]
        model = args[8]
        heads, head_dim, scaling, kernel = model[3]
        if kernel is None:
            raise SystemExit("the shipped step has no attention kernel here (HMT_CPU_KERNELS=0, or it did not build)")
        # Both baselines keep keys and values in float32 (the tensor operations would otherwise widen a float16
        # cache at every step, a cost of their own): "tensor-ops" is the step as it was before the kernel.
        if against == "float32-cache" and args[4][0].dtype == torch.float32:
            raise SystemExit("the shipped cache is float32 already (model.kv_cache)")
        # The python-fbgemm baseline keeps the shipped caches: only the layers' op differs.
        caches = tuple([t.float() if against != "python-fbgemm" else t.clone() for t in store]
                       for store in args[4:8])
        if against == "tensor-ops":
            model = model[:3] + ((heads, head_dim, scaling, None),) + model[4:]
        if against == "python-fbgemm":
            model = through_python(model)
            if not moved or all(op is python_op for op in moved):
                raise SystemExit("the shipped step has no int8 layers calling fbgemm from C++ here")
        base_args = args[:4] + caches + (model, args[9])
        # A package of its own: one AotFunction keeps one package per argument structure.
        other = plain.setdefault(id(shipped), compiled.CompiledStep(freeze=shipped.frozen))
        variants = {"shipped": (shipped, args), "baseline": (other, base_args)}

        def run(name: str) -> Any:
            fn, a = variants[name]
            with torch.inference_mode():
                return fn(*a)

        same = bool(torch.equal(run("shipped").argmax(-1), run("baseline").argmax(-1)))
        ms: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(rounds):
            for name in variants:
                t0 = time.perf_counter()
                for _ in range(calls):
                    run(name)
                ms[name].append((time.perf_counter() - t0) / calls * 1e3)
        mine, theirs = statistics.median(ms["shipped"]), statistics.median(ms["baseline"])
        rows.append({key: s[key] for key in ("rows", "columns", "source", "self_seen", "source_seen")} | {
            "shipped_ms": mine, "baseline_ms": theirs, "ratio": mine / theirs, "same_tokens": same,
            "compiled": shipped.active and other.active})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.attention", description=__doc__.splitlines()[0])
    p.add_argument("--every", type=int, default=20, help="capture every N-th compiled step of the run")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--against", choices=("tensor-ops", "float32-cache", "python-fbgemm"), default="tensor-ops",
                   help="the baseline: attention as tensor operations, the kernel over a float32 cache, or int8 "
                        "layers calling fbgemm through Python")
    args = p.parse_args(argv)
    service, steps = capture(args.every)
    try:
        info = service.status()["backbone"]
        rows = compare(steps, args.rounds, args.calls, args.against)
    finally:
        service.close()
    big = [r for r in rows if r["rows"] >= 32]
    data = {"args": vars(args), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "quantization": info.get("quantization"), "kv_cache": info.get("kv_cache", "model dtype"), "steps": rows,
            "median_ratio": statistics.median(r["ratio"] for r in rows) if rows else None,
            "median_ratio_32_rows_or_more": statistics.median(r["ratio"] for r in big) if big else None}
    command = "python -m bench.attention" + "".join(
        f" --{name} {value}" for name, value in vars(args).items() if value != p.get_default(name))
    baseline = {"tensor-ops": "attention as tensor operations over every column (`kvcache._attend`) of a float32 cache",
                "float32-cache": "the same kernel over keys and values kept in float32",
                "python-fbgemm": "the same step with its int8 layers calling fbgemm through Python "
                                 "(`hmt::fbgemm_linear`)"}[args.against]
    lines = [f"# Decode step: as shipped against {args.against} ({data['date']}, `{command}`)", "",
             f"Weights: {data['quantization']}, attention keys/values: {data['kv_cache']}. Shipped: the attention "
             f"kernel and the int8 GEMM called from C++ (hunyuan_mt/kernels); baseline: {baseline}. Each step is a "
             f"captured compiled step of the 600-sentence run, both packages alternating in one process; ms are "
             f"medians of {args.rounds} rounds of {args.calls} calls. 'seen' = share of the cache's columns the "
             f"rows do not mask.", "",
             "| rows | columns | self seen | source | source seen | shipped ms | baseline ms | ratio | same tokens |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['rows']} | {r['columns']} | {r['self_seen']:.2f} | {r['source']} | {r['source_seen']:.2f} | "
              f"{r['shipped_ms']:.2f} | {r['baseline_ms']:.2f} | {r['ratio']:.3f} | {r['same_tokens']} |"
              for r in rows]
    if rows:
        lines += ["", f"Median ratio: **{data['median_ratio']:.3f}** over {len(rows)} steps"
                  + (f", **{data['median_ratio_32_rows_or_more']:.3f}** over the {len(big)} of 32 rows or more."
                     if big else ".")]
    if not all(r["compiled"] for r in rows):
        lines += ["", "Some steps ran eagerly (a package refused them): those rows compare eager steps."]
    write_results("attention" if args.against == "tensor-ops" else "attention-" + args.against, data, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
