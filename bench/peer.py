"""Ours against the engine LibreTranslate runs (CTranslate2), on the same model, sentences and threads.

    python -m bench.peer                    # 3 runs, 2 threads each → bench/results/peer.{json,md}
    python -m bench.peer --runs 1 --quick   # smoke: 60 sentences, no quality pass

CTranslate2 is a bench extra (`pip install -r requirements-bench.txt`), never a serving dependency. It gets the demo
backbone with one pair's adapter merged into the weights (PEFT's merge_and_unload), converted by CTranslate2's own
converter with a loader for the demo's vocabulary (`<pad>` is id 0 and has a trained embedding, where CTranslate2's
Marian loader assumes Opus-MT's layout: `<pad>` last, the decoder started from a zero vector).

Every engine runs in a process of its own (no thread pool shared with another engine), with the same number of
threads, and answers:
- (a) the 600 sentences on one pair: CTranslate2 fp32 and int8 with batches of 64 (sorted by length, as its
  translate_batch does), ours through `translate_batch` in fp32 and, where this CPU's faster int8 kernel beats
  float32 (what the default profile's `model.quantization: auto` decides by, `int8.gemm_speed`: torch._int_mm
  where torch has an int8 kernel for the CPU, fbgemm on AVX2 alone), in int8 (translation memory off so the model
  answers). Where neither beats float32, ours in int8 is left out unless `--int8 always`, and "as shipped" is fp32;
- (b) ours with the same 600 sentences spread over the 8 shipped adapters, sent by 8 concurrent callers so the
  rows mix in the running batch, against CTranslate2 int8 on its one merged model;
- (c) one short sentence on an idle engine, in-process, and for ours also over HTTP (POST /translate);
- the cores busy during (a): the process's CPU time over wall time;
- agreement with CTranslate2 fp32 (exact and chrF) and chrF against the references;
- chrF of ours in int8 against ours in fp32 (when int8 ran) on the held-out UI strings of all 8 directions and the held-out help
  sentences: the shipped build's own split when `data/demo` holds its extraction, else drawn as the build draws
  them (see `sentences`).
Medians over `--runs` runs; the ratios are ours ÷ the peer, from medians of the same invocation. Each process
runs (a) `--passes` times (default 2): the headline is its first pass, as a freshly started server meets a first
batch; the later passes give the steady row (oneDNN creates its primitives for shapes not seen yet, and the
cache grows into fresh memory, during a process's first pass: ours in float32 paid ~10 % there on 2026-12-05,
CTranslate2 float32 0–3 %). CTranslate2's
converted model is kept in the work folder and made again when the backbone's or the adapter's weights change.

OpenMP: ours runs on Intel's runtime, preloaded as `./start.sh` does (hunyuan_mt/host/cpu.py). CTranslate2's wheel
ships its own GNU OpenMP (a vendored libgomp), and runs twice: on it, as a user of the wheel (LibreTranslate) gets
it, and on the same preloaded Intel runtime as ours (rows `-iomp`). The ratios are taken against the latter, the
same runtime on both sides: on a 2-core Intel Xeon VM (2026-12-07) CTranslate2 int8 on its own libgomp kept 1.1-1.2
cores busy and took 2.2-2.6 s for the 600 where the Intel runtime took 0.83-1.17 s, with the same 600 outputs, so
a comparison with the wheel as shipped measured its OpenMP runtime more than its engine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from hunyuan_mt.config import PROJECT_ROOT
from . import openmp
from .openmp import IOMP_SUFFIX
from .report import write_results

WORK = PROJECT_ROOT / "bench" / "results" / "tmp" / "peer"
PAIR = "en2es"
SHORT = "Open the file."
PAIRS = ("en2es", "en2de", "en2fr", "en2zh", "es2en", "de2en", "fr2en", "zh2en")
HELP_ROOT = PROJECT_ROOT / "data" / "libreoffice"


# ---------------------------------------------------------------------------------------------------- sentences

def sentences(quick: bool = False) -> dict[str, Any]:
    """The held-out UI strings of every direction and the held-out help sentences, 200 longer catalogue sentences
    (8-30 words, not held out). The held-out sets are the shipped build's own (`data/demo/test` and
    `data/demo/help_test`, what `build-demo` extracted and kept out of training) when that folder is here; else
    they are drawn from the system's gettext catalogues as the demo build draws them (and the help sentences only
    when data/libreoffice holds LibreOffice's help). Cached in the work folder, made again when the build's sets
    change: the cache of 2026-12-01 held a split the next build trained on (369 of its 400 en→es strings)."""
    built = PROJECT_ROOT / "data" / "demo"
    held = sorted([*(built / "test").glob("*.jsonl"), *(built / "help_test").glob("*.jsonl")])
    source = _fingerprint(held) if held else "catalogues"
    cache = WORK / "sentences.json"
    data = json.loads(cache.read_text(encoding="utf-8")) if cache.is_file() else None
    if data is None or data.get("source") != source:
        import itertools
        import random

        from hunyuan_mt.demo import sources
        from hunyuan_mt.demo.corpus import build_corpus, clean, load_corpus
        from hunyuan_mt.text.masking import protect

        system = list(sources.gettext_catalogues())
        if held:
            corpus = load_corpus(built)
        else:
            corpus = build_corpus(itertools.chain(system, sources.libreoffice_help(HELP_ROOT)))
        kept_out = {en for en, _ in corpus.test["en2es"]}
        longer: dict[str, str] = {}
        for e in system:
            if e.lang != "es":
                continue
            en, es = clean(e.en), clean(e.text)
            if (en and es and en not in kept_out and 8 <= len(en.split()) <= 30 and en[0].isalpha()
                    and en.endswith(".") and "\n" not in en and not protect(en).spans):
                longer.setdefault(en, es)
        keys = sorted(longer)
        random.Random(7).shuffle(keys)
        data = {"source": source, "ui": corpus.test, "long": [(k, longer[k]) for k in sorted(keys[:200])],
                "help": corpus.help_test}
        WORK.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    if quick:
        data = {"ui": {k: v[:40] for k, v in data["ui"].items()}, "long": data["long"][:20],
                "help": {k: v[:20] for k, v in data["help"].items()}}
    return data


def workload(data: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(sources, references) of the one-pair workload: held-out UI strings then the longer sentences, en→es."""
    rows = list(data["ui"][PAIR]) + list(data["long"])
    return [s for s, _ in rows], [r for _, r in rows]


# ---------------------------------------------------------------------------------------------------- CTranslate2

def convert(pair: str, out: Path) -> Path:
    """The demo backbone with `pair`'s adapter merged, converted for CTranslate2 (float32; int8 is chosen when it
    loads)."""
    import torch
    from ctranslate2.converters import transformers as ct2t
    from peft import PeftModel
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    target = out / f"ct2-{pair}"
    # Converted again whenever the backbone or the adapter changes: a conversion kept from an earlier demo build
    # compared our engine on the new model with CTranslate2 on the old one (2026-12-02: 83 of 600 outputs alike).
    stamp = _fingerprint([PROJECT_ROOT / "models" / "demo" / "model.safetensors",
                          *sorted((PROJECT_ROOT / "adapters" / pair).glob("adapter_model.*"))])
    if (target / "model.bin").is_file() and _read(target / "source.sha256") == stamp:
        return target

    class DemoMarianLoader(ct2t.MarianMTLoader):
        """All 8,012 rows kept, decoding starts from `<pad>`'s own embedding (the demo was trained that way)."""

        def get_model_spec(self, model: Any) -> Any:
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return ct2t.BartLoader.get_model_spec(self, model)

        def set_config(self, config: Any, model: Any, tokenizer: Any) -> None:
            config.eos_token = tokenizer.eos_token
            config.unk_token = tokenizer.unk_token
            config.decoder_start_token = tokenizer.pad_token

        def set_decoder(self, spec: Any, decoder: Any) -> None:
            ct2t.BartLoader.set_decoder(self, spec, decoder)

        def get_vocabulary(self, model: Any, tokenizer: Any) -> list[str]:
            return ct2t.BartLoader.get_vocabulary(self, model, tokenizer)

    merged = out / f"merged-{pair}"
    model = AutoModelForSeq2SeqLM.from_pretrained(PROJECT_ROOT / "models" / "demo", dtype=torch.float32)
    model = PeftModel.from_pretrained(model, PROJECT_ROOT / "adapters" / pair).merge_and_unload()
    model.save_pretrained(merged)
    AutoTokenizer.from_pretrained(PROJECT_ROOT / "models" / "demo").save_pretrained(merged)
    ct2t._MODEL_LOADERS["MarianConfig"] = DemoMarianLoader()
    ct2t.TransformersConverter(str(merged)).convert(str(target), force=True)
    (target / "source.sha256").write_text(stamp)
    return target


def _fingerprint(paths: list[Path]) -> str:
    import hashlib

    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.is_file() else None


def ct2_translate(translator: Any, tok: Any, texts: list[str]) -> list[str]:
    """Greedy, batches of 64 (CTranslate2 sorts them by length); tokenizing and detokenizing count, as they do on
    our side. `<pad>` is suppressed as the demo's generation config bans it."""
    tokens = [tok.convert_ids_to_tokens(tok(t)["input_ids"]) for t in texts]
    results = translator.translate_batch(tokens, max_batch_size=64, beam_size=1, max_decoding_length=128,
                                         suppress_sequences=[["<pad>"]])
    return [tok.decode(tok.convert_tokens_to_ids(r.hypotheses[0]), skip_special_tokens=True).strip()
            for r in results]


def run_ct2(args: argparse.Namespace) -> dict[str, Any]:
    import ctranslate2
    from transformers import AutoTokenizer

    data = sentences(args.quick)
    texts, _ = workload(data)
    tok = AutoTokenizer.from_pretrained(PROJECT_ROOT / "models" / "demo")
    translator = ctranslate2.Translator(str(convert(PAIR, WORK)), device="cpu", compute_type=args.compute,
                                        intra_threads=args.threads, inter_threads=1)

    def translate(batch: list[str]) -> list[str]:
        return ct2_translate(translator, tok, batch)

    translate(texts[:16])
    outputs, seconds, busy = [], [], []
    for _ in range(args.repeat):
        cpu0, t0 = time.process_time(), time.perf_counter()
        outputs = translate(texts)
        seconds.append(time.perf_counter() - t0)
        busy.append((time.process_time() - cpu0) / seconds[-1])
    return {"engine": f"ct2-{args.compute}", "seconds": seconds, "busy": busy, "outputs": outputs,
            "short_ms": _short(lambda: translate([SHORT]))}


# ---------------------------------------------------------------------------------------------------- ours

def _service(quantization: str | None, extra: dict[str, Any] | None = None) -> Any:
    """The shipped profile, warmed up, translation memory and memory monitor off; `extra`: more overrides."""
    from hunyuan_mt.config import load_config
    from hunyuan_mt.service.translation import TranslationService

    overrides: dict[str, Any] = {"tm.enabled": False, "memory.enabled": False, "limits.max_batch_items": 1000,
                                 "model.warmup": True, **(extra or {})}
    if quantization is not None:
        overrides["model.quantization"] = quantization
    service = TranslationService(load_config(None, overrides, env={}))
    service.wait_full_speed()  # measured as a warm server runs: the compiled step, not the eager one beside its build
    return service


def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    data = sentences(args.quick)
    texts, _ = workload(data)
    service = _service(args.quantization)
    try:
        # As a user meets it once /health says ok: the detector's helper process has finished loading (it takes a
        # core for about two seconds after start).
        service.wait_ready(120)
        info = service.status()["backbone"]
        import torch

        service.translate_batch(texts[:32], "en", "es")
        outputs, seconds, busy, mixed = [], [], [], []
        for _ in range(args.repeat):
            cpu0, t0 = time.process_time(), time.perf_counter()
            outputs = [r.text for r in service.translate_batch(texts, "en", "es")]
            seconds.append(time.perf_counter() - t0)
            busy.append((time.process_time() - cpu0) / seconds[-1])
            mixed.append(_mixed(service, texts))
        result = {"engine": f"ours-{info['quantization']}", "threads": torch.get_num_threads(),
                  "seconds": seconds, "busy": busy, "mixed_seconds": mixed, "outputs": outputs,
                  "short_ms": _short(lambda: service.translate(SHORT, "en", "es"))}
        result["http_short_ms"] = _http_short(service)
        if args.quality:
            result["quality"] = _quality_outputs(service, data)
        return result
    finally:
        service.close()


def _mixed(service: Any, texts: list[str]) -> float:
    """The sentences spread over the 8 shipped adapters, one concurrent caller per pair (the rows mix in the running
    batch). Returns the wall time."""
    groups = {pair: texts[i::len(PAIRS)] for i, pair in enumerate(PAIRS)}
    errors: list[BaseException] = []

    def call(pair: str) -> None:
        src, tgt = pair.split("2")
        try:
            service.translate_batch(groups[pair], src, tgt)
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(p,)) for p in PAIRS]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def _short(fn: Any, n: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(n):
        time.sleep(0.02)  # idle between requests
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _http_short(service: Any) -> float:
    """POST /translate of the short sentence to the app served on 127.0.0.1 (the REST path as shipped)."""
    import socket
    import urllib.request

    from hunyuan_mt.config import load_config
    from hunyuan_mt.web.server import ServerThread, build_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ServerThread(build_app(service, load_config(None, {}, env={})), "127.0.0.1", port).start()
    body = json.dumps({"q": SHORT, "source": "en", "target": "es"}).encode()

    def post() -> None:
        req = urllib.request.Request(f"{server.url}/translate", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            json.loads(resp.read())

    try:
        return _short(post)
    finally:
        server.stop()


def _quality_outputs(service: Any, data: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for part in ("ui", "help"):
        for direction, rows in sorted(data[part].items()):
            if direction not in PAIRS or not rows:
                continue
            src, tgt = direction.split("2")
            out[f"{part}:{direction}"] = [r.text for r in service.translate_batch([s for s, _ in rows], src, tgt)]
    return out


# ---------------------------------------------------------------------------------------------------- driver

def _worker(args: argparse.Namespace) -> int:
    result = run_ct2(args) if args.worker == "ct2" else run_ours(args)
    Path(args.out).write_text(json.dumps(result, ensure_ascii=False))
    return 0


def _spawn(kind: str, extra: list[str], args: argparse.Namespace, tag: str,
           intel_openmp: bool = False) -> dict[str, Any]:
    """One worker process. Ours runs as ./start.sh runs it (Intel's OpenMP preloaded where installed); CTranslate2
    on the OpenMP its wheel links, or with `intel_openmp` on the same preloaded runtime as ours."""
    out = WORK / f"{tag}.json"
    cmd = [sys.executable, "-m", "bench.peer", "--worker", kind, "--out", str(out), "--threads", str(args.threads),
           "--repeat", str(args.passes)] + extra + (["--quick"] if args.quick else [])
    env = openmp.worker_env(dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                                 PYTHONPATH=str(PROJECT_ROOT)), intel=kind == "ours" or intel_openmp)
    subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, check=True)
    return json.loads(out.read_text(encoding="utf-8"))


def _med(values: list[float]) -> float:
    return statistics.median(values)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peer", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="CTranslate2's intra_threads; ours: model.cpu_threads")
    p.add_argument("--quick", action="store_true", help="60 sentences and no quality pass (smoke test)")
    p.add_argument("--passes", type=int, default=2,
                   help="passes of the one-pair workload per process: the first is the headline, the later ones the "
                        "steady row (default 2)")
    p.add_argument("--int8", choices=["auto", "always", "never"], default="auto",
                   help="run ours in int8 too: auto = where this CPU's int8 GEMM beats float32 (what the shipped "
                        "profile's model.quantization: auto runs); always = also where it is a slow loop")
    p.add_argument("--worker", choices=["ct2", "ours"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--compute", default="int8", help=argparse.SUPPRESS)
    p.add_argument("--quantization", default=None, help=argparse.SUPPRESS)
    p.add_argument("--repeat", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--quality", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)

    import sacrebleu

    WORK.mkdir(parents=True, exist_ok=True)
    data = sentences(args.quick)
    texts, refs = workload(data)
    convert(PAIR, WORK)
    speed, shipped = _as_shipped(args.threads)
    with_int8 = args.int8 == "always" or (args.int8 == "auto" and shipped == "int8")
    ours = ["ours-int8", "ours-none"] if with_int8 else ["ours-none"]
    peers = [f"ct2-{compute}{omp}" for omp in openmp.peer_runtimes() for compute in ("float32", "int8")]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in (*peers, *ours)}
    for r in range(args.runs):
        # Interleaved, so drift in the machine's load hits every engine alike.
        for name in peers:
            runs[name].append(_spawn("ct2", ["--compute", name.split("-")[1]], args, f"{name}-{r}",
                                     intel_openmp=name.endswith(IOMP_SUFFIX)))
        quality = ["--quality"] if r == 0 and not args.quick and with_int8 else []
        for name in ours:
            runs[name].append(_spawn("ours", ["--quantization", name.split("-")[1]] + quality, args, f"{name}-{r}"))
    med = {name: {
        "seconds": _med([x["seconds"][0] for x in rs]), "seconds_runs": [round(x["seconds"][0], 3) for x in rs],
        "short_ms": _med([x["short_ms"] for x in rs]), "busy": _med([x["busy"][0] for x in rs]),
        **(_steady(rs) if args.passes > 1 else {}),
        **({"mixed_seconds": _med([x["mixed_seconds"][0] for x in rs]),
            "mixed_runs": [round(x["mixed_seconds"][0], 3) for x in rs],
            "http_short_ms": _med([x["http_short_ms"] for x in rs])} if name.startswith("ours") else {}),
    } for name, rs in runs.items()}
    ct2_fp32 = runs["ct2-float32"][-1]["outputs"]
    agreement = {}
    for name, rs in runs.items():
        outs = rs[-1]["outputs"]
        agreement[name] = {
            "exact_vs_ct2_fp32": sum(a == b for a, b in zip(outs, ct2_fp32)),
            "chrf_vs_ct2_fp32": round(sacrebleu.corpus_chrf(outs, [ct2_fp32]).score, 1),
            "chrf_vs_reference": round(sacrebleu.corpus_chrf(outs, [refs]).score, 1),
        }
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(PROJECT_ROOT / "models" / "demo")
    for name, rs in runs.items():
        generated = sum(len(tok(o, add_special_tokens=False)["input_ids"]) + 1 for o in rs[-1]["outputs"])
        med[name]["tokens_per_s"] = round(generated / med[name]["seconds"])
    quality = _quality_table(runs, data) if not args.quick and with_int8 else {}
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "threads": args.threads,
               "runs": args.runs, "passes": args.passes, "sentences": len(texts), "median": med, "agreement": agreement,
               "quality": quality, "ours_threads": runs["ours-none"][0]["threads"],
               "int8_gemm": {"int8_us": round(speed.int8_us, 1), "float32_us": round(speed.float32_us, 1),
                             "fbgemm_us": None if speed.fbgemm_us is None else round(speed.fbgemm_us, 1),
                             "kernel": speed.kernel, "capability": speed.capability, "note": speed.describe()},
               # What the default profile (model.quantization: auto) runs on this CPU, and the run quoted for it
               # (float32 when int8 is shipped but was not run: --int8 never).
               "shipped": shipped, "quoted": f"ours-{shipped}" if f"ours-{shipped}" in runs else "ours-none"}
    write_results("peer" if not args.quick else "peer-quick", results, _report(results))
    return 0


def _as_shipped(threads: int) -> tuple[Any, str]:
    """This CPU's int8 GEMM timing and what the default profile's `model.quantization: auto` runs on it ("int8" or
    "none"), decided as the backbone decides it (`backbone.resolve_quantization`), on the benchmark's threads."""
    import torch

    from hunyuan_mt.quant import int8
    from hunyuan_mt.runtime.backbone import resolve_quantization
    from hunyuan_mt.config import ModelConfig

    torch.set_num_threads(threads)
    shipped, _ = resolve_quantization(ModelConfig(quantization="auto"), "cpu", torch.float32)
    return int8.gemm_speed(threads), shipped


def _quality_table(runs: dict[str, list[dict[str, Any]]], data: dict[str, Any]) -> dict[str, Any]:
    import sacrebleu

    q8, q32 = runs["ours-int8"][0]["quality"], runs["ours-none"][0]["quality"]
    table = {}
    for key in sorted(q32):
        part, direction = key.split(":")
        refs = [t for _, t in data[part][direction]]
        a = sacrebleu.corpus_chrf(q8[key], [refs]).score
        b = sacrebleu.corpus_chrf(q32[key], [refs]).score
        table[key] = {"int8": round(a, 2), "fp32": round(b, 2), "delta": round(a - b, 2), "n": len(refs)}
    return table


def _steady(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """The steady row of one engine: each run's median over its passes after the first, and their median."""
    per_run = [_med(x["seconds"][1:]) for x in rs]
    return {"steady_seconds": _med(per_run), "steady_runs": [round(v, 3) for v in per_run]}


def _report(r: dict[str, Any]) -> list[str]:
    m, a = r["median"], r["agreement"]
    # The peer of every ratio: CTranslate2 on the OpenMP runtime ours runs on, where both ran; the last column
    # keeps the ratio to CTranslate2 on the runtime its wheel ships.
    same = IOMP_SUFFIX if f"ct2-int8{IOMP_SUFFIX}" in m else ""
    ct8, ct32, o32 = m[f"ct2-int8{same}"], m[f"ct2-float32{same}"], m["ours-none"]
    own8, own32 = m["ct2-int8"], m["ct2-float32"]
    shipped = m[r["quoted"]]
    kind = "int8" if r["quoted"] == "ours-int8" else "fp32"
    if r["quoted"] != f"ours-{r['shipped']}":
        ran = " It was not run (`--int8 never`): the rows below quote fp32."
    else:
        ran = "" if "ours-int8" in m else " Ours in int8 was not run (`--int8 always` runs it)."
    passes = r.get("passes", 1)
    lines = [f"# Ours against CTranslate2 ({r['date']}, `python -m bench.peer --runs {r['runs']} --threads "
             f"{r['threads']} --passes {passes}`)", "",
             f"{r['sentences']} sentences en→es (held-out UI strings + longer catalogue sentences), greedy, "
             f"{r['threads']} threads each (ours: model.cpu_threads={r['ours_threads']}), translation memory off, "
             "tokenizing included. Medians of the runs; each run is a process of its own, and its first pass over "
             "the sentences is the one quoted" + (f" (the steady rows: the median of its next {passes - 1})."
                                                   if passes > 1 else "."), "",
             f"This CPU: {r['int8_gemm']['note']}, so the shipped profile (`model.quantization: auto`) runs "
             f"**{'int8' if r['shipped'] == 'int8' else 'fp32'}**.{ran}", "",
             "Ours runs on Intel's OpenMP, preloaded as `./start.sh` does. CTranslate2 runs on the GNU OpenMP its "
             "wheel ships" + (" and, in the `-iomp` rows, on the same preloaded Intel runtime as ours: the ratios "
                              "below are taken against those." if same else
                              " (Intel's runtime is not installed here, so that is the only peer)."),
             "", "| engine | seconds (runs) | generated tok/s | cores busy | short sentence, idle (ms) |",
             "|---|---|---|---|---|"]
    labels = [(f"ct2-{c}{omp}", f"CTranslate2 {c.replace('float32', 'fp32')}, batch 64, "
               + ("Intel's OpenMP (as ours)" if omp else "its own OpenMP"))
              for omp in ("", IOMP_SUFFIX) for c in ("int8", "float32")]
    labels += [("ours-int8", "ours, int8"), ("ours-none", "ours, fp32")]
    for name, label in labels:
        if name not in m:
            continue
        x = m[name]
        label += " (as shipped here)" if name == f"ours-{r['shipped']}" else ""
        lines.append(f"| {label} | {x['seconds']:.2f} ({', '.join(str(v) for v in x['seconds_runs'])}) | "
                     f"{x['tokens_per_s']:,} | "
                     f"{x['busy']:.2f} | {x['short_ms']:.1f} |")

    def row(measure: str, ours: float, peer: float, own: float, unit: str, detail: str = "",
            peer_detail: str = "") -> str:
        digits = 1 if unit == "ms" else 2
        return (f"| {measure} | {ours:.{digits}f} {unit}{detail} | {peer:.{digits}f} {unit}{peer_detail} | "
                f"**{ours / peer:.2f}** | {ours / own:.2f} |")

    def runs_of(values: list[float]) -> str:
        return f" ({', '.join(str(v) for v in values)})"

    lines += ["", "| measure | ours | peer | ours ÷ peer | ours ÷ CTranslate2 on its own OpenMP |",
              "|---|---|---|---|---|",
              row(f"{r['sentences']} sentences, one pair: ours as shipped ({kind}) vs CTranslate2 int8",
                  shipped["seconds"], ct8["seconds"], own8["seconds"], "s"),
              row("the same over 8 pairs mixed vs CTranslate2 int8 on one merged model", shipped["mixed_seconds"],
                  ct8["seconds"], own8["seconds"], "s", runs_of(shipped["mixed_runs"])),
              row("fp32: ours vs CTranslate2 fp32", o32["seconds"], ct32["seconds"], own32["seconds"], "s"),
              *([row(f"the same, one pair, later passes (steady): ours as shipped ({kind}) vs CTranslate2 int8",
                     shipped["steady_seconds"], ct8["steady_seconds"], own8["steady_seconds"], "s"),
                 row("fp32, later passes (steady): ours vs CTranslate2 fp32", o32["steady_seconds"],
                     ct32["steady_seconds"], own32["steady_seconds"], "s", runs_of(o32["steady_runs"]),
                     runs_of(ct32["steady_runs"]))] if "steady_seconds" in o32 else []),
              row("one short sentence, idle, in-process, vs CTranslate2 int8", shipped["short_ms"], ct8["short_ms"],
                  own8["short_ms"], "ms"),
              row("one short sentence, idle, over HTTP, vs CTranslate2 int8 in-process", shipped["http_short_ms"],
                  ct8["short_ms"], own8["short_ms"], "ms"),
              f"| cores busy during the {r['sentences']} (as shipped) | {shipped['busy']:.2f} | {ct8['busy']:.2f} | "
              f"– | {own8['busy']:.2f} (its own OpenMP) |",
              "", "Agreement (last run's outputs):", "",
              "| engine | identical to CTranslate2 fp32 | chrF vs CTranslate2 fp32 | chrF vs references |",
              "|---|---|---|---|"]
    for name, x in a.items():
        lines.append(f"| {name} | {x['exact_vs_ct2_fp32']}/{r['sentences']} | {x['chrf_vs_ct2_fp32']} | "
                     f"{x['chrf_vs_reference']} |")
    if r["quality"]:
        lines += ["", "Ours int8 against ours fp32, chrF against the references (held-out sets):", "",
                  "| set | n | fp32 | int8 | int8 − fp32 |", "|---|---|---|---|---|"]
        for key, x in r["quality"].items():
            lines.append(f"| {key} | {x['n']} | {x['fp32']} | {x['int8']} | {x['delta']:+.2f} |")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
