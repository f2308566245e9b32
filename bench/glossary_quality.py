"""Does a glossary help where it applies? chrF against human references with and without it.

    python -m bench.glossary_quality --data data        # the held-out sets of `build-demo` (data/demo)

The phrases: every held-out UI string and help sentence of en→es and en→de (the `build-demo` extraction's test
sets, which no training pair contains) in which a term of the glossary below occurs and whose human reference uses
that term's translation. So the glossary says what the reference says, and any loss comes from how the term is
put in, not from a disagreement about the term. Each phrase is translated by the embedded demo model, through the
service, without a glossary and with each `glossary.mode` (sentinel; visible, which translates a text again with
sentinels when its output lost a term), and scored with sacrebleu's chrF against its reference. Results: bench/results/glossary_quality.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from hunyuan_mt.config import PROJECT_ROOT, load_config
from hunyuan_mt.text.glossary import Glossary

from .report import write_results

#: glossary.mode values: "visible" falls back to "sentinel" for a text whose output lost a term.
MODES = ("sentinel", "visible")

#: Common UI nouns and their usual translations (genders differ: the agreement is what a forced term can break).
TERMS = {
    "es": {"file": "archivo", "folder": "carpeta", "window": "ventana", "page": "página", "printer": "impresora",
           "password": "contraseña", "image": "imagen", "document": "documento", "message": "mensaje",
           "account": "cuenta", "server": "servidor", "user": "usuario", "list": "lista", "name": "nombre",
           "directory": "directorio", "device": "dispositivo", "text": "texto", "table": "tabla", "cell": "celda",
           "column": "columna", "row": "fila", "line": "línea", "field": "campo", "option": "opción",
           "connection": "conexión", "disk": "disco", "menu": "menú", "tab": "pestaña", "button": "botón",
           "chart": "gráfico", "error": "error"},
    "de": {"file": "Datei", "folder": "Ordner", "window": "Fenster", "page": "Seite", "printer": "Drucker",
           "password": "Passwort", "image": "Bild", "document": "Dokument", "message": "Nachricht",
           "account": "Konto", "server": "Server", "user": "Benutzer", "list": "Liste", "name": "Name",
           "directory": "Verzeichnis", "device": "Gerät", "text": "Text", "table": "Tabelle", "cell": "Zelle",
           "column": "Spalte", "row": "Zeile", "line": "Zeile", "field": "Feld", "option": "Option",
           "connection": "Verbindung", "disk": "Datenträger", "menu": "Menü", "button": "Schaltfläche",
           "chart": "Diagramm", "error": "Fehler"},
}


def phrases(data: Path, tgt: str) -> list[tuple[str, str]]:
    """(source, reference) pairs of the held-out sets where a term applies and the reference agrees with it."""
    out = []
    for path in (data / "demo" / "test" / f"en2{tgt}.jsonl", data / "demo" / "help_test" / f"en2{tgt}.jsonl"):
        if not path.is_file():
            raise SystemExit(f"{path} is missing: run `python -m hunyuan_mt build-demo --memory-only --data {data}` "
                             "first (it extracts the held-out sets)")
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            src, ref = row["src"], row["tgt"]
            found = [t for t in TERMS[tgt] if re.search(rf"(?<!\w){t}(?!\w)", src, re.I)]
            if found and all(TERMS[tgt][t].lower() in ref.lower() for t in found):
                out.append((src, ref))
    return out


def score(service: Any, rows: list[tuple[str, str]], tgt: str, glossary: Glossary | None) -> dict[str, Any]:
    import sacrebleu

    outs = []
    for start in range(0, len(rows), 32):
        batch = [src for src, _ in rows[start:start + 32]]
        outs += [r.text for r in service.translate_batch(batch, "en", tgt, glossary=glossary)]
    refs = [ref for _, ref in rows]
    kept = sum(all(TERMS[tgt][t].lower() in out.lower() for t in TERMS[tgt]
                   if re.search(rf"(?<!\w){t}(?!\w)", src, re.I)) for (src, _), out in zip(rows, outs))
    return {"chrf": round(sacrebleu.corpus_chrf(outs, [refs]).score, 2), "terms_kept": kept, "outputs": outs[:20]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.glossary_quality", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=PROJECT_ROOT / "data")
    args = parser.parse_args(argv)
    from dataclasses import replace

    from hunyuan_mt.text.glossary import parse_terms
    from hunyuan_mt.service.translation import TranslationService

    service = TranslationService(load_config(None, {"model.warmup": False, "memory.enabled": False,
                                                    "tm.enabled": False}))
    results: dict[str, Any] = {}
    for tgt in ("es", "de"):
        rows = phrases(args.data, tgt)
        entry: dict[str, Any] = {"phrases": len(rows), "none": score(service, rows, tgt, None)}
        glossary = parse_terms(TERMS[tgt], len(TERMS[tgt]))
        for mode in MODES:
            service.cfg = replace(service.cfg, glossary=replace(service.cfg.glossary, mode=mode))
            entry[mode] = score(service, rows, tgt, glossary)
        results[f"en2{tgt}"] = entry
    service.close()
    lines = ["# Glossary where it applies (`python -m bench.glossary_quality`)", "",
             "Held-out UI strings and help sentences in which a glossary term occurs and whose reference uses its "
             "translation; chrF against the references; tm off.", "",
             "| direction | phrases | no glossary | " + " | ".join(MODES) + " | terms kept (" + ", ".join(MODES) + ") |",
             "|---|---:|---:|" + "---:|" * len(MODES) + "---|"]
    for pair, entry in results.items():
        base = entry["none"]["chrf"]
        cells = [f"{entry[m]['chrf']} ({entry[m]['chrf'] / base:.3f}×)" for m in MODES]
        kept = ", ".join(f"{entry[m]['terms_kept']}/{entry['phrases']}" for m in MODES)
        lines.append(f"| {pair} | {entry['phrases']} | {base} | " + " | ".join(cells) +
                     f" | {kept} (none: {entry['none']['terms_kept']}) |")
    write_results("glossary_quality", results, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
