"""One document translation for the web fronts: detect the source when asked, then documents.translate_document."""

from __future__ import annotations

from typing import Any, Callable

from ..config import LimitsConfig
from ..documents import Document, RenderedDocument, translate_document
from ..errors import Cancelled, InvalidInput, UnreachablePair
from ..languages import normalize_code
from ..router import not_available

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
                     context: str | None = None) -> tuple[RenderedDocument, str]:
    """(rendered document, source code actually used). `source` may be "auto". `data` may be the upload already
    read (`documents.read_document`).

    `charge(characters)` is called once the document is read, before anything is translated: the caller's
    character budget (`AccessPolicy.spend_chars`) refuses a document that does not fit. `ticket` (background,
    see ticket.py) lets the caller cancel the document's rows. `context` (what the document is about) shapes
    every segment's translation and is not translated.
    """
    target = normalize_code(target)
    # The first call has the whole document; a second one (pieces redone to keep their markup) is neither billed
    # again nor detected again on its short pieces.
    state: dict[str, Any] = {"source": source, "charged": False}

    def run(segments: list[str], report: Callable[[int, int], None] | None) -> list[str]:
        if charge is not None and not state["charged"]:
            charge(sum(len(s) for s in segments))
            state["charged"] = True
        state["source"] = document_source(service, state["source"], segments)
        if ticket is not None and ticket.cancelled:
            raise Cancelled(f"Cancelled: {ticket.reason}.")
        return service.translate_segments(segments, state["source"], target, progress=report, glossary=glossary,
                                          ticket=ticket, context=context, origins=origins)

    origins: dict[str, str] = {}
    rendered = translate_document(data, filename, limits, run, progress=progress, target=target, glossary=glossary,
                                  origins=origins)
    return rendered, state["source"]
