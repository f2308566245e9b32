"""What a translation gives back (`TranslationResult`, `LanguageInfo`), and one text on its way through its hops
(`TextJob`: layout, masked segments, memory answers, scores) with what the facade reads off it."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ..scheduler.router import RoutePlan
from ..text import masking as _masking
from ..text import review
from ..text.detect import Detection


@dataclass
class TranslationResult:
    text: str
    source: str
    target: str
    detected: Detection | None
    #: Languages along the route: ["es", "en", "de"] for a pivot.
    route: list[str]
    route_kind: str  # "identity" | "direct" | "pivot" | "base"
    adapters: list[str]
    timings_ms: dict[str, float] = field(default_factory=dict)
    #: Other translations of the text, best first, each different from `text` (only when asked for).
    alternatives: list[str] = field(default_factory=list)
    #: How many of the text's segments came from the translation memory, of how many it has.
    memory_segments: int = 0
    #: How many of those were near-exact: the entry differed in case or closing punctuation (numbers and
    #: placeholders are the query's own either way).
    memory_near_segments: int = 0
    segments: int = 1
    #: How many glossary terms were found in the text and enforced (0 without a glossary).
    glossary_terms: int = 0
    #: Near entries of the translation memory for segments it did not know exactly, best first: each with the
    #: segment's index, the score (0..1) and the entry's source and target (tm.fuzzy_threshold).
    memory_matches: list[dict[str, Any]] = field(default_factory=list)
    #: Each segment's confidence in (0, 1] (`TextJob.confidences`): the model's own token probabilities, as
    #: bergamot-translator's quality estimate; 1.0 from the memory; None where there is no score.
    segment_confidences: list[float | None] = field(default_factory=list)
    #: Each segment's translation, in order (what `segment_confidences` score; the text joins them).
    segment_texts: list[str] = field(default_factory=list)
    #: Per segment, its last hop's tokens as (text, log-probability), the texts joining into the segment's
    #: translation; None where the model gave none that join up (memory, beam search, a repaired placeholder).
    segment_tokens: list[list[tuple[str, float]] | None] = field(default_factory=list)

    @property
    def confidence(self) -> float | None:
        """The text's confidence: its least confident segment's (a reviewer looks for the weakest sentence)."""
        known = [c for c in self.segment_confidences if c is not None]
        return min(known) if known else None

    @property
    def route_label(self) -> str:
        return f"{' → '.join(self.route)} ({self.route_kind})"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["route_label"] = self.route_label
        out["confidence"] = self.confidence
        return out


@dataclass(frozen=True)
class LanguageInfo:
    code: str
    english: str
    native: str
    #: Targets this language can be translated into with the adapters registered now.
    targets: list[str]


@dataclass
class TextJob:
    """One text on its way through the hops: its layout, masked segments and current texts."""

    plan: RoutePlan
    layout: Any  # segment.Segmented
    protected: list[Any]  # masking.Protected | None per segment
    current: list[str]
    todo: list[int]  # indices of segments that need the model
    #: Segment index → the last hop's n best outputs, when alternatives were asked for.
    nbest: dict[int, list[str]] = field(default_factory=dict)
    #: Segment index → its translation from the translation memory (restored), which is the answer.
    memory: dict[int, str] = field(default_factory=dict)
    #: Segments of `memory` answered by a near-exact entry (differing in case or closing punctuation).
    near: set[int] = field(default_factory=set)
    #: Segment index → the translation memory's nearest entry, when it had no exact one (tm.fuzzy_threshold).
    matches: dict[int, Any] = field(default_factory=dict)
    #: The target term of each glossary term found in the text: the output must hold them.
    required: list[str] = field(default_factory=list)
    #: Whether the terms were written into the source as themselves (glossary.mode "visible").
    visible: bool = False
    #: The request's context: shapes every segment's translation, never translated itself (prompts.py).
    context: str | None = None
    #: Segment index → the glossary terms it holds, for the terminology prompt (glossary.mode: prompt).
    prompt_terms: dict[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    #: Whether the model's segments are scored (`confidences`): text requests, and documents that keep origins.
    scored: bool = False
    #: Segment index → the sum over its hops of each hop's mean token log-probability (None: a hop had none).
    logprob: dict[int, float | None] = field(default_factory=dict)
    #: Segment index → its last hop's output tokens and their log-probabilities (scored jobs).
    tokens: dict[int, tuple[list[int], list[float]]] = field(default_factory=dict)
    #: Segments the model gave back as their source (review.unchanged): never confident.
    unchanged: set[int] = field(default_factory=set)

    def confidences(self) -> list[float | None]:
        """Each segment's confidence in (0, 1]: the geometric mean of its tokens' probabilities, multiplied over a
        pivot's hops, at most review.UNCHANGED_CONFIDENCE for a segment that came back as its source; 1.0 for a
        segment the translation memory answered; None where the model gave no score (beam search) or the segment
        needed no translation."""
        out: list[float | None] = []
        for i in range(len(self.current)):
            if i in self.memory:
                out.append(1.0)
            else:
                value = self.logprob.get(i)
                score = None if value is None else round(math.exp(value), 4)
                if score is not None and i in self.unchanged:
                    score = min(score, review.UNCHANGED_CONFIDENCE)
                out.append(score)
        return out

    @property
    def terms(self) -> int:
        return len(self.required)

    def render(self, segments: list[str]) -> str:
        if self.layout is None:
            return segments[0]
        if self.plan is None:
            return self.layout.render(segments)
        return self.layout.render(segments, self.plan.src, self.plan.tgt)


def fuzzy_matches(job: TextJob) -> list[dict[str, Any]]:
    """The job's fuzzy memory matches for display, best first: the entry's spans are the segment's own where the
    counts agree (as an exact hit's are), so "Delete ⟦0⟧ files" shows the query's number."""
    out = []
    for i, near in job.matches.items():
        spans = job.protected[i]
        out.append({"segment": i, "score": near.score, "source": _masking.restore(near.source, spans),
                    "target": _masking.restore(near.target, spans)})
    return sorted(out, key=lambda m: (-m["score"], m["segment"]))


def alternatives_of(job: TextJob, limit: int) -> list[str]:
    """Up to `limit` renderings of the text other than the main one: the k-th puts, in every segment, that
    segment's k-th best output that differs from its main translation (or the main one where it has no k-th)."""
    if limit <= 0 or not job.nbest:
        return []
    others: dict[int, list[str]] = {}
    for i, hypotheses in job.nbest.items():
        distinct: list[str] = []
        for h in hypotheses:
            if h.strip() and h != job.current[i] and h not in distinct:
                distinct.append(h)
        others[i] = distinct
    main = job.render(job.current)
    out: list[str] = []
    for k in range(max((len(d) for d in others.values()), default=0)):
        segments = list(job.current)
        for i, distinct in others.items():
            if k < len(distinct):
                segments[i] = distinct[k]
        text = job.render(segments)
        if text != main and text not in out:
            out.append(text)
        if len(out) == limit:
            break
    return out


def local_spans(segment: str, spans: list[str]) -> Any:
    """A segment of a text masked as a whole, renumbered ⟦0⟧, ⟦1⟧, ... with only its own spans."""
    local: list[str] = []

    def renumber(match: re.Match[str]) -> str:
        local.append(spans[int(match.group(1))])
        return _masking.sentinel(len(local) - 1)

    return _masking.Protected(_masking.SENTINEL.sub(renumber, segment), local)
