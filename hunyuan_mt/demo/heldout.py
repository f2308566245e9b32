"""`python -m hunyuan_mt.demo.heldout`: each demo direction's standing held-out set, `adapters/<pair>/heldout.tsv`
(source<TAB>reference), what a candidate adapter trained from corrections is scored on besides the corrections
(retrain.py).

The rows are the demo build's own held-out UI strings: drawn by `corpus.build_corpus` from the system's gettext
catalogues alone (the split does not depend on the other sources), 400 per direction, never in any training pair.
Rebuilt from a machine's catalogues they match the build's split as far as the catalogues match the build
machine's; the files are committed so that every machine scores on the same rows.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .corpus import ADAPTER_DIRECTIONS, build_corpus
from .sources import gettext_catalogues

HEADER = "# {pair}: the demo build's held-out UI strings (system gettext catalogues, seed 13); source<TAB>reference\n"


def write_heldout(adapters_dir: Path, locale_root: Path = Path("/usr/share/locale")) -> dict[str, int]:
    corpus = build_corpus(gettext_catalogues(locale_root))
    written = {}
    for pair in ADAPTER_DIRECTIONS:
        rows = corpus.test.get(pair, [])
        folder = adapters_dir / pair
        if not rows or not folder.is_dir():
            continue
        lines = [f"{' '.join(s.split())}\t{' '.join(t.split())}\n" for s, t in rows]
        (folder / "heldout.tsv").write_text(HEADER.format(pair=pair) + "".join(lines), encoding="utf-8")
        written[pair] = len(lines)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", type=Path, default=Path("adapters"))
    parser.add_argument("--locale-root", type=Path, default=Path("/usr/share/locale"))
    args = parser.parse_args()
    for pair, count in write_heldout(args.adapters, args.locale_root).items():
        print(f"{pair}: {count} held-out rows written to {args.adapters / pair / 'heldout.tsv'}")


if __name__ == "__main__":
    main()
