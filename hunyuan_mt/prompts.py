"""The instruction a decoder-only backbone is given for one segment, per model family (`model.prompt`), and the
context a request may add (text that shapes the translation and is not itself translated).

- "hunyuan-mt": Hunyuan-MT-7B's card: `把下面的文本翻译成{target}，不要额外解释。` when either side is Chinese, else
  `Translate the following segment into {target}, without additional explanation.`, then a blank line and the text.
- "hy-mt1.5": the HY-MT1.5 card (Tencent-Hunyuan/HY-MT, README, "Prompts"), for HY-MT1.5 and Hy-MT2:
  ZH⇄XX `将以下文本翻译为{target}，注意只需要输出翻译后的结果，不要额外解释：` and XX⇄XX the English line above.
- With context, both families take the card's contextual template: `{context}` on its own line, then
  `参考上面的信息，把下面的文本翻译成{target}，注意不需要翻译上文，也不要额外解释：` and the text.
- With glossary terms (`glossary.mode: prompt`), the card's terminology template: `参考下面的翻译：`, a line
  `{source_term} 翻译成 {target_term}` per term, a blank line, then
  `将以下文本翻译为{target}，注意只需要输出翻译后的结果，不要额外解释：` and the text. With context too, the terms'
  lines come first and the contextual template after them (the card has no template for both; this is the two
  composed).

- A document segment with inline markup, under "hy-mt1.5" (`model.markup`: tags; inline.py): the card's formatted
  translation template, `将以下<source></source>之间的文本翻译为{target}，注意只需要输出翻译后的结果，不要额外解释，
  原文中的<sn></sn>标签表示标签内文本包含格式信息，需要在译文中相应的位置尽量保留该标签。输出格式为：<target>str</target>`,
  a blank line, and `<source>{text}</source>` with the text's pieces as `<s1>…</s1>` (the technical report's
  Table 3 shows the numbering and the `<target>` answer). Glossary terms' lines and a context line come before it
  (the card has no template for both; these are composed as above).

The card asks for the languages' full names, Chinese ones in a Chinese instruction and English ones in an English
instruction. The chat template (the model's own) wraps the result as the user turn; the card uses no system prompt.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import InputTooLarge, InvalidInput
from .languages import LANGUAGES, ZH_GROUP, Language

STYLES = ("hunyuan-mt", "hy-mt1.5")

#: What a request's text (and its context) may not carry into a prompt: control characters, and lone surrogates
#: (replaced by U+FFFD: the tokenizer cannot encode them).
CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
SURROGATES = re.compile(r"[\ud800-\udfff]")


def clean_context(context: Any, limit: int) -> str | None:
    """A request's context as the prompt will hold it (None: none given, or only whitespace), or a typed error
    saying why it cannot be: the same rules as the text's, and its own limit (limits.max_chars). The edges call it
    too (a document's context is refused before its job exists)."""
    if context is None or (isinstance(context, str) and not context.strip()):
        return None
    if not isinstance(context, str):
        raise InvalidInput(f"Context must be a string, got {type(context).__name__}.")
    if len(context) > limit:
        raise InputTooLarge(f"Context is {len(context)} characters, over the limit of {limit} (limits.max_chars).")
    return CONTROL_CHARS.sub("", SURROGATES.sub("\ufffd", context)).strip() or None


def build(style: str, text: str, src: str, tgt: str, context: str | None = None,
          terms: tuple[tuple[str, str], ...] = (), formatted: bool = False) -> str:
    """The user turn for `text` from `src` into `tgt` (canonical codes), with a request's context and the glossary
    terms the segment holds (source term, target term). `formatted`: `text` holds `<sN>` pairs (inline.to_tags)
    and takes the card's formatted-translation template."""
    target = LANGUAGES[tgt]
    preface = ("参考下面的翻译：\n" + "\n".join(f"{s} 翻译成 {t}" for s, t in terms) + "\n\n") if terms else ""
    if formatted:
        if context and context.strip():
            preface += f"{context.strip()}\n"
        return (f"{preface}将以下<source></source>之间的文本翻译为{target.chinese}，注意只需要输出翻译后的结果，"
                "不要额外解释，原文中的<sn></sn>标签表示标签内文本包含格式信息，需要在译文中相应的位置尽量保留该标签。"
                f"输出格式为：<target>str</target>\n\n<source>{text}</source>")
    if context and context.strip():
        return (f"{preface}{context.strip()}\n参考上面的信息，把下面的文本翻译成{target.chinese}，注意不需要翻译上文，"
                f"也不要额外解释：\n{text}")
    if terms:
        return f"{preface}将以下文本翻译为{target.chinese}，注意只需要输出翻译后的结果，不要额外解释：\n{text}"
    chinese = src in ZH_GROUP or tgt in ZH_GROUP
    if style == "hy-mt1.5":
        if chinese:
            return f"将以下文本翻译为{target.chinese}，注意只需要输出翻译后的结果，不要额外解释：\n\n{text}"
        return f"Translate the following segment into {target.english}, without additional explanation.\n\n{text}"
    if style != "hunyuan-mt":
        raise ValueError(f"prompt style {style!r}: one of {', '.join(STYLES)}")
    if chinese:
        return f"把下面的文本翻译成{target.chinese}，不要额外解释。\n\n{text}"
    return f"Translate the following segment into {target.english}, without additional explanation.\n\n{text}"


#: Every family's plain instructions (the OpenAI-compatible endpoint reads them back), with the target's name.
_PATTERNS = (
    re.compile(r"^把下面的文本翻译成(?P<lang>[^，,]+)[，,]\s*不要额外解释。\s*\n\n(?P<text>.*)$", re.S),
    re.compile(r"^将以下文本翻译为(?P<lang>[^，,]+)[，,]\s*注意只需要输出翻译后的结果[，,]\s*不要额外解释[：:]\s*\n\n"
               r"(?P<text>.*)$", re.S),
    re.compile(
        r"^Translate the following segment into (?P<lang>[^,]+?), without additional explanation\.\s*\n\n(?P<text>.*)$",
        re.S,
    ),
)


def parse(message: str) -> tuple[str | None, str]:
    """Inverse of `build` for the plain instructions: (target code or None, text). A message in none of them
    returns (None, message)."""
    for pattern in _PATTERNS:
        match = pattern.match(message.strip())
        if match:
            found = _by_name(match.group("lang").strip())
            if found is not None:
                return found.code, match.group("text")
    return None, message


def _by_name(name: str) -> Language | None:
    return next((lang for lang in LANGUAGES.values() if name in (lang.english, lang.chinese, lang.native)), None)
