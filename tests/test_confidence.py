"""A confidence for every translated segment: the mean log-probability of the tokens the model
took, from its own distribution at each step, as bergamot-translator's quality estimate. It must be what
transformers' scores say for the same tokens, a row's own alone or in any batch, and come back through the REST
API beside LibreTranslate's fields."""

from __future__ import annotations

import math

import httpx
import pytest
import torch

from hunyuan_mt.runtime.backbone import PromptRow
from hunyuan_mt.config import GenerationConfig
from hunyuan_mt.decode import Sequence
from hunyuan_mt.lora import BASE_SLOT
from web_server import LiveServer

TEXTS = ["Hello world, how are you today?", "Open the file, save the document and close the window.",
         "The quick brown fox.", "Bonjour le monde."]


def _run(bb, rows: list[PromptRow], scored: list[bool], max_new: int = 12) -> dict[int, tuple[list[int], list[float]]]:
    batch = bb.new_batch(GenerationConfig())
    out: dict[int, tuple[list[int], list[float]]] = {}
    with torch.inference_mode():
        seqs = []
        for i, (row, score) in enumerate(zip(rows, scored)):
            e = bb.encode(row)
            seqs.append(Sequence(i, e.input_ids, BASE_SLOT, max_new, e.decoder_prefix, scored=score))
        batch.add(seqs)
        while True:
            for live in batch.pop_finished():
                out[live.seq.tag] = (live.output, list(live.logprobs))
            if not len(batch):
                return out
            batch.step()


@pytest.mark.parametrize("model", ["marian", "hunyuan"])
def test_each_tokens_logprob_is_transformers_log_softmax_for_it(model: str, request, fresh_backbone) -> None:
    bb = fresh_backbone(request.getfixturevalue(f"{model}_dir"))
    row = PromptRow(TEXTS[1], "en", "es")
    tokens, logprobs = _run(bb, [row], [True])[0]
    assert len(logprobs) == len(tokens) > 0
    e = bb.encode(row)
    prompt = torch.tensor([e.input_ids])
    kwargs = {"decoder_input_ids": torch.tensor([list(e.decoder_prefix)])} if e.decoder_prefix else {}
    with torch.inference_mode():
        generated = bb.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=len(tokens),
                                      do_sample=False, num_beams=1, output_logits=True, return_dict_in_generate=True,
                                      **kwargs)
    theirs = [torch.log_softmax(step[0].float(), -1)[token].item() for step, token in zip(generated.logits, tokens)]
    assert logprobs == pytest.approx(theirs, abs=1e-4)


def test_a_rows_logprobs_are_its_own_alone_or_in_a_batch_and_unscored_rows_cost_nothing(marian_dir,
                                                                                         fresh_backbone) -> None:
    bb = fresh_backbone(marian_dir)
    rows = [PromptRow(t, "en", "es") for t in TEXTS]
    together = _run(bb, rows, [True, False, True, True])
    for i, row in enumerate(rows):
        if i == 1:
            assert together[i][1] == []  # not asked for: not computed
            continue
        assert _run(bb, [row], [True])[0] == together[i]  # the same tokens and the same values to the bit


def test_translate_answers_a_confidence_per_text_beside_libretranslates_fields(live_server: LiveServer) -> None:
    body = {"q": ["Open the file.", "Where is the printer? It is out of paper."], "source": "en", "target": "es"}
    answer = httpx.post(live_server.url + "/translate", json=body, timeout=60).json()
    results = live_server.service.translate_batch(body["q"], "en", "es")
    assert answer["confidence"] == [r.confidence for r in results]
    assert all(0 < c <= 1 for c in answer["confidence"])
    two = results[1]
    assert two.segments == 2 and len(two.segment_confidences) == 2
    assert two.confidence == min(two.segment_confidences)
    single = httpx.post(live_server.url + "/translate", json={**body, "q": body["q"][0]}, timeout=60).json()
    assert single["confidence"] == results[0].confidence and math.isfinite(single["confidence"])


XLIFF = (b'<?xml version="1.0" encoding="UTF-8"?>\n<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">'
         b'<file source-language="en" target-language="es" datatype="plaintext" original="ui"><body>'
         b'<trans-unit id="1"><source>Open the file.</source></trans-unit>'
         b'<trans-unit id="2"><source>The printer on the second floor is out of paper.</source></trans-unit>'
         b'</body></file></xliff>')
XLIFF_2 = (b'<?xml version="1.0" encoding="UTF-8"?>\n<xliff version="2.0" xmlns="urn:oasis:names:tc:xliff:document:2.0" '
           b'srcLang="en"><file id="f"><unit id="1"><segment><source>Open the file.</source></segment>'
           b'<segment><source>The printer on the second floor is out of paper.</source></segment></unit></file></xliff>')
PO = (b'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
      b'msgid "Open the file."\nmsgstr ""\n\nmsgid "The printer on the second floor is out of paper."\nmsgstr ""\n')


@pytest.mark.parametrize("review_below", [0.0, 1.0])
def test_documents_mark_for_review_what_the_model_was_unsure_of(web_service, monkeypatch: pytest.MonkeyPatch,
                                                                 review_below: float) -> None:
    """quality.review_below: at 0 every machine translation is confident (XLIFF `translated`, no PO fuzzy flag, a
    comment saying so); at 1 every one is marked for review (XLIFF `needs-review-translation`, PO fuzzy)."""
    import dataclasses

    import polib
    from lxml import etree

    from hunyuan_mt.documents import read_document, translate_document

    cfg = web_service.cfg
    monkeypatch.setattr(cfg, "quality", dataclasses.replace(cfg.quality, review_below=review_below))
    monkeypatch.setattr(cfg, "tm", dataclasses.replace(cfg.tm, enabled=False))  # the model answers every segment
    sure = review_below == 0.0

    def run(data: bytes, name: str) -> bytes:
        origins: dict[str, str] = {}
        document = read_document(data, name, cfg.limits)
        rendered = translate_document(document, name, cfg.limits, lambda segments, progress: web_service
                                      .translate_segments(segments, "en", "es", origins=origins),
                                      target="es", origins=origins)
        return rendered.data

    targets = etree.fromstring(run(XLIFF, "ui.xlf")).iter("{urn:oasis:names:tc:xliff:document:1.2}target")
    assert [(t.get("state"), t.get("state-qualifier")) for t in targets] == \
           [("translated" if sure else "needs-review-translation", "mt-suggestion")] * 2
    segments = etree.fromstring(run(XLIFF_2, "ui.xliff")).iter("{urn:oasis:names:tc:xliff:document:2.0}segment")
    assert [(s.get("state"), s.get("subState")) for s in segments] == \
           [("translated" if sure else "initial", "hunyuan-mt:mt-suggestion")] * 2
    entries = [e for e in polib.pofile(run(PO, "ui.po").decode()) if e.msgid]
    assert [("fuzzy" in e.flags, "confident" in e.tcomment) for e in entries] == [(not sure, sure)] * 2


def test_the_openai_client_gets_logprobs_per_token_when_it_asks(live_server: LiveServer) -> None:
    """One entry per token the model wrote, their texts joining into the message (placeholders put back, the
    space between sentences on the next one's first token), and each sentence's tokens averaging to the log of its
    confidence."""
    import openai

    client = openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    text = "Where is the printer? It is out of paper on 3 floors."
    asked = client.chat.completions.create(model="en2es", messages=[{"role": "user", "content": text}],
                                           logprobs=True)
    want = live_server.service.translate_batch([text], "en", "es", token_logprobs=True)[0]
    entries = asked.choices[0].logprobs.content
    assert asked.choices[0].message.content == want.text
    assert "".join(e.token for e in entries) == want.text and len(entries) > len(want.segment_texts)
    assert any("3" in e.token for e in entries) and not any("⟦" in e.token for e in entries)
    for pieces, confidence in zip(want.segment_tokens, want.segment_confidences):
        assert pieces and "".join(p for p, _ in pieces).strip() in want.text
        mean = sum(lp for _, lp in pieces) / len(pieces)
        assert math.exp(mean) == pytest.approx(confidence, abs=1e-3)
    # A token that adds no text (the end of the sentence) is not an entry.
    assert [e.logprob for e in entries] == [pytest.approx(lp, abs=1e-6) for pieces in want.segment_tokens
                                            for piece, lp in pieces if piece]
    plain = client.chat.completions.create(model="en2es", messages=[{"role": "user", "content": text}])
    assert plain.choices[0].logprobs is None  # not asked: not sent


def test_the_pages_line_names_the_sentences_to_check_first() -> None:
    from hunyuan_mt.service.translation import TranslationResult
    from hunyuan_mt.web.ui import _info_line

    def line(confidences: list[float | None]) -> str:
        result = TranslationResult(text="x", source="en", target="es", detected=None, route=["en", "es"],
                                   route_kind="direct", adapters=["en2es"], timings_ms={"total": 12.0},
                                   segments=len(confidences), segment_confidences=confidences)
        return _info_line(result, None, 0.012, review_below=0.5)

    assert line([0.9, 0.3, 0.2]).endswith(" · **Confidence:** 20% · **Check first:** sentence 3 (20%), sentence 2 (30%)")
    assert line([0.31]).endswith(" · **Confidence:** 31% (low: check it)")
    assert line([0.9, None]).endswith(" · **Confidence:** 90%")
    assert "Confidence" not in line([None])
    assert line([0.1, 0.2, 0.3, 0.4, 0.9]).count("sentence") == 3 and "and 1 more" in line([0.1, 0.2, 0.3, 0.4, 0.9])


@pytest.mark.parametrize("review_below, comments_on, comments", [(1.0, True, 2), (1.0, False, 0), (0.0, True, 0)])
def test_a_docx_gets_a_word_comment_on_each_segment_to_review_when_asked(
        web_service, monkeypatch: pytest.MonkeyPatch, review_below: float, comments_on: bool, comments: int) -> None:
    """quality.docx_comments: Word has no review state, so a segment below quality.review_below gets a comment
    over its runs; off by default, and no comment for a confident segment. Written in a parser helper, as the
    server writes documents."""
    import dataclasses
    import io

    import docx

    from hunyuan_mt.config import LimitsConfig
    from hunyuan_mt.documents.parsers import DocumentParsers
    from hunyuan_mt.web.doctranslate import translate_upload

    cfg = web_service.cfg
    monkeypatch.setattr(cfg, "quality", dataclasses.replace(cfg.quality, review_below=review_below,
                                                           docx_comments=comments_on))
    monkeypatch.setattr(cfg, "tm", dataclasses.replace(cfg.tm, enabled=False))
    source = docx.Document()
    source.add_paragraph("Open the file.")
    source.add_paragraph("The printer on the second floor is ").add_run("out of paper").bold = True
    data = io.BytesIO()
    source.save(data)
    parsers = DocumentParsers(LimitsConfig(parse_workers=1))
    try:
        rendered, _ = translate_upload(web_service, data.getvalue(), "a.docx", "en", "es", cfg.limits,
                                       read=parsers.reader(), review_comments=cfg.quality.docx_comments)
    finally:
        parsers.close()
    out = docx.Document(io.BytesIO(rendered.data))
    found = list(out.comments)
    assert len(found) == comments
    assert all(c.author == "Hunyuan-MT" and "low confidence" in c.text for c in found)
    assert [p.text for p in out.paragraphs][0] != "Open the file."  # translated either way


def test_review_below_one_marks_even_a_segment_whose_confidence_rounds_to_one(web_service,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Confidences are rounded to 4 places: a very sure segment shows 1.0. `review_below: 1.0` is documented to mark
    every machine translation for review, so it must not count such a segment as at or above it."""
    import dataclasses

    from hunyuan_mt.documents.base import ORIGIN_MODEL, ORIGIN_MODEL_SURE
    from hunyuan_mt.service.results import TextJob

    job = TextJob(None, None, [None], ["Abra el archivo."], [0], scored=True, logprob={0: -1e-7})
    assert job.confidences() == [1.0]
    cfg = web_service.cfg
    for review_below, origin in ((1.0, ORIGIN_MODEL), (0.5, ORIGIN_MODEL_SURE)):
        monkeypatch.setattr(cfg, "quality", dataclasses.replace(cfg.quality, review_below=review_below))
        assert web_service._model_origin(job) == origin


@pytest.mark.parametrize("rows", [1, 3, 64])
def test_the_in_place_logsumexp_is_torchs_to_the_bit(rows: int) -> None:
    """The token choice takes each row's log-sum-exp in its own copy of the logits (`logsumexp_in_place`), without
    torch's two temporaries: the same bits as torch.logsumexp, on one thread and two, for finite rows, rows with
    -inf entries (banned tokens) and a row all -inf."""
    from hunyuan_mt.decode.batch import logsumexp_in_place

    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 8012, generator=gen) * 8
    x[:, :3] = -float("inf")
    if rows > 1:
        x[1] = -float("inf")
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert torch.equal(logsumexp_in_place(x.clone()), torch.logsumexp(x, dim=-1))
    finally:
        torch.set_num_threads(before)
