"""Content sniffing: what the bytes really are, whatever the file name says."""

from __future__ import annotations

import io
import zipfile

from .encoding import bom_encoding

# Signatures of formats people upload by mistake, so the refusal can say what the file is.
_MAGIC: list[tuple[bytes, str]] = [
    (b"%PDF-", "a PDF document"),
    (b"PK\x03\x04", "a zip archive"),
    (b"PK\x05\x06", "an empty zip archive"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "a legacy Office file (.doc/.xls/.ppt)"),
    (b"{\\rtf", "an RTF document"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!", "a RAR archive"),
    (b"\x7fELF", "an executable"),
    (b"MZ", "a Windows executable"),
]

# A few control characters are normal in text (tab, newlines, form feed, escape in old files); many are not.
_TEXT_CONTROLS = {0x09, 0x0A, 0x0C, 0x0D, 0x1B}


def magic_kind(data: bytes) -> str | None:
    """A human name for a known binary signature, or None."""
    # The PDF spec lets the header sit within the first 1024 bytes.
    if b"%PDF-" in data[:1024]:
        return "a PDF document"
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    return None


def looks_binary(data: bytes) -> bool:
    """NUL bytes or many control characters in the first 8 KiB (BOM-marked UTF-16/32 text is not binary)."""
    if bom_encoding(data):
        return False
    head = data[:8192]
    if b"\x00" in head:
        return True
    controls = sum(1 for b in head if b < 0x20 and b not in _TEXT_CONTROLS)
    return controls > max(2, len(head) // 100)


def describe_text_content(data: bytes) -> str | None:
    """None when the bytes can be text; otherwise what they look like instead."""
    kind = magic_kind(data)
    if kind is None and looks_binary(data):
        kind = "binary data"
    return kind


def zip_names(data: bytes) -> list[str] | None:
    """The member names of a zip archive, or None when it is not a readable zip."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            return zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return None
