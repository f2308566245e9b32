"""Documents: one reader/writer per format (txt, md, srt, docx, pptx, xlsx, odt, ods, odp, epub, pdf, html, po/pot,
json, yaml, xliff), plus upload checks and limits.

    document = read_document(data, "report.docx", limits)   # segments to translate, in order
    rendered = document.render(translations)                  # RenderedDocument(data, filename, media_type, note)

or in one call, with the service's `translate_segments` bound to a pair: `translate_document(...)`.
"""

from .base import Document, RenderedDocument
from .reader import (LISTED_EXTENSIONS, SUPPORTED_EXTENSIONS, KeptMarkup, distinct_segments, read_document,
                     translate_document, translate_keeping_markup)

__all__ = ["Document", "KeptMarkup", "LISTED_EXTENSIONS", "RenderedDocument", "SUPPORTED_EXTENSIONS", "distinct_segments",
           "read_document", "translate_document", "translate_keeping_markup"]
