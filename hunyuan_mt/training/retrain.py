"""Corrections that become adapters: `python -m hunyuan_mt train-adapter --from-corrections PAIR`.

The pair's serving adapter is continued on its corrections (the store's, the latest per source) plus a replay
sample of what it was trained on, so that it learns the team's domain without forgetting its own. The candidate is
scored in shadow against the serving version, greedy, through the serving prompt and masking:

- on a held-out split of the corrections (never trained on);
- on the pair's standing held-out set (`adapters/<pair>/heldout.tsv`, source<TAB>reference).

It is promoted only if the first improves and the second drops by at most `MAX_STANDING_DROP` chrF; the report says
why in numbers. Versions live in `adapters/<pair>/<version>/` ("v1" is the pair's own folder); the store records
which serves, and every server on the store swaps to it while serving (rows in flight finish on the old one).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidInput
from ..store.tm import read_rows, tsv_rows
from .train import TrainOptions, chrf, fit, split_held_out, translate_with

#: The most the standing held-out set's chrF may fall for a candidate to be promoted.
MAX_STANDING_DROP = 0.5
#: Fewer corrections than this train nothing worth scoring.
MIN_CORRECTIONS = 10
#: The standing held-out set of a pair, in its adapter folder.
STANDING_FILE = "heldout.tsv"


@dataclass
class ShadowReport:
    pair: str
    parent: str
    version: str
    corrections: int
    trained_on: int
    held_out: int
    replay: int
    standing: int
    #: chrF of the serving version ("current") and the candidate on each set.
    scores: dict[str, dict[str, float | None]] = field(default_factory=dict)
    decision: str = ""
    reason: str = ""
    seconds: float = 0.0
    promoted: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def standing_set(adapters_dir: Path, pair: str) -> list[tuple[str, str]]:
    """The pair's standing held-out set: (source, reference) rows of `heldout.tsv`, read like a memory import
    (`#` lines are comments); [] when the pair has none."""
    path = adapters_dir / pair / STANDING_FILE
    if not path.is_file():
        return []
    src, tgt = pair.split("2", 1)
    return [(s, t) for s, t in read_rows(path.read_bytes(), path.name, src, tgt) if s and t]


def replay_sample(pair: str, count: int, seed: int, shipped_dir: Path | None,
                  replay_file: Path | None = None) -> list[tuple[str, str]]:
    """`count` pairs of what the adapter was trained on: `replay_file` (TSV/JSONL) when given, else the shipped
    memory of the pair (the demo's memory is built from its training pairs); [] when neither exists."""
    from .train import read_pairs

    if replay_file is not None:
        rows = read_pairs(replay_file)
    else:
        path = shipped_dir / f"{pair}.tsv.gz" if shipped_dir is not None else None
        if path is None or not path.is_file():
            return []
        rows = list(tsv_rows(path))
    rng = random.Random(seed)
    return rng.sample(rows, min(count, len(rows)))


def version_folder(adapters_dir: Path, pair: str, version: str) -> Path:
    return adapters_dir / pair if version == "v1" else adapters_dir / pair / version


def retrain(backbone: Any, store: Any, adapters_dir: Path, pair: str, options: TrainOptions,
            shipped_dir: Path | None = None, replay_file: Path | None = None, replay_ratio: float = 2.0,
            promote: bool = True, progress: bool = True) -> ShadowReport:
    """Continue the pair's serving adapter on its corrections, score it in shadow, record it, and promote it
    when it earns it. `backbone`: a float backbone of its own (train.run loads one)."""
    from peft import PeftModel

    started = time.monotonic()
    src, tgt = pair.split("2", 1)
    corrections = [(c.source, c.translation) for c in store.memory.corrections(pair)]
    if len(corrections) < MIN_CORRECTIONS:
        raise InvalidInput(f"{pair} has {len(corrections)} corrections; at least {MIN_CORRECTIONS} are needed to "
                           "train on them (POST /v1/corrections, /suggest, or the page's Save correction).")
    train_rows, held_rows = split_held_out(corrections, options.held_out, options.seed)
    replay = replay_sample(pair, int(len(train_rows) * replay_ratio), options.seed, shipped_dir, replay_file)
    standing = standing_set(adapters_dir, pair)
    parent = store.adapters.current().get(pair, "v1")
    source_folder = version_folder(adapters_dir, pair, parent)
    if not (source_folder / "adapter_config.json").is_file():
        raise InvalidInput(f"{pair} has no adapter to continue ({source_folder} holds none).")
    version = store.adapters.next_version(pair)
    model = PeftModel.from_pretrained(backbone.base_model, str(source_folder), is_trainable=True)
    report = ShadowReport(pair, parent, version, len(corrections), len(train_rows), len(held_rows), len(replay),
                          len(standing))
    sets = {"corrections": held_rows, "standing": standing}
    # Trained first: scoring runs under inference mode, whose cached tensors (position tables) autograd then
    # refuses. The serving version is scored afterwards, loaded beside the candidate under a name of its own.
    fit(backbone, model, src, tgt, train_rows + replay, options, progress)
    model.load_adapter(str(source_folder), adapter_name="serving")
    for name, adapter in (("candidate", "default"), ("current", "serving")):
        model.set_adapter(adapter)
        for set_name, rows in sets.items():
            score = chrf(translate_with(backbone, src, tgt, [s for s, _ in rows], options),
                         [t for _, t in rows]) if rows else None
            report.scores.setdefault(set_name, {})[name] = score
    model.set_adapter("default")
    model.delete_adapter("serving")
    out = version_folder(adapters_dir, pair, version)
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(str(out))
    model.unload()
    _write_metadata(source_folder, out, report)
    report.decision, report.reason = _decide(report)
    report.seconds = round(time.monotonic() - started, 1)
    report.promoted = promote and report.decision == "promote"
    store.adapters.add_candidate(pair, version, parent, report.to_dict())
    if report.promoted:
        store.adapters.promote(pair, version)
    (out / "report.json").write_text(json.dumps(report.to_dict(), indent=1, ensure_ascii=False), encoding="utf-8")
    return report


def _decide(report: ShadowReport) -> tuple[str, str]:
    corr, stand = report.scores.get("corrections", {}), report.scores.get("standing", {})
    now, new = corr.get("current"), corr.get("candidate")
    if now is None or new is None:
        return "keep", "no held-out corrections to score on (too few corrections)"
    if new <= now:
        return "keep", f"the held-out corrections did not improve: chrF {new} against {now} for {report.parent}"
    if stand.get("current") is None or stand.get("candidate") is None:
        gain = f"held-out corrections chrF {now} → {new}"
        return "keep", f"{gain}, but the pair has no standing held-out set ({STANDING_FILE}) to check it against"
    drop = round(stand["current"] - stand["candidate"], 1)
    if drop > MAX_STANDING_DROP:
        return "keep", (f"held-out corrections chrF {now} → {new}, but the standing held-out set fell by {drop} "
                        f"({stand['current']} → {stand['candidate']}; at most {MAX_STANDING_DROP} is allowed)")
    return "promote", (f"held-out corrections chrF {now} → {new} (+{round(new - now, 1)}); standing held-out set "
                       f"{stand['current']} → {stand['candidate']} (change {round(-drop, 1):+})")


def _write_metadata(parent: Path, out: Path, report: ShadowReport) -> None:
    try:
        metadata = json.loads((parent / "metadata.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        metadata = {}
    metadata.update({"version": report.version, "continued_from": report.parent,
                     "corrections": {"trained_on": report.trained_on, "held_out": report.held_out,
                                     "replay": report.replay},
                     "shadow_scores": report.scores})
    (out / "metadata.json").write_text(json.dumps(metadata, indent=1, ensure_ascii=False), encoding="utf-8")
