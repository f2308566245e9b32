"""What the weight formats do to translations: the demo's held-out UI strings through float32, int8 (the kernel
`auto` picks, and qgemm's) and qgemm's 4-bit weights.

    python -m bench.weights_quality                 # bench/results/weights_quality.{json,md}
    python -m bench.weights_quality --limit 100     # fewer rows per direction

Every direction's standing held-out UI strings (`adapters/<pair>/heldout.tsv`, 400 rows kept out of training) go
through a service per variant, memory off, in `translate_batch` calls of the REST API's size. Per direction: corpus
chrF against the reference, and the share of outputs identical to float32's. The demo is a 13M-parameter model:
rounding hurts a small model more than a large one, so its 4-bit loss is an upper bound for the Hunyuan family's,
not a measurement of it (no Hunyuan weights are on this machine).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from hunyuan_mt.config import PROJECT_ROOT

from .confidence import heldout_ui
from .demo_build import _service
from .report import write_results

DIRECTIONS = ("en2es", "en2de", "en2fr", "en2zh", "es2en", "de2en", "fr2en", "zh2en")
#: (name, settings on top of the demo's): the formats compared.
VARIANTS = (("float32", {"model.quantization": "none"}),
            ("int8 (auto kernel)", {"model.quantization": "int8"}),
            ("int8 (qgemm)", {"model.quantization": "int8", "model.int8_kernel": "qgemm"}),
            ("int4 (qgemm)", {"model.quantization": "int4"}))


def translate_all(settings: dict[str, Any], sets: dict[str, list[tuple[str, str]]]) -> tuple[dict[str, list[str]],
                                                                                                float, str]:
    service = _service(PROJECT_ROOT, {**settings, "model.compile": "false"})
    outputs: dict[str, list[str]] = {}
    started = time.perf_counter()
    try:
        kernel = str(service.backbone.info().get("int8_kernel", "float32"))
        step = service.cfg.limits.max_batch_items
        for direction, pairs in sets.items():
            src, tgt = direction.split("2")
            texts = [s for s, _ in pairs]
            outputs[direction] = [r.text for start in range(0, len(texts), step)
                                  for r in service.translate_batch(texts[start:start + step], src, tgt)]
    finally:
        service.close()
    return outputs, time.perf_counter() - started, kernel


def main(argv: list[str] | None = None) -> int:
    import sacrebleu

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=400, help="rows per direction")
    args = parser.parse_args(argv)
    from .hunyuan_cpu import cpu_line

    sets = {d: heldout_ui(PROJECT_ROOT, d)[:args.limit] for d in DIRECTIONS}
    runs = {name: translate_all(settings, sets) for name, settings in VARIANTS}
    reference_outputs = runs["float32"][0]
    table: dict[str, dict[str, Any]] = {}
    for name, (outputs, seconds, kernel) in runs.items():
        row: dict[str, Any] = {"kernel": kernel, "seconds": round(seconds, 1)}
        for d in DIRECTIONS:
            refs = [ref for _, ref in sets[d]]
            row[d] = {"chrf": round(sacrebleu.corpus_chrf(outputs[d], [refs]).score, 1),
                      "same_as_float32": round(sum(a == b for a, b in zip(outputs[d], reference_outputs[d]))
                                               / len(refs) * 100, 1)}
        table[name] = row
    rows = len(next(iter(sets.values())))
    lines = [f"`python -m bench.weights_quality{f' --limit {args.limit}' if args.limit != 400 else ''}`; CPU: "
             f"{cpu_line()}; the shipped demo, memory off, {rows} held-out UI strings per direction. chrF (outputs "
             "identical to float32's)", "",
             "| weights | kernel | " + " | ".join(d.replace("2", "→") for d in DIRECTIONS) + " | seconds |",
             "|---|---|" + "---|" * len(DIRECTIONS) + "---|"]
    for name, row in table.items():
        cells = [f"{row[d]['chrf']} ({row[d]['same_as_float32']:.0f} %)" for d in DIRECTIONS]
        lines.append(f"| {name} | {row['kernel']} | " + " | ".join(cells) + f" | {row['seconds']} |")
    write_results("weights_quality", {"cpu": cpu_line(), "rows": rows, "variants": table}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
