"""One measurement in a fresh process: `python -m bench.worker SPEC.json OUT.json`.

Kinds:
- "load": start one variant, run every (workload, concurrency) cell, report latencies, counters and peak memory.
  For ours it first measures a pinned pair's first request against its steady state.
- "cold_raw" / "cold_ours": time to a first result from a fresh process: the reference (tokenizer + safetensors
  model load + one forward pass) or the full service (backbone, registry, pinned adapters, warm-up, translate).
- "memory": resident memory of ours or B2 after traffic over every registered pair (4, 38, 200 pairs).
  For ours it also times lease() of pairs attached from disk against pairs re-attached from the RAM tier.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PROCESS_T0 = time.perf_counter()


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def trimmed_rss_mb() -> float:
    """RSS after freeing what Python and glibc hold on to, so "resident" compares like with like."""
    from hunyuan_mt.host import heap

    heap.collect_and_trim()
    return rss_mb()


def gpu_peak_mb() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated() / 2**20


# --------------------------------------------------------------------------------------------------------------
# Variants


def build_config(spec: dict[str, Any]):
    from hunyuan_mt.config import load_config

    return load_config(spec.get("config"), overrides=spec.get("overrides") or {})


def model_spec(cfg, adapters_dir: Path):
    from .baselines import ModelSpec

    return ModelSpec(model_dir=cfg.model.resolved_path, adapters_dir=adapters_dir, device=cfg.model.device,
                     dtype=cfg.model.dtype, max_new_tokens=cfg.limits.max_new_tokens,
                     num_beams=cfg.generation.num_beams,
                     repetition_penalty=cfg.generation.resolved(None).repetition_penalty)


def make_variant(name: str, cfg, adapters_dir: Path, preload_deadline_s: float | None = None):
    from .baselines import AllAttached, ReloadPerRequest, SetAdapterServer
    from .ours import Ours

    if name == "ours":
        return Ours(cfg)
    spec = model_spec(cfg, adapters_dir)
    if name == "B2":
        return AllAttached(spec, preload_deadline_s=preload_deadline_s)
    return {"B0": ReloadPerRequest, "B1": SetAdapterServer}[name](spec)


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}


def hit_rate(counters: dict[str, float]) -> float | None:
    """Share of adapter lookups served by an adapter already attached (pinned or in a slot)."""
    lookups = counters.get("lookups", 0)
    return None if not lookups else round(counters.get("hits", 0) / lookups, 4)


# --------------------------------------------------------------------------------------------------------------
# Kinds


def run_load(spec: dict[str, Any]) -> dict[str, Any]:
    from .loadgen import closed_loop, summarize
    from .workload import Workload, requests

    cfg = build_config(spec)
    variant = make_variant(spec["variant"], cfg, Path(spec["adapters_dir"]))
    t0 = time.perf_counter()
    variant.start()
    out: dict[str, Any] = {"variant": variant.name, "start_s": round(time.perf_counter() - t0, 3),
                           "rss_mb_started": round(rss_mb(), 1), "cells": []}
    if spec["variant"] == "ours" and spec.get("pinned_probe"):
        out["pinned_first"] = pinned_first(variant, spec["pinned_probe"])
    for wl_dict in spec["workloads"]:
        wl = Workload(**{k: tuple(v) if isinstance(v, list) else v for k, v in wl_dict.items()})
        stream = requests(wl, spec["stream_len"], seed=spec.get("seed", 0))
        warm = spec.get("warmup_requests", 0)
        if warm:
            closed_loop(variant.translate, stream[-warm:], min(4, warm), warm, spec["time_cap_s"])
        for level in spec["levels"]:
            cap = spec["max_requests"][str(level)]
            before = variant.counters()
            lat, errs, wall, issued, capped = closed_loop(variant.translate, stream, level, cap, spec["time_cap_s"])
            cell = summarize(variant.name, wl.name, level, lat, errs, wall, issued, capped)
            cell.counters = _delta(variant.counters(), before)
            cell.hit_rate = hit_rate(cell.counters)
            cell.rss_mb_after = round(rss_mb(), 1)
            out["cells"].append(cell.to_dict())
            print(f"[bench] {variant.name} {wl.name} c={level}: {cell.completed} ok, {cell.errors} err, "
                  f"{cell.qps} qps, p50 {cell.p50_ms} ms, p95 {cell.p95_ms} ms", file=sys.stderr, flush=True)
    out["peak_rss_mb"] = round(peak_rss_mb(), 1)
    out["gpu_peak_mb"] = gpu_peak_mb()
    if hasattr(variant, "extra"):
        out["extra"] = variant.extra()
    variant.close()
    return out


def wait_for_detector_warmup() -> float:
    """Wait until the service's language detector (a helper process, started with the service) has loaded."""
    from hunyuan_mt.text import detect

    t0 = time.perf_counter()
    if detect._detector is not None:
        detect.warm(timeout=120)
    return time.perf_counter() - t0


def pinned_first(variant, probe: dict[str, str]) -> dict[str, Any]:
    """Latency of the very first request on a pinned pair after start, against the same request repeated."""
    from .workload import Request

    # The service loads the language detector in a helper process; on 2 cores it competes with the first request
    # for CPU, which is not what pinning is about. Wait for it (bounded) and report how long that took.
    waited = wait_for_detector_warmup()
    req = Request(**probe)
    t0 = time.perf_counter()
    variant.translate(req)
    first = (time.perf_counter() - t0) * 1000
    steady = []
    for _ in range(9):
        t0 = time.perf_counter()
        variant.translate(req)
        steady.append((time.perf_counter() - t0) * 1000)
    med = statistics.median(steady)
    return {"pair": req.pair, "first_ms": round(first, 2), "steady_median_ms": round(med, 2),
            "ratio": round(first / med, 3), "waited_for_detector_warmup_s": round(waited, 2)}


def run_cold(spec: dict[str, Any]) -> dict[str, Any]:
    """Both kinds first import the same libraries and the model's class (transformers imports model modules
    lazily, which would otherwise land inside the timed region), timed apart; then time load → first result."""
    t_imp = time.perf_counter()
    import peft  # noqa: F401
    import torch
    import transformers
    from safetensors.torch import load_file

    from .workload import Request

    cfg = build_config(spec)
    hf_config = transformers.AutoConfig.from_pretrained(cfg.model.resolved_path)
    for arch in hf_config.architectures or []:
        getattr(transformers, arch, None)
    if spec["kind"] == "cold_ours":
        from hunyuan_mt.service.translation import TranslationService
    from .baselines import PlainModel

    imports_s = time.perf_counter() - t_imp
    req = Request(**spec["probe"])
    if spec["kind"] == "cold_raw":
        t0 = time.perf_counter()
        plain = PlainModel(model_spec(cfg, Path(spec["adapters_dir"])))
        model = plain.load_model()
        batch, _ = plain.encode(req)
        with torch.inference_mode():
            if plain.encoder_decoder and "decoder_input_ids" not in batch:
                start = model.config.decoder_start_token_id
                batch["decoder_input_ids"] = torch.tensor([[start]], device=plain.device)
            model(**batch)
        first_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        for f in sorted(cfg.model.resolved_path.glob("*.safetensors")):
            load_file(str(f))
        read_s = time.perf_counter() - t1
        return {"kind": "cold_raw", "imports_s": round(imports_s, 3), "first_s": round(first_s, 3),
                "safetensors_read_s": round(read_s, 4),
                "since_process_start_s": round(time.perf_counter() - PROCESS_T0, 3), "rss_mb": round(rss_mb(), 1)}
    t0 = time.perf_counter()
    service = TranslationService(cfg)
    started_s = time.perf_counter() - t0
    result = service.translate(req.text, req.src, req.tgt)
    first_s = time.perf_counter() - t0
    # Closed before the process ends: an exit while its warm-up thread was still in a forward aborted the process
    # ("terminate called without an active exception") once no detector helper held the exit up.
    service.close()
    return {"kind": "cold_ours", "imports_s": round(imports_s, 3), "first_s": round(first_s, 3),
            "service_init_s": round(started_s, 3), "backbone": service.backbone.info(),
            "since_process_start_s": round(time.perf_counter() - PROCESS_T0, 3), "rss_mb": round(rss_mb(), 1),
            "text": result.text}


def run_memory(spec: dict[str, Any]) -> dict[str, Any]:
    from .loadgen import closed_loop
    from .workload import Request, split_pair

    cfg = build_config(spec)
    adapters_dir = Path(spec["adapters_dir"])
    rss_before = trimmed_rss_mb()
    variant = make_variant(spec["variant"], cfg, adapters_dir, spec.get("preload_deadline_s"))
    variant.start()
    wait_for_detector_warmup()  # ours loads lingua's models in a helper process: let it finish before measuring
    rss_started = trimmed_rss_mb()
    out: dict[str, Any] = {"variant": variant.name, "registered": spec["registered"],
                           "rss_mb_before_model": round(rss_before, 1), "rss_mb_started": round(rss_started, 1)}
    if spec["variant"] == "ours" and spec.get("attach_probe"):
        out["attach"] = variant.attach_probe(spec["attach_probe"])
    pairs = sorted(p.name for p in adapters_dir.iterdir() if (p / "adapter_config.json").is_file())
    if spec["variant"] == "B2":
        # B2's memory is its attached adapters; its serving path is B1's. A sample of the attached pairs is
        # enough traffic (a pair it did not attach in time would be a B1-style lazy load, not B2).
        pairs = [p for p in pairs if p in variant.preload][:spec.get("b2_requests", 40)]
    text = spec["text"]
    stream = [Request(p, *split_pair(p), text) for p in pairs]
    lat, errs, wall, _, _ = closed_loop(variant.translate, stream, 4, len(stream), spec["time_cap_s"])
    out.update({"served": len(lat), "errors": len(errs), "error_samples": sorted(set(errs))[:3],
                "wall_s": round(wall, 2), "rss_mb_after_traffic": round(trimmed_rss_mb(), 1),
                "peak_rss_mb": round(peak_rss_mb(), 1), "gpu_peak_mb": gpu_peak_mb(),
                "counters": variant.counters()})
    if hasattr(variant, "extra"):
        out["extra"] = variant.extra()
    variant.close()
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    if spec.get("threads"):
        import torch

        torch.set_num_threads(int(spec["threads"]))
    kind = spec["kind"]
    if kind == "load":
        out = run_load(spec)
    elif kind in ("cold_raw", "cold_ours"):
        out = run_cold(spec)
    elif kind == "memory":
        out = run_memory(spec)
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    Path(argv[1]).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
