"""Where a lone stream's first piece goes: the service in this process, one stream at a time, each a new text.

    python -m bench.first_piece                        # 40 streams, en→es, the default profile (compiled step)
    python -m bench.first_piece --compare-trim         # also: the heap trimmed after every drained batch
    python -m bench.first_piece --streams 80 --set model.compile=false

The service is built as app.py builds it (warm-up included) and waits until ready. Each stream is
`translate_stream` of a different 18-word sentence, the next one sent as soon as the last has ended (what a page
or script that translates sentence after sentence does). Timestamps around the service's and the engine's parts
give, per stream, from the call:
- `before the engine`: cleaning, planning, masking, splitting, the translation memory (of which `memory check`,
  the store's stamp query) and tokenizing, until the rows are queued;
- `engine started`: when the engine's round that admits them begins (after `before the engine`, the engine's
  wake-up);
- `prefill`: the encoder and the rows' entry into the batch;
- `first step`: the first decode step (its cache reserved), against a later one (`steady step`, the 6th);
- `first piece`: the first non-empty text the stream yields, and its share of the whole stream.
Medians over the streams. `--compare-trim` alternates blocks of 10 streams between the heap policy in use
(`heap.trim_if_grown`) and a trim after every drained batch (the policy before 2026-12-06), in this one process.
Results: bench/results/first_piece.{json,md}.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Any, Callable

from .report import write_results

WORDS = ("printer report folder window settings backup drive password meeting update disk copy file server network "
         "account message screen keyboard camera").split()


def sentences(n: int) -> list[str]:
    """`n` different 18-word sentences of one shape (the words vary, so no cache answers a later one)."""
    out = []
    for i in range(n):
        a, b, c = WORDS[i % len(WORDS)], WORDS[(i * 7 + 3) % len(WORDS)], WORDS[(i * 11 + 5) % len(WORDS)]
        out.append(f"The {a} on the second floor is not working, so use the {b} and save the {c} first.")
    return out


class Timeline:
    """Timestamps of named events in this process (any thread), for one stream at a time."""

    def __init__(self) -> None:
        self.events: list[tuple[str, float]] = []

    def mark(self, name: str) -> None:
        self.events.append((name, time.perf_counter()))

    def around(self, owner: Any, attr: str, name: str) -> None:
        """Mark `name>` and `name<` around every call of owner.attr."""
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def marked(*args: Any, **kwargs: Any) -> Any:
            self.mark(name + ">")
            try:
                return fn(*args, **kwargs)
            finally:
                self.mark(name + "<")

        setattr(owner, attr, marked)

    def at(self, name: str, k: int = 0, after: float = float("-inf")) -> float:
        found = [t for n, t in self.events if n == name and t >= after]
        return found[k] if len(found) > k else float("nan")


def one_stream(service: Any, timeline: Timeline, text: str) -> dict[str, float]:
    timeline.events.clear()
    t0 = time.perf_counter()
    first: float | None = None
    for item in service.translate_stream(text, "en", "es"):
        if first is None and isinstance(item, str) and item.strip():
            first = time.perf_counter()
    first = float("nan") if first is None else first   # a stream that never showed text: no numbers
    whole = time.perf_counter()
    at = timeline.at
    queued = at("submit<")
    ms = lambda t: (t - t0) * 1000  # noqa: E731
    return {
        "before the engine": ms(queued),
        "memory check": (at("stamp<") - at("stamp>")) * 1000,
        "engine started": ms(at("iterate>", after=queued)),
        "prefill": (at("add<") - at("add>")) * 1000,
        "first step": (at("step<") - at("step>")) * 1000,
        "steady step": (at("step<", 5) - at("step>", 5)) * 1000,
        "first piece": ms(first),
        "first piece ÷ whole": (first - t0) / (whole - t0),
    }


def instrument(service: Any) -> Timeline:
    from hunyuan_mt.scheduler import engine as engine_module
    from hunyuan_mt.decode import batch as batch_module

    timeline = Timeline()
    timeline.around(engine_module.BatchEngine, "submit", "submit")
    timeline.around(engine_module.BatchEngine, "_iterate", "iterate")
    timeline.around(batch_module.Prefill, "advance", "add")   # the engine runs a prefill a forward a round
    timeline.around(batch_module.RunningBatch, "step", "step")
    timeline.around(service.tm.rows, "stamp", "stamp")
    return timeline


def _policies() -> dict[str, Callable[..., bool]]:
    from hunyuan_mt.host import heap

    def always(slack: int = 0) -> bool:
        heap.trim()
        return True

    return {"trim if grown (in use)": heap.trim_if_grown, "trim after every batch (before)": always}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.first_piece", description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=40)
    parser.add_argument("--compare-trim", action="store_true")
    from hunyuan_mt.config import add_config_arguments

    add_config_arguments(parser)
    args = parser.parse_args(argv)

    from hunyuan_mt.scheduler import engine as engine_module
    from hunyuan_mt.config import load_config, parse_set_args
    from hunyuan_mt.service.translation import TranslationService

    from .hunyuan_cpu import cpu_line

    service = TranslationService(load_config(args.config, parse_set_args(args.set)))
    service.wait_full_speed()  # a warm server's first piece, not one beside the background build
    try:
        if not service.wait_ready(900):
            raise SystemExit("the service did not become ready in 15 minutes")
        time.sleep(1.0)
        timeline = instrument(service)
        texts = sentences(args.streams * (2 if args.compare_trim else 1))
        policies = _policies() if args.compare_trim else {"trim if grown (in use)": engine_module.heap.trim_if_grown}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in policies}
        blocks = [texts[i:i + 10] for i in range(0, len(texts), 10)]
        for n, block in enumerate(blocks):
            name = list(policies)[n % len(policies)]
            engine_module.heap.trim_if_grown = policies[name]
            service.translate_batch(["Warm the block."], "en", "es")  # one drained batch under this policy first
            runs[name] += [one_stream(service, timeline, text) for text in block]
        engine_module.heap.trim_if_grown = policies["trim if grown (in use)"]
    finally:
        service.close()
    medians = {name: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
               for name, rows in runs.items()}
    command = "python -m bench.first_piece" + (f" --streams {args.streams}" if args.streams != 40 else "") + \
        (" --compare-trim" if args.compare_trim else "") + "".join(f" --set {s}" for s in args.set)
    lines = [f"# A lone stream's first piece (`{command}`)", "", f"CPU: {cpu_line()}; "
             f"{len(next(iter(runs.values())))} streams of a new 18-word en→es sentence each per column; ms from "
             "the call, medians.", "",
             "| measure | " + " | ".join(medians) + " |", "|---|" + "---:|" * len(medians)]
    for key in next(iter(medians.values())):
        digits = 3 if "÷" in key else 2
        lines.append(f"| {key} | " + " | ".join(f"{m[key]:.{digits}f}" for m in medians.values()) + " |")
    write_results("first_piece", {"args": vars(args), "cpu": cpu_line(), "medians": medians, "runs": runs}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
