"""Zip-based uploads (docx, pptx, xlsx, OpenDocument, epub): refuse bombs and wrong kinds before parsing."""

from __future__ import annotations

import io
import stat
import zipfile

from ..config import LimitsConfig
from ..errors import InputTooLarge, UnsupportedDocument

#: More zip members than any real document has; refused before anything is unpacked.
MAX_ZIP_MEMBERS = 10_000


def _kind(names: set[str], mimetype: str) -> str | None:
    if "word/document.xml" in names:
        return "docx"
    if "ppt/presentation.xml" in names:
        return "pptx"
    if "xl/workbook.xml" in names:
        return "xlsx"
    for kind, media in _ODF_MEDIA.items():
        if mimetype == media:
            return kind
    if mimetype == "application/epub+zip":
        return "epub"
    return None


_ODF_MEDIA = {"odt": "application/vnd.oasis.opendocument.text",
              "ods": "application/vnd.oasis.opendocument.spreadsheet",
              "odp": "application/vnd.oasis.opendocument.presentation"}

_DESCRIBED = {"docx": "a Word document", "pptx": "a PowerPoint presentation", "xlsx": "an Excel workbook",
              "odt": "an OpenDocument text", "ods": "an OpenDocument spreadsheet",
              "odp": "an OpenDocument presentation", "epub": "an EPUB book"}


def check_zip(data: bytes, filename: str, limits: LimitsConfig, kind: str) -> None:
    """Refuse zip bombs from the central directory's declared sizes, before any member is decompressed, and an
    archive that is not a `kind` file (saying what it is instead).

    zipfile never yields more than a member's declared size (a member that inflates further fails its CRC check),
    so the declared total bounds what parsing can unpack.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            infos = zf.infolist()
            names = {info.filename for info in infos}
            if len(infos) <= MAX_ZIP_MEMBERS and "mimetype" in names and zf.getinfo("mimetype").file_size < 200:
                mimetype = zf.read("mimetype").decode("ascii", "replace").strip()
            else:
                mimetype = ""
    except (zipfile.BadZipFile, OSError, ValueError, KeyError):
        raise UnsupportedDocument(f"{filename}: the .{kind} is damaged (not a readable zip archive)") from None
    if len(infos) > MAX_ZIP_MEMBERS:
        raise InputTooLarge(f"{filename}: the archive holds {len(infos)} files, the limit is {MAX_ZIP_MEMBERS}")
    outside = next((info.filename for info in infos if _escapes(info.filename)), None)
    if outside is not None:
        # The translated package is written back member by member: a "../" name (or an absolute one) would reach
        # whoever unpacks the download with a naive tool. No real package has one.
        raise UnsupportedDocument(f"{filename}: the package holds a file named {outside[:80]!r}, which points "
                                  "outside the package; such a package is refused")
    total = sum(info.file_size for info in infos)
    if total > limits.max_unzipped_bytes:
        raise InputTooLarge(f"{filename}: unpacks to {total} bytes, the limit is {limits.max_unzipped_bytes} bytes")
    actual = _kind(names, mimetype)
    if actual != kind:
        what = f"it is {_DESCRIBED[actual]}; save it as .{kind} or upload it as .{actual}" if actual else \
            "it is some other zip archive"
        raise UnsupportedDocument(f"{filename}: not {_DESCRIBED[kind]} ({what})")


def _escapes(name: str) -> bool:
    """Whether a member name leaves the package: absolute, a drive, or a ".." step (either slash)."""
    parts = name.replace("\\", "/").split("/")
    return name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or ".." in parts


def _plain_mode(external_attr: int) -> int:
    """The member's attributes with its Unix type made a plain file (or kept a folder): a symlink flag copied into
    the download would make an unpacker create a link; permissions and DOS bits stay."""
    mode = external_attr >> 16
    if mode and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        mode = stat.S_IFREG | 0o644
    return (mode << 16) | (external_attr & 0xFFFF)


def _member_info(info: zipfile.ZipInfo) -> zipfile.ZipInfo:
    """A fresh header for a copied member: same name, date, compression, permissions and comment (a symlink's
    type dropped); `mimetype` stored with no extra field, as OpenDocument and EPUB require of it."""
    out = zipfile.ZipInfo(info.filename, info.date_time)
    out.compress_type = zipfile.ZIP_STORED if info.filename == "mimetype" else info.compress_type
    out.external_attr = _plain_mode(info.external_attr)
    out.create_system = info.create_system
    out.comment = info.comment
    return out


def rewrite_zip(original: bytes, replaced: dict[str, bytes]) -> bytes:
    """The package with the `replaced` members' new bytes and every other member's bytes unchanged, in the same
    order, except that `mimetype` goes first (stored) whatever the upload did."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(original)) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        infos = sorted(zin.infolist(), key=lambda info: info.filename != "mimetype")  # stable: the rest keep order
        for info in infos:
            data = replaced[info.filename] if info.filename in replaced else zin.read(info)
            zout.writestr(_member_info(info), data)
        zout.comment = zin.comment
    return out.getvalue()
