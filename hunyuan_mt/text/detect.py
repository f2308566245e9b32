"""Language detection: lingua for the languages it knows, script rules for the ones it does not.

lingua is an n-gram detector; on one- or two-word strings ("Hello", "Merci", "Le chat dort.") its n-grams are
too few and it often prefers a neighbouring language. For short Latin-script text we therefore also weigh each
word's corpus frequency per language (wordfreq), which is what disambiguates such strings for a human too.
Chinese script is split into zh / zh-Hant (hanzidentifier) and yue (Cantonese-only characters); Khmer, Burmese
and Tibetan have scripts of their own; Uyghur is Arabic script with letters Arabic, Persian and Urdu do not use.

The detector runs in a process of its own (`DetectorProcess`). Loading lingua's models takes about two seconds
during which lingua holds the GIL: in the server's process that froze every thread, the decode loop and the HTTP
side included. In a helper process the server keeps serving while it loads; a detection request that arrives
before it is ready waits for it (that request only), and `ready()` says when none would wait.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import re
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Collection

from ..errors import ModelUnavailable
from ..host.helpers import become_helper, main_not_rerun
from .languages import LANGUAGES, ZH_GROUP

log = logging.getLogger(__name__)


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
    """lingua plus the rules above, in the process that calls it (the helper process builds one)."""

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


# ------------------------------------------------------------------ the helper process

_CHILD: LanguageDetector | None = None


#: Texts the helper detects before it says it is ready, one per branch of `LanguageDetector.detect`: lingua's
#: models, the short-text word lists (wordfreq reads each language's list on first use: 250 ms for the first
#: "Hola amigo" after start), Chinese script (hanzidentifier) and the script rules.
WARM_TEXTS = ("warm up the language models, all of them", "Hola amigo", "这是一个测试。", "這是一個測試。",
              "بۇ بىر سىناق")


def _child_init(parent: int) -> None:
    """In the helper process: build the detector and load everything a first detection would load."""
    global _CHILD
    become_helper(parent, "hmt-detector")  # the server shuts the pool down; it is not stopped by signals
    _CHILD = LanguageDetector()
    for text in WARM_TEXTS:
        _CHILD.detect(text, among=None)


def _child_ready() -> bool:
    return _CHILD is not None


def _child_detect(text: str, among: list[str] | None, top: int) -> list[tuple[str, float]]:
    assert _CHILD is not None
    return [(d.code, d.confidence) for d in _CHILD.detect(text, among=among, top=top)]


class DetectorProcess:
    """The detector in a helper process (see the module docstring). Thread-safe; starts loading at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._start()

    def _start(self) -> None:
        # spawn, not fork: the server process holds threads (and torch) that a forked child must not inherit.
        self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_child_init, initargs=(os.getpid(),))
        self._started = time.monotonic()
        with main_not_rerun():  # the first submit launches the helper
            self._ready: Future = self._pool.submit(_child_ready)
        self._ready.add_done_callback(self._announce)

    def _announce(self, future: Future) -> None:
        if future.exception() is None:
            log.info("language detector ready in %.1f s (helper process)", time.monotonic() - self._started)
        else:
            log.error("language detector failed to load: %s", future.exception())

    def ready(self) -> bool:
        """Whether a detection now would be served without waiting for the models to load."""
        return self._ready.done() and self._ready.exception() is None

    def wait(self, timeout: float | None = None) -> None:
        """Block until the models are loaded (ModelUnavailable if the helper cannot start)."""
        try:
            self._ready.result(timeout)
        except (BrokenProcessPool, OSError) as exc:
            raise ModelUnavailable(f"Language detection is unavailable: {type(exc).__name__}: {exc}") from None

    def detect(self, text: str, among: Collection[str] | None = None, top: int = 3) -> list[Detection]:
        arg = None if among is None else sorted(among)
        for attempt in (1, 2):
            try:
                found = self._pool.submit(_child_detect, text, arg, top).result()
                return [Detection(code, confidence) for code, confidence in found]
            except BrokenProcessPool as exc:
                # The helper died (killed, out of memory): start a new one once, then give up with a clear error.
                log.warning("language detector process died (%s); starting it again", exc)
                with self._lock:
                    self._pool.shutdown(wait=False, cancel_futures=True)
                    self._start()
                if attempt == 2:
                    raise ModelUnavailable("Language detection is unavailable: its process keeps dying; give the "
                                           "source language.") from None
        return []  # pragma: no cover - the loop returns or raises

    def close(self, wait: bool = False) -> None:
        """Stop the helper. `wait` joins it too, so that its queues' semaphores are released before the process
        exits (else Python's resource tracker warns that they leaked)."""
        self._pool.shutdown(wait=wait, cancel_futures=True)


_detector: DetectorProcess | None = None
_lock = threading.Lock()


def get_detector() -> DetectorProcess:
    """The process-wide detector, its helper started on first use (thread-safe)."""
    global _detector
    if _detector is None:
        with _lock:
            if _detector is None:
                _detector = DetectorProcess()
    return _detector


def detect(text: str, among: Collection[str] | None = None, top: int = 3) -> list[Detection]:
    """Best guesses first; waits for the helper's models on the very first call if they are still loading."""
    return get_detector().detect(text, among=among, top=top)


def start() -> None:
    """Start loading the detector in its helper process, without waiting (the service calls this at start)."""
    get_detector()


def ready() -> bool:
    return _detector is not None and _detector.ready()


def shutdown() -> None:
    """Stop the helper process and wait for it (the server calls this on its way out)."""
    global _detector
    with _lock:
        detector, _detector = _detector, None
    if detector is not None:
        detector.close(wait=True)


def warm(timeout: float | None = None) -> None:
    """Start the helper if needed and wait until its models are loaded."""
    get_detector().wait(timeout)


__all__ = ["Detection", "DetectorProcess", "LanguageDetector", "ZH_GROUP", "detect", "get_detector", "ready", "shutdown", "start", "warm"]
