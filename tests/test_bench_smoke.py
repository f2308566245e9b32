"""The benchmark harness produces well-formed results (never timings: those belong to bench/ and BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bench import run as bench_run
from bench.adapters import prepare_adapters
from bench.loadgen import closed_loop, percentile
from bench.workload import all_pairs, requests, w1, w2
from hunyuan_mt.adapters.request import Pair

# The load runs a user's `python -m bench.run` makes (B2 serves as B1 does; it runs in the memory-scaling part,
# which this test checks too): a fourth variant cost the test a process start and 20 more requests.
VARIANTS = bench_run.DEFAULT_LOAD_VARIANTS


def test_workloads_are_valid_pairs_with_the_specified_mix() -> None:
    pairs = all_pairs(["en2es", "es2en", "en2de"])
    assert pairs[:3] == ["en2es", "es2en", "en2de"]
    assert len(pairs) == len(set(pairs)) >= 200
    for key in pairs[:200]:
        assert Pair.parse(key).key == key
    wl = w1(pairs)
    assert len(wl.pairs) == 38 and abs(sum(wl.weights) - 1) < 1e-9
    stream = requests(wl, 2000, seed=0)
    assert stream == requests(wl, 2000, seed=0)  # every variant sees the same stream
    hot = sum(r.pair in wl.pairs[:5] for r in stream) / len(stream)
    assert 0.87 < hot < 0.93
    assert set(wl.pairs[:5]) <= {r.pair for r in stream} <= set(wl.pairs)
    assert {r.pair for r in requests(w2(pairs), 500)} == set(pairs[:12])


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99)) == (50.0, 95.0, 99.0)
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) is None


def test_closed_loop_respects_the_request_cap_and_records_errors() -> None:
    from bench.workload import Request

    stream = [Request("en2es", "en", "es", f"t{i}") for i in range(10)]
    seen: list[str] = []

    def call(req: Request) -> str:
        seen.append(req.text)
        if req.text == "t3":
            raise RuntimeError("boom")
        return req.text

    lat, errs, _, issued, capped = closed_loop(call, stream, concurrency=4, max_requests=7, time_cap_s=60)
    assert issued == 7 and sorted(seen) == [f"t{i}" for i in range(7)]
    assert len(lat) == 6 and errs == ["RuntimeError: boom"] and capped == "requests"


def test_generated_adapters_copy_shapes_and_differ(tmp_path: Path, marian_dir: Path, marian_adapters: Path) -> None:
    out = prepare_adapters(tmp_path / "a", marian_dir, marian_adapters, ["en2es", "en2ja", "ja2en"])
    real = load_file(str(marian_adapters / "en2es" / "adapter_model.safetensors"))
    assert load_file(str(out / "en2es" / "adapter_model.safetensors")).keys() == real.keys()
    ja, ja2 = (load_file(str(out / p / "adapter_model.safetensors")) for p in ("en2ja", "ja2en"))
    template = load_file(str(sorted(marian_adapters.iterdir())[0] / "adapter_model.safetensors"))
    assert {k: v.shape for k, v in ja.items()} == {k: v.shape for k, v in template.items()}
    assert any(not torch.equal(ja[k], ja2[k]) for k in ja)
    stamp = (out / ".bench-stamp").stat().st_mtime_ns
    prepare_adapters(tmp_path / "a", marian_dir, marian_adapters, ["en2es", "en2ja", "ja2en"])
    assert (out / ".bench-stamp").stat().st_mtime_ns == stamp  # reused, not rebuilt


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quick_bench_writes_well_formed_results(tmp_path: Path, marian_dir: Path, marian_adapters: Path) -> None:
    cfg = tmp_path / "bench.yaml"
    cfg.write_text(f"model:\n  path: {marian_dir}\n  warmup: true\ncache:\n  adapters_dir: {marian_adapters}\n"
                   "  pinned: [en2es, es2en]\n  slots: 3\nrouting:\n  pivot: en\nlimits:\n  max_new_tokens: 6\n")
    parser = argparse.ArgumentParser()
    bench_run.add_arguments(parser)
    args = parser.parse_args(["--quick", "--levels", "1,4", "--variants", ",".join(VARIANTS), "--config", str(cfg), "--out", str(tmp_path / "out"),
                              "--workdir", str(tmp_path / "work"), "--threads", "1",
                              # Bounded by the 5 requests a cell, not by time: a loaded machine is slow, not wrong.
                              "--time-cap", "120"])
    assert bench_run.run(args) == 0
    results = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert results["failures"] == []
    summary = results["summary"]
    cells = {(c["variant"], c["workload"], c["concurrency"]): c for c in summary["cells"]}
    assert set(cells) == {(v, w, c) for v in VARIANTS for w in ("W1", "W2") for c in (1, 4)}
    for key, cell in cells.items():
        assert cell["completed"] == 5 and cell["errors"] == 0, key
        assert cell["qps"] > 0 and cell["p50_ms"] <= cell["p95_ms"] <= cell["p99_ms"], key
    for w in ("W1", "W2"):
        assert cells[("B0", w, 1)]["disk_loads"] == 5 and cells[("B0", w, 1)]["hit_rate"] == 0
    raw_ours = [c for o in results["load"] if o["variant"] == "ours" for c in o["cells"]]
    # Lookups are per adapter per batch (rows of one pair in one batch share a lease), so at least one per cell.
    assert all(c["counters"]["lookups"] >= 1 for c in raw_ours)
    assert all(0 <= c["hit_rate"] <= 1 for c in raw_ours)
    ours_out = next(o for o in results["load"] if o["variant"] == "ours")
    assert ours_out["pinned_first"]["pair"] == results["pinned"][0]
    assert ours_out["extra"]["leases_held"] == 0
    # Memory scaling: both variants at both sizes, every registered pair served once.
    rows = {(r["variant"], r["registered"]): r for r in summary["scaling"]}
    assert set(rows) == {(v, n) for v in ("ours", "B2") for n in (4, 12)}
    assert all(r["served"] == r["registered"] and r["errors"] == 0 for r in rows.values())
    # The attach probe really compared a disk load with a RAM-tier re-attach, per the cache's own counters.
    samples = summary["attach"]["samples"]
    assert samples and all(s["first"]["disk_loads"] == 1 and s["again"]["ram_hits"] == 1 for s in samples)
    assert summary["cold"]["ratio"] is not None
    assert {t["name"] for t in summary["targets"]} >= {
        "pinned pair first request / steady state", "RAM-tier re-attach / disk attach",
        "re-attach from the RAM tier, ms",
        "W1 one client, p50 latency ours / B1",
        "cold start to first translation / (load + one forward)"}
    md = (tmp_path / "out" / "bench.md").read_text()
    assert "## Throughput and latency" in md and md.count("| W1 | 1 |") == len(VARIANTS)
    assert (tmp_path / "out" / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_markup_bench_counts_only_validly_nested_tags() -> None:
    from bench.markup import tag_sequence, tagged_strings

    strings = tagged_strings()
    assert len(strings) == len(set(strings)) == 50 and all(tag_sequence(s) for s in strings)
    assert tag_sequence("<p>Click </b>Saveve <b> écrits.</p>") is None  # crossed tags
    assert tag_sequence("<p>a <b><i>b</b></i></p>") is None
    assert tag_sequence("<p>a <b>b</b></p>") == ["<p>", "<b>", "</b>", "</p>"]


def test_gemm_paths_times_every_path_on_the_same_product() -> None:
    from bench.gemm_paths import measure

    cell = measure(8, 16, 32, calls=2)
    assert set(cell) == {"mm", "onednn_packed", "mkl_packed"}
    assert cell["mm"] > 0 and cell["onednn_packed"] > 0
    assert cell["mkl_packed"] is None or cell["mkl_packed"] > 0


def test_hunyuan_cpu_bench_runs_ours_and_transformers_on_a_tiny_model(tmp_path: Path) -> None:
    """bench.hunyuan_cpu's engines in process on its tiny preset: ours through the lean decoder-only step with 8
    adapters attached (16 rows over them), transformers eager and + PEFT one at a time, and the report's ratios."""
    from bench import hunyuan_cpu

    model_dir = hunyuan_cpu.build("tiny", tmp_path)
    adapters = tmp_path / "adapters"
    assert sorted(p.name for p in adapters.iterdir()) == sorted(hunyuan_cpu.PAIRS)
    from hunyuan_mt.quant import packed as int8_packed

    kernel = "qgemm" if int8_packed.available() else "auto"
    args = argparse.Namespace(preset="tiny", runs=1, prompt=8, new=3, requests=4, threads=2, quantization="int8",
                              int8_kernel=kernel, ours="", slot_dtype="bfloat16", compile=False, peft=True)
    ours = hunyuan_cpu.run_ours(model_dir, adapters, args)
    assert ours["batch"] == "LlamaBatch" and not ours["compiled"]
    assert kernel == "auto" or ours["int8_kernel"] == "qgemm"
    assert ours["decode_tok_s"] > 0 and ours["concurrent_tok_s"] > 0 and ours["int8_weight_mb"] > 0
    hf = hunyuan_cpu.run_transformers(model_dir, adapters, args)
    assert hf["peft_sequential_tok_s"] > 0 and len(hf["peft_walls"]) == 1
    lines = hunyuan_cpu.report({"ours": ours, "transformers": hf, "cpu": hunyuan_cpu.cpu_line(),
                                "llama_cpp_note": "not installed"}, args)
    text = "\n".join(lines)
    assert "÷ transformers eager, decode" in text and "4 concurrent ÷ transformers + PEFT" in text
    assert "llama.cpp: not installed" in text


def test_hunyuan_cpu_workers_get_their_openmp_runtime_whatever_the_callers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ours on Intel's OpenMP (as ./start.sh serves), llama.cpp on its build's GNU OpenMP and again on Intel's
    (`-iomp`), transformers on torch's own: a caller's LD_PRELOAD reaches none of them (it decided every runtime
    before, so a ratio could compare engines on different runtimes without saying so)."""
    from bench import hunyuan_cpu, openmp

    monkeypatch.setattr(openmp, "with_intel_openmp",
                        lambda env: {**env, "LD_PRELOAD": "/x/libiomp5.so", "KMP_BLOCKTIME": "1"})
    monkeypatch.setenv("LD_PRELOAD", "/elsewhere/libiomp5.so")
    monkeypatch.setenv("KMP_BLOCKTIME", "200")
    envs = {e: hunyuan_cpu.worker_env(e, 2) for e in ("ours", "transformers", "llama:q8_0", "llama:q8_0-iomp")}
    assert {e: (env.get("LD_PRELOAD"), env.get("KMP_BLOCKTIME")) for e, env in envs.items()} == {
        "ours": ("/x/libiomp5.so", "1"), "transformers": (None, None), "llama:q8_0": (None, None),
        "llama:q8_0-iomp": ("/x/libiomp5.so", "1")}
    assert {env["OMP_NUM_THREADS"] for env in envs.values()} == {"2"}


def test_a_hunyuan_cpu_worker_reports_the_runtime_it_ran_on() -> None:
    """The runtime each row names is read in the worker, from what its process mapped."""
    import subprocess
    import sys

    from bench import hunyuan_cpu
    from hunyuan_mt.config import PROJECT_ROOT
    from hunyuan_mt.host.cpu import intel_openmp_path

    code = ("import torch; torch.ones(4).sum(); from hunyuan_mt.host.cpu import openmp_runtime; "
            "print(openmp_runtime())")
    seen = {}
    for engine in ("transformers", "ours"):
        done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=hunyuan_cpu.worker_env(engine, 1),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        seen[engine] = done.stdout.split()[-1]
    assert seen == {"transformers": "gnu", "ours": "intel" if intel_openmp_path() is not None else "gnu"}


def test_the_hunyuan_cpu_report_names_each_rows_runtime_and_compares_on_both() -> None:
    from bench import hunyuan_cpu

    def engine(decode: float, runtime: str, **extra: float) -> dict:
        return {"first_token_s": 1.0, "decode_tok_s": decode, "stream_tok_s": decode, "rss_mb": 2000.0,
                "openmp": runtime, **extra}

    ours = engine(12.0, "intel", concurrent_tok_s=72.0, int8_weight_mb=1700.0, int8_kernel="qgemm")
    results = {"ours int8:qgemm": ours, "transformers": engine(4.0, "gnu", peft_sequential_tok_s=3.0),
               "llama.cpp q8_0": engine(8.0, "gnu"), "llama.cpp q8_0-iomp": engine(10.0, "intel"),
               "cpu": "x", "llama_cpp_note": "", "isa_caps": {"ATEN_CPU_CAPABILITY": "avx2"},
               "command": "python -m bench.hunyuan_cpu --preset hy-mt1.5-1.8b --tag avx2"}
    args = argparse.Namespace(preset="hy-mt1.5-1.8b", threads=2, prompt=60, new=64, runs=3, compile=False,
                              slot_dtype="bfloat16", ours="int8:qgemm", requests=16, quantization="int8")
    text = "\n".join(hunyuan_cpu.report(results, args))
    assert "| llama.cpp q8_0 (GNU OpenMP) | 1.000 | 8.0 |" in text
    assert "| llama.cpp q8_0-iomp (Intel's OpenMP) | 1.000 | 10.0 |" in text
    assert "adapter attached; Intel's OpenMP) | 1.000 | 12.0 |" in text
    assert "- ÷ llama.cpp q8_0 (GNU OpenMP), decode: **1.50×**" in text
    assert "- ÷ llama.cpp q8_0-iomp (Intel's OpenMP), decode: **1.20×**" in text
    # A run under the ISA caps says so, and names its command as given.
    assert "CPU: x under instruction-set caps (ATEN_CPU_CAPABILITY=avx2; llama.cpp: the ISA its build" in text
    assert "Command: `python -m bench.hunyuan_cpu --preset hy-mt1.5-1.8b --tag avx2`" in text


def test_tagged_bench_files_read_back_their_formatted_pieces() -> None:
    """bench.tagged writes each held-out segment as HTML, .docx, .pptx, .odt and XLIFF with its formatted pieces
    marked; the server's readers see one sentinel pair per formatted piece, and a translator that gives every
    segment back as it came leaves the bench reading the same pieces out of the rendered file."""
    from bench import tagged
    from hunyuan_mt.config import LimitsConfig
    from hunyuan_mt.documents import read_document, translate_document

    assert tagged.usable("Click ⟦0⟧ here ⟦1⟧ to ⟦2⟧ save ⟦3⟧.") == ["Click ", "here", " to ", "save", "."]
    assert tagged.usable("Run ⟦0⟧ now") is None and tagged.usable("a ⟦0⟧ 1 ⟦1⟧ b") is None
    segments = [["Click ", "here", " to ", "save", "."], ["", "Open", " the menu"]]
    for fmt, (make, read, name) in tagged.FORMATS.items():
        data = make(segments)
        assert read_document(data, name, LimitsConfig()).segments[0].count("⟦") == 4, fmt
        rendered = translate_document(data, name, LimitsConfig(), lambda texts, progress: list(texts))
        assert read(rendered.data) == [(["here", "save"], "Click here to save."), (["Open"], "Open the menu")], fmt


def test_chunked_prefill_bench_times_a_long_prompt_beside_running_streams(tmp_path: Path) -> None:
    """bench.chunked_prefill's trial on bench.hunyuan_cpu's tiny preset: the long row prefills in one forward with
    the setting off, in pieces with a budget, and the trial's four figures come back."""
    from bench import chunked_prefill

    backbone, cache = chunked_prefill.load("tiny", tmp_path, 2)
    args = argparse.Namespace(streams=2, short=6, new=12, long=100, late=0.0)
    pieces = {}
    for chunk in ("off", "32"):
        engine = chunked_prefill.make_engine(backbone, cache, chunk, args.new)
        try:
            result = chunked_prefill.trial(engine, args, seed=0)
            prefills = [h for h in engine.history if h.kind == "prefill"]
            long_seq = max(prefills, key=lambda h: h.padded_tokens).seqs[0]
            pieces[chunk] = sum(1 for h in prefills if long_seq in h.seqs)
        finally:
            engine.close()
        assert set(result) == {"stall_ms", "step_ms", "first_token_s", "late_first_token_s", "trial_s"}
        assert all(value > 0 for value in result.values())
    assert pieces["off"] == 1 and pieces["32"] >= 4
