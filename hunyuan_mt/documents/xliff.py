"""XLIFF 1.2 and 2.x (.xlf, .xliff): each unit's source gets a target; inline codes come back as they went in.

Read and written with lxml (already the XML library under python-docx), with entity resolution and network access
off. A unit marked translate="no", and one whose target already holds a translation, is left alone. A new target
says where it came from and whether it needs review. In 1.2: state-qualifier="mt-suggestion" for the model's and
"leveraged-tm" for the translation memory's, with state="translated" for an exact memory entry and a model
translation at or above `quality.review_below`, "needs-review-translation" for the rest. 2.x has neither a review
state nor a standard qualifier: the segment's state is "translated" or, for review, "initial" (a target that is not
a translation yet), and its subState (the 2.x way to refine a state, "prefix:value") says where the target came from:
`hunyuan-mt:mt-suggestion`, `hunyuan-mt:leveraged-tm` or `hunyuan-mt:leveraged-tm-near`. The file's target
language is set to the one asked for.

Inline codes travel as masking sentinels, like HTML tags: a paired code's start and end (`<g>…</g>` in 1.2,
`<pc>…</pc>` in 2.x, `<mrk>` in both) are two sentinels with the text between them translated; a standalone code
(`<x/>`, `<bx/>`, `<ex/>`, `<ph/>`, `<sc/>`, `<ec/>`, `<sm/>`, `<em/>`, `<cp/>`), a code that carries native data
(`<ph>`, `<bpt>`, `<ept>`, `<it>` in 1.2) and a marker of text not to translate (`<mrk mtype="protected">`, or
`translate="no"` in 2.x) is one sentinel, copied whole. The codes are placed in the translation of
the segment without them (`reader.translate_keeping_markup`), so they keep their order.
"""

from __future__ import annotations

from dataclasses import dataclass

from lxml import etree

from ..text import masking
from ..config import LimitsConfig
from ..errors import InvalidInput
from .base import (ORIGIN_MEMORY, ORIGIN_MEMORY_NEAR, ORIGIN_MODEL, ORIGIN_MODEL_SURE, Document, RenderedDocument, check_xml_caps,
                   needs_translation, output_filename)

_NOTE = ("Targets written by the model are marked for review, and those from the translation memory say so; inline "
         "codes, notes and translated units are kept.")
#: XLIFF 1.2's state and state-qualifier per origin: the memory's exact answer is a translation (leveraged from
#: the memory); its near-exact one and the model's are for review.
_STATES_1 = {ORIGIN_MEMORY: ("translated", "leveraged-tm"),
             ORIGIN_MEMORY_NEAR: ("needs-review-translation", "leveraged-tm"),
             ORIGIN_MODEL: ("needs-review-translation", "mt-suggestion"),
             ORIGIN_MODEL_SURE: ("translated", "mt-suggestion")}
#: XLIFF 2.x's segment state and subState per origin (the same decisions in the states 2.x has).
_STATES_2 = {ORIGIN_MEMORY: ("translated", "hunyuan-mt:leveraged-tm"),
             ORIGIN_MEMORY_NEAR: ("initial", "hunyuan-mt:leveraged-tm-near"),
             ORIGIN_MODEL: ("initial", "hunyuan-mt:mt-suggestion"),
             ORIGIN_MODEL_SURE: ("translated", "hunyuan-mt:mt-suggestion")}
XLIFF_1 = "urn:oasis:names:tc:xliff:document:1.2"
XLIFF_2 = "urn:oasis:names:tc:xliff:document:2.0"
# Elements whose content is text to translate (the start and end are codes), and codes copied whole.
_PAIRED = {"g", "mrk", "pc"}
_DONE_1 = {"translated", "needs-review-translation", "needs-review-l10n", "needs-review-adaptation",
           "signed-off", "final"}


@dataclass
class _Unit:
    """Where one segment goes: the element that holds the source, and the masked source with its code spans."""

    holder: etree._Element  # trans-unit (1.2) or segment (2.x)
    source: etree._Element
    protected: masking.Protected


def _shallow(element: etree._Element) -> str:
    """`element` alone, as the start of its pair: `<g xmlns="..." id="1">` (its end is `</g>`)."""
    copy = etree.Element(element.tag, dict(element.items()), nsmap=element.nsmap)
    text = etree.tostring(copy, encoding="unicode")
    return text[:-2] + ">" if text.endswith("/>") else text.split("></", 1)[0] + ">"


def _flatten(source: etree._Element) -> masking.Protected:
    """The source's content as text with one sentinel per code (paired codes: one for the start, one for the
    end). Text is unescaped; the spans are XML as it was."""
    pieces: list[str] = []
    spans: list[str] = []

    def code(xml: str) -> None:
        pieces.append(masking.sentinel(len(spans)))
        spans.append(xml)

    def walk(element: etree._Element) -> None:
        if element.text:
            pieces.append(element.text)
        for child in element:
            # Comments, processing instructions and entity references (never resolved) are copied as they are.
            markup = not isinstance(child.tag, str)
            name = "" if markup else etree.QName(child).localname
            protected = markup or child.get("mtype") == "protected" or child.get("translate") == "no"
            if name in _PAIRED and not protected:
                code(_shallow(child))
                walk(child)
                code(f"</{etree.QName(child).localname}>" if child.prefix is None else
                     f"</{child.prefix}:{etree.QName(child).localname}>")
            else:
                tail, child.tail = child.tail, None
                code(etree.tostring(child, encoding="unicode", with_tail=False))
                child.tail = tail
            if child.tail:
                pieces.append(child.tail)

    walk(source)
    return masking.Protected("".join(pieces), spans)


class XliffDocument(Document):
    kind = "xliff"
    sentinel_markup = True

    def __init__(self, filename: str, data: bytes) -> None:
        parser = etree.XMLParser(resolve_entities=False, no_network=True, remove_blank_text=False)
        try:
            self._root = etree.fromstring(data, parser)
        except etree.XMLSyntaxError as exc:
            raise InvalidInput(f"{filename}: not well-formed XML ({str(exc)[:160]})") from None
        check_xml_caps(self._root, filename)
        namespace = etree.QName(self._root).namespace
        if etree.QName(self._root).localname != "xliff" or namespace not in (XLIFF_1, XLIFF_2):
            raise InvalidInput(f"{filename}: not an XLIFF 1.2 or 2.x file (its root is "
                               f"{etree.QName(self._root).localname!r} in {namespace or 'no namespace'})")
        self._ns = namespace
        self._units = self._units_1() if namespace == XLIFF_1 else self._units_2()
        super().__init__(filename, [unit.protected.text for unit in self._units])

    def _q(self, name: str) -> str:
        return f"{{{self._ns}}}{name}"

    def _units_1(self) -> list[_Unit]:
        units = []
        for unit in self._root.iter(self._q("trans-unit")):
            source, target = unit.find(self._q("source")), unit.find(self._q("target"))
            if unit.get("translate") == "no" or source is None:
                continue
            if target is not None and "".join(target.itertext()).strip() and (
                    target.get("state") in _DONE_1 or target.get("state") is None):
                continue
            self._add(units, unit, source)
        return units

    def _units_2(self) -> list[_Unit]:
        units = []
        for unit in self._root.iter(self._q("unit")):
            if unit.get("translate") == "no":
                continue
            for segment in unit.iter(self._q("segment")):
                source, target = segment.find(self._q("source")), segment.find(self._q("target"))
                if source is None or (target is not None and "".join(target.itertext()).strip()):
                    continue
                self._add(units, segment, source)
        return units

    def _add(self, units: list[_Unit], holder: etree._Element, source: etree._Element) -> None:
        protected = _flatten(source)
        if needs_translation(masking.SENTINEL.sub("", protected.text)):
            units.append(_Unit(holder, source, protected))

    def _render(self, translations: list[str], target: str | None) -> RenderedDocument:
        from xml.sax.saxutils import escape

        for unit, translation in zip(self._units, translations):
            content = masking.restore(escape(translation), unit.protected)
            try:
                new = etree.fromstring(f'<target xmlns="{self._ns}">{content}</target>')
            except etree.XMLSyntaxError:  # cannot happen with the codes restored verbatim; keep the file valid
                new = etree.Element(self._q("target"))
                new.text = translation
            old = unit.holder.find(self._q("target"))
            if old is not None:
                for name, value in old.attrib.items():
                    new.set(name, value)
                unit.holder.replace(old, new)
            else:
                unit.source.addnext(new)
                new.tail = unit.source.tail
            origin = self.origins.get(unit.protected.text, ORIGIN_MODEL)
            if self._ns == XLIFF_1:
                state, qualifier = _STATES_1[origin]
                new.set("state", state)
                new.set("state-qualifier", qualifier)
            else:
                state, sub_state = _STATES_2[origin]
                unit.holder.set("state", state)
                unit.holder.set("subState", sub_state)
        if target:
            if self._ns == XLIFF_1:
                for file in self._root.iter(self._q("file")):
                    file.set("target-language", target)
            else:
                self._root.set("trgLang", target)
        data = etree.tostring(self._root.getroottree(), xml_declaration=True, encoding="UTF-8")
        ext = ".xliff" if self.filename.lower().endswith(".xliff") else ".xlf"
        return RenderedDocument(data, output_filename(self.filename, ext, target), "application/xliff+xml", _NOTE)


def read_xliff(data: bytes, filename: str, limits: LimitsConfig) -> XliffDocument:
    return XliffDocument(filename, data)
