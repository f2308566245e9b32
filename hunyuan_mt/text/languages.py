"""The language table of Hunyuan-MT-7B (the prompts that name its languages are in `prompts.py`).

33 languages, 38 codes: zh-Hant, yue and the minority languages bo, kk, mn, ug count as codes of their own.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any
from dataclasses import dataclass

from ..errors import UnsupportedLanguage


@dataclass(frozen=True)
class Language:
    code: str
    english: str
    native: str
    #: The name used inside the Chinese instruction of the Hunyuan-MT prompt.
    chinese: str

    @property
    def label(self) -> str:
        """"Español — Spanish (es)", the form shown in dropdowns."""
        if self.native == self.english:
            return f"{self.english} ({self.code})"
        return f"{self.native} — {self.english} ({self.code})"


_TABLE: tuple[Language, ...] = (
    Language("zh", "Chinese", "中文", "中文"),
    Language("en", "English", "English", "英语"),
    Language("fr", "French", "Français", "法语"),
    Language("pt", "Portuguese", "Português", "葡萄牙语"),
    Language("es", "Spanish", "Español", "西班牙语"),
    Language("ja", "Japanese", "日本語", "日语"),
    Language("tr", "Turkish", "Türkçe", "土耳其语"),
    Language("ru", "Russian", "Русский", "俄语"),
    Language("ar", "Arabic", "العربية", "阿拉伯语"),
    Language("ko", "Korean", "한국어", "韩语"),
    Language("th", "Thai", "ไทย", "泰语"),
    Language("it", "Italian", "Italiano", "意大利语"),
    Language("de", "German", "Deutsch", "德语"),
    Language("vi", "Vietnamese", "Tiếng Việt", "越南语"),
    Language("ms", "Malay", "Bahasa Melayu", "马来语"),
    Language("id", "Indonesian", "Bahasa Indonesia", "印尼语"),
    Language("tl", "Filipino", "Filipino", "菲律宾语"),
    Language("hi", "Hindi", "हिन्दी", "印地语"),
    Language("zh-Hant", "Traditional Chinese", "繁體中文", "繁体中文"),
    Language("pl", "Polish", "Polski", "波兰语"),
    Language("cs", "Czech", "Čeština", "捷克语"),
    Language("nl", "Dutch", "Nederlands", "荷兰语"),
    Language("km", "Khmer", "ភាសាខ្មែរ", "高棉语"),
    Language("my", "Burmese", "မြန်မာဘာသာ", "缅甸语"),
    Language("fa", "Persian", "فارسی", "波斯语"),
    Language("gu", "Gujarati", "ગુજરાતી", "古吉拉特语"),
    Language("ur", "Urdu", "اردو", "乌尔都语"),
    Language("te", "Telugu", "తెలుగు", "泰卢固语"),
    Language("mr", "Marathi", "मराठी", "马拉地语"),
    Language("he", "Hebrew", "עברית", "希伯来语"),
    Language("bn", "Bengali", "বাংলা", "孟加拉语"),
    Language("ta", "Tamil", "தமிழ்", "泰米尔语"),
    Language("uk", "Ukrainian", "Українська", "乌克兰语"),
    Language("bo", "Tibetan", "བོད་ཡིག", "藏语"),
    Language("kk", "Kazakh", "Қазақ тілі", "哈萨克语"),
    Language("mn", "Mongolian", "Монгол", "蒙古语"),
    Language("ug", "Uyghur", "ئۇيغۇرچە", "维吾尔语"),
    Language("yue", "Cantonese", "粵語", "粤语"),
)

LANGUAGES: dict[str, Language] = {lang.code: lang for lang in _TABLE}
_BY_LOWER: dict[str, str] = {code.lower(): code for code in LANGUAGES}
# Aliases callers commonly send (LibreTranslate, BCP-47 variants). They map to a canonical code.
_ALIASES: dict[str, str] = {
    "zh-cn": "zh", "zh-hans": "zh", "zh_cn": "zh", "zh-tw": "zh-Hant", "zh-hk": "zh-Hant", "zh_tw": "zh-Hant",
    "zh_hant": "zh-Hant", "fil": "tl", "iw": "he", "pt-br": "pt", "pt-pt": "pt", "in": "id",
}
_CODE_SHAPE = re.compile(r"^[A-Za-z]{2,3}([-_]([A-Za-z]{2,4}|\d{3}))?$")
_REGION = re.compile(r"^[A-Za-z]{2,3}[-_]([A-Za-z]{2}|\d{3})$")

ZH_GROUP = frozenset({"zh", "zh-Hant", "yue"})


def served_codes(infos: Sequence[Any]) -> list[str]:
    """The codes a server translates from or into, in `infos`' order (`service.LanguageInfo`s: code, targets):
    a language with no route either way is left out of /languages and of the error that names the codes."""
    used = {i.code for i in infos if i.targets} | {t for i in infos for t in i.targets}
    return [i.code for i in infos if i.code in used]


def normalize_code(code: str, served: Collection[str] | None = None) -> str:
    """Canonical code for `code`, accepting case variants (`zh-hant`) and common aliases.

    Raises UnsupportedLanguage for anything else, quoting the code as given (truncated) so that
    a hostile value cannot flood a log line or an error message. The message lists `served` (the codes this
    server translates, when the caller knows them) rather than the whole table: 38 codes, of which the demo
    serves 5, sent users to codes that then failed another way.
    """
    if not isinstance(code, str):
        raise UnsupportedLanguage("Language code must be a string.")
    raw = code.strip()
    shown = raw[:16] + ("…" if len(raw) > 16 else "")
    if not _CODE_SHAPE.match(raw):
        raise UnsupportedLanguage(f"Malformed language code {shown!r}: expected something like 'en' or 'zh-Hant'.",
                                  short=f"{shown} is not supported")
    lowered = raw.lower()
    canonical = _BY_LOWER.get(lowered) or _ALIASES.get(lowered)
    if canonical is None and _REGION.match(raw):
        # Clients often send locale tags (es-ES, de_DE, en-US); the region does not change the model's language.
        canonical = _BY_LOWER.get(re.split(r"[-_]", lowered)[0])
    if canonical is None:
        listed = f"Codes this server translates: {', '.join(served)}" if served else \
            f"Supported codes: {', '.join(LANGUAGES)}"
        raise UnsupportedLanguage(
            f"Unsupported language code {shown!r}. {listed}.",
            short=f"{shown} is not supported",
        )
    return canonical


def get(code: str) -> Language:
    return LANGUAGES[normalize_code(code)]
