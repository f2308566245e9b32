"""Does a request's output depend on the requests beside it? (Invariant 5, in-process, at scale.)

    python -m bench.invariance                                  # the default profile, 160 requests, 16 callers
    python -m bench.invariance --set model.quantization=none    # float32
    python -m bench.invariance --set model.compile=false        # the eager step

The held-out UI strings of the 8 shipped directions (`bench.peer.sentences`), 20 per direction, are translated one at
a time on an idle service, then by `--callers` threads at once, so that rows of mixed pairs and lengths share the
running batch. Reported: how many answers are the same both ways, and the ones that are not. The tests check the
invariant on small cases in float32; this shows it where int8 rounding can amplify float32 rounding that differs
with the batch's shape (BENCHMARKS.md). Results: bench/results/invariance.{json,md}.
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

from .peer import PAIRS, sentences
from .report import write_results


def requests(per_pair: int) -> list[tuple[str, str, str]]:
    """(text, source, target), pair after pair."""
    ui = sentences(False)["ui"]
    return [(text, pair[:2], pair[3:]) for pair in PAIRS for text, _ in ui[pair][:per_pair]]


def concurrently(service: Any, reqs: list[tuple[str, str, str]], callers: int) -> list[str]:
    out: list[str] = [""] * len(reqs)
    pending = iter(range(len(reqs)))
    lock = threading.Lock()

    def caller() -> None:
        while True:
            with lock:
                i = next(pending, None)
            if i is None:
                return
            text, src, tgt = reqs[i]
            out[i] = service.translate(text, src, tgt).text

    threads = [threading.Thread(target=caller, name=f"caller-{n}") for n in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.invariance", description=__doc__.splitlines()[0])
    p.add_argument("--per-pair", type=int, default=20)
    p.add_argument("--callers", type=int, default=16)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override, repeatable")
    args = p.parse_args(argv)

    from hunyuan_mt.config import load_config
    from hunyuan_mt.service.translation import TranslationService

    overrides: dict[str, Any] = {"tm.enabled": False, "memory.enabled": False, "model.warmup": True}
    overrides.update(dict(item.split("=", 1) for item in args.set))
    service = TranslationService(load_config(None, overrides, env={}))
    service.wait_full_speed()  # the step a warm server decodes with
    try:
        service.wait_ready(600)
        backbone = service.status()["backbone"]
        reqs = requests(args.per_pair)
        alone = [service.translate(text, src, tgt).text for text, src, tgt in reqs]
        together = concurrently(service, reqs, args.callers)
    finally:
        service.close()
    differ = [{"text": t, "pair": f"{s}2{g}", "alone": a, "beside_others": b}
              for (t, s, g), a, b in zip(reqs, alone, together) if a != b]
    data = {"args": vars(args), "quantization": backbone.get("quantization"),
            "int8_kernel": backbone.get("int8_kernel"), "requests": len(reqs),
            "identical": len(reqs) - len(differ), "differ": differ}
    command = "python -m bench.invariance" + "".join(
        f" --{name.replace('_', '-')} {value}" for name, value in (("per_pair", args.per_pair),
                                                                  ("callers", args.callers))
        if value != p.get_default(name)) + "".join(" --set " + s for s in args.set)
    lines = [f"# Alone against beside others: {len(reqs)} requests, {args.callers} callers (`{command}`)", "",
             f"Weights: {data['quantization']}{' (' + data['int8_kernel'] + ')' if data['int8_kernel'] else ''}. "
             f"**{data['identical']}/{len(reqs)}** answers identical.", ""]
    if differ:
        lines += ["| pair | source | alone | beside others |", "|---|---|---|---|"]
        lines += [f"| {d['pair']} | {d['text']} | {d['alone']} | {d['beside_others']} |" for d in differ]
    write_results("invariance", data, lines)
    return 0 if not differ else 1


if __name__ == "__main__":
    raise SystemExit(main())
