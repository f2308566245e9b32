"""A long prompt arriving beside running streams, on the Hunyuan family's shapes: how long the running streams
stall while it prefills, and when its own first token comes, with its prefill in one forward ("off", what the
engine did before 2026-12-06) and in pieces of `engine.prefill_chunk_tokens`.

    python -m bench.chunked_prefill                             # HY-MT1.5-1.8B's shapes, int8 (minutes)
    python -m bench.chunked_prefill --preset mid --runs 3       # hidden 512, 8 layers: quick
    python -m bench.chunked_prefill --chunks off,128,64 --long 512 --streams 2

The model is bench.hunyuan_cpu's random HunYuanDenseV1 of the preset's shapes (built there once and reused), int8
with the serving default kernel, its adapters in the adapter cache: the engine as the service runs it, in this
process. A trial starts `--streams` streams (short prompts, `--new` tokens each, en→es on an adapter), waits until
each has taken 3 steps, then submits one row with a prompt of about `--long` tokens (en→de) and waits for all.
Token times come from the engine's token listener (one call per row and step). Per trial:
- `stall`: the longest gap between two tokens of a running stream from the long row's submit until its first
  token (what a reader of the stream sees freeze);
- `step`: the running streams' median gap before the submit (a decode step);
- `first token`: from the long row's submit to its first token (its prefill, plus the steps between pieces);
- `late first token`: a short request sent `--late` seconds after the long row, from its submit to its first
  token (a prompt of one forward starts beside a long prompt's prefill);
- `trial`: from the first stream's submit until every row is done.
The settings alternate within each run (`--runs`, medians over them), on one backbone: compare columns of one
invocation. Results: bench/results/chunked_prefill.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

from hunyuan_mt.config import PROJECT_ROOT

from .report import write_results

WORK = PROJECT_ROOT / "bench" / "results" / "tmp" / "hunyuan_cpu"


def _words(n: int, seed: int) -> str:
    """`n` words (the bench tokenizer reads each as one token)."""
    return " ".join(f"w{(seed * 131 + i * 7) % 997}" for i in range(n))


class Clock:
    """Each row's token times, from the engine's listener (thread-safe enough: one writer, the engine)."""

    def __init__(self) -> None:
        self.times: dict[int, list[float]] = {}
        self.lock = threading.Lock()

    def listener(self, row: int) -> Any:
        def heard(_index: int, ids: list[int], _done: bool) -> None:
            now = time.perf_counter()
            with self.lock:
                seen = self.times.setdefault(row, [])
                seen.extend([now] * (len(ids) - len(seen)))
        return heard

    def count(self, row: int) -> int:
        with self.lock:
            return len(self.times.get(row, []))


def trial(engine: Any, args: argparse.Namespace, seed: int) -> dict[str, float]:
    from hunyuan_mt.adapters.request import Pair
    from hunyuan_mt.scheduler.engine import Row
    from hunyuan_mt.scheduler.ticket import Ticket

    clock = Clock()
    t0 = time.perf_counter()
    futures = []
    for i in range(args.streams):
        row = Row(_words(args.short, seed + i), "en", "es", Pair.parse("en2es"), args.new)
        futures += engine.submit([row], Ticket(on_tokens=clock.listener(i)))
    deadline = time.monotonic() + 600
    while any(clock.count(i) < 3 for i in range(args.streams)):
        if time.monotonic() > deadline:
            raise SystemExit("the running streams did not start within 10 minutes")
        time.sleep(0.002)
    submitted = time.perf_counter()
    long_row = Row(_words(args.long, seed + 99), "en", "de", Pair.parse("en2de"), 4)
    futures += engine.submit([long_row], Ticket(on_tokens=clock.listener(-1)))
    time.sleep(args.late)
    late = time.perf_counter()
    late_row = Row(_words(args.short, seed + 77), "en", "es", Pair.parse("en2es"), 4)
    futures += engine.submit([late_row], Ticket(on_tokens=clock.listener(-2)))
    for f in futures:
        f.result(timeout=1200)
    end = time.perf_counter()
    first = clock.times[-1][0]
    stall, before = 0.0, []
    for i in range(args.streams):
        times = clock.times[i]
        before += [b - a for a, b in zip(times, times[1:]) if b <= submitted]
        during = [b - a for a, b in zip(times, times[1:]) if b > submitted and a < first]
        stall = max([stall] + during)
    return {"stall_ms": stall * 1000, "step_ms": statistics.median(before) * 1000,
            "first_token_s": first - submitted, "late_first_token_s": clock.times[-2][0] - late,
            "trial_s": end - t0}


def load(preset: str, folder: Any, threads: int) -> tuple[Any, Any]:
    """The backbone (int8, the serving default kernel) and an adapter cache over bench.hunyuan_cpu's random model
    of `preset` (built in `folder` once), en2es and en2de pinned."""
    from hunyuan_mt.adapters.cache import AdapterCache
    from hunyuan_mt.adapters.registry import AdapterRegistry
    from hunyuan_mt.runtime.backbone import Backbone
    from hunyuan_mt.config import CacheConfig, ModelConfig

    from .hunyuan_cpu import build

    model_dir = build(preset, folder)
    backbone = Backbone.load_uncached(ModelConfig(path=str(model_dir), quantization="int8", warmup=False,
                                                  cpu_threads=threads, compile="false"))
    registry = AdapterRegistry(folder / "adapters", backbone.spec)
    registry.scan()
    cache = AdapterCache(backbone, registry, CacheConfig(adapters_dir=str(folder / "adapters"), slots=3,
                                                         pinned=["en2es", "en2de"]))
    cache.start()
    return backbone, cache


def make_engine(backbone: Any, cache: Any, chunk: str, new: int) -> Any:
    """The engine as the service makes it, with `engine.prefill_chunk_tokens` = `chunk`."""
    from hunyuan_mt.config import EngineConfig, GenerationConfig, LimitsConfig
    from hunyuan_mt.scheduler.engine import BatchEngine

    # Random weights: no end token is expected, the guard would cut their repetitions, and the output cap is
    # the row's own.
    limits = LimitsConfig(max_new_tokens=max(new, 8), loop_repeats=0, max_output_ratio=0)
    return BatchEngine(backbone, cache, EngineConfig(max_wait_ms=0, prefill_chunk_tokens=chunk), GenerationConfig(),
                       limits)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chunked_prefill", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="hy-mt1.5-1.8b")
    parser.add_argument("--chunks", default="off,128,64", help="engine.prefill_chunk_tokens values to compare")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--streams", type=int, default=2)
    parser.add_argument("--short", type=int, default=24, help="words of each running stream's text")
    parser.add_argument("--new", type=int, default=200, help="tokens each running stream generates")
    parser.add_argument("--long", type=int, default=480, help="words of the long row's text")
    parser.add_argument("--late", type=float, default=0.2,
                        help="seconds after the long row a short request arrives")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    from .hunyuan_cpu import cpu_line

    backbone, cache = load(args.preset, WORK / args.preset, args.threads)
    chunks = [c.strip() for c in args.chunks.split(",") if c.strip()]
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in chunks}
    for run in range(args.runs + 1):   # run 0 warms every setting's shapes and is not kept
        for chunk in chunks:
            engine = make_engine(backbone, cache, chunk, args.new)
            try:
                result = trial(engine, args, seed=run * 10)
            finally:
                engine.close()
            if run:
                runs[chunk].append(result)
            print(f"run {run} chunk {chunk}: " + ", ".join(f"{k} {v:.3g}" for k, v in result.items()), flush=True)
    medians = {c: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for c, rows in runs.items()}
    # Ratios per run (the settings alternate within a run), then their median: the box's speed drifts between runs.
    ratios = {c: {k: statistics.median(r[k] / b[k] for r, b in zip(runs[c], runs[chunks[0]])) for k in medians[c]}
              for c in chunks}
    command = "python -m bench.chunked_prefill" + "".join(
        f" --{k} {v}" for k, v in vars(args).items() if v != parser.get_default(k))
    lines = [f"# A long prompt beside running streams (`{command}`)", "",
             f"CPU: {cpu_line()}; preset {args.preset}, int8 ({backbone.int8_kernel}), {args.threads} threads; "
             f"{args.streams} running streams of {args.short} words, a long row of {args.long} words; medians of "
             f"{args.runs} runs, and in brackets the median of each run's ratio to `{chunks[0]}`.", "",
             "| engine.prefill_chunk_tokens | " + " | ".join(chunks) + " |", "|---|" + "---:|" * len(chunks)]
    for key, label, fmt in (("stall_ms", "running streams' longest gap", "{:,.0f} ms"),
                            ("step_ms", "their step before", "{:.1f} ms"),
                            ("first_token_s", "the long row's first token", "{:.2f} s"),
                            ("late_first_token_s", "a short request's first token, sent 0.2 s after it",
                             "{:.2f} s"),
                            ("trial_s", "whole trial", "{:.1f} s")):
        cells = [fmt.format(medians[c][key]) + ("" if c == chunks[0] else f" ({ratios[c][key]:.2f}×)")
                 for c in chunks]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    write_results("chunked_prefill", {"args": vars(args), "cpu": cpu_line(), "runs": runs, "medians": medians,
                                      "ratios": ratios}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
