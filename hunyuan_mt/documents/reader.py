"""The entry points: check an upload (size, type, content), parse it, and translate it through a callback."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from ..text import masking
from ..config import LimitsConfig
from ..errors import InputTooLarge, InvalidInput, UnsupportedDocument
from ..text.glossary import Glossary, has_terms
from . import alignment
from .base import (ORIGIN_MEMORY, ORIGIN_MEMORY_NEAR, ORIGIN_MODEL, Document, RenderedDocument, check_not_empty,
                   check_segment_limits, plural)
from .sniff import describe_text_content, magic_kind

Progress = Callable[[int, int], None]
TranslateSegments = Callable[[list[str], Progress | None], list[str]]
#: How an upload becomes a Document: `read_document`, or the same in a helper process.
Reader = Callable[[bytes, str, LimitsConfig], Document]


@dataclass(frozen=True)
class _Format:
    label: str
    #: "module:function" in this package: imported on the first upload of the format, not when the server starts.
    #: The Office, PDF and e-book libraries took ~0.7 s of every process's start, servers and CLI runs alike, most
    #: of which never read such a file.
    reader: str
    #: "text", "zip" or "pdf": what the bytes must look like.
    content: str

    def read(self, data: bytes, filename: str, limits: LimitsConfig) -> Document:
        return _resolve(self.reader)(data, filename, limits)


def _resolve(target: str) -> Callable[..., Any]:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def import_all_formats() -> None:
    """Every format's module and library, now: for a process whose reads run against a deadline (the document
    helpers), which must not spend a read's time importing."""
    for target in {fmt.reader for fmt in _FORMATS.values()} | set(_LAYOUT_WRITERS.values()):
        _resolve(target)


_FORMATS: dict[str, _Format] = {
    ".txt": _Format("a plain-text file", "plaintext:read_text", "text"),
    ".md": _Format("a Markdown file", "markdown:read_markdown", "text"),
    ".markdown": _Format("a Markdown file", "markdown:read_markdown", "text"),
    ".srt": _Format("an SRT subtitle file", "subtitles:read_subtitles", "text"),
    ".docx": _Format("a Word document", "word:read_word", "zip"),
    ".pptx": _Format("a PowerPoint presentation", "presentation:read_presentation", "zip"),
    ".xlsx": _Format("an Excel workbook", "spreadsheet:read_spreadsheet", "zip"),
    ".odt": _Format("an OpenDocument text document", "opendocument:read_odt", "zip"),
    ".ods": _Format("an OpenDocument spreadsheet", "opendocument:read_ods", "zip"),
    ".odp": _Format("an OpenDocument presentation", "opendocument:read_odp", "zip"),
    ".epub": _Format("an EPUB book", "ebook:read_epub", "zip"),
    ".pdf": _Format("a PDF", "pdf:read_pdf", "pdf"),
    ".html": _Format("an HTML page", "htmlpage:read_html", "text"),
    ".htm": _Format("an HTML page", "htmlpage:read_html", "text"),
    ".po": _Format("a gettext catalogue", "gettext:read_gettext", "text"),
    ".pot": _Format("a gettext template", "gettext:read_gettext", "text"),
    ".json": _Format("a JSON file", "structured:read_json", "text"),
    ".yaml": _Format("a YAML file", "structured:read_yaml", "text"),
    ".yml": _Format("a YAML file", "structured:read_yaml", "text"),
    ".xlf": _Format("an XLIFF file", "xliff:read_xliff", "text"),
    ".xliff": _Format("an XLIFF file", "xliff:read_xliff", "text"),
}

#: Extensions the upload widgets accept, in the order they are listed to users.
SUPPORTED_EXTENSIONS: tuple[str, ...] = tuple(_FORMATS)
#: The same without the aliases (.markdown, .htm): what the page, the CLI and the API summary name.
LISTED_EXTENSIONS: tuple[str, ...] = tuple(ext for ext in _FORMATS
                                          if ext not in (".markdown", ".htm", ".yml", ".xliff"))


# The binary Office formats that people rename to the new extension.
_LEGACY = {".docx": (".doc", "Word"), ".pptx": (".ppt", "PowerPoint"), ".xlsx": (".xls", "Excel")}


def _extension(filename: str) -> str:
    return PurePath(filename.replace("\\", "/")).suffix.lower()


def _check_content(data: bytes, filename: str, ext: str, fmt: _Format) -> None:
    """Refuse a file whose bytes are not what its extension claims, saying what they look like instead."""
    actual = magic_kind(data)
    if fmt.content == "text":
        actual = describe_text_content(data)
        ok = actual is None
    elif fmt.content == "zip":
        ok = data.startswith(b"PK\x03\x04")
        if actual is None:
            actual = "text" if describe_text_content(data) is None else "binary data"
        if actual.startswith("a legacy Office") and ext in _LEGACY:
            old, app = _LEGACY[ext]
            raise UnsupportedDocument(f"{filename}: this is a legacy {app} {old} file, not a {ext}; save it as {ext} "
                                      "and upload it again")
    else:
        ok = actual == "a PDF document"
        if actual is None:
            actual = "text" if describe_text_content(data) is None else "binary data"
    if not ok:
        raise UnsupportedDocument(f"{filename}: the file's content is {actual}, not {fmt.label} as its {ext} "
                                  "extension says; upload the real file or give it the right extension")


#: The formats written from their layout alone (`Document.layout`), by kind: no second read of the file.
_LAYOUT_WRITERS: dict[str, str] = {"pdf": "pdf:write_pdf_translation"}


def render_layout(kind: str, filename: str, layout: object, translations: list[str],
                  target: str | None) -> RenderedDocument:
    """A translation written from a document's layout (what `Document.layout` gave), without its file."""
    return _resolve(_LAYOUT_WRITERS[kind])(filename, layout, translations, target)


def upload_name(filename: str) -> str:
    """An upload's name as messages and the document give it: its last path part (either slash), or "upload"."""
    return PurePath((filename or "").replace("\\", "/")).name or "upload"


def read_document(data: bytes, filename: str, limits: LimitsConfig) -> Document:
    """Parse an upload into segments. UnsupportedDocument / InputTooLarge / InvalidInput carry a readable reason."""
    name = upload_name(filename)
    ext = _extension(name)
    fmt = _FORMATS.get(ext)
    if fmt is None:
        shown = f"'{ext}'" if ext else "(no extension)"
        raise UnsupportedDocument(f"{name}: unsupported file type {shown}; supported: "
                                  f"{', '.join(SUPPORTED_EXTENSIONS)}")
    if not data:
        raise InvalidInput(f"{name}: the file is empty")
    if len(data) > limits.max_file_bytes:
        raise InputTooLarge(f"{name}: the file is {len(data)} bytes, the limit is {limits.max_file_bytes} bytes")
    _check_content(data, name, ext, fmt)
    document = fmt.read(data, name, limits)
    check_not_empty(name, document.segments)
    check_segment_limits(name, document.segments, limits)
    return document


def translate_document(data: bytes | Document, filename: str, limits: LimitsConfig,
                       translate_segments: TranslateSegments, progress: Progress | None = None,
                       target: str | None = None, glossary: Glossary | None = None,
                       origins: dict[str, str] | None = None, read: Reader | None = None,
                       review_comments: bool = False) -> RenderedDocument:
    """Read, translate and render an upload in one call (what the web layer and the CLI use). `data` may be a
    document `read_document` already read (a job checks the upload before it answers with an id). `read` reads
    it otherwise: `read_document` by default, the server's helper processes (`parsers.DocumentParsers`) there.

    `translate_segments(segments, progress)` is the service's `translate_segments` bound to a language pair.
    `target` names the output file (`report.es.docx`). `origins` (segment text → `base.ORIGIN_*`) is filled by
    the translator as it goes; the formats with a place for it write it.
    """
    document = data if isinstance(data, Document) else (read or read_document)(data, filename, limits)
    kept = translate_keeping_markup(document, translate_segments, progress, glossary, origins)
    if origins is not None:
        document.origins = origins
    document.review_comments = review_comments
    rendered = document.render(kept.translations, target=target)
    notes = []
    if kept.redone:
        notes.append(f"{plural(kept.redone, 'segment')} whose markup could not be placed in the whole sentence's "
                     f"translation {'were' if kept.redone > 1 else 'was'} translated piece by piece, between the tags "
                     "(to check).")
    if kept.unsure:
        notes.append(f"{plural(kept.unsure, 'formatted segment')} {'have' if kept.unsure > 1 else 'has'} "
                     "formatting placed by a weak alignment (to check).")
    if notes:
        rendered = dataclasses.replace(rendered, note=" ".join([rendered.note, *notes]).strip())
    return rendered


def distinct_segments(document: Document) -> int:
    """How many segments a translation sends (repeated ones go once): a document job's `total`."""
    return len(set(document.segments))


@dataclass
class KeptMarkup:
    """What `translate_keeping_markup` gives: every segment's translation, in the document's order, and how the
    formatted ones were put together."""

    translations: list[str]
    #: Formatted segments translated whole, their markup placed in that translation (`alignment.place_markup`).
    aligned: int = 0
    #: Of those, placements the pieces' own translations did not bear out: marked for review.
    unsure: int = 0
    #: Formatted segments whose markup could not be placed in the whole translation: translated piece by piece
    #: between the tags, and marked for review.
    redone: int = 0


def translate_keeping_markup(document: Document, translate_segments: TranslateSegments,
                             progress: Progress | None = None,
                             glossary: Glossary | None = None,
                             origins: dict[str, str] | None = None) -> KeptMarkup:
    """Every segment's translation, and how the formatted ones were put together.

    Repeated segments (table headers, running footers) are sent once. A segment with markup sentinels
    (`Document.sentinel_markup`) goes once as it is, then its text without the markup is translated whole, and the
    pieces inside its elements on their own (through the memory and corrections, like any segment; every piece when
    the first translation lost the markup's order). A model shown the markup translates worse than one shown the
    bare sentence (chrF 0.4-7.0 lower on the demo, `python -m bench.formatted`), so the whole translation is kept,
    and the markup is placed in it by alignment (`alignment.place_markup`): the sentinels come back once each and
    in order, so tags cannot end up swapped or badly nested. When the first translation has the same words as the
    whole one, its own sentinels stand. A piece the memory knows takes the memory's words in its place (a bold
    `Cancel` is the memory's `Abbrechen`).

    A segment whose markup cannot be placed (the whole translation has fewer words than the source has formatted
    pieces) is translated piece by piece and put back between the sentinels in the source's order, which keeps
    the markup valid whatever the model does. With `origins` (the caller's record of where each segment came
    from), that segment, a placement its pieces did not bear out, and one where a `glossary` term left its piece
    are marked for review (`ORIGIN_MODEL`). A segment the translation memory answered is left as the memory has
    it: a translator kept the words and their markup.
    """
    unique = list(dict.fromkeys(document.segments))
    translated = translate_segments(unique, progress)
    if len(translated) != len(unique):
        raise RuntimeError(f"translate_segments returned {len(translated)} texts for {len(unique)} segments")
    known = origins if origins is not None else {}
    formatted: dict[int, list[str]] = {}
    if document.sentinel_markup:
        for i, source in enumerate(unique):
            count = masking.sentinel_count(source)
            pieces = masking.split_at_sentinels(source, count) if count else None
            if pieces is not None and known.get(source) not in (ORIGIN_MEMORY, ORIGIN_MEMORY_NEAR):
                formatted[i] = pieces
    bare = {i: _bare(unique[i]) for i in formatted}
    firsts = {i: masking.split_at_sentinels(translated[i], len(pieces) - 1) for i, pieces in formatted.items()}
    texts = [text for text in bare.values() if text]
    texts += [p.strip() for i, pieces in formatted.items() for p in _alone(pieces, firsts[i] is not None)]
    done = _translate_each(texts, translate_segments)
    kept = KeptMarkup(translated)
    redo: list[int] = []
    for i, pieces in formatted.items():
        source, first = unique[i], firsts[i]
        # A translator that echoes sentinels into a text that had none (the service's masking never does): they
        # are not the source's.
        whole = masking.SENTINEL.sub("", done.get(bare[i], ""))
        alone = [done.get(p.strip()) if _has_words(p) else None for p in pieces]
        emptied = first is not None and _emptied(pieces, first)
        if first is not None and not emptied and _bare(translated[i]) == " ".join(whole.split()):
            placed: alignment.Placement | None = alignment.Placement(translated[i], True, (True,) * len(pieces))
        else:
            placed = alignment.place_markup(source, whole, alone, first,
                                            _emptied_words(pieces, first) if emptied else None)
        if placed is None:
            redo.append(i)
            continue
        slices = masking.split_at_sentinels(placed.text, len(pieces) - 1) or []
        changed = _memory_pieces(pieces, slices, alone, placed.matched, known)
        translated[i] = masking.join_pieces(changed) if changed != slices else placed.text
        kept.aligned += 1
        sure = placed.confident and (glossary is None or _terms_stay(pieces, changed, glossary))
        kept.unsure += not sure
        if origins is not None:
            # The memory's words for the bare sentence with markup placed here: a near answer, to check.
            origin = origins.get(bare[i], ORIGIN_MODEL) if sure else ORIGIN_MODEL
            origins[source] = ORIGIN_MEMORY_NEAR if origin == ORIGIN_MEMORY else origin
    # Piece by piece: the pieces not translated alone yet go in one more call.
    more = [p.strip() for i in redo for p in formatted[i] if _has_words(p) and p.strip() not in done]
    done.update(_translate_each(more, translate_segments))
    for i in redo:
        translated[i] = masking.join_pieces([_around(p, _initial_case(p, done.get(p.strip(), p)))
                                             for p in formatted[i]])
        kept.redone += 1
        known[unique[i]] = ORIGIN_MODEL
    by_source = dict(zip(unique, translated))
    kept.translations = [by_source[s] for s in document.segments]
    return kept


def _bare(segment: str) -> str:
    """A formatted segment's text without its sentinels, as one line: what is translated whole."""
    return " ".join(masking.SENTINEL.sub("", segment).split())


def _alone(pieces: list[str], hinted: bool) -> list[str]:
    """The pieces of a formatted segment to translate on their own: those an element holds (glued to their
    sentinels, `alignment.element_pieces`: where the memory's words for a bold `Cancel` matter, and what the
    alignment finds least well otherwise), and the others too when the tagged translation gave no hints."""
    inside = alignment.element_pieces(pieces)
    return [p for p, held in zip(pieces, inside) if _has_words(p) and (held or not hinted)]


def _has_words(piece: str) -> bool:
    return any(ch.isalpha() for ch in piece)


def _memory_pieces(pieces: list[str], slices: list[str], alone: list[str | None], matched: tuple[bool, ...],
                   origins: dict[str, str]) -> list[str]:
    """`slices` with the memory's translation of each piece the memory knows in place of what the whole
    translation had there, where that slice was found to be the piece's (a translator's term for a bold `Cancel`
    wins over the model's word in the sentence)."""
    out = list(slices)
    for k, (piece, mine) in enumerate(zip(pieces, alone)):
        if (mine and mine.strip() and k < len(matched) and matched[k] and out[k].strip()
                and origins.get(piece.strip()) in (ORIGIN_MEMORY, ORIGIN_MEMORY_NEAR)
                and _words(mine) != _words(out[k])):
            out[k] = _around(out[k], _initial_case(piece, mine))
    return out


def _translate_each(texts: list[str], translate_segments: TranslateSegments) -> dict[str, str]:
    """Each distinct text's translation, each sent once; nothing is sent when there is none."""
    unique = list(dict.fromkeys(texts))
    return dict(zip(unique, translate_segments(unique, None))) if unique else {}


def _words(text: str) -> str:
    """A piece's words for comparison: spacing and the punctuation at its ends do not count. Case does: a piece
    whose case changed was worked on, not copied."""
    return " ".join(text.split()).strip(" .,:;!?\"'«»“”‘’()")


def _initial_case(source: str, translation: str) -> str:
    """A piece translated alone starts as a sentence would (`Cambios`); inside the sentence it had the source's
    lower-case start (`sus cambios`). An acronym or a name stays as written (`PDF`, `GIMP`)."""
    src, out = source.strip(), translation.strip()
    if src[:1].islower() and out[:1].isupper() and not out[1:2].isupper():
        return out[:1].lower() + out[1:]
    return out


def _emptied(pieces: list[str], translated: list[str]) -> bool:
    """Whether a piece that must keep words (`alignment.needs_words`) came back empty: the model moved them out of
    their markup (`su contraseña <strong></strong>.`), which would leave the formatting on nothing."""
    return any(needed and not out.strip() for needed, out in zip(alignment.needs_words(pieces), translated))


def _emptied_words(pieces: list[str], translated: list[str]) -> list[str | None]:
    """For each element a tagged translation emptied, the word just before its sentinels: a model that loses the
    place of a formatted word writes the word, then the tags (`la cuenta ⟦0⟧⟦1⟧.`), so that word is a guess at
    the element's text (`alignment.place_markup`'s `guesses`)."""
    out: list[str | None] = [None] * len(pieces)
    for k in range(1, len(pieces)):
        if any(ch.isalpha() for ch in pieces[k]) and not translated[k].strip():
            out[k] = alignment.last_word(translated[k - 1].rstrip()) or None
    return out


def _terms_stay(pieces: list[str], translated: list[str], glossary: Glossary) -> bool:
    """Whether each translated piece holds the glossary terms of its source piece."""
    return all(has_terms(out, glossary.targets(masking.Protected(piece, [])))
               for piece, out in zip(pieces, translated))


def _around(source_piece: str, translation: str) -> str:
    """`translation` with the whitespace that surrounded the source piece (it separates it from the markup)."""
    stripped = source_piece.strip()
    if not stripped:
        return source_piece
    lead = source_piece[:len(source_piece) - len(source_piece.lstrip())]
    trail = source_piece[len(source_piece.rstrip()):]
    return lead + translation.strip() + trail
