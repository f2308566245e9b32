"""gettext catalogues (.po, .pot): untranslated entries get a machine translation, marked fuzzy where the model
was unsure or gave the source back.

Read and written with polib, the library translate-toolkit and Weblate's tooling rest on, so what comes back is a
catalogue `msgfmt` takes: the header, every entry's order, `msgctxt`, comments, references, flags and obsolete
entries stay as they were. An entry already translated is left alone (a translator's work is never overwritten); an
entry the model fills below `quality.review_below` confidence, or with its source unchanged, gets the `fuzzy` flag,
which is how gettext says "check me" (msgfmt leaves fuzzy entries out of the compiled catalogue until someone
removes the flag), and one at or above it a translator comment saying it is a confident machine translation (1.0
flags them all); an entry the translation memory filled gets a translator comment saying so, and the fuzzy flag
only when the match was near-exact (an exact one is a person's translation). A plural entry gets its singular's translation in msgstr[0] and its plural's in every other form the header's Plural-Forms asks for (2 without one). Placeholders
(`%s`, `{name}`, `%(count)d`) travel as masking spans like everywhere else. A .pot comes back as a .po whose
header names the target language.
"""

from __future__ import annotations

import re
import tempfile

import polib

from ..config import LimitsConfig
from ..errors import InvalidInput
from .base import (ORIGIN_MEMORY, ORIGIN_MEMORY_NEAR, ORIGIN_MODEL, ORIGIN_MODEL_SURE, Document, RenderedDocument,
                   needs_translation, output_filename)
from .encoding import decode_text

_NOTE = ("Entries the model translated with low confidence (quality.review_below) or left as the source are marked "
         "fuzzy for review; entries already translated, contexts, comments and flags are kept.")
_NPLURALS = re.compile(r"nplurals\s*=\s*(\d+)")
#: The translator comment an entry gets for where its translation came from (the model's unsure ones have the
#: fuzzy flag alone): an exact answer is a person's translation and is not fuzzy; a near-exact one is.
_COMMENTS = {ORIGIN_MEMORY: "translation memory: exact match",
             ORIGIN_MEMORY_NEAR: "translation memory: near-exact match (case, punctuation, numbers or placeholders "
                                 "differed); check it",
             ORIGIN_MODEL_SURE: "machine translation, confident (at or above quality.review_below)"}
#: A line that holds a string: a keyword line or a continuation, of a live, obsolete (#~) or previous (#|) entry.
_STRING_LINE = re.compile(r'^(?:#[~|]\s*)?(?:(?:msgctxt|msgid|msgid_plural|msgstr(?:\[\d+\])?)\s+)?"')
#: Its string, whole: quoted, escapes paired, nothing after the closing quote but blanks.
_WHOLE_STRING = re.compile(r'"(?:[^"\\]|\\.)*"\s*$')


class GettextDocument(Document):
    kind = "po"

    def __init__(self, filename: str, text: str) -> None:
        _check_strings(filename, text)
        try:
            self._catalogue = _parse(text)
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"{filename}: not a readable gettext catalogue ({str(exc)[:160]})") from None
        self._template = filename.lower().endswith(".pot")
        self._plurals = self._nplurals()
        segments: list[str] = []
        #: (entry, its singular's segment index or None, its plural's segment index or None)
        self._todo: list[tuple[polib.POEntry, int | None, int | None]] = []
        for entry in self._catalogue:
            # Left alone: obsolete entries, the header, and any entry that has a translation, fuzzy ones included
            # (a stale translation is still a translator's draft).
            if entry.obsolete or not entry.msgid or not needs_translation(entry.msgid) or entry.msgstr or any(
                    (entry.msgstr_plural or {}).values()):
                continue
            singular = len(segments)
            segments.append(entry.msgid)
            plural = None
            if entry.msgid_plural and needs_translation(entry.msgid_plural):
                plural = len(segments)
                segments.append(entry.msgid_plural)
            self._todo.append((entry, singular, plural))
        super().__init__(filename, segments)

    def _nplurals(self) -> int:
        match = _NPLURALS.search(self._catalogue.metadata.get("Plural-Forms", ""))
        return max(1, int(match.group(1))) if match else 2

    def _render(self, translations: list[str], target: str | None) -> RenderedDocument:
        for entry, singular, plural in self._todo:
            if singular is None:
                continue
            if entry.msgid_plural:
                other = translations[plural] if plural is not None else entry.msgid_plural
                entry.msgstr_plural = {i: translations[singular] if i == 0 else other for i in range(self._plurals)}
            else:
                entry.msgstr = translations[singular]
            sources = [entry.msgid] + ([entry.msgid_plural] if plural is not None else [])
            found = {self.origins.get(text, ORIGIN_MODEL) for text in sources}
            # The entry is as sure as its least sure string.
            origin = next(o for o in (ORIGIN_MODEL, ORIGIN_MEMORY_NEAR, ORIGIN_MODEL_SURE, ORIGIN_MEMORY) if o in found)
            if origin in _COMMENTS:
                entry.tcomment = "\n".join(filter(None, [entry.tcomment, _COMMENTS[origin]]))
            if origin in (ORIGIN_MODEL, ORIGIN_MEMORY_NEAR) and "fuzzy" not in entry.flags:
                entry.flags.insert(0, "fuzzy")  # first, as msgmerge writes it: "#, fuzzy, c-format"
        if target and (self._template or not self._catalogue.metadata.get("Language")):
            self._catalogue.metadata["Language"] = target
        data = self._catalogue.__unicode__().encode("utf-8")
        return RenderedDocument(data, output_filename(self.filename, ".po", target), "text/x-gettext-translation",
                                _NOTE)


def _check_strings(filename: str, text: str) -> None:
    """Refuse a string that is not closed where it starts. polib takes `msgid "Open the file` (no closing quote)
    and reads it as "Open the fil"; the file would come back rewritten around a broken source."""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        match = _STRING_LINE.match(stripped)
        if match and not _WHOLE_STRING.fullmatch(stripped, match.end() - 1):
            raise InvalidInput(f"{filename}: line {number}: unterminated or malformed string "
                               f"({stripped[:60]!r}); each string must be closed by a \" on its own line.")


def _parse(text: str) -> polib.POFile:
    """polib.pofile reads its argument as a path when a file of that name exists: an upload whose whole content
    is "/etc/passwd" would be read from the disk. Give it a file of our own instead, removed at once."""
    with tempfile.NamedTemporaryFile("w", suffix=".po", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        return polib.pofile(handle.name, wrapwidth=78, encoding="utf-8")


def read_gettext(data: bytes, filename: str, limits: LimitsConfig) -> GettextDocument:
    return GettextDocument(filename, decode_text(data, filename).text)
