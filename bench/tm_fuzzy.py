"""Fuzzy translation-memory lookup: its cost per segment at 50k entries, and what its word prefilter misses.

    python -m bench.tm_fuzzy            # the demo's shipped en→fr memory (52.8k entries), 300 near queries

Each query is an entry of the memory with one word reversed (or " now" added to a one- or two-word entry), so a
near entry exists. Both ways use rapidfuzz's ratio at tm.fuzzy_threshold 0.75: every entry compared, or only
those sharing one of the query's three rarest words (tm.py, what the service does). Reported: ms per lookup
(medians of 3 passes), and how often the prefilter finds the same best score. Results: bench/results/tm_fuzzy.md.
"""

from __future__ import annotations

import random
import statistics
import time

from hunyuan_mt.config import PROJECT_ROOT
from hunyuan_mt.store.tm import TranslationMemory

from .report import write_results

THRESHOLD = 0.75


def main() -> int:
    from rapidfuzz import fuzz, process

    memory = TranslationMemory(PROJECT_ROOT / "tm-none", PROJECT_ROOT / "models" / "demo" / "memory")
    memory.preload(["en2fr"], fuzzy=True)
    entries = memory._entries("en2fr")
    keys = list(entries.exact)
    folded = [k.casefold() for k in keys]
    rng = random.Random(1)
    queries = []
    for key in rng.sample(keys, 300):
        words = key.split()
        if len(words) > 2:
            j = rng.randrange(len(words))
            words[j] = words[j][::-1]
        else:
            words.append("now")
        queries.append(" ".join(words))

    def timed(lookup) -> tuple[float, list]:
        passes = []
        for _ in range(3):
            t0 = time.perf_counter()
            found = [lookup(q) for q in queries]
            passes.append((time.perf_counter() - t0) / len(queries) * 1000)
        return statistics.median(passes), found

    full_ms, full = timed(lambda q: process.extractOne(q.casefold(), folded, scorer=fuzz.ratio,
                                                         score_cutoff=THRESHOLD * 100))
    fast_ms, fast = timed(lambda q: entries.nearest(q, THRESHOLD))
    same = sum((a is None and b is None) or (a is not None and b is not None and round(a[1] / 100, 3) == b.score)
               for a, b in zip(full, fast))
    lines = ["# Fuzzy memory lookup (`python -m bench.tm_fuzzy`)", "",
             f"{len(keys)} entries (the demo's en→fr memory), {len(queries)} near queries, threshold {THRESHOLD}, "
             "medians of 3 passes.", "",
             "| way | ms per lookup | found |", "|---|---:|---:|",
             f"| every entry compared | {full_ms:.2f} | {sum(a is not None for a in full)} |",
             f"| entries sharing a rare word (shipped) | {fast_ms:.2f} | {sum(b is not None for b in fast)} |", "",
             f"Same best score: {same} of {len(queries)}."]
    write_results("tm_fuzzy", {"entries": len(keys), "queries": len(queries), "full_ms": full_ms,
                               "indexed_ms": fast_ms, "same_best": same}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
