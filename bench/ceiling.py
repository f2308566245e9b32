"""What one batched generate costs, without the engine: our slot layers and decode loop against PEFT's mixed path.

    python -m bench.ceiling                  # demo model, batch sizes 1..32, 5 rounds each, 3 repeats

Two measurements, each on the demo backbone with the same rows (W1's texts), greedy, the same token limit:

1. **Batching ceiling**: rows/s of one whole batch of b rows over 5 adapters, against b = 1. `ours` is
   `Backbone.generate` (slot layers, our decode loop); `peft` is PEFT's `generate(adapter_names=...)`. rows/s at
   batch size b over rows/s at 1 is what any batching server can gain at most on this hardware.
2. **Mixing cost**: 16 rows on 8 different adapters against the same 16 rows all on one adapter, for both.

Every row generates exactly `--tokens` tokens (the end token is held back until then, in both paths), so a batch
over 8 adapters and one over a single adapter do the same work: different adapters would otherwise stop after
different numbers of steps. Each figure is the median over `--repeats` repeats of the median of `--rounds` rounds
(the first round of each size warms up). Writes bench/results/ceiling.json and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from hunyuan_mt.config import PROJECT_ROOT, load_config, parse_set_args

from .workload import TEXTS


def _timed(fn: Callable[[], Any], rounds: int) -> float:
    fn()  # warm-up round
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ceiling", description=__doc__.split("\n")[0])
    p.add_argument("--config", default=None)
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--sizes", default="1,2,4,8,16,32")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tokens", type=int, default=16, help="tokens every row generates (end token held back)")
    p.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench" / "results" / "ceiling.json")
    args = p.parse_args(argv)
    from peft import PeftModel

    from hunyuan_mt.adapters.cache import AdapterCache
    from hunyuan_mt.adapters.registry import AdapterRegistry
    from hunyuan_mt.adapters.request import Pair
    from hunyuan_mt.runtime.backbone import Backbone, PromptRow

    cfg = load_config(args.config, overrides=parse_set_args(args.set))
    cfg.cache.pinned = []
    adapters = cfg.cache.resolved_dir
    pairs = sorted(d.name for d in adapters.iterdir() if (d / "adapter_config.json").is_file())[:8]
    limit = args.tokens
    gen = cfg.generation

    ours_bb = Backbone.load_uncached(cfg.model)
    ours_bb.model.generation_config.min_new_tokens = limit  # the decode loop's token rules read it
    registry = AdapterRegistry(adapters, ours_bb.spec)
    registry.scan()
    cfg.cache.slots = len(pairs)
    cache = AdapterCache(ours_bb, registry, cfg.cache)
    lease = cache.try_acquire([Pair.parse(k) for k in pairs])
    assert lease is not None
    slot_of = dict(zip(pairs, lease.slots))

    peft_bb = Backbone.load_uncached(cfg.model)
    peft = PeftModel.from_pretrained(peft_bb.model, adapters / pairs[0], adapter_name=pairs[0])
    for key in pairs[1:]:
        peft.load_adapter(adapters / key, adapter_name=key)
    peft.eval()
    peft_bb.model = peft
    tok = peft_bb.tokenizer

    def rows_for(n: int, keys: list[str]) -> tuple[list[PromptRow], list[str]]:
        chosen = [keys[i % len(keys)] for i in range(n)]
        rows = [PromptRow(TEXTS[i % len(TEXTS)], *Pair.parse(k).key.split("2", 1)) for i, k in enumerate(chosen)]
        return rows, chosen

    def ours(rows: list[PromptRow], keys: list[str]) -> Callable[[], Any]:
        slots = [slot_of[k] for k in keys]
        return lambda: ours_bb.generate(rows, slots, gen, limit)

    def plain(rows: list[PromptRow], keys: list[str]) -> Callable[[], Any]:
        encoded = [peft_bb.encode(r) for r in rows]
        batch = tok.pad([{"input_ids": list(e.input_ids)} for e in encoded], return_tensors="pt")
        kwargs = dict(peft_bb._generation_kwargs(gen, limit), min_new_tokens=limit)
        if len(encoded[0].decoder_prefix) > 1:
            batch["decoder_input_ids"] = torch.tensor([list(e.decoder_prefix) for e in encoded])

        def run() -> Any:
            with torch.inference_mode():
                return peft.generate(**batch, adapter_names=list(keys), **kwargs)
        return run

    sizes = [int(x) for x in args.sizes.split(",")]
    five = pairs[:5]
    ceiling: list[dict[str, Any]] = []
    mixing: dict[str, list[float]] = {"ours_mixed": [], "ours_one": [], "peft_mixed": [], "peft_one": []}
    per_size: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for size in sizes:
            rows, keys = rows_for(size, five)
            per_size.setdefault(("ours", size), []).append(_timed(ours(rows, keys), args.rounds))
            per_size.setdefault(("peft", size), []).append(_timed(plain(rows, keys), args.rounds))
        rows, keys = rows_for(16, pairs)
        one = [pairs[0]] * 16
        mixing["ours_mixed"].append(_timed(ours(rows, keys), args.rounds))
        mixing["ours_one"].append(_timed(ours(rows, one), args.rounds))
        mixing["peft_mixed"].append(_timed(plain(rows, keys), args.rounds))
        mixing["peft_one"].append(_timed(plain(rows, one), args.rounds))
    for size in sizes:
        entry: dict[str, Any] = {"batch": size}
        for who in ("ours", "peft"):
            med = statistics.median(per_size[(who, size)])
            entry[f"{who}_ms"] = round(med * 1000, 1)
            entry[f"{who}_rows_per_s"] = round(size / med, 2)
        ceiling.append(entry)
    for entry in ceiling:
        for who in ("ours", "peft"):
            entry[f"{who}_speedup_vs_1"] = round(entry[f"{who}_rows_per_s"] / ceiling[0][f"{who}_rows_per_s"], 2)
    mix = {k: round(statistics.median(v) * 1000, 1) for k, v in mixing.items()}
    mix["ours_ratio"] = round(mix["ours_mixed"] / mix["ours_one"], 3)
    mix["peft_ratio"] = round(mix["peft_mixed"] / mix["peft_one"], 3)
    lease.release()
    result = {"threads": torch.get_num_threads(), "pairs": pairs, "tokens_per_row": limit, "rounds": args.rounds,
              "repeats": args.repeats, "ceiling": ceiling, "mixing": mix}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"torch threads {result['threads']}; medians of {args.repeats} repeats x {args.rounds} rounds\n")
    print("| rows per generate | ours ms | ours rows/s | ours speed-up | PEFT ms | PEFT rows/s | PEFT speed-up | "
          "ours / PEFT time |\n|---|---|---|---|---|---|---|---|")
    for e in ceiling:
        print(f"| {e['batch']} | {e['ours_ms']} | {e['ours_rows_per_s']} | {e['ours_speedup_vs_1']} | {e['peft_ms']} | "
              f"{e['peft_rows_per_s']} | {e['peft_speedup_vs_1']} | {e['ours_ms'] / e['peft_ms']:.2f} |")
    print(f"\n| 16 rows | 8 adapters ms | 1 adapter ms | ratio |\n|---|---|---|---|\n"
          f"| ours | {mix['ours_mixed']} | {mix['ours_one']} | **{mix['ours_ratio']}** |\n"
          f"| PEFT | {mix['peft_mixed']} | {mix['peft_one']} | {mix['peft_ratio']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
