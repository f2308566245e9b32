"""Why formatted words stay in the source language: one word between two markup sentinels, glued to
them as the document readers write it (`Click ⟦0⟧here⟦1⟧ to continue.`) or with a space on each side.

    python -m bench.inline_markup            # the embedded demo model, en → es, de, fr

For each sentence and target it records whether the word between the sentinels came back unchanged (copied) and
whether any text stayed between them. Results: bench/results/inline_markup.{json,md}.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from .report import write_results

#: (before, the formatted word, after): UI sentences with one formatted word.
SENTENCES = [("Click ", "here", " to continue."), ("Press ", "Save", " to keep your work."),
             ("Open the ", "file", " menu."), ("Change your ", "password", " now."),
             ("Select the ", "folder", " to open."), ("Close the ", "window", " first."),
             ("Delete the ", "document", " from the list."), ("Print the ", "page", " again.")]
TARGETS = ("es", "de", "fr")
_BETWEEN = re.compile(r"⟦0⟧(.*?)⟦1⟧", re.S)


def measure(service: Any) -> dict[str, dict[str, dict[str, int]]]:
    """target → layout ("glued" / "spaced") → {"copied": n, "kept_between": n, "of": n}."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for target in TARGETS:
        out[target] = {}
        for layout in ("glued", "spaced"):
            copied = kept = 0
            for before, word, after in SENTENCES:
                inner = f"⟦0⟧{word}⟦1⟧" if layout == "glued" else f"⟦0⟧ {word} ⟦1⟧"
                translated = service.translate_segments([before + inner + after], "en", target)[0]
                found = _BETWEEN.search(translated)
                between = found.group(1).strip() if found else ""
                copied += between == word
                kept += bool(between)
            out[target][layout] = {"copied": copied, "kept_between": kept, "of": len(SENTENCES)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inline_markup", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=None, help="profile (default: the demo)")
    args = parser.parse_args(argv)
    from hunyuan_mt.config import load_config
    from hunyuan_mt.service.translation import TranslationService

    service = TranslationService(load_config(args.config, {"model.warmup": False, "memory.enabled": False,
                                                           "tm.enabled": False}, env={}))
    try:
        results = measure(service)
    finally:
        service.close()
    lines = ["# A formatted word between markup sentinels (`python -m bench.inline_markup`)", "",
             f"{len(SENTENCES)} UI sentences, one formatted word each; greedy, no memory.", "",
             "| target | glued (`⟦0⟧word⟦1⟧`): word copied | text kept between | spaced (`⟦0⟧ word ⟦1⟧`): word copied "
             "| text kept between |", "|---|---:|---:|---:|---:|"]
    for target, by in results.items():
        g, s = by["glued"], by["spaced"]
        lines.append(f"| en→{target} | {g['copied']}/{g['of']} | {g['kept_between']}/{g['of']} | "
                     f"{s['copied']}/{s['of']} | {s['kept_between']}/{s['of']} |")
    write_results("inline_markup", {"sentences": SENTENCES, "results": results}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
