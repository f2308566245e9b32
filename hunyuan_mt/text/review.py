"""What makes a machine translation one to review, beside a low confidence: it came back as its source.

A model that copies (`Hello {name}, welcome back!` en→de, at confidence 0.70) writes something a reader would ship
as translated. `unchanged` tells such a segment from its source outside the protected spans; the service caps its
confidence at `UNCHANGED_CONFIDENCE` and never calls it confident, whatever `quality.review_below` says.
"""

from __future__ import annotations

import re

#: The most confidence a segment that came back as its source reports (`/translate`'s `confidence`): below any
#: sensible `quality.review_below`, and the marks do not depend on it (the service checks `unchanged` itself).
UNCHANGED_CONFIDENCE = 0.1

#: What does not count in the comparison: sentinels of protected spans, digits, punctuation, spacing, case.
_NOT_WORDS = re.compile(r"⟦\d+⟧|[\W\d_]+")


def words(text: str) -> str:
    """A masked text's letters, case-folded: what a translation changes."""
    return _NOT_WORDS.sub("", text).casefold()


def unchanged(source: str, translation: str) -> bool:
    """Whether `translation` (masked, as the model gave it) has the same words as `source` (masked), and words at
    all: the model copied rather than translated."""
    letters = words(source)
    return bool(letters) and words(translation) == letters
