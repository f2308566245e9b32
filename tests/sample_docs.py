"""Small documents of every supported format, built in code, for the web tests' round trips."""

from __future__ import annotations

import io

import docx

TXT = "Open the file.\n\nSave the document and close the window.\n"
MD = "# Settings\n\nOpen the **file** and save it.\n\n```python\nprint('keep me')\n```\n\n- Close the window\n"
SRT = ("1\n00:00:01,000 --> 00:00:02,500\nHello world.\n\n"
       "2\n00:00:03,000 --> 00:00:04,000\nOpen the file.\n")
HTML = ("<!DOCTYPE html><html><head><title>Help</title></head><body><h1>Settings</h1>"
        "<p>Open the <b>file</b> and <a href=\"https://example.org/x\">save it</a>.</p></body></html>")


def make_docx() -> bytes:
    """A heading, a paragraph with a bold run, and a 2×2 table."""
    document = docx.Document()
    document.add_heading("Settings", level=1)
    paragraph = document.add_paragraph("Open the ")
    paragraph.add_run("file").bold = True
    paragraph.add_run(" and close the window.")
    table = document.add_table(rows=2, cols=2)
    for (r, c), text in {(0, 0): "Name", (0, 1): "Value", (1, 0): "Save", (1, 1): "Close"}.items():
        table.cell(r, c).text = text
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def make_pdf(lines: list[str]) -> bytes:
    """A one-page PDF whose text layer holds `lines` (Helvetica, one line each)."""
    ops = " ".join(f"({line}) Tj 0 -18 Td" for line in lines)
    content = f"BT /F1 12 Tf 72 720 Td {ops} ET"
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >> "
        "/Contents 5 0 R >>",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        f"<< /Length {len(content)} >>\nstream\n{content}\nendstream",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


PDF_LINES = ["Open the file.", "Close the window."]


def docx_structure(data: bytes) -> dict:
    """What must survive a translation: paragraph styles and texts, bold runs, table shape and texts."""
    document = docx.Document(io.BytesIO(data))
    return {
        "paragraphs": [(p.style.name, p.text) for p in document.paragraphs],
        "bold": [r.text for p in document.paragraphs for r in p.runs if r.bold],
        "tables": [[[cell.text for cell in row.cells] for row in table.rows] for table in document.tables],
    }


def log_warnings(count: int, filename: str) -> int:
    """What a reader's library does on a file full of bad objects: one warning each (pypdf's way). Module-level, so
    a document helper can run it (`DocumentParsers.call` pickles it by name)."""
    import logging

    noisy = logging.getLogger("pypdf._reader")
    for n in range(count):
        noisy.warning("bad object %d in %s", n, filename)
    return count
