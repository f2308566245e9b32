"""Language table and the prompt formats of the Hunyuan family (prompts.py)."""

import pytest

from hunyuan_mt.errors import UnsupportedLanguage
from hunyuan_mt.text import prompts
from hunyuan_mt.text.languages import LANGUAGES, normalize_code


def hunyuan_prompt(text: str, src: str, tgt: str) -> str:
    return prompts.build("hunyuan-mt", text, src, tgt)


parse_hunyuan_prompt = prompts.parse


def test_table_has_38_codes_including_minority_languages() -> None:
    assert len(LANGUAGES) == 38
    for code in ("zh-Hant", "yue", "bo", "kk", "mn", "ug"):
        assert code in LANGUAGES


@pytest.mark.parametrize(("given", "expected"), [("zh-hant", "zh-Hant"), ("EN", "en"), ("zh-TW", "zh-Hant"),
                                                 ("zh_CN", "zh"), (" es ", "es"),
                                                 ("es-ES", "es"), ("de_DE", "de"), ("en-US", "en"),
                                                 ("es-419", "es"), ("zh-HK", "zh-Hant")])
def test_case_variants_and_aliases_are_accepted(given: str, expected: str) -> None:
    assert normalize_code(given) == expected


@pytest.mark.parametrize("bad", ["xx", "english", "../en", "en/../../etc", "", "e", "%2e%2e", "xx-ES", "es-Latn-ES"])
def test_unknown_or_malformed_codes_are_refused(bad: str) -> None:
    with pytest.raises(UnsupportedLanguage):
        normalize_code(bad)


def test_chinese_instruction_when_zh_is_involved() -> None:
    assert hunyuan_prompt("Hello", "en", "zh") == "把下面的文本翻译成中文，不要额外解释。\n\nHello"
    assert hunyuan_prompt("你好", "zh", "en") == "把下面的文本翻译成英语，不要额外解释。\n\n你好"


def test_english_instruction_otherwise() -> None:
    assert hunyuan_prompt("Hola", "es", "de") == (
        "Translate the following segment into German, without additional explanation.\n\nHola")


def test_prompt_parses_back() -> None:
    for src, tgt in (("en", "zh"), ("es", "de"), ("zh", "yue")):
        assert parse_hunyuan_prompt(hunyuan_prompt("Some text\nwith lines", src, tgt)) == (tgt, "Some text\nwith lines")
    assert parse_hunyuan_prompt("just text") == (None, "just text")


def test_hy_mt15_prompts_are_the_cards_templates() -> None:
    """HY-MT1.5's card (Tencent-Hunyuan/HY-MT, README): ZH<=>XX, XX<=>XX, and the contextual template; the
    languages' full names, Chinese in a Chinese instruction."""
    assert prompts.build("hy-mt1.5", "It's on the house.", "en", "zh") == (
        "将以下文本翻译为中文，注意只需要输出翻译后的结果，不要额外解释：\n\nIt's on the house.")
    assert prompts.build("hy-mt1.5", "你好", "zh", "en") == (
        "将以下文本翻译为英语，注意只需要输出翻译后的结果，不要额外解释：\n\n你好")
    assert prompts.build("hy-mt1.5", "Hola", "es", "de") == (
        "Translate the following segment into German, without additional explanation.\n\nHola")
    context = "The file menu of a text editor."
    for style in ("hunyuan-mt", "hy-mt1.5"):
        assert prompts.build(style, "Open", "en", "de", context=context) == (
            "The file menu of a text editor.\n参考上面的信息，把下面的文本翻译成德语，注意不需要翻译上文，也不要额外解释：\nOpen")
        assert prompts.build(style, "Open", "en", "de", context="  ") == prompts.build(style, "Open", "en", "de")
    assert prompts.parse(prompts.build("hy-mt1.5", "Some text\nwith lines", "en", "zh")) == ("zh", "Some text\nwith lines")
    with pytest.raises(ValueError, match="one of hunyuan-mt, hy-mt1.5, hy-mt2"):
        prompts.build("llama", "x", "en", "de")
