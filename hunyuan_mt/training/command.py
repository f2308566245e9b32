"""`python -m hunyuan_mt train-adapter`: the command over `train` (a new adapter from a file) and `retrain`
(`--from-corrections`: the serving version continued on the store's corrections). Kept apart from both so that
`retrain` can build on `train` without the two importing each other."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import add_config_arguments, config_from
from ..errors import InvalidInput
from .train import TrainOptions, read_pairs, train_adapter

#: The learning rate of --from-corrections: an adapter already trained is continued, gentler than a new one.
CONTINUE_LR = 5e-4


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train-adapter", help="train a LoRA adapter for one language pair from TSV/JSONL",
                              description="`python -m hunyuan_mt train-adapter`: a LoRA adapter for one language pair "
                                          "from a TSV or JSONL file.")
    p.add_argument("--pair", help="direction, e.g. en2es or zh-Hant2en")
    p.add_argument("--data", type=Path, help="TSV (source<TAB>target) or JSONL ({src, tgt})")
    p.add_argument("--from-corrections", metavar="PAIR", default=None,
                   help="continue PAIR's serving adapter on the store's corrections (plus a replay sample), score "
                        "it in shadow and promote it if it earns it (retrain.py); --data and --pair are not used")
    p.add_argument("--replay", type=Path, default=None,
                   help="with --from-corrections: what the adapter was trained on, to replay (default: the pair's "
                        "shipped memory)")
    p.add_argument("--replay-ratio", type=float, default=2.0,
                   help="with --from-corrections: replayed pairs per correction trained on")
    p.add_argument("--no-promote", action="store_true",
                   help="with --from-corrections: score and keep the candidate, but do not promote it")
    p.add_argument("--out", type=Path, default=None, help="adapter folder (default: <adapters_dir>/<pair>)")
    p.add_argument("--base", default=None, help="backbone folder (default: model.path of the config)")
    p.add_argument("--device", default=None, help="cpu, cuda or auto (default: the config's)")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=int, default=None, help="LoRA alpha (default: 2 × rank)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate (default 1e-3; with --from-corrections 5e-4, which continues a trained adapter "
                        "and kept the standing held-out set within 0.5 chrF where 1e-3 did not, bench/corrections_adapter.py)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-length", type=int, default=128, help="longest example in tokens; longer ones are skipped")
    p.add_argument("--held-out", type=float, default=None,
                   help="fraction kept for the chrF printed at the end (default 0.1; with --from-corrections 0.2 of "
                        "the corrections, what the candidate is judged on)")
    p.add_argument("--target-modules", default=None, help="comma-separated module names (default: by architecture)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (on a busy shared CPU, 1 is often faster than the default)")
    p.add_argument("--force", action="store_true", help="overwrite an existing adapter folder")
    add_config_arguments(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..adapters.request import Pair
    from ..runtime.backbone import Backbone

    if args.from_corrections:
        return _run_from_corrections(args)
    if not args.pair or not args.data:
        raise InvalidInput("train-adapter needs --pair and --data (or --from-corrections PAIR)")
    pair = Pair.parse(args.pair)
    cfg, model_cfg = _training_config(args)
    out = args.out or cfg.cache.resolved_dir / pair.key
    if out.exists() and any(out.iterdir()) and not args.force:
        raise InvalidInput(f"{out} already exists; pass --force to overwrite it")
    pairs = read_pairs(args.data)
    options = TrainOptions(rank=args.rank, alpha=args.alpha, epochs=args.epochs, lr=args.lr or TrainOptions.lr,
                           batch_size=args.batch_size, max_length=args.max_length,
                           held_out=0.1 if args.held_out is None else args.held_out,
                           target_modules=tuple(args.target_modules.split(",")) if args.target_modules else None)
    backbone = Backbone.load_uncached(model_cfg)
    result = train_adapter(backbone, pair.src, pair.tgt, pairs, out, options, force=args.force,
                           data_name=args.data.name)
    print(f"adapter {pair.key} written to {result.out}: {result.train_size} training pairs, {result.steps} steps "
          f"in {result.seconds:.0f} s")
    if result.chrf_adapter is not None:
        print(f"held-out chrF on {result.test_size} pairs: {result.chrf_adapter} with the adapter, "
              f"{result.chrf_base} without")
    return 0


def _training_config(args: argparse.Namespace):
    """(config, the backbone's settings to train on): the config's model (or --base), float32, not warmed. PEFT
    trains float layers: the adapter is trained on the float32 backbone whatever the profile serves with (an int8
    profile then serves it with LoRA in float32 on top of its int8 weights)."""
    from dataclasses import replace

    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    cfg = config_from(args)
    model_cfg = cfg.model
    if args.base:
        model_cfg = replace(model_cfg, path=args.base)
    if args.device:
        model_cfg = replace(model_cfg, device=args.device)
    return cfg, replace(model_cfg, warmup=False, quantization="none")


def _run_from_corrections(args: argparse.Namespace) -> int:
    from ..adapters.request import Pair
    from ..runtime.backbone import Backbone
    from .retrain import retrain
    from ..store import Store

    pair = Pair.parse(args.from_corrections)
    cfg, model_cfg = _training_config(args)
    backbone = Backbone.load_uncached(model_cfg)
    store = Store.open(cfg.store.url, cfg.store.dir)
    options = TrainOptions(epochs=args.epochs, lr=args.lr or CONTINUE_LR, batch_size=args.batch_size,
                           max_length=args.max_length, held_out=0.2 if args.held_out is None else args.held_out)
    report = retrain(backbone, store, cfg.cache.resolved_dir, pair.key, options, cfg.tm.resolved_shipped,
                     args.replay, args.replay_ratio, promote=not args.no_promote)
    print(f"{pair.key} {report.version} (from {report.parent}): trained on {report.trained_on} corrections and "
          f"{report.replay} replayed pairs in {report.seconds:.0f} s")
    for name, scores in report.scores.items():
        print(f"  {name:12} chrF {scores.get('current')} with {report.parent}, {scores.get('candidate')} with "
              f"{report.version}")
    verdict = "promoted: servers on the store swap to it while serving" if report.promoted else (
        "kept as a candidate, not promoted" if report.decision == "promote" else "not promoted")
    print(f"{verdict}: {report.reason}")
    return 0
