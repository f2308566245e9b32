"""Review marks a translator can trust: a segment that came back as its source, or whose formatting was placed
piece by piece, is never "confident" (XLIFF state, PO fuzzy flag, a .docx comment when they are on, a low
confidence in the API); formatted pieces take the memory's words; Chinese output has Chinese punctuation."""

from __future__ import annotations

import dataclasses
import io
from typing import Any, Callable

import docx
import polib
import pytest
from lxml import etree

from hunyuan_mt.documents import read_document, translate_document
from hunyuan_mt.documents.base import ORIGIN_MEMORY, ORIGIN_MODEL, ORIGIN_MODEL_SURE
from hunyuan_mt.text.masking import protect
from hunyuan_mt.text.punctuation import tidy
from hunyuan_mt.text.review import UNCHANGED_CONFIDENCE, unchanged

COPIED = "Hello {name}, welcome back!"


@pytest.mark.parametrize("source, translation, expected", [
    ("Hello ⟦0⟧, welcome back!", "Hello ⟦0⟧, welcome back!", True),
    ("Hello ⟦0⟧, welcome back!", "hello ⟦0⟧ welcome back", True),       # case, spacing and punctuation aside
    ("Open ⟦0⟧ now", "Open ⟦1⟧ now", True),                             # the spans are not words
    ("Hello ⟦0⟧, welcome back!", "Hallo ⟦0⟧, willkommen zurück!", False),
    ("⟦0⟧ ⟦1⟧", "⟦0⟧ ⟦1⟧", False),                                        # nothing to translate: not a copy
])
def test_unchanged_compares_the_words_outside_protected_spans(source: str, translation: str, expected: bool) -> None:
    assert unchanged(source, translation) is expected


def test_a_copy_is_never_confident_whatever_the_threshold(web_service: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from hunyuan_mt.service.results import TextJob

    job = TextJob(None, None, [None], ["Hello {name}"], [0], scored=True, logprob={0: -0.01}, unchanged={0})
    assert job.confidences() == [UNCHANGED_CONFIDENCE]
    cfg = web_service.cfg
    monkeypatch.setattr(cfg, "quality", dataclasses.replace(cfg.quality, review_below=0.0))
    assert web_service._model_origin(job) == ORIGIN_MODEL


@pytest.fixture()
def copying(web_service: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The service with a model that gives every row back as it went in (the demo did so with `Hello {name},
    welcome back!` en→de) and no memory."""
    monkeypatch.setattr(web_service.backbone, "read_output", lambda output, text, markup: text)
    monkeypatch.setattr(web_service.cfg, "tm", dataclasses.replace(web_service.cfg.tm, enabled=False))
    monkeypatch.setattr(web_service.tm, "enabled", False)
    return web_service


def test_an_untranslated_text_has_a_low_confidence_in_the_api(copying: Any) -> None:
    result = copying.translate(COPIED, "en", "de")
    assert result.text == COPIED
    assert result.confidence is not None and result.confidence <= UNCHANGED_CONFIDENCE
    assert result.confidence < copying.cfg.quality.review_below


def _document(service: Any, data: bytes, name: str, target: str = "de", comments: bool = False) -> bytes:
    origins: dict[str, str] = {}
    document = read_document(data, name, service.cfg.limits)
    return translate_document(document, name, service.cfg.limits, lambda segments, progress: service
                              .translate_segments(segments, "en", target, origins=origins), target=target,
                              origins=origins, review_comments=comments).data


PO = ('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
      f'#, python-brace-format\nmsgid "{COPIED}"\nmsgstr ""\n').encode()
XLIFF = ('<?xml version="1.0" encoding="UTF-8"?>\n<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">'
         '<file source-language="en" datatype="plaintext" original="ui"><body>'
         f'<trans-unit id="1"><source>{COPIED}</source></trans-unit></body></file></xliff>').encode()


def test_an_untranslated_segment_is_marked_for_review_in_every_format(copying: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Even where every machine translation would otherwise count as confident.
    monkeypatch.setattr(copying.cfg, "quality", dataclasses.replace(copying.cfg.quality, review_below=0.0))
    entry = next(e for e in polib.pofile(_document(copying, PO, "ui.po").decode()) if e.msgid)
    assert entry.msgstr == COPIED and "fuzzy" in entry.flags and "confident" not in entry.tcomment
    target = next(etree.fromstring(_document(copying, XLIFF, "ui.xlf")).iter(
        "{urn:oasis:names:tc:xliff:document:1.2}target"))
    assert target.get("state") == "needs-review-translation"
    page = docx.Document()
    page.add_paragraph(COPIED)
    buffer = io.BytesIO()
    page.save(buffer)
    out = docx.Document(io.BytesIO(_document(copying, buffer.getvalue(), "a.docx", comments=True)))
    assert [c.text for c in out.comments] and "left as the source" in list(out.comments)[0].text


def _formatted_docx() -> bytes:
    page = docx.Document()
    paragraph = page.add_paragraph("Click ")
    paragraph.add_run("Save").bold = True
    paragraph.add_run(" to keep your ")
    paragraph.add_run("changes").italic = True
    paragraph.add_run(".")
    buffer = io.BytesIO()
    page.save(buffer)
    return buffer.getvalue()


def _fake(whole: dict[str, str], origins: dict[str, str], memory: dict[str, str] | None = None
          ) -> Callable[[list[str], Any], list[str]]:
    """A translator: tagged segments come back with their markup swapped, bare sentences from `whole`, pieces from
    `memory` (told as the memory's) or as they are; every answer of the model's is confident."""
    def translate(segments: list[str], progress: Any = None) -> list[str]:
        out = []
        for s in segments:
            if "⟦" in s:
                out.append(s.replace("⟦0⟧", "\x00").replace("⟦1⟧", "⟦0⟧").replace("\x00", "⟦1⟧"))
            elif memory and s in memory:
                out.append(memory[s])
                origins[s] = ORIGIN_MEMORY
                continue
            else:
                out.append(whole.get(s, s))
            origins[s] = ORIGIN_MODEL_SURE
        return out
    return translate


def test_a_segment_put_together_piece_by_piece_gets_the_docx_comment() -> None:
    from hunyuan_mt.config import LimitsConfig

    origins: dict[str, str] = {}
    # The whole sentence comes back as one word: its three formatted runs cannot each get one.
    rendered = translate_document(_formatted_docx(), "a.docx", LimitsConfig(), _fake(
        {"Click Save to keep your changes.": "Guardar."}, origins), target="es", origins=origins,
        review_comments=True)
    out = docx.Document(io.BytesIO(rendered.data))
    assert len(list(out.comments)) == 1 and "piece by piece" in rendered.note


def test_a_formatted_piece_takes_the_memorys_words() -> None:
    from hunyuan_mt.config import LimitsConfig

    origins: dict[str, str] = {}
    data = b"<p>Click <b>Cancel</b> to close the window.</p>"
    translate = _fake({"Click Cancel to close the window.": "Klicken Sie auf Ankalität, um das Fenster zu schließen.",
                       "Click": "Klicken Sie"}, origins, memory={"Cancel": "Abbrechen"})

    def tagged_in_order(segments: list[str], progress: Any = None) -> list[str]:
        # Shown the markup, the model places it around its own word for the button.
        if any("⟦" in s for s in segments):
            return ["Klicken Sie auf ⟦0⟧Ankalität⟦1⟧, um das Fenster zu schließen." for _ in segments]
        return translate(segments)

    out = translate_document(data, "a.html", LimitsConfig(), tagged_in_order, target="de", origins=origins)
    assert "<p>Klicken Sie auf <b>Abbrechen</b>, um das Fenster zu schließen.</p>" in out.data.decode()


def test_bold_cancel_comes_from_the_shipped_memory(web_service: Any) -> None:
    if web_service.tm.match("en", "de", protect("Cancel")) is None:
        pytest.skip("no shipped memory answers Cancel")
    out = _document(web_service, b"<p>Click <b>Cancel</b> to close the window.</p>", "a.html").decode()
    assert "<b>Abbrechen</b>" in out


@pytest.mark.parametrize("text, expected", [
    ("文件已保存 。", "文件已保存。"),
    ("打开它们, 请参阅。", "打开它们，请参阅。"),
    ("真的吗?", "真的吗？"),
    ("错误：文件（ ⟦0⟧ ）未找到!", "错误：文件（⟦0⟧）未找到！"),
    ("⟦0⟧, ⟦1⟧ 和 ⟦2⟧", "⟦0⟧, ⟦1⟧ 和 ⟦2⟧"),      # between protected spans: left alone
    ("Export to PDF, then print.", "Export to PDF, then print."),
])
def test_chinese_output_gets_chinese_punctuation(text: str, expected: str) -> None:
    assert tidy(text, "zh") == expected
    assert tidy(text, "de") == text


def test_the_services_chinese_output_has_no_space_before_a_full_stop_nor_an_ascii_comma(
        web_service: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(web_service.backbone, "read_output", lambda output, text, markup: "文件已保存 , 请打开 ⟦0⟧ 。")
    monkeypatch.setattr(web_service.tm, "enabled", False)
    result = web_service.translate("The file was saved, open report.txt.", "en", "zh")
    assert result.text == "文件已保存，请打开 report.txt。"
