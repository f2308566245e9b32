"""The entry points: check an upload (size, type, content), parse it, and translate it through a callback."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath

from .. import masking
from ..config import LimitsConfig
from ..errors import InputTooLarge, InvalidInput, UnsupportedDocument
from ..glossary import Glossary, has_terms
from .base import (ORIGIN_MEMORY, ORIGIN_MEMORY_NEAR, Document, RenderedDocument, check_not_empty,
                   check_segment_limits, plural)
from .ebook import read_epub
from .gettext import read_gettext
from .htmlpage import read_html
from .markdown import read_markdown
from .opendocument import read_odp, read_ods, read_odt
from .pdf import read_pdf, write_pdf_translation
from .presentation import read_presentation
from .spreadsheet import read_spreadsheet
from .structured import read_json, read_yaml
from .plaintext import read_text
from .sniff import describe_text_content, magic_kind
from .subtitles import read_subtitles
from .word import read_word
from .xliff import read_xliff

Progress = Callable[[int, int], None]
TranslateSegments = Callable[[list[str], Progress | None], list[str]]
#: How an upload becomes a Document: `read_document`, or the same in a helper process.
Reader = Callable[[bytes, str, LimitsConfig], Document]


@dataclass(frozen=True)
class _Format:
    label: str
    read: Callable[[bytes, str, LimitsConfig], Document]
    #: "text", "zip" or "pdf": what the bytes must look like.
    content: str


_FORMATS: dict[str, _Format] = {
    ".txt": _Format("a plain-text file", read_text, "text"),
    ".md": _Format("a Markdown file", read_markdown, "text"),
    ".markdown": _Format("a Markdown file", read_markdown, "text"),
    ".srt": _Format("an SRT subtitle file", read_subtitles, "text"),
    ".docx": _Format("a Word document", read_word, "zip"),
    ".pptx": _Format("a PowerPoint presentation", read_presentation, "zip"),
    ".xlsx": _Format("an Excel workbook", read_spreadsheet, "zip"),
    ".odt": _Format("an OpenDocument text document", read_odt, "zip"),
    ".ods": _Format("an OpenDocument spreadsheet", read_ods, "zip"),
    ".odp": _Format("an OpenDocument presentation", read_odp, "zip"),
    ".epub": _Format("an EPUB book", read_epub, "zip"),
    ".pdf": _Format("a PDF", read_pdf, "pdf"),
    ".html": _Format("an HTML page", read_html, "text"),
    ".htm": _Format("an HTML page", read_html, "text"),
    ".po": _Format("a gettext catalogue", read_gettext, "text"),
    ".pot": _Format("a gettext template", read_gettext, "text"),
    ".json": _Format("a JSON file", read_json, "text"),
    ".yaml": _Format("a YAML file", read_yaml, "text"),
    ".yml": _Format("a YAML file", read_yaml, "text"),
    ".xlf": _Format("an XLIFF file", read_xliff, "text"),
    ".xliff": _Format("an XLIFF file", read_xliff, "text"),
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
_LAYOUT_WRITERS: dict[str, Callable[..., RenderedDocument]] = {"pdf": write_pdf_translation}


def render_layout(kind: str, filename: str, layout: object, translations: list[str],
                  target: str | None) -> RenderedDocument:
    """A translation written from a document's layout (what `Document.layout` gave), without its file."""
    return _LAYOUT_WRITERS[kind](filename, layout, translations, target)


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
        notes.append(f"{plural(kept.redone, 'segment')} whose markup came back out of order "
                     f"{'were' if kept.redone > 1 else 'was'} translated piece by piece, between the tags.")
    if kept.retranslated:
        many = kept.retranslated > 1
        notes.append(f"{plural(kept.retranslated, 'formatted piece')} the model had left in the source language "
                     f"{'were' if many else 'was'} translated on {'their' if many else 'its'} own.")
    if notes:
        rendered = dataclasses.replace(rendered, note=" ".join([rendered.note, *notes]).strip())
    return rendered


def distinct_segments(document: Document) -> int:
    """How many segments a translation sends (repeated ones go once): a document job's `total`."""
    return len(set(document.segments))


@dataclass
class KeptMarkup:
    """What `translate_keeping_markup` gives: every segment's translation, in the document's order, and how many
    segments and pieces needed a second pass."""

    translations: list[str]
    #: Segments whose markup came back out of order (or emptied, or without a glossary term): re-done piece by
    #: piece between the tags.
    redone: int = 0
    #: Formatted pieces the model copied from the source as they were: translated again on their own.
    retranslated: int = 0


def translate_keeping_markup(document: Document, translate_segments: TranslateSegments,
                             progress: Progress | None = None,
                             glossary: Glossary | None = None,
                             origins: dict[str, str] | None = None) -> KeptMarkup:
    """Every segment's translation, and how many had to be re-done to keep their markup or translate it.

    Repeated segments (table headers, running footers) are sent once. When a segment carries markup sentinels
    (`Document.sentinel_markup`) and its translation does not give them back once each and in order, the tags
    could end up swapped or badly nested (`<b>…</i>`): the text between the markup is then translated piece by
    piece and put back between the sentinels in the source's order, which keeps the markup valid whatever the
    model does. So is a segment where a `glossary` term left the element it was in (`Open the <b>file</b>` coming
    back as `Abre el <b></b> archivo`): each piece between the markup must hold its own terms.

    A segment whose markup came back in order can still have a formatted piece that came back exactly as the
    source wrote it (`Pulse ⟦0⟧Save⟦1⟧ para…`): a model may have learnt that text between sentinels is to be
    copied, as code is. Words in a formatting run are language, so such a piece is translated again on its own,
    and its translation replaces the copy where it differs (a name or a term the model keeps stays as it was).
    Code, `translate="no"` and protected spans are not pieces: the readers and the masking keep them out. Nor is a
    segment the translation memory answered (`origins`, when the caller keeps them): a translator kept the words.
    """
    unique = list(dict.fromkeys(document.segments))
    translated = translate_segments(unique, progress)
    if len(translated) != len(unique):
        raise RuntimeError(f"translate_segments returned {len(translated)} texts for {len(unique)} segments")
    redo: dict[int, list[str]] = {}
    copied: dict[int, tuple[list[str], list[int]]] = {}
    if document.sentinel_markup:
        for i, (source, out) in enumerate(zip(unique, translated)):
            count = masking.sentinel_count(source)
            if not count:
                continue
            pieces = masking.split_at_sentinels(source, count)
            if pieces is None:  # a document's own sentinels are always in order
                continue
            came_back = masking.split_at_sentinels(out, count)
            if (came_back is None or _emptied(pieces, came_back)
                    or (glossary is not None and not _terms_stay(pieces, came_back, glossary))):
                redo[i] = pieces
            elif (origins or {}).get(source) not in (ORIGIN_MEMORY, ORIGIN_MEMORY_NEAR) and \
                    (positions := _copied(pieces, came_back)):
                copied[i] = (came_back, positions)
    texts = [p.strip() for pieces in redo.values() for p in pieces if p.strip()]
    texts += [came_back[k].strip() for came_back, positions in copied.values() for k in positions]
    done = _translate_each(texts, translate_segments)
    for i, pieces in redo.items():
        translated[i] = masking.join_pieces([_around(p, _initial_case(p, done.get(p.strip(), p))) for p in pieces])
    retranslated = 0
    for i, (came_back, positions) in copied.items():
        changed = 0
        for k in positions:
            again = done.get(came_back[k].strip(), "")
            if again.strip() and _words(again) != _words(came_back[k]):
                came_back[k] = _around(came_back[k], _initial_case(came_back[k], again))
                changed += 1
        if changed:  # else the model's own text stays, to the byte
            translated[i] = masking.join_pieces(came_back)
            retranslated += changed
    by_source = dict(zip(unique, translated))
    return KeptMarkup([by_source[s] for s in document.segments], len(redo), retranslated)


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


def _copied(pieces: list[str], translated: list[str]) -> list[int]:
    """Positions of the pieces between two sentinels that hold a word (two letters in a row) and came back with
    the same words as the source's: a formatted word the model copied rather than translated."""
    return [k for k in range(1, len(pieces) - 1)
            if masking.WORD.search(pieces[k]) and _words(pieces[k]) == _words(translated[k])]


def _emptied(pieces: list[str], translated: list[str]) -> bool:
    """Whether a piece between two sentinels that held words came back empty: the model moved them out of their
    markup (`su contraseña <strong></strong>.`), which would leave the formatting on nothing. The first and last
    pieces may empty as the target's word order moves the formatted words to an end (`⟦0⟧Viel schneller⟦1⟧ als
    geplant wuchs der Umsatz.`); that is not checked."""
    return any(any(ch.isalpha() for ch in piece) and not out.strip()
               for piece, out in zip(pieces[1:-1], translated[1:-1]))


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
