"""How a backbone is shown a document's inline markup (inline.py) and the HY-MT1.5 formatted-translation prompt."""

from __future__ import annotations

import pytest

from hunyuan_mt.text import inline, prompts
from hunyuan_mt.text.masking import protect


def test_markup_indices_are_the_spans_that_were_sentinels() -> None:
    masked = protect("Click ⟦0⟧here⟦1⟧ to open %s or ⟦2⟧ v2.1 ⟦3⟧.")
    assert masked.spans == ["⟦0⟧", "⟦1⟧", "%s", "⟦2⟧", "v2.1", "⟦3⟧"]
    assert inline.markup_indices(masked.spans) == (0, 1, 3, 5)
    # A text sent with format=html carries its tags as spans: they are markup too.
    html = protect('Click <a href="/s">here</a> at 10:30')
    assert inline.markup_indices(html.spans) == (0, 1)


def test_spacing_sets_markup_apart_and_leaves_protected_spans_glued() -> None:
    text = "Click ⟦0⟧here⟦1⟧, then 0x⟦2⟧ and «⟦3⟧»."
    assert inline.space_markup(text, {0, 1, 3}) == "Click ⟦0⟧ here ⟦1⟧, then 0x⟦2⟧ and «⟦3⟧»."
    assert inline.space_markup(text) == "Click ⟦0⟧ here ⟦1⟧, then 0x ⟦2⟧ and «⟦3⟧»."


def test_unspacing_puts_back_the_sources_spacing() -> None:
    source = "Click ⟦0⟧here⟦1⟧ to change your ⟦2⟧password⟦3⟧."
    out = "Pulse ⟦0⟧ aquí ⟦1⟧ para cambiar su ⟦2⟧ contraseña ⟦3⟧ ."
    assert inline.unspace_markup(out, source, {0, 1, 2, 3}) == \
        "Pulse ⟦0⟧aquí⟦1⟧ para cambiar su ⟦2⟧contraseña⟦3⟧."
    # Where the source had a space, a word glued to the sentinel gets one back.
    assert inline.unspace_markup("Pulse ⟦0⟧ aquí ⟦1⟧para", source, {0, 1, 2, 3}) == "Pulse ⟦0⟧aquí⟦1⟧ para"
    # A protected span is not markup: its spacing is the model's.
    assert inline.unspace_markup("a ⟦0⟧ b", "a⟦0⟧b", set()) == "a ⟦0⟧ b"


def test_unspacing_beside_chinese_leaves_no_space() -> None:
    source = "Click ⟦0⟧ here ⟦1⟧ now"
    assert inline.unspace_markup("现在 点击 ⟦0⟧ 这里 ⟦1⟧ 吧", source, {0, 1}) == "现在 点击⟦0⟧这里⟦1⟧吧"
    # A Chinese source glues everything: that says nothing about English spacing, which stays the model's.
    assert inline.unspace_markup("Click ⟦0⟧ here ⟦1⟧ now.", "点击⟦0⟧这里⟦1⟧吧。", {0, 1}) == "Click ⟦0⟧ here ⟦1⟧ now."


def test_round_trip_through_the_spaced_form_is_the_identity_for_a_model_that_copies() -> None:
    for text in ("Click ⟦0⟧here⟦1⟧ to change.", "⟦0⟧Bold⟦1⟧ start", "a ⟦0⟧b⟦1⟧⟦2⟧c⟦3⟧ d", "x⟦0⟧"):
        markup = set(range(text.count("⟦")))
        shown = inline.to_model(text, markup, "spaced")
        assert inline.from_model(shown, text, markup, "spaced") == text


def test_tags_number_every_piece_between_markup() -> None:
    text = "Click ⟦0⟧here⟦1⟧ to open ⟦2⟧."
    assert inline.to_tags(text, {0, 1}) == "<s1>Click </s1><s2>here</s2><s3> to open ⟦2⟧.</s3>"


def test_tags_come_back_as_the_readers_sentinels() -> None:
    text = "Click ⟦0⟧here⟦1⟧ to open ⟦2⟧."
    answer = "<target><s1>点击</s1><s2>这里</s2><s3>打开⟦2⟧。</s3></target>"
    assert inline.from_tags(answer, text, {0, 1}) == "点击⟦0⟧这里⟦1⟧打开⟦2⟧。"
    # Without the <target> wrapper too (the card's "尽量": the model may leave it out).
    assert inline.from_tags("<s1>A </s1><s2>b</s2><s3> c</s3>", "A ⟦0⟧b⟦1⟧ c", {0, 1}) == "A ⟦0⟧b⟦1⟧ c"


@pytest.mark.parametrize("answer", [
    "<target><s1>点击</s1><s3>打开</s3><s2>这里</s2></target>",    # out of order
    "<target><s1>点击这里打开</s1></target>",                      # pairs lost
    "<target><1>点击</s1><s2>这里</s2><s3>打开</s3></target>",     # the report's "<1>" without the format prompt
])
def test_tags_that_do_not_come_back_whole_leave_no_sentinel(answer: str) -> None:
    """The document layer then translates the segment piece by piece (reader.translate_keeping_markup)."""
    out = inline.from_tags(answer, "Click ⟦0⟧here⟦1⟧ to open", {0, 1})
    assert "⟦" not in out and "<s" not in out and "target" not in out


def test_formatted_prompt_is_the_cards_template() -> None:
    shown = inline.to_model("Click ⟦0⟧here⟦1⟧.", (0, 1), "tags")
    assert prompts.build("hy-mt1.5", shown, "en", "zh", formatted=True) == (
        "将以下<source></source>之间的文本翻译为中文，注意只需要输出翻译后的结果，不要额外解释，"
        "原文中的<sn></sn>标签表示标签内文本包含格式信息，需要在译文中相应的位置尽量保留该标签。"
        "输出格式为：<target>str</target>\n\n<source><s1>Click </s1><s2>here</s2><s3>.</s3></source>")
    with_terms = prompts.build("hy-mt1.5", shown, "en", "de", terms=(("here", "hier"),), formatted=True)
    assert with_terms.startswith("参考下面的翻译：\nhere 翻译成 hier\n\n将以下<source></source>之间的文本翻译为德语，")


def test_a_formatted_row_gets_the_template_through_the_backbone(fresh_backbone, hunyuan_dir, marian_dir) -> None:
    from hunyuan_mt.runtime.backbone import PromptRow

    backbone = fresh_backbone(hunyuan_dir, prompt="hy-mt1.5", quantization="none")
    assert backbone.markup_form == "tags"
    text = backbone.prompt_text(PromptRow("Open ⟦0⟧Settings⟦1⟧ now", "en", "zh", markup=(0, 1)))
    assert "<source><s1>Open </s1><s2>Settings</s2><s3> now</s3></source>" in text
    plain = backbone.prompt_text(PromptRow("Open ⟦0⟧ now", "en", "zh"))
    assert "<source>" not in plain and "Open ⟦0⟧ now" in plain
    assert backbone.read_output("<target><s1>打开</s1><s2>设置</s2><s3>吧</s3></target>", "Open ⟦0⟧Settings⟦1⟧ now",
                                (0, 1)) == "打开⟦0⟧设置⟦1⟧吧"
    # The card's tags need a prompt: an encoder-decoder model keeps the reader's sentinels under "tags".
    assert fresh_backbone(marian_dir, markup="tags", quantization="none").markup_form == "sentinels"
    spaced = fresh_backbone(marian_dir, markup="spaced", quantization="none")
    assert spaced.prompt_text(PromptRow("Open ⟦0⟧Settings⟦1⟧ now", "en", "es", markup=(0, 1))) == \
        "Open ⟦0⟧ Settings ⟦1⟧ now"


@pytest.fixture(scope="module")
def hy_service(hunyuan_dir, hunyuan_adapters):
    from hunyuan_mt.runtime.backbone import Backbone
    from hunyuan_mt.config import load_config
    from hunyuan_mt.service.translation import TranslationService

    cfg = load_config(overrides={
        "model.path": str(hunyuan_dir), "model.warmup": False, "model.prompt": "hy-mt1.5", "model.markup": "auto",
        "cache.adapters_dir": str(hunyuan_adapters), "routing.pivot": "en", "memory.enabled": False,
        "limits.max_new_tokens": 8, "limits.max_chars": 300, "engine.max_wait_ms": 1, "model.quantization": "none",
    }, env={})
    service = TranslationService(cfg, backbone=Backbone.load_uncached(cfg.model))
    yield service
    service.close()


def test_a_documents_markup_reaches_every_hop_as_the_cards_tags(hy_service, monkeypatch) -> None:
    """Through the service: the reader's sentinels become `<sN>` pairs in the prompt of each hop (a protected span
    stays a sentinel inside its piece), and an answer in the card's form comes back as the reader's sentinels, with
    the protected span restored."""
    service = hy_service
    seen: list[str] = []
    encode = service.backbone.encode

    def spy(row):
        seen.append(service.backbone.prompt_text(row))
        return encode(row)

    monkeypatch.setattr(service.backbone, "encode", spy)
    # The tiny model's byte tokens would have the splitter cut the segment: this is about one whole segment.
    monkeypatch.setattr(service.backbone, "fits", lambda *args: True)
    monkeypatch.setattr(service.backbone, "decode",
                        lambda ids: "<target><s1>Öffne </s1><s2>Einstellungen</s2><s3> um ⟦2⟧ Uhr</s3></target>")
    out = service.translate_segments(["Open ⟦0⟧Settings⟦1⟧ at 10:30"], "es", "de")
    assert out == ["Öffne ⟦0⟧Einstellungen⟦1⟧ um 10:30 Uhr"]
    assert len(seen) == 2   # es → en → de: both hops in the card's form
    # The first hop gets the segment; the second the first's answer read back, in the same form again.
    assert "将以下<source></source>之间的文本翻译为英语" in seen[0]
    assert "<source><s1>Open </s1><s2>Settings</s2><s3> at ⟦2⟧</s3></source>" in seen[0]
    assert "将以下<source></source>之间的文本翻译为德语" in seen[1]
    assert "<source><s1>Öffne </s1><s2>Einstellungen</s2><s3> um ⟦2⟧ Uhr</s3></source>" in seen[1]
