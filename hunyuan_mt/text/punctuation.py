"""A target script's punctuation: Chinese and Japanese write full-width marks with no space before them.

The demo model puts a space before "。" and writes an ASCII ", " between Chinese words (it learnt from text that
mixes both); `tidy` fixes a model's output for such a target before its protected spans go back in, so a comma
inside a placeholder, a path or code is never touched.
"""

from __future__ import annotations

import re

from .segment import UNSPACED_SENTENCES

_HAN = r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"
_CLOSING = "。，、；：！？）」』】》〉"
_OPENING = "（「『【《〈"
#: Blanks before a full-width mark, or after an opening one.
_BEFORE = re.compile(rf"[ \t]+(?=[{_CLOSING}])")
_AFTER = re.compile(rf"(?<=[{_OPENING}])[ \t]+")
#: An ASCII comma, semicolon or colon between two Chinese characters (spaces around it or not).
_BETWEEN = re.compile(rf"(?<={_HAN})[ \t]*([,;:])[ \t]*(?={_HAN})")
#: An ASCII "!" or "?" after a Chinese character, at the end or before more Chinese.
_END = re.compile(rf"(?<={_HAN})[ \t]*([!?])(?=[ \t]*(?:$|{_HAN}))")
_FULL_WIDTH = {",": "，", ";": "；", ":": "：", "!": "！", "?": "？"}


def tidy(text: str, target: str) -> str:
    """`text` with the target's habits where it writes full-width punctuation (`UNSPACED_SENTENCES`); as it is
    otherwise."""
    if target not in UNSPACED_SENTENCES:
        return text
    text = _BETWEEN.sub(lambda m: _FULL_WIDTH[m.group(1)], text)
    text = _END.sub(lambda m: _FULL_WIDTH[m.group(1)], text)
    return _AFTER.sub("", _BEFORE.sub("", text))
