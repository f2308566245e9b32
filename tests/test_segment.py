"""Sentence splitting keeps the exact layout; whitespace-only pieces are never segments."""

from __future__ import annotations

import pytest

from hunyuan_mt.text.segment import pysbd_language, split_text

LAYOUTS = [
    ("Hello Mr. Smith.  How are you?It is 3.5 km. Ok!   ", "en"),
    ("  Para one. Second sentence!\n\n\n  Para two\r\nline\t end.  \n", "en"),
    ("今天天气很好。我们去公园吧！好的？", "zh"),
    ("¿Cómo estás? Bien, gracias.\n\nEl Sr. López llegó.", "es"),
    ("Première phrase. Deuxième phrase.\n", "fr"),
    ("ប្រយោគទីមួយ។ ប្រយោគទីពីរ។", "km"),
    ("", "en"),
    ("   \n\t \n", "en"),
]


@pytest.mark.parametrize("text,lang", LAYOUTS)
def test_identity_render_reproduces_input(text: str, lang: str) -> None:
    seg = split_text(text, lang)
    assert seg.render(seg.segments) == text
    assert all(s.strip() == s and s for s in seg.segments)


def test_sentences_split_and_layout_kept() -> None:
    text = "  Hello Mr. Smith. How are you?\n\nSecond paragraph.\n"
    seg = split_text(text, "en")
    assert seg.segments == ["Hello Mr. Smith.", "How are you?", "Second paragraph."]
    out = seg.render(["A.", "B?", "C."])
    assert out == "  A. B?\n\nC.\n"


def test_chinese_rules() -> None:
    assert split_text("今天天气很好。我们去公园吧！", "zh").segments == ["今天天气很好。", "我们去公园吧！"]
    assert pysbd_language("zh-Hant") == "zh" and pysbd_language("yue") == "zh"


def test_fallback_rules_for_languages_pysbd_lacks() -> None:
    assert pysbd_language("pt") == "en"
    assert split_text("Olá. Tudo bem?", "pt").segments == ["Olá.", "Tudo bem?"]


def test_whitespace_only_has_no_segments() -> None:
    seg = split_text(" \n\n\t", "en")
    assert seg.segments == [] and seg.render([]) == " \n\n\t"


def test_no_sentence_split_keeps_lines() -> None:
    seg = split_text("One. Two.\nThree.", "en", sentences=False)
    assert seg.segments == ["One. Two.", "Three."]


def test_overlong_sentence_cut_at_whitespace() -> None:
    text = " ".join(["word"] * 500)  # 2499 chars, no sentence end
    seg = split_text(text, "en", max_segment_chars=100)
    assert all(len(s) <= 100 for s in seg.segments)
    assert len(seg.segments) > 20
    assert seg.render(seg.segments) == text


def test_render_checks_count() -> None:
    seg = split_text("One. Two.", "en")
    with pytest.raises(ValueError, match="expected 2 translations, got 1"):
        seg.render(["x"])


@pytest.mark.parametrize("text,segments", [
    # A dot that starts a word is a file name or an extension, not a sentence end.
    ("The .lzma format is older than xz. Use it only for old files.",
     ["The .lzma format is older than xz.", "Use it only for old files."]),
    ("Read the credentials from .netrc in your home folder. Then connect.",
     ["Read the credentials from .netrc in your home folder.", "Then connect."]),
    ("Edit config.yaml and restart. It takes a second.", ["Edit config.yaml and restart.", "It takes a second."]),
    ("Install version 2.4.1 first. Then run it.", ["Install version 2.4.1 first.", "Then run it."]),
    ("See e.g. the manual for details. It helps.", ["See e.g. the manual for details.", "It helps."]),
    ("Ask Dr. Smith about the backup. Then restore it.", ["Ask Dr. Smith about the backup.", "Then restore it."]),
    # A trailing prompt, or a piece too short to translate alone, goes with its neighbour.
    ("Overwrite the file? (y/N)", ["Overwrite the file? (y/N)"]),
    ("Delete all files? [Y/n]", ["Delete all files? [Y/n]"]),
    ("OK. Now save the file.", ["OK. Now save the file."]),
    ("The backup is done. OK.", ["The backup is done. OK."]),
    ("Yes. The backup is done.", ["Yes.", "The backup is done."]),  # short, but a sentence of its own
])
def test_technical_text_splits_where_sentences_end(text: str, segments: list[str]) -> None:
    seg = split_text(text, "en")
    assert seg.segments == segments
    assert seg.render(seg.segments) == text
