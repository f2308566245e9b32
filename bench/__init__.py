"""Benchmarks: the batching engine against the usual ways of serving per-pair adapters.

Not tests: timings live here, never in `tests/`. Entry points:

- `python -m hunyuan_mt bench` (or `python -m bench.run`): throughput/latency over workloads W1/W2 and variants
  B0/B1/B2/ours, cold start, memory scaling, pinned first request, RAM-tier vs disk attach. Writes JSON, a markdown
  table and a PNG plot to `bench/results/`.
- `python -m bench.soak`: a bounded soak over HTTP against the real app.

Every measurement that loads a model runs in its own subprocess (`bench.worker`), so peak RSS belongs to one
variant and no variant inherits another's warm caches.
"""
