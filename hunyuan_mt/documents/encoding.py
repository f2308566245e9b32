"""Bytes → text for the plain-text formats (txt, md, srt, html), and text → bytes for their output."""

from __future__ import annotations

import codecs
from dataclasses import dataclass

from charset_normalizer import from_bytes

from ..errors import InvalidInput

# Longest first: the UTF-32 LE BOM starts with the UTF-16 LE one.
_BOMS = [
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
]


@dataclass(frozen=True)
class DecodedText:
    text: str
    #: The codec the upload was read with ("utf-8", "utf-16", "cp1252", ...).
    encoding: str
    #: The upload began with a byte-order mark; the output keeps one (UTF-8) so Windows tools still read it right.
    had_bom: bool

    def encode(self, text: str) -> bytes:
        """Output is always UTF-8, whatever the input was: a translation may not fit the original code page."""
        return (codecs.BOM_UTF8 if self.had_bom else b"") + text.encode("utf-8")

    def note(self, kept: str = "") -> str:
        """`kept` (what the format module preserved) plus a word on the encoding when it changed."""
        if self.encoding in ("utf-8", "utf-8-sig"):
            return kept
        return f"{kept} The upload was {self.encoding} text; the translation is saved as UTF-8.".strip()


def bom_encoding(data: bytes) -> str | None:
    for bom, name in _BOMS:
        if data.startswith(bom):
            return name
    return None


def decode_text(data: bytes, filename: str) -> DecodedText:
    """UTF-8 or a BOM-marked Unicode encoding as is; anything else only when charset-normalizer is confident."""
    bom = bom_encoding(data)
    if bom:
        try:
            return DecodedText(data.decode(bom), bom, True)
        except UnicodeDecodeError:
            raise InvalidInput(f"{filename}: starts with a {bom.upper()} byte-order mark but is not valid "
                               f"{bom.upper()} text") from None
    try:
        return DecodedText(data.decode("utf-8"), "utf-8", False)
    except UnicodeDecodeError:
        pass
    best = from_bytes(data).best()
    if best is None or best.encoding is None:
        raise InvalidInput(f"{filename}: the text is not UTF-8 and its encoding could not be detected; "
                           "save it as UTF-8 and upload it again")
    return DecodedText(str(best), best.encoding, False)
