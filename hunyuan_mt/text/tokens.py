"""`PromptTokens`: a backbone's prompts to token ids and generated ids back to text, cheaply and thread-safely.

Tokenizing runs in the callers' threads while the decode loop computes on every core, so each microsecond of it is
taken from a step. Two measured costs (600 sentences, the demo model, 2026-12-02):

- transformers' `tokenizer(text)` wraps the Rust tokenizer's ids in a `BatchEncoding` (attention mask, overflow
  bookkeeping): 33 µs a sentence idle against 15 µs for the Rust `Tokenizer.encode` alone, and ~370 µs a call
  under the engine's load (`_convert_encoding` was half of it). `decode` likewise: 5 µs against 2 µs.
- every first-hop segment was tokenized twice: once by the splitter asking whether it fits the model, once when it
  is queued. Ids are kept in a small LRU keyed by the exact prompt string, so the second is a lookup.

The Rust path is used only when it gives the same ids and text as transformers' own calls: checked once, at
construction, on probe strings in several scripts (a tokenizer with Python-side pre- or post-processing fails
the check and keeps the transformers path). NLLB/M2M tokenizers, whose source-language prefix is switched per row
through `src_lang`, always take the transformers path under a lock, and are keyed by source language too.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from cachetools import LRUCache

log = logging.getLogger(__name__)

#: Strings the Rust path must tokenize and detokenize exactly as transformers does before it is trusted: Latin
#: with diacritics and punctuation, CJK, Arabic, digits and symbols, odd spacing, an emoji (byte fallback).
_PROBES = (
    "Open the file.", "  Café, naïve résumé — 3.5 GB / 100 % done!  ", "文件未找到。请重试", "مرحبا بالعالم",
    "Ctrl+C; x<y & \"quoted\" 'single' (y/N)?", "tab\there\nnew line", "🙂 ok", "ÄÖÜß ½ ﬁ",
)

#: Prompts whose ids are kept (segments are short: a few MB at most).
_KEPT = 4096


class PromptTokens:
    """Prompt text → ids (`ids`) and generated ids → text (`text`) for one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        #: NLLB/M2M-style tokenizers take the source language as state (`src_lang`): switched per row, under
        #: `lock`, through transformers' own call.
        self.per_source = hasattr(tokenizer, "src_lang")
        #: Held while the tokenizer's state is switched or used across calls (`src_lang`, `pad`).
        self.lock = threading.Lock()
        self._kept: LRUCache = LRUCache(maxsize=_KEPT)
        self._kept_lock = threading.Lock()
        backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        same_ids, same_text = self._agrees(backend) if backend is not None else (False, False)
        self._encoder = backend if same_ids and not self.per_source else None
        self._decoder = backend if same_text else None
        if backend is not None and not ((same_ids or self.per_source) and same_text):
            log.info("tokenizer: the Rust tokenizer disagrees with %s on a probe; tokenizing through transformers",
                     type(tokenizer).__name__)

    def _agrees(self, backend: Any) -> tuple[bool, bool]:
        """Whether the Rust tokenizer gives transformers' ids, and transformers' text back, on every probe."""
        tok = self.tokenizer
        same_ids = same_text = True
        try:
            for probe in _PROBES:
                for special in (True, False):
                    ids = tok(probe, add_special_tokens=special)["input_ids"]
                    same_ids = same_ids and backend.encode(probe, add_special_tokens=special).ids == ids
                    same_text = same_text and (backend.decode(ids, skip_special_tokens=True)
                                               == tok.decode(ids, skip_special_tokens=True))
        except Exception:  # noqa: BLE001 - any failure means: keep transformers' path
            return False, False
        return same_ids, same_text

    def ids(self, prompt: str, *, special: bool = True, source: str | None = None) -> tuple[int, ...]:
        """The ids of `prompt` (`special`: with the tokenizer's special tokens). `source` is the row's source
        language as the tokenizer spells it, for per-source tokenizers; ignored otherwise."""
        # A per-source tokenizer without a known source keeps whatever `src_lang` it has: not kept, as its ids
        # depend on the rows before.
        key = None if self.per_source and source is None else (prompt, special, source)
        if key is not None:
            with self._kept_lock:
                found = self._kept.get(key)
            if found is not None:
                return found
        if self._encoder is not None:
            ids = tuple(self._encoder.encode(prompt, add_special_tokens=special).ids)
        else:
            with self.lock:
                if self.per_source and source is not None:
                    self.tokenizer.src_lang = source
                ids = tuple(self.tokenizer(prompt, add_special_tokens=special)["input_ids"])
        if key is not None:
            with self._kept_lock:
                self._kept[key] = ids
        return ids

    def text(self, ids: Any) -> str:
        """Generated ids as text, special tokens left out, stripped."""
        if self._decoder is not None:
            return self._decoder.decode(list(ids), skip_special_tokens=True).strip()
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()
