"""Language detection: lingua for the languages it knows, script rules for the ones it does not.

lingua is an n-gram detector; on one- or two-word strings ("Hello", "Merci", "Le chat dort.") its n-grams are
too few and it often prefers a neighbouring language. For short Latin-script text we therefore also weigh each
word's corpus frequency per language (wordfreq), which is what disambiguates such strings for a human too.
Chinese script is split into zh / zh-Hant (hanzidentifier) and yue (Cantonese-only characters); Khmer, Burmese
and Tibetan have scripts of their own; Uyghur is Arabic script with letters Arabic, Persian and Urdu do not use.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass
from typing import Collection

from .languages import LANGUAGES, ZH_GROUP


@dataclass(frozen=True)
class Detection:
    code: str
    confidence: float


# Table codes whose language lingua has a model for; lingua names the ISO 639-1 code the same way except Tagalog.
_LINGUA_CODES = ("zh", "en", "fr", "pt", "es", "ja", "tr", "ru", "ar", "ko", "th", "it", "de", "vi", "ms", "id",
                 "tl", "hi", "pl", "cs", "nl", "fa", "gu", "ur", "te", "mr", "he", "bn", "ta", "uk", "kk", "mn")
# wordfreq's code for a table code, for the Latin-script languages the short-text word model covers.
_WORDFREQ = {"en": "en", "fr": "fr", "pt": "pt", "es": "es", "tr": "tr", "it": "it", "de": "de", "vi": "vi",
             "ms": "ms", "id": "id", "tl": "fil", "pl": "pl", "cs": "cs", "nl": "nl"}
#: Texts with at most this many words get the word-frequency model on top of lingua.
SHORT_WORDS = 4
_FREQ_FLOOR = 1e-8

_SCRIPT_RULES = (  # (code, regex of the script's letters)
    ("km", re.compile(r"[\u1780-\u17FF]")),
    ("my", re.compile(r"[\u1000-\u109F]")),
    ("bo", re.compile(r"[\u0F00-\u0FFF]")),
)
_UYGHUR_LETTERS = re.compile(r"[\u06C6\u06C7\u06C8\u06CB\u06D0\u06D5]")  # ۆ ۇ ۈ ۋ ې ە
_ARABIC_SCRIPT = re.compile(r"[\u0600-\u06FF]")
# Characters written in Cantonese but not in Mandarin (係 is left out: it is also the traditional form of 系).
_CANTONESE = re.compile(r"[嘅咗喺哋冇嘢啲嚟嗰佢唔乜咁畀]")
_HAN = re.compile(r"[\u4E00-\u9FFF\u3400-\u4DBF]")
_LETTER = re.compile(r"[^\W\d_]", re.UNICODE)
_LATIN_WORD = re.compile(r"[A-Za-zÀ-ÖØ-öø-ɏḀ-ỿ']+")


class LanguageDetector:
    """Built once per process (`get_detector()`); lingua models load lazily on the first call."""

    def __init__(self) -> None:
        from lingua import Language, LanguageDetectorBuilder

        by_iso = {lang.iso_code_639_1.name.lower(): lang for lang in Language.all()}
        by_iso["tl"] = Language.TAGALOG
        self._to_lingua = {code: by_iso[code] for code in _LINGUA_CODES if code in by_iso}
        self._from_lingua = {lang: code for code, lang in self._to_lingua.items()}
        self._detector = LanguageDetectorBuilder.from_languages(*self._to_lingua.values()).build()

    def detect(self, text: str, among: Collection[str] | None = None, top: int = 3) -> list[Detection]:
        """Best guesses first, confidences summing to at most 1. `among` restricts the candidates (table codes).

        Returns [] when the text has no letters or no candidate fits.
        """
        candidates = set(LANGUAGES) if among is None else {c for c in among if c in LANGUAGES}
        sample = text[:2000]  # detection needs a paragraph at most; keeps a 200k-char document cheap
        if not _LETTER.search(sample) or not candidates:
            return []
        by_script = self._by_script(sample, candidates)
        if by_script is not None:
            return by_script[:top]
        scores = {self._from_lingua[c.language]: c.value
                  for c in self._detector.compute_language_confidence_values(sample)}
        if _HAN.search(sample) and scores.get("zh", 0.0) > 0.5:
            return self._chinese(sample, candidates, scores["zh"])[:top]
        scores = {code: value for code, value in scores.items() if code in candidates}
        scores = self._with_word_model(sample, scores)
        total = sum(scores.values())
        if total <= 0:
            return []
        ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
        return [Detection(code, round(value / total, 4)) for code, value in ranked[:top] if value > 0]

    def _by_script(self, text: str, candidates: set[str]) -> list[Detection] | None:
        letters = len(_LETTER.findall(text))
        for code, pattern in _SCRIPT_RULES:
            if code in candidates and len(pattern.findall(text)) * 2 >= letters:
                return [Detection(code, 1.0)]
        if "ug" in candidates and _UYGHUR_LETTERS.search(text) and len(_ARABIC_SCRIPT.findall(text)) * 2 >= letters:
            return [Detection("ug", 1.0)]
        return None

    @staticmethod
    def _chinese(text: str, candidates: set[str], confidence: float) -> list[Detection]:
        import hanzidentifier

        if _CANTONESE.search(text):
            order = ["yue", "zh-Hant", "zh"]
        elif hanzidentifier.identify(text) == hanzidentifier.TRADITIONAL:
            order = ["zh-Hant", "yue", "zh"]
        else:
            order = ["zh", "zh-Hant", "yue"]
        allowed = [c for c in order if c in candidates]
        if not allowed:
            return []
        return [Detection(allowed[0], round(confidence, 4))] + [Detection(c, 0.0) for c in allowed[1:]]

    @staticmethod
    def _with_word_model(text: str, scores: dict[str, float]) -> dict[str, float]:
        words = _LATIN_WORD.findall(text.lower())
        latin = [code for code in scores if code in _WORDFREQ]
        if not words or len(words) > SHORT_WORDS or len(latin) < 2:
            return scores
        # Only when the text is (mostly) Latin letters: otherwise lingua's script evidence is already decisive.
        if sum(map(len, words)) * 2 < len(_LETTER.findall(text)):
            return scores
        from wordfreq import word_frequency

        logs: dict[str, float] = {}
        for code in latin:
            logp = math.log(max(scores[code], 1e-6))
            for word in words:
                logp += math.log(max(word_frequency(word, _WORDFREQ[code], wordlist="small"), _FREQ_FLOOR))
            logs[code] = logp
        peak = max(logs.values())
        latin_mass = sum(scores[c] for c in latin)
        weights = {c: math.exp(v - peak) for c, v in logs.items()}
        norm = sum(weights.values())
        # Redistribute only the mass lingua gave to Latin-script candidates; the rest keeps lingua's values.
        out = dict(scores)
        for code, weight in weights.items():
            out[code] = latin_mass * weight / norm
        return out


_detector: LanguageDetector | None = None
_lock = threading.Lock()


def get_detector() -> LanguageDetector:
    """The process-wide detector, built on first use (thread-safe)."""
    global _detector
    if _detector is None:
        with _lock:
            if _detector is None:
                _detector = LanguageDetector()
    return _detector


def detect(text: str, among: Collection[str] | None = None, top: int = 3) -> list[Detection]:
    return get_detector().detect(text, among=among, top=top)


def warm() -> None:
    """Load lingua's models now (a few seconds) so the first `auto` request is not the slow one."""
    detect("warm up the language models", among=None)


__all__ = ["Detection", "LanguageDetector", "ZH_GROUP", "detect", "get_detector", "warm"]
