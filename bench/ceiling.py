"""What batching can buy on this machine at most: one mixed-adapter `generate` per batch size, no engine.

    python -m bench.ceiling                  # demo model, batch sizes 1..32, 5 rounds each

Plain transformers + PEFT: the backbone with 5 adapters attached, rows of W1's texts with per-row `adapter_names`,
the same greedy settings and inputs as the benchmark. rows/s at batch size b over rows/s at batch size 1 is the
ceiling of any batching server's speed-up over a one-row-at-a-time server on the same hardware (ours also pays for
queueing, routing and leases). Writes bench/results/ceiling.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from hunyuan_mt.config import PROJECT_ROOT, load_config, parse_set_args

from .baselines import PlainModel
from .worker import model_spec
from .workload import TEXTS, Request


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ceiling", description=__doc__.split("\n")[0])
    p.add_argument("--config", default=None)
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--sizes", default="1,2,4,8,16,32")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench" / "results" / "ceiling.json")
    args = p.parse_args(argv)
    from peft import PeftModel

    cfg = load_config(args.config, overrides=parse_set_args(args.set))
    adapters = cfg.cache.resolved_dir
    pairs = sorted(d.name for d in adapters.iterdir() if (d / "adapter_config.json").is_file())[:5]
    plain = PlainModel(model_spec(cfg, adapters))
    model = PeftModel.from_pretrained(plain.load_model(), adapters / pairs[0], adapter_name=pairs[0])
    for pair in pairs[1:]:
        model.load_adapter(adapters / pair, adapter_name=pair)
    tok = plain.tokenizer
    tok.padding_side = "right"  # as the backbone does for encoder-decoder models
    rows = [Request(pairs[i % len(pairs)], *pairs[i % len(pairs)].split("2", 1), TEXTS[i % len(TEXTS)])
            for i in range(64)]
    results = []
    for size in [int(x) for x in args.sizes.split(",")]:
        times = []
        for r in range(args.rounds + 1):
            batch_rows = rows[r:r + size] if r + size <= len(rows) else rows[:size]
            encoded = [plain.encode(req)[0] for req in batch_rows]
            batch = tok.pad([{"input_ids": e["input_ids"][0].tolist()} for e in encoded], return_tensors="pt")
            if "decoder_input_ids" in encoded[0]:
                batch["decoder_input_ids"] = torch.cat([e["decoder_input_ids"] for e in encoded])
            t0 = time.perf_counter()
            with torch.inference_mode():
                model.generate(**batch, adapter_names=[q.pair for q in batch_rows],
                               max_new_tokens=cfg.limits.max_new_tokens, num_beams=1, do_sample=False,
                               temperature=None, top_p=None, top_k=None, pad_token_id=tok.pad_token_id)
            if r:  # the first round warms up
                times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        results.append({"batch": size, "ms_per_batch": round(med * 1000, 1), "rows_per_s": round(size / med, 2)})
    base = results[0]["rows_per_s"]
    for row in results:
        row["speedup_vs_1"] = round(row["rows_per_s"] / base, 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"threads": torch.get_num_threads(), "pairs": pairs, "results": results},
                                   indent=2))
    print("| rows per generate | ms per generate | rows/s | speed-up over 1 row |\n|---|---|---|---|")
    for row in results:
        print(f"| {row['batch']} | {row['ms_per_batch']} | {row['rows_per_s']} | {row['speedup_vs_1']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
