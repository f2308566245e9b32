"""Command line: `python -m hunyuan_mt COMMAND ...`.

Core commands live here: `translate`, `adapters`, `detect`. Other parts of the project add theirs as modules with
`register(subparsers)` (which adds a parser and sets `handler=run(args) -> int`); they are listed in `PLUGINS` and
imported only when their command is asked for, so `translate` does not pay for Ray or the benchmark.

Errors end as one readable line on stderr and a non-zero exit status, never a traceback
(set HMT_TRACEBACK=1 to see one while debugging).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from .config import add_config_arguments, config_from
from .errors import ConfigError, InvalidInput, TranslationError

#: command → (module with `register(subparsers)`, one-line help shown before the module is imported)
PLUGINS: dict[str, tuple[str, str]] = {
    "build-demo": ("hunyuan_mt.demo.build", "rebuild the embedded demo model from scratch"),
    "train-adapter": ("hunyuan_mt.training.command", "train a LoRA adapter for one language pair from TSV/JSONL"),
    "bench": ("hunyuan_mt.bench", "benchmark against the baselines; results in bench/results/"),
    "serve-ray": ("hunyuan_mt.serve_ray", "serve on Ray Serve, replicas multiplexed by language pair"),
}

#: Exit status for errors the caller can fix (bad input, bad code, bad config) vs. failures of the service.
EXIT_USAGE = 2
EXIT_FAILURE = 1


def _service(args: argparse.Namespace):
    from .service.translation import get_service

    return get_service(config_from(args))


def run(argv: Sequence[str] | None = None) -> int:
    """`main` for a process that ends after the command (`python -m hunyuan_mt`): the service the command built is
    closed before the exit. With warm-up on (`--set model.warmup=true`) a translation finished while the warm-up
    thread still ran; the exit shut the detector's pool under it, and that thread's traceback ("warm-up failed;
    serving cold") came out under the translation. Closed first, the thread stops quietly. In process (tests, a
    caller's own script) `main` leaves the process-wide service open for the next call."""
    try:
        return main(argv)
    finally:
        module = sys.modules.get("hunyuan_mt.service.translation")  # a command that built no service imports nothing
        if module is not None:
            module.close_service()


# ---------------------------------------------------------------------------------------------------- translate


def _read_input(args: argparse.Namespace) -> str:
    if args.text:
        return " ".join(args.text)
    if sys.stdin is None or sys.stdin.isatty():
        raise InvalidInput("No text given: pass it as an argument, on stdin, or with --file.")
    return sys.stdin.read()


def cmd_translate(args: argparse.Namespace) -> int:
    from .text.languages import normalize_code

    # Check the codes before loading a model: a typo should fail in milliseconds.
    if args.src.strip().lower() != "auto":
        normalize_code(args.src)
    normalize_code(args.tgt)
    if args.file:
        return _translate_file(args)
    text = _read_input(args)
    service = _service(args)
    result = service.translate(text, args.src, args.tgt, glossary=_glossary(args, service),
                               context=getattr(args, "context", None))
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False, indent=1))
    else:
        print(result.text)
        if args.verbose:
            detected = f", detected {result.detected.code} ({result.detected.confidence:.2f})" if result.detected else ""
            print(f"route: {result.route_label}{detected}, {result.timings_ms['total']:.0f} ms", file=sys.stderr)
    return 0


def _glossary(args: argparse.Namespace, service: Any) -> Any:
    """--glossary: a file of terms ('source = target' or 'source<TAB>target' per line), or a stored glossary's id."""
    if not args.glossary:
        return None
    from .text.glossary import GlossaryStore, parse_terms

    path = Path(args.glossary)
    if path.is_file():
        return parse_terms(path.read_text(encoding="utf-8"), service.cfg.glossary.max_terms, path.name)
    return GlossaryStore(service.cfg.glossary.resolved_dir, service.cfg.glossary.max_terms,
                         service.store.glossaries).resolve(args.glossary, args.src, args.tgt)


def _translate_file(args: argparse.Namespace) -> int:
    from .documents import translate_document

    path = Path(args.file)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"Cannot read {args.file}: {exc.strerror or exc}") from None
    service = _service(args)
    glossary = _glossary(args, service)

    def segments(texts: list[str], progress: Any) -> list[str]:
        return service.translate_segments(texts, args.src, args.tgt, progress=progress, glossary=glossary)

    def progress(done: int, total: int) -> None:
        if args.verbose:
            print(f"\r{done}/{total} segments", end="" if done < total else "\n", file=sys.stderr)

    rendered = translate_document(data, path.name, service.cfg.limits, segments, progress, target=args.tgt,
                                  glossary=glossary)
    if args.output == "-" or (args.output is None and rendered.media_type.startswith("text/")):
        sys.stdout.write(rendered.data.decode("utf-8"))
        return 0
    out = Path(args.output) if args.output else path.with_name(rendered.filename)
    out.write_bytes(rendered.data)
    print(f"wrote {out}" + (f" ({rendered.note})" if rendered.note else ""), file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------------- memory


def cmd_tm(args: argparse.Namespace) -> int:
    """`tm import FILE --pair en2es`: add a TSV or TMX file to the translation memory; `tm export [FILE] --pair
    en2es`: write the pair's memory as TMX (no model is loaded either way)."""
    from .adapters.request import Pair
    from .config import load_config, parse_set_args
    from .store import Provenance, Store
    from .store.tm import open_memory, read_rows, tmx_bytes

    cfg = load_config(args.config, parse_set_args(args.set))
    pair = Pair.parse(args.pair)
    store = Store.open(cfg.store.url, cfg.store.dir)
    memory = open_memory(cfg, store)
    if args.action == "export":
        out = Path(args.file or f"{pair.key}.tmx")
        rows = memory.export_entries(pair)
        out.write_bytes(tmx_bytes(rows, pair.src, pair.tgt))
        print(f"{pair.key}: {len(rows)} entries written to {out} (TMX 1.4)")
        return 0
    if not args.file:
        raise InvalidInput("tm import needs the file to import: tm import FILE --pair en2es")
    path = Path(args.file)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"Cannot read {args.file}: {exc.strerror or exc}") from None
    result = memory.add(pair, read_rows(data, path.name, pair.src, pair.tgt), Provenance("import", "cli"))
    print(f"{pair.key}: {result.added} entries added, {result.replaced} replaced, {result.skipped} skipped "
          f"(placeholders differ or a side is empty); {result.entries} in the memory now ({store.describe()})")
    print("A server on the same store answers with them from its next request; no restart is needed.")
    return 0


# ---------------------------------------------------------------------------------------------------- adapters


def cmd_adapters(args: argparse.Namespace) -> int:
    service = _service(args)
    if args.rescan:
        service.rescan()
    stats = service.cache.stats()
    state: dict[str, str] = {}
    for r in stats.resident:
        state[r.key] = "pinned" if r.pinned else f"slot {r.slot}"
    for key in stats.ram_tier:
        state.setdefault(key, "RAM tier")
    for key in stats.failed:
        state[key] = "failed"
    rows = []
    for info in service.registry.infos():
        rows.append({
            "pair": info.key, "usable": info.usable, "state": state.get(info.key, "on disk"),
            "rank": info.rank, "size_kb": round(info.size_bytes / 1024, 1),
            "reason": info.reason or stats.failed.get(info.key) or "",
        })
    summary = {"slots": stats.slots, "pinned": service.cache.pinned(), "lru_order": service.cache.lru_order(),
               "ram_tier": stats.ram_tier, "hit_rate": stats.hit_rate, "folder": str(service.registry.root)}
    if args.json:
        print(json.dumps({"adapters": rows, "cache": summary,
                          "ignored": [{"folder": f, "reason": r} for f, r in service.registry.ignored()]},
                         ensure_ascii=False, indent=1))
        return 0
    print(f"adapters in {summary['folder']}: {len(rows)} registered, {sum(r['usable'] for r in rows)} usable; "
          f"{summary['slots']} slots, pinned {', '.join(summary['pinned']) or 'none'}")
    header = ("PAIR", "USABLE", "STATE", "RANK", "SIZE KB", "REASON")
    table = [header] + [(r["pair"], "yes" if r["usable"] else "no", r["state"], str(r["rank"] or "-"),
                         f"{r['size_kb']:g}", r["reason"]) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    for folder, reason in service.registry.ignored():
        print(f"ignored folder {folder!r}: {reason}")
    return 0


# ---------------------------------------------------------------------------------------------------- detect


def cmd_detect(args: argparse.Namespace) -> int:
    from .text.detect import detect
    from .text.languages import LANGUAGES, normalize_code

    text = _read_input(args)
    among = [normalize_code(c) for c in args.among.split(",")] if args.among else None
    found = detect(text, among=among, top=args.top)
    if args.json:
        print(json.dumps([{"code": d.code, "confidence": d.confidence} for d in found]))
        return 0
    if not found:
        raise InvalidInput("Could not detect a language: the text has no letters.")
    for d in found:
        print(f"{d.code}\t{d.confidence:.3f}\t{LANGUAGES[d.code].english}")
    return 0


# ---------------------------------------------------------------------------------------------------- parser


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The full parser; the plugin for `command` (if any) is imported and registers its real arguments."""
    from . import __version__

    parser = argparse.ArgumentParser(prog="python -m hunyuan_mt",
                                     description="Hunyuan-MT translation server: command line tools.")
    parser.add_argument("--version", action="version", version=f"hunyuan_mt {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress and the route to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("translate", help="translate text, stdin or a file",
                       description="Translate text given as arguments, on stdin, or a document with --file.")
    p.add_argument("text", nargs="*", help="text to translate (default: read stdin)")
    p.add_argument("--src", default="auto", help="source language code, or auto (default)")
    p.add_argument("--tgt", required=True, help="target language code")
    # Written out: importing documents (and every format library) only for --help would slow every command.
    p.add_argument("--file", help="a document to translate (txt, md, srt, docx, pptx, xlsx, odt, ods, odp, epub, "
                                  "pdf, html, po, pot, json, yaml, xlf)")
    p.add_argument("--output", "-o", help="where to write a translated --file ('-' for stdout)")
    p.add_argument("--json", action="store_true", help="print the whole result (route, adapters, timings) as JSON")
    p.add_argument("--context", help="text that shapes the translation and is not translated (decoder-only models "
                   "read it in their prompt; the demo ignores it)")
    p.add_argument("--glossary", metavar="FILE_OR_ID",
                   help="terms to enforce: a file ('Save = Guardar' per line) or a stored glossary's id")
    add_config_arguments(p)
    p.set_defaults(handler=cmd_translate)

    p = sub.add_parser("adapters", help="list registered adapters and the cache state")
    p.add_argument("--rescan", action="store_true", help="re-read the adapters folder first")
    p.add_argument("--json", action="store_true")
    add_config_arguments(p)
    p.set_defaults(handler=cmd_adapters)

    p = sub.add_parser("tm", help="translation memory: tm import FILE --pair en2es (TSV or TMX); "
                                  "tm export [FILE] --pair en2es (TMX)")
    p.add_argument("action", choices=["import", "export"])
    p.add_argument("file", nargs="?", help="import: a .tsv (source<TAB>target per line) or .tmx file; export: the "
                                          ".tmx to write (default <pair>.tmx here)")
    p.add_argument("--pair", required=True, help="the direction, e.g. en2es")
    add_config_arguments(p)
    p.set_defaults(handler=cmd_tm)

    p = sub.add_parser("detect", help="detect the language of text (arguments or stdin)")
    p.add_argument("text", nargs="*")
    p.add_argument("--top", type=int, default=3, help="how many guesses to show")
    p.add_argument("--among", help="comma-separated codes to choose among (default: every language)")
    p.add_argument("--json", action="store_true")
    add_config_arguments(p)
    p.set_defaults(handler=cmd_detect)

    for name, (module, help_text) in PLUGINS.items():
        if name == command:
            _load_plugin(name, module).register(sub)
        else:
            # A placeholder so `--help` lists it; its real arguments come with its module.
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _load_plugin(name: str, module: str) -> Any:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise _PluginMissing(f"The '{name}' command is not available in this checkout ({module} is missing).")
        raise _PluginMissing(f"The '{name}' command cannot start: it needs the Python package '{exc.name}', "
                             "which is not installed.") from None
    if not hasattr(mod, "register"):
        raise _PluginMissing(f"The '{name}' command is not available: {module} has no register().")
    return mod


class _PluginMissing(Exception):
    pass


def _first_command(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    verbose = "-v" in argv or "--verbose" in argv
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # Libraries' warnings (transformers, peft, torch) are log records, shown with -v only: the CLI prints what was
    # asked for.
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").setLevel(logging.WARNING if verbose else logging.ERROR)
    try:
        parser = build_parser(_first_command(argv))
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        handler = getattr(args, "handler", None)
        if handler is None:  # a placeholder parser: only possible if the plugin did not set a handler
            print(f"error: the '{args.command}' command has no handler", file=sys.stderr)
            return EXIT_FAILURE
        if not verbose:
            _quiet_libraries()
        return int(handler(args) or 0)
    except _PluginMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (InvalidInput, ConfigError) as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except TranslationError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `| head`; nothing left to tell anyone
        return 0
    except Exception as exc:  # noqa: BLE001 - the CLI's edge: one line, never a traceback
        if os.environ.get("HMT_TRACEBACK"):
            raise
        line = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        print(f"error: {type(exc).__name__}{': ' + line if line else ''} (HMT_TRACEBACK=1 shows the traceback)",
              file=sys.stderr)
        return EXIT_FAILURE


def _quiet_libraries() -> None:
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass
