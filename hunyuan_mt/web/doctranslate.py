"""One document translation for the web fronts: detect the source when asked, then documents.translate_document."""

from __future__ import annotations

from typing import Any, Callable

from ..config import Config, LimitsConfig
from ..documents import Document, RenderedDocument, translate_document
from ..documents.reader import Reader
from ..errors import Cancelled, InvalidInput, UnreachablePair
from ..text.languages import normalize_code
from ..text.glossary import Glossary
from ..service.jobs import Checkpoint, JobSpec, Runner, Work
from ..store import Store
from ..scheduler.router import not_available

#: Characters of the document shown to the language detector; enough for a confident guess.
_DETECT_SAMPLE = 2000


def document_source(service: Any, source: str, segments: list[str]) -> str:
    """The source code a document is translated from: `source`, or for "auto" the language detected on its
    first `_DETECT_SAMPLE` characters."""
    if source != "auto":
        return normalize_code(source)
    detections = service.detect(" ".join(segments)[:_DETECT_SAMPLE])
    if not detections:
        raise InvalidInput("Could not detect the document's language; choose the source language.")
    return detections[0].code


def check_document_route(service: Any, source: str, target: str, segments: list[str]) -> str:
    """The document's source (detected for "auto"), once a route to `target` is known to exist: a job that no
    route could serve is refused when it is submitted (UnreachablePair, 400), as /translate_file refuses it,
    instead of being accepted and failing later."""
    resolved = document_source(service, source, segments)
    if resolved == target:
        return resolved
    # From languages(), which the single-process service and the Ray ingress both answer the same way.
    reachable = next((info.targets for info in service.languages() if info.code == resolved), [])
    if target not in reachable:
        raise UnreachablePair(
            f"No route from {resolved} to {target}; reachable from {resolved}: {', '.join(reachable) or 'nothing'}.",
            reachable=reachable, short=not_available(resolved, target))
    return resolved


def translate_upload(service: Any, data: bytes | Document, filename: str, source: str, target: str, limits: LimitsConfig,
                     progress: Callable[[int, int], None] | None = None,
                     charge: Callable[[int], None] | None = None,
                     glossary: Any = None, ticket: Any = None,
                     context: str | None = None, checkpoint: Checkpoint | None = None,
                     read: Reader | None = None, review_comments: bool = False) -> tuple[RenderedDocument, str]:
    """(rendered document, source code actually used). `source` may be "auto". `data` may be the upload already
    read (`documents.read_document`); else `read` reads it (the server's helper processes). `review_comments`
    (`quality.docx_comments`) has a .docx comment its segments to review.

    `charge(characters)` is called once the document is read, before anything is translated: the caller's
    character budget (`AccessPolicy.spend_chars`) refuses a document that does not fit. `ticket` (background,
    see ticket.py) lets the caller cancel the document's rows. `context` (what the document is about) shapes
    every segment's translation and is not translated. `checkpoint` (a document job's) skips the segments it has
    finished and is told of each round of them as it ends: a job run again after a restart sends only the rest.
    """
    target = normalize_code(target)
    # The first call has the whole document; a second one (pieces redone to keep their markup) is neither billed
    # again nor detected again on its short pieces.
    state: dict[str, Any] = {"source": source, "charged": False, "checkpointed": False}

    def run(segments: list[str], report: Callable[[int, int], None] | None) -> list[str]:
        if charge is not None and not state["charged"]:
            charge(sum(len(s) for s in segments))
            state["charged"] = True
        state["source"] = document_source(service, state["source"], segments)
        if ticket is not None and ticket.cancelled:
            raise Cancelled(f"Cancelled: {ticket.reason}.")
        if checkpoint is None or state["checkpointed"]:  # the pieces redone for markup are not checkpointed
            return service.translate_segments(segments, state["source"], target, progress=report,
                                              glossary=glossary, ticket=ticket, context=context, origins=origins)
        state["checkpointed"] = True
        return _resume(service, segments, state["source"], target, report, glossary, ticket, context, origins,
                       checkpoint)

    origins: dict[str, str] = {}
    rendered = translate_document(data, filename, limits, run, progress=progress, target=target, glossary=glossary,
                                  origins=origins, read=read, review_comments=review_comments)
    return rendered, state["source"]


def job_spec(filename: str, source: str, target: str, glossary: Any, context: str | None) -> JobSpec:
    """What a document job runs, in a form the store keeps: the glossary as its terms."""
    return JobSpec(filename, source, target, tuple(glossary.terms) if glossary is not None else None,
                   getattr(glossary, "name", None), context)


def document_runner(service: Any, cfg: Config, read: Reader | None = None) -> Runner:
    """Document jobs' work over `service` (the REST API's and the page's, which share one job queue), under `cfg`'s
    limits and quality settings. `read` reads an upload kept as bytes (a job restored after a restart)."""
    def runner(spec: JobSpec, upload: bytes | Document, checkpoint: Checkpoint) -> Work:
        glossary = Glossary(spec.glossary_terms, spec.glossary_name or "inline") \
            if spec.glossary_terms is not None else None

        def work(progress: Callable[[int, int], None], ticket: Any) -> tuple[RenderedDocument, str]:
            return translate_upload(service, upload, spec.filename, spec.source, spec.target, cfg.limits, progress,
                                    None, glossary, ticket, spec.context, checkpoint, read,
                                    cfg.quality.docx_comments)
        return work
    return runner


def jobs_store(cfg: Config) -> Store:
    """The store document jobs are kept in: the configured one (the service's too, in one process; the Ray
    ingress has no service of its own). Opened by the web app itself, so that each app over a service finds only
    the jobs of its own configuration (tests start many apps over one service, each with a data folder of its
    own)."""
    return Store.open(cfg.store.url, cfg.store.dir)


#: Segments a job writes down at a time: what a `kill -9` can make it translate again, at most.
CHECKPOINT_SEGMENTS = 16


def _resume(service: Any, segments: list[str], source: str, target: str,
            report: Callable[[int, int], None] | None, glossary: Any, ticket: Any, context: str | None,
            origins: dict[str, str], checkpoint: Checkpoint) -> list[str]:
    """A job's distinct segments translated, those the checkpoint has finished taken from it; each round of
    `CHECKPOINT_SEGMENTS` written down as it ends."""
    done = checkpoint.finished()
    out = [done[i][0] if i in done else text for i, text in enumerate(segments)]
    for i, (_, origin) in done.items():
        if origin is not None and i < len(segments):
            origins[segments[i]] = origin
    todo = [i for i in range(len(segments)) if i not in done]
    already = len(segments) - len(todo)

    def finished(positions: list[int], translations: list[str]) -> None:
        rows = [(todo[p], text, origins.get(segments[todo[p]])) for p, text in zip(positions, translations)]
        checkpoint.record(rows)

    def progress(count: int, total: int) -> None:
        if report is not None:
            report(already + count, already + total)

    translated = service.translate_segments([segments[i] for i in todo], source, target, progress=progress,
                                            glossary=glossary, ticket=ticket, context=context, origins=origins,
                                            finished=finished, chunk=CHECKPOINT_SEGMENTS)
    for i, text in zip(todo, translated):
        out[i] = text
    return out
