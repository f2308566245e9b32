"""The user turn a decoder-only backbone is given for one segment, and each model family's recipe as its card writes
it (`RECIPES`, chosen by `model.prompt`): the templates, whether the chat template ends with the assistant's
marker, the tokens that end generation, the output budget and the sampling values.

The table below is meant to be read beside the cards, line by line:

- "hunyuan-mt": Hunyuan-MT-7B's card (Tencent-Hunyuan/Hunyuan-MT, README, "Prompts", "Use with transformers").
- "hy-mt1.5": the HY-MT1.5 card (Tencent-Hunyuan/HY-MT, README, "Prompts", "Use with transformers"), for
  HY-MT1.5-1.8B and -7B.
- "hy-mt2": the Hy-MT2 card (Tencent-Hunyuan/Hy-MT2, README, "Translation Task Instruction Examples", "Inference
  and Deployment"), for Hy-MT2-1.8B and -7B.

Templates keep the card's own placeholder names. Where this table departs from a card's text, or fills a gap the
card leaves, the entry says so:

- HY-MT1.5's formatted-translation template writes 中文 where the others write `{target_language}`. Its one worked
  instance (the technical report's Table 3, scenario 3) translates an English source into Chinese, so 中文 reads as
  that example's target filled in: the table writes `{target_language}`, which gives the card's text to the
  character for a Chinese target and the target's Chinese name otherwise.
- Hunyuan-MT-7B's card has only the two plain templates; its terminology, context and formatted templates are
  HY-MT1.5's (`Recipe.borrowed`).
- Hy-MT2's card names no "context" template; its "Structured Data 2" row (background information the model reads
  and does not translate) is what this table uses for a request's context. It has no formatted (`<sn>`) template.
  Its table sets instructions in bold (`**…**`): markdown in a table cell, not prompt text.
- HY-MT1.5's and Hunyuan-MT-7B's code examples send an English→Chinese request with the XX⇄XX template; the table
  follows the templates' headings (ZH⇄XX: the Chinese instruction).
- The cards do not say which instruction language a direction takes beyond HY-MT1.5's "ZH⇄XX" and "XX⇄XX": every
  family takes the Chinese instruction when either side is Chinese (zh, zh-Hant, yue) and the English one
  otherwise; a template the English side lacks is the Chinese one, with Chinese names (the cards ask for the
  languages' full names, Chinese in a Chinese instruction, English in an English one).
- Several at once (terms with a context, or with a formatted segment): the cards have no template for both; the
  terminology template's lines and the blank line after them come first, then the other template (a context line
  before a formatted one).

The chat template (the model's own, or the family's in `CHAT_FORMATS` where the profile asks for it) wraps the
result as the user turn; no card uses a system prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import InputTooLarge, InvalidInput
from .languages import LANGUAGES, ZH_GROUP, Language


@dataclass(frozen=True)
class Sampling:
    """A card's decoding values: what `generation.do_sample: true` takes for each value the config leaves unset."""

    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float


@dataclass(frozen=True)
class Instructions:
    """One instruction language's templates, each as its card writes it (None: the card has none). Fields:
    the target's name (`{target_language}` or `{target_lang}`), `{source_text}`, `{context}` / `{background_text}`,
    `{src_text_with_format}`, and `{terms}`: one `term_line` per term (`{source_term}`, `{target_term}`)."""

    #: Which of the language table's names fills the target's field: "chinese" or "english".
    names: str
    plain: str
    terminology: str | None = None
    term_line: str | None = None
    context: str | None = None
    formatted: str | None = None


@dataclass(frozen=True)
class ChatFormat:
    """A family's chat template, for a model folder that lacks its own (`model.chat_template: family`). It fits a
    tokenizer that has every one of `markers`."""

    name: str
    markers: tuple[str, ...]
    template: str


@dataclass(frozen=True)
class Recipe:
    """One family's card."""

    name: str
    card: str
    #: ZH⇄XX: either side is zh, zh-Hant or yue.
    chinese: Instructions
    #: XX⇄XX; a template it lacks is the Chinese one.
    english: Instructions
    #: What the card's own code passes to `apply_chat_template`.
    add_generation_prompt: bool
    #: Tokens that end a translation besides the model's declared end-of-sequence ids (those the tokenizer has).
    end_tokens: tuple[str, ...]
    #: The card's output budget (what its profiles set as limits.max_new_tokens).
    max_new_tokens: int
    sampling: Sampling
    #: The chat formats of this family's models (`CHAT_FORMATS`), for a folder without a template.
    chat_formats: tuple[str, ...]
    #: Template kinds the card does not document, taken from another card (which is said in `card`).
    borrowed: tuple[str, ...] = ()


# ----------------------------------------------------------------------------------------------------------------
# The cards' templates

#: HY-MT1.5 (Tencent-Hunyuan/HY-MT, README, "Prompts"). The formatted template: 中文 written as the target's field
#: (see the module's docstring).
HY_MT15_CHINESE = Instructions(
    names="chinese",
    plain="将以下文本翻译为{target_language}，注意只需要输出翻译后的结果，不要额外解释：\n\n{source_text}",
    terminology="参考下面的翻译：\n{terms}\n\n将以下文本翻译为{target_language}，注意只需要输出翻译后的结果，"
                "不要额外解释：\n{source_text}",
    term_line="{source_term} 翻译成 {target_term}",
    context="{context}\n参考上面的信息，把下面的文本翻译成{target_language}，注意不需要翻译上文，也不要额外解释：\n"
            "{source_text}",
    formatted="将以下<source></source>之间的文本翻译为{target_language}，注意只需要输出翻译后的结果，不要额外解释，"
              "原文中的<sn></sn>标签表示标签内文本包含格式信息，需要在译文中相应的位置尽量保留该标签。"
              "输出格式为：<target>str</target>\n\n<source>{src_text_with_format}</source>",
)
HY_MT15_ENGLISH = Instructions(
    names="english",
    plain="Translate the following segment into {target_language}, without additional explanation.\n\n{source_text}",
)

#: Hunyuan-MT-7B (Tencent-Hunyuan/Hunyuan-MT, README, "Prompts"): the card writes `<target_language>` and
#: `<source_text>`; its code example puts a blank line between the two, as the template block does.
HUNYUAN_MT_CHINESE = Instructions(
    names="chinese",
    plain="把下面的文本翻译成{target_language}，不要额外解释。\n\n{source_text}",
    terminology=HY_MT15_CHINESE.terminology, term_line=HY_MT15_CHINESE.term_line, context=HY_MT15_CHINESE.context,
    formatted=HY_MT15_CHINESE.formatted,
)
HUNYUAN_MT_ENGLISH = HY_MT15_ENGLISH

#: Hy-MT2 (Tencent-Hunyuan/Hy-MT2, README, "Translation Task Instruction Examples"): the Default Translation,
#: Terminology and Structured Data 2 rows, Chinese prompt and English prompt.
HY_MT2_CHINESE = Instructions(
    names="chinese",
    plain="将以下文本翻译为{target_lang}，注意只需要输出翻译后的结果，不要额外解释：\n\n{source_text}",
    terminology="参考下面的翻译：\n{terms}\n将以下文本翻译为{target_lang}，注意只需要输出翻译后的结果，不要额外解释：\n\n"
                "{source_text}",
    term_line="{source_term} 翻译成 {target_term}",
    context="【背景信息】\n{background_text}\n\n请结合背景信息将以下文本翻译为{target_lang}。\n\n【待翻译文本】\n{source_text}",
)
HY_MT2_ENGLISH = Instructions(
    names="english",
    plain="Translate the following text into {target_lang}. Note that you should only output the translated result "
          "without any additional explanation:\n\n{source_text}",
    terminology="Reference the following translations:\n{terms}\n\nTranslate the following text into {target_lang}. "
                "Note that you must ONLY output the translated result without any additional explanation:\n\n"
                "{source_text}",
    term_line="{source_term} translates to {target_term}",
    context="[Background Information]\n{background_text}\n\nPlease translate the following text into {target_lang}, "
            "taking the provided background information into consideration.\n\n[Source Text]\n{source_text}",
)

# ----------------------------------------------------------------------------------------------------------------
# The models' chat formats and end tokens

#: The 1.8B models' end of a turn, their tokenizer's eos_token (120020): Tencent's description of the 1.8B's
#: chat_template.jinja (Tencent-Hunyuan/Hy-MT2, train/llama_factory_support/hy_dense_template.py).
HY_DENSE_EOS = "<｜hy_place▁holder▁no▁2｜>"
#: The 7B models' (same description; the HY-MT1.5 card's vLLM example ends generation on its id, 127960).
DENSE_7B_EOS = "<|eos|>"

#: Written from that same description of the official chat_template.jinja files, not copied from them (the model
#: repositories were not reachable): the start token, the system turn and its closing marker, the user turn, the
#: assistant turn closed by the end token; the 1.8B's generation prompt is its assistant marker, and the 7B's user
#: turn already ends with the marker the model answers after.
CHAT_FORMATS: dict[str, ChatFormat] = {f.name: f for f in (
    ChatFormat(
        "hunyuan-1.8b",
        ("<｜hy_begin▁of▁sentence｜>", "<｜hy_User｜>", "<｜hy_Assistant｜>", HY_DENSE_EOS),
        "{{ '<｜hy_begin▁of▁sentence｜>' }}{% for m in messages %}"
        "{% if m['role'] == 'system' %}{{ m['content'] + '<｜hy_place▁holder▁no▁3｜>' }}"
        "{% elif m['role'] == 'user' %}{{ '<｜hy_User｜>' + m['content'] }}"
        "{% elif m['role'] == 'assistant' %}{{ '<｜hy_Assistant｜>' + m['content'] + '<｜hy_place▁holder▁no▁2｜>' }}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<｜hy_Assistant｜>' }}{% endif %}",
    ),
    ChatFormat(
        "hunyuan-7b",
        ("<|startoftext|>", "<|extra_0|>", DENSE_7B_EOS),
        "{{ '<|startoftext|>' }}{% for m in messages %}"
        "{% if m['role'] == 'system' %}{{ m['content'] + '<|extra_4|>' }}"
        "{% elif m['role'] == 'user' %}{{ ('' if loop.first or loop.previtem['role'] == 'system' else "
        "'<|startoftext|>') + m['content'] + '<|extra_0|>' }}"
        "{% elif m['role'] == 'assistant' %}{{ m['content'] + '<|eos|>' }}{% endif %}{% endfor %}",
    ),
)}

# ----------------------------------------------------------------------------------------------------------------
# The table

#: The cards' recommended sampling: HY-MT1.5's and Hunyuan-MT-7B's "recommend using the following set of
#: parameters", and Hy-MT2's "For 1.8B and 7B".
CARD_SAMPLING = Sampling(temperature=0.7, top_p=0.6, top_k=20, repetition_penalty=1.05)

RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe(
        name="hunyuan-mt",
        card="Hunyuan-MT-7B's card (Tencent-Hunyuan/Hunyuan-MT, README); terminology, context and formatted "
             "templates from the HY-MT1.5 card, which Hunyuan-MT-7B's does not document",
        chinese=HUNYUAN_MT_CHINESE, english=HUNYUAN_MT_ENGLISH,
        # The card's transformers example; its example generates max_new_tokens=2048.
        add_generation_prompt=False, max_new_tokens=2048,
        end_tokens=(DENSE_7B_EOS,), sampling=CARD_SAMPLING, chat_formats=("hunyuan-7b",),
        borrowed=("terminology", "context", "formatted"),
    ),
    Recipe(
        name="hy-mt1.5",
        card="the HY-MT1.5 card (Tencent-Hunyuan/HY-MT, README)",
        chinese=HY_MT15_CHINESE, english=HY_MT15_ENGLISH,
        # The card's transformers example, as Hunyuan-MT-7B's. Hy-MT2's card, on the same 1.8B chat format, passes
        # True, and llama.cpp's hunyuan-dense renderer ends a user turn with the assistant's marker too.
        add_generation_prompt=False, max_new_tokens=2048,
        end_tokens=(HY_DENSE_EOS, DENSE_7B_EOS), sampling=CARD_SAMPLING, chat_formats=("hunyuan-1.8b", "hunyuan-7b"),
    ),
    Recipe(
        name="hy-mt2",
        card="the Hy-MT2 card (Tencent-Hunyuan/Hy-MT2, README), 1.8B and 7B",
        chinese=HY_MT2_CHINESE, english=HY_MT2_ENGLISH,
        # The card's transformers example passes True; its parameters give "max_tokens": 4096.
        add_generation_prompt=True, max_new_tokens=4096,
        end_tokens=(HY_DENSE_EOS, DENSE_7B_EOS), sampling=CARD_SAMPLING, chat_formats=("hunyuan-1.8b", "hunyuan-7b"),
    ),
)}

STYLES = tuple(RECIPES)


def recipe(style: str) -> Recipe:
    """The family's recipe (`model.prompt`)."""
    found = RECIPES.get(style)
    if found is None:
        raise ValueError(f"prompt style {style!r}: one of {', '.join(STYLES)}")
    return found


# ----------------------------------------------------------------------------------------------------------------
# Building the user turn

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
    and takes the family's formatted-translation template."""
    family = recipe(style)
    side = family.chinese if src in ZH_GROUP or tgt in ZH_GROUP else family.english
    context = context.strip() if context and context.strip() else None
    kind = "formatted" if formatted else "context" if context else "terminology" if terms else "plain"
    template, names = _template(family, side, kind)
    fields = _fields(LANGUAGES[tgt], names, text, context or "")
    if kind == "terminology":
        return template.format_map({**fields, "terms": _term_lines(family, side, terms)})
    body = template.format_map(fields)
    if kind == "formatted" and context:
        body = f"{context}\n{body}"
    if terms:
        body = _terms_block(family, side, terms) + body
    return body


def _template(family: Recipe, side: Instructions, kind: str) -> tuple[str, str]:
    """The template of `kind` for this direction, and which names fill it: the direction's own, else the
    Chinese one."""
    for instructions in (side, family.chinese):
        template = getattr(instructions, kind)
        if template is not None:
            return template, instructions.names
    raise ValueError(f"the {family.name} prompt has no {kind} template ({family.card})")


def _fields(target: Language, names: str, text: str, context: str) -> dict[str, str]:
    name = target.chinese if names == "chinese" else target.english
    return {"target_language": name, "target_lang": name, "source_text": text, "src_text_with_format": text,
            "context": context, "background_text": context}


def _term_lines(family: Recipe, side: Instructions, terms: tuple[tuple[str, str], ...]) -> str:
    line, _ = _template(family, side, "term_line")
    return "\n".join(line.format(source_term=s, target_term=t) for s, t in terms)


def _terms_block(family: Recipe, side: Instructions, terms: tuple[tuple[str, str], ...]) -> str:
    """The terminology template up to its instruction (the header, the term lines and the whitespace after
    them), to come before another template."""
    template, _ = _template(family, side, "terminology")
    head = re.match(r"(.*?\{terms\}\s*)", template, re.S)
    assert head is not None, f"{family.name}: its terminology template has no {{terms}}"
    return head.group(1).format(terms=_term_lines(family, side, terms))


# ----------------------------------------------------------------------------------------------------------------
# Reading a user turn back (the OpenAI-compatible endpoint)

#: Every family's plain instructions, with the target's name. Commas and colons full-width or not: the Hy-MT2
#: card's own transformers example writes them half-width (and 翻译成).
_PATTERNS = (
    re.compile(r"^把下面的文本翻译成(?P<lang>[^，,]+)[，,]\s*不要额外解释。\s*\n\n(?P<text>.*)$", re.S),
    re.compile(r"^将以下文本翻译[为成](?P<lang>[^，,]+)[，,]\s*注意只需要输出翻译后的结果[，,]\s*不要额外解释[：:]\s*\n\n"
               r"(?P<text>.*)$", re.S),
    re.compile(
        r"^Translate the following segment into (?P<lang>[^,]+?), without additional explanation\.\s*\n\n(?P<text>.*)$",
        re.S,
    ),
    re.compile(r"^Translate the following text into (?P<lang>[^.]+?)\. Note that you should only output the "
               r"translated result without any additional explanation:\s*\n\n(?P<text>.*)$", re.S),
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
