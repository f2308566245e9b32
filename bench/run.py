"""The benchmark driver: `python -m bench.run` (also `python -m hunyuan_mt bench`).

It prepares the adapters folders (demo adapters + generated extra pairs), then runs, `--runs` times and interleaved
so that drift in machine load hits every variant alike:
  1. every variant over W1 and W2 at each concurrency level (one fresh process per variant and run);
  2. cold start to a first translation: ours against the reference (tokenizer + safetensors load + one forward);
and once: 3. the memory-scaling run (ours and B2 with 4, 38, 200 registered pairs, plus RAM-tier vs disk attach).
Results: bench/results/bench.json, bench.md, bench.png. Every run is bounded by request counts and time caps.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from hunyuan_mt.config import PROJECT_ROOT, load_config, parse_set_args

from . import report
from .workload import TEXTS, all_pairs, w1, w2

RESULTS = PROJECT_ROOT / "bench" / "results"
WORKDIR = RESULTS / "tmp"
VARIANTS = ("B0", "B1", "B2", "ours")

#: Default request caps per concurrency level, sized so the whole default bench (3 runs) fits in ~15 minutes on a
#: 2-core CPU with the demo model. B0 loads the model per request, so it gets a few requests (its QPS is exact;
#: at c ≥ its cap the clients run one partial wave, see BENCHMARKS.md).
DEFAULT_REQUESTS = {1: 16, 4: 32, 16: 64, 64: 128}
DEFAULT_B0_REQUESTS = {1: 2, 4: 3, 16: 3, 64: 3}
#: B2 serves exactly like B1 (set_adapter under a lock); it exists for memory, so by default it runs in the
#: memory-scaling part only. `--variants B0,B1,B2,ours` adds it to the load runs.
DEFAULT_LOAD_VARIANTS = ("B0", "B1", "ours")
QUICK_REQUESTS = {1: 5, 4: 5, 16: 5, 64: 5}


def _levels_map(text: str) -> dict[int, int]:
    """"1:30,4:60" → {1: 30, 4: 60}."""
    out = {}
    for item in text.split(","):
        level, _, n = item.partition(":")
        out[int(level)] = int(n)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="config profile or YAML path (default: configs/default.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override, repeatable")
    p.add_argument("--runs", type=int, default=3, help="repeat the load and cold-start runs; medians are reported")
    p.add_argument("--variants", default=",".join(DEFAULT_LOAD_VARIANTS),
                   help="variants of the load runs, from B0,B1,B2,ours (the memory run always compares ours and B2)")
    p.add_argument("--levels", default="1,4,16,64", help="closed-loop client counts")
    p.add_argument("--requests", default=None, help="requests per level, e.g. 1:30,4:60,16:128,64:256")
    p.add_argument("--b0-requests", default=None, help="B0's requests per level (it reloads the model each time)")
    p.add_argument("--time-cap", type=float, default=10.0, help="seconds after which a cell issues no new request")
    p.add_argument("--memory-pairs", default="4,38,200", help="registered pairs for the memory-scaling run ('' skips)")
    p.add_argument("--b2-preload-cap", type=float, default=60.0,
                   help="seconds B2 may spend attaching adapters at start in the memory run (it reports how many)")
    p.add_argument("--skip-cold", action="store_true", help="skip the cold-start comparison")
    p.add_argument("--quick", action="store_true", help="smoke run: 5 requests per cell, 1 run, 4 and 12 pairs")
    p.add_argument("--out", type=Path, default=RESULTS, help="where bench.json/.md/.png go")
    p.add_argument("--workdir", type=Path, default=WORKDIR, help="generated adapters and worker scratch")
    p.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: torch's default)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    from .adapters import prepare_adapters, trained_adapters  # torch: only once a run starts, not for --help

    t_start = time.perf_counter()
    # The engine is what is measured: the translation memory would answer some workload texts without it.
    # No bench request asks for detection. A smoke run (--quick) starts no detector helper in its ~9 worker
    # processes (lingua's models: ~5 s of a core and ~420 MB each); a full run keeps it, as a server runs, so that
    # its memory figures stay those of BENCHMARKS.md.
    quick = {"routing.detect": False} if args.quick else {}
    overrides = {"tm.enabled": False, **quick, **parse_set_args(args.set)}
    cfg = load_config(args.config, overrides=overrides)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variant(s) {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    levels = [int(x) for x in args.levels.split(",")]
    if args.quick:
        runs, req_caps, b0_caps = 1, dict(QUICK_REQUESTS), dict(QUICK_REQUESTS)
        sizes, n_w1, n_w2 = ([4, 12] if args.memory_pairs else []), 12, 6
    else:
        runs = args.runs
        req_caps = _levels_map(args.requests) if args.requests else dict(DEFAULT_REQUESTS)
        b0_caps = _levels_map(args.b0_requests) if args.b0_requests else dict(DEFAULT_B0_REQUESTS)
        sizes = [int(x) for x in args.memory_pairs.split(",") if x]
        n_w1, n_w2 = 38, 12
    for lv in levels:
        req_caps.setdefault(lv, max(req_caps.values()))
        b0_caps.setdefault(lv, max(b0_caps.values()))

    # ---- pairs and adapters folders
    model_dir = cfg.model.resolved_path
    templates = trained_adapters(cfg.cache.resolved_dir)
    first = list(cfg.cache.pinned) + [t.name for t in templates]
    pairs = all_pairs(first)
    hot = min(5, n_w2)
    pinned = pairs[:hot]
    args.workdir.mkdir(parents=True, exist_ok=True)
    log(f"model {model_dir}, {len(templates)} trained adapters to copy, hot/pinned {pinned}")
    main_dir = prepare_adapters(args.workdir / f"adapters_{n_w1}", model_dir, cfg.cache.resolved_dir, pairs[:n_w1])
    workloads = [w1(pairs, hot=hot, registered=n_w1), w2(pairs, n=n_w2, registered=n_w1)]

    common = {"config": args.config, "threads": args.threads,
              "overrides": {**overrides, "cache.slots": cfg.cache.slots, "cache.pinned": pinned}}
    ours_overrides = {**common["overrides"], "cache.adapters_dir": str(main_dir)}
    probe = {"pair": pinned[0], "src": pinned[0].split("2")[0], "tgt": pinned[0].split("2", 1)[1],
             "text": TEXTS[0]}

    results: dict[str, Any] = {"machine": machine(), "config": cfg.to_dict(), "args": _jsonable(vars(args)),
                               "pinned": pinned, "workloads": [w.to_dict() for w in workloads],
                               "load": [], "cold": [], "memory": [], "failures": []}
    # ---- 1 + 2: interleaved runs
    for r in range(runs):
        for v in variants:
            caps = b0_caps if v == "B0" else req_caps
            spec = {**common, "kind": "load", "variant": v, "adapters_dir": str(main_dir),
                    "overrides": ours_overrides, "workloads": [w.to_dict() for w in workloads],
                    "levels": levels, "max_requests": {str(k): caps[k] for k in levels},
                    "stream_len": max(req_caps.values()), "time_cap_s": args.time_cap, "seed": r,
                    "warmup_requests": 0 if v == "B0" else 8, "pinned_probe": probe if v == "ours" else None}
            out = _worker(spec, args.workdir, f"load-{v}-r{r}", timeout=180 + len(levels) * 2 * (args.time_cap + 60))
            if out is not None:
                out["run"] = r
                results["load"].append(out)
            else:
                results["failures"].append(f"load {v} run {r}")
        if not args.skip_cold and "ours" in variants:
            for kind in ("cold_raw", "cold_ours"):
                spec = {**common, "kind": kind, "adapters_dir": str(main_dir), "overrides": ours_overrides,
                        "probe": probe}
                out = _worker(spec, args.workdir, f"{kind}-r{r}", timeout=300)
                if out is not None:
                    out["run"] = r
                    results["cold"].append(out)
                else:
                    results["failures"].append(f"{kind} run {r}")

    # ---- 3: memory scaling (+ RAM-tier vs disk attach on the largest folder)
    for n in sizes:
        mem_dir = prepare_adapters(args.workdir / f"adapters_{n}", model_dir, cfg.cache.resolved_dir, pairs[:n])
        mem_pinned = pairs[:min(hot, n)]
        for v in ("ours", "B2"):
            spec = {**common, "kind": "memory", "variant": v, "adapters_dir": str(mem_dir), "registered": n,
                    "overrides": {**overrides, "cache.slots": cfg.cache.slots, "cache.pinned": mem_pinned,
                                  "cache.adapters_dir": str(mem_dir)},
                    "text": TEXTS[0], "time_cap_s": max(120.0, args.time_cap),
                    "preload_deadline_s": args.b2_preload_cap}
            cold, slots = pairs[hot:n], cfg.cache.slots
            k = min(5, len(cold) - slots)
            if v == "ours" and n == max(sizes) and k >= 1:
                # Pairs the traffic has not touched yet: the first lease reads the disk, the second the RAM tier.
                spec["attach_probe"] = {"targets": cold[len(cold) - slots - k:len(cold) - slots],
                                        "fillers": cold[-slots:]}
            out = _worker(spec, args.workdir, f"memory-{v}-{n}", timeout=600)
            if out is not None:
                out["adapter_bytes"] = (mem_dir / pairs[0] / "adapter_model.safetensors").stat().st_size
                out["pinned"] = len(mem_pinned)
                out["slots"] = cfg.cache.slots
                results["memory"].append(out)
            else:
                results["failures"].append(f"memory {v} {n}")

    results["wall_s"] = round(time.perf_counter() - t_start, 1)
    results["summary"] = report.summarize(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(results, indent=2, default=str))
    (args.out / "bench.md").write_text(report.markdown(results))
    report.plot(results, args.out / "bench.png")
    log(f"done in {results['wall_s']} s: {args.out / 'bench.md'}")
    return 1 if results["failures"] else 0


def _worker(spec: dict[str, Any], workdir: Path, name: str, timeout: float) -> dict[str, Any] | None:
    """Run one measurement in a fresh interpreter; its "[bench]" lines are echoed, the rest kept for errors."""
    spec_path = workdir / f"{name}.spec.json"
    out_path = workdir / f"{name}.out.json"
    spec_path.write_text(json.dumps(spec, default=str))
    out_path.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    log(f"{name} ...")
    tail: deque[str] = deque(maxlen=40)
    proc = subprocess.Popen([sys.executable, "-m", "bench.worker", str(spec_path), str(out_path)], cwd=PROJECT_ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def pump() -> None:  # a thread, so a silent worker cannot keep us past the timeout
        assert proc.stderr is not None
        for line in proc.stderr:
            tail.append(line.rstrip())
            if line.startswith("[bench]"):
                print(line.rstrip(), file=sys.stderr, flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
        tail.append(f"killed after the {timeout:.0f} s timeout")
    reader.join(timeout=5)
    if rc != 0 or not out_path.is_file():
        log(f"{name} FAILED (exit {rc}); last lines:\n  " + "\n  ".join(tail))
        return None
    return json.loads(out_path.read_text())


def machine() -> dict[str, Any]:
    import psutil
    import torch

    info = {"cpu_count": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
            "ram_gb": round(psutil.virtual_memory().total / 2**30, 1), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.cuda.is_available(), "load_avg_at_start": os.getloadavg(),
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    try:
        import transformers
        import peft

        info["transformers"], info["peft"] = transformers.__version__, peft.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in d.items()}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
