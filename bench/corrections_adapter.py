"""Corrections that become an adapter: a team's corrections in a domain the demo never saw, posted to a
store, then `python -m hunyuan_mt train-adapter --from-corrections en2es` timed end to end, with its shadow scores.

The domain: Wagtail's CMS editor interface (its Spanish catalogue, from the wagtail wheel on PyPI), less every
string the demo's training data had (its shipped memory is built from the training pairs). `--count` corrections
are posted through the service (as POST /v1/corrections does); the trainer holds 20 % of them out, trains on the rest
plus a replay sample of the pair's shipped memory, and scores the serving adapter and the candidate on the held-out
corrections and on the pair's standing held-out set (adapters/en2es/heldout.tsv). The adapters folder is copied to
a scratch folder first: the repository's is never written.

    python -m bench.corrections_adapter [--count 500] [--pair en2es] [--epochs 3] [--lr 5e-4]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEEL = "wagtail==7.2"
CACHE = ROOT / "bench" / "results" / "tmp" / "wheels"


def domain_pairs(lang: str) -> list[tuple[str, str]]:
    """(English, translation) of Wagtail's catalogues for `lang`: single forms, not fuzzy, not obsolete."""
    import polib

    CACHE.mkdir(parents=True, exist_ok=True)
    if not list(CACHE.glob("wagtail-*.whl")):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", WHEEL,
                        "-d", str(CACHE)], check=True)
    [wheel] = list(CACHE.glob("wagtail-*.whl"))
    pairs: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            if f"locale/{lang}/LC_MESSAGES/" in name and name.endswith(".po"):
                for entry in polib.pofile(archive.read(name).decode("utf-8")):
                    if entry.msgstr and not entry.msgid_plural and not entry.obsolete and "fuzzy" not in entry.flags:
                        pairs[" ".join(entry.msgid.split())] = " ".join(entry.msgstr.split())
    return list(pairs.items())


def unseen(pairs: list[tuple[str, str]], pair: str) -> list[tuple[str, str]]:
    """The pairs whose source the demo's training data did not have, usable as corrections (the same
    placeholders on both sides), 3 to 150 characters."""
    from hunyuan_mt.text.masking import protect, protect_pair
    from hunyuan_mt.store.tm import memory_key, tsv_rows

    trained = {memory_key(source) for source, _ in tsv_rows(ROOT / "models" / "demo" / "memory" / f"{pair}.tsv.gz")}
    return [(s, t) for s, t in pairs if 3 <= len(s) <= 150 and protect_pair(s, t) is not None
            and memory_key(protect(s).text) not in trained and any(c.isalpha() for c in s)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="en2es")
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    src, tgt = args.pair.split("2")
    rows = unseen(domain_pairs(tgt), args.pair)
    random.Random(0).shuffle(rows)
    rows = rows[:args.count]
    scratch = Path(tempfile.mkdtemp(prefix="hmt-corrections-"))
    adapters = scratch / "adapters"
    shutil.copytree(ROOT / "adapters", adapters)
    env = dict(os.environ, HMT_DATA=str(scratch / "data"))
    settings = ["--set", f"cache.adapters_dir={adapters}", "--set", "model.warmup=false"]

    from hunyuan_mt.config import load_config
    from hunyuan_mt.service.translation import TranslationService

    os.environ["HMT_DATA"] = env["HMT_DATA"]
    cfg = load_config(None, {"cache.adapters_dir": str(adapters), "model.warmup": False,
                             "memory.enabled": False}, env={})
    service = TranslationService(cfg)
    for source, target in rows:
        service.correct(source, src, tgt, target, who="bench")
    service.close()
    print(f"{len(rows)} corrections posted ({args.pair}, Wagtail's CMS interface, none in the demo's training "
          "data)")
    command = [sys.executable, "-m", "hunyuan_mt", "train-adapter", "--from-corrections", args.pair,
               "--epochs", str(args.epochs), "--lr", str(args.lr), *settings]
    if args.threads:
        command += ["--threads", str(args.threads)]
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    print(done.stdout.strip())
    if done.returncode != 0:
        print(done.stderr[-3000:])
        raise SystemExit(done.returncode)
    report = json.loads(next((adapters / args.pair).glob("v*/report.json")).read_text(encoding="utf-8"))
    print(f"wall time from --from-corrections to the decision: {wall:.0f} s (trainer's own count: "
          f"{report['seconds']} s)")
    print(json.dumps({k: report[k] for k in ("scores", "decision", "promoted", "trained_on", "held_out",
                                              "replay", "standing")}, ensure_ascii=False))
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
