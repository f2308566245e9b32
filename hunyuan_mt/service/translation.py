"""The service facade that the web UI, REST API, CLI and Ray Serve replicas call.

One `TranslationService` per process (`get_service()`): it loads the backbone (once, invariant 1), scans the
registry, starts the adapter cache, the batching engine and the memory policy, and plans routes. A request is
validated (typed errors), detected when the source is "auto", routed, split into sentences, masked
(do-not-translate spans), translated as engine rows (a pivot runs as two batched hops) and reassembled with its
original layout.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import re
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import asdict
from typing import Any, Callable, Iterator, Sequence

from ..adapters.attach import attach_adapters
from ..adapters.request import Pair
from .. import kernels
from . import prebuild
from ..runtime.backbone import Backbone, kernels_needed_at_load, load_backbone
from ..config import Config, load_config
from ..text.detect import Detection, detect as detect_language, ready as detector_ready, start as start_detector
from ..scheduler.engine import BatchEngine, Row, future_scores, future_tokens
from ..errors import InputTooLarge, InvalidInput, UnsupportedLanguage
from ..text import inline, prompts, punctuation, review
from ..text.glossary import Glossary, has_terms
from ..text.prompts import CONTROL_CHARS, SURROGATES
from ..adapters.watch import VersionWatch
from ..store import Correction, Provenance, Store
from ..store.tm import open_memory
from .warmup import WarmupReport, warm_service
from ..text.languages import LANGUAGES, normalize_code, served_codes
from ..runtime.pressure import MemoryMonitor, MemoryPolicy
from ..scheduler.router import RoutePlan, Router
from ..documents.base import ORIGIN_MEMORY, ORIGIN_MEMORY_NEAR, ORIGIN_MODEL, ORIGIN_MODEL_SURE, check_mark_runs
from ..text.masking import protect_pair
from ..text.segment import split_text
from ..text.streaming import TextStream
from ..scheduler.ticket import Ticket
from ..text import masking as _masking
from .results import (LanguageInfo, TextJob, TranslationResult, alternatives_of, fuzzy_matches,
                      local_spans)


log = logging.getLogger(__name__)

#: Segments of at most this many tokens are never cut to fit the generation budget (see `_job`).
MIN_CUT_TOKENS = 64

AUTO = "auto"
# C0 controls except tab/newline/carriage return, DEL and C1 controls: never meaningful in text to translate.
_LETTER = re.compile(r"[^\W\d_]")
#: Confidence above which auto-detection trusts a language no adapter serves over the nearest one that has one.
_CLEARLY = 0.9
#: Segments per engine round in `translate_segments`, so documents report progress as they go.
_DOC_CHUNK = 64
#: A stream's other sentences wait at most this long for its first one's first token (streaming: `_first_alone`).
_STREAM_HEAD_START_S = 0.25


class TranslationService:
    """See the module docstring. Thread-safe; every public method may be called from many threads."""

    def __init__(self, cfg: Config, backbone: Backbone | None = None) -> None:
        """`backbone` is for tests and benchmarks that need a private one; by default the process-wide backbone."""
        self.cfg = cfg
        t0 = time.perf_counter()
        #: The kernels and compiled packages being built beside the serving process (prebuild.py), or None.
        self.build: prebuild.BackgroundBuild | None = None
        beside = cfg.model.compile == "auto" and cfg.model.warmup
        if beside and backbone is None and not kernels.built() and not kernels_needed_at_load(cfg.model):
            # Built by the background build while the eager step serves; activated by the engine's upgrade.
            kernels.defer()
        self.backbone = backbone if backbone is not None else load_backbone(cfg.model)
        self.store = Store.open(cfg.store.url, cfg.store.dir)
        self.registry, self.cache = attach_adapters(cfg, self.backbone, self.store, start=False)
        self.versions = VersionWatch(self.store.adapters.current, self.registry, self.rescan)
        self.tm = open_memory(cfg, self.store)
        self.cache.start()
        # After the pinned adapters are in: the slot layers they wrap are part of the compiled graph.
        if cfg.model.compile == "on":
            self.backbone.compile_step()
        elif beside and kernels.state() != "deferred":
            # Built on an earlier start: loaded in about a second. Else the background build makes them.
            self.backbone.compile_step(build=False)
        self.engine = BatchEngine(self.backbone, self.cache, cfg.engine, cfg.generation, cfg.limits)
        if beside:
            self._build_beside()
        self.router = Router(self.registry, cfg.routing)
        self.monitor = MemoryMonitor(self.backbone.device)
        self.memory = MemoryPolicy(cfg.memory, self.monitor, self.cache, self.engine)
        self.memory.start()
        self.versions.start()
        self.started_at = time.time()
        self.startup_s = time.perf_counter() - t0
        self._latency: deque[float] = deque(maxlen=1000)
        #: (unix time, latency ms, cache hit rate or None, "text" | "document") per request, for the status plots.
        self._history: deque[tuple[float, float, float | None, str]] = deque(maxlen=500)
        self._counts = {"requests": 0, "errors": 0, "segments": 0, "characters": 0}
        self._lock = threading.Lock()
        #: What the warm-up ran (warmup.py), once it has.
        self.warmup: WarmupReport | None = None
        self._warm = threading.Event()
        self._closing = threading.Event()
        if cfg.model.warmup:
            # lingua's models take seconds to load and hold the GIL meanwhile: they load in a helper process, so
            # this process keeps serving while they and the first request of every kind run in the background; a
            # request before then may wait for them (see `ready`).
            if cfg.routing.detect:
                start_detector()
            threading.Thread(target=self._warm_up, name="hmt-warmup", daemon=True).start()
        else:
            self._warm.set()

    def _build_beside(self) -> None:
        """Start the background build of what the fast step still lacks (prebuild.py), if anything."""
        bb = self.backbone
        deferred = kernels.state() == "deferred"
        step = bb.compiled[0] if bb.compiled else None
        missing = bb.compile_note() is None and (step is None or not step.active)
        if not deferred and not missing:
            return
        packages = prebuild.PACKAGES.get(bb.arch, ()) if missing else ()
        self.build = prebuild.BackgroundBuild(prebuild.config_for_worker(self.cfg, bb), deferred, packages,
                                              self._built)
        self.build.start()

    def _built(self, what: str) -> None:
        """The background build has put `what` ("kernels", "packages") on disk: switch to it where no row is
        decoding (the engine's upgrade)."""
        if what == "kernels":
            self.engine.request_upgrade("the CPU kernels", kernels.activate)
        else:
            self.engine.request_upgrade("the compiled decode step", lambda: self.backbone.compile_step(build=False))

    def wait_full_speed(self, timeout: float | None = None) -> bool:
        """Block until the background build has finished and the engine has switched to what it built (benchmarks
        that measure the fast step); True when there is nothing left to switch to."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            build = self.build
            if (build is None or build.done) and not self.engine.upgrade_pending:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def full_speed(self) -> dict[str, Any]:
        """What /status and the page say about the fast step: built and in use, or still being built."""
        bb = self.backbone
        step = bb.compiled[0] if bb.compiled else None
        out: dict[str, Any] = {"kernels": kernels.state(), "compiled_step": bool(step is not None and step.active),
                               "upgrades": self.engine.upgrades()}
        note = bb.compile_note()
        if note is not None:
            out["compiled_step_note"] = note
        if self.build is not None:
            out["build"] = self.build.status()
            out["line"] = prebuild.describe(out["build"])
        out["reached"] = (self.build is None or self.build.done) and not self.engine.upgrade_pending
        return out

    def _warm_up(self) -> None:
        try:
            self.warmup = warm_service(self)
            log.info("warm-up: %s", self.warmup.line())
            # What is alive now (the model, tokenizers, torch's and the libraries' modules: ~400k objects for the
            # demo) lives as long as the process. Frozen, Python's cycle collector stops walking it: an oldest-
            # generation collection over it took 283 ms, a pause that lands on whichever request is running.
            gc.collect()
            gc.freeze()
        except Exception as exc:  # noqa: BLE001 - a warm-up bug must not keep the server from ever becoming ready
            if self._closing.is_set():
                # Stopped while it ran (Ctrl+C during start-up): its requests fail because the engine is gone.
                log.info("warm-up stopped: the service is closing (%s)", exc)
            else:
                log.exception("warm-up failed; serving cold")
        finally:
            self._warm.set()

    @property
    def ready(self) -> bool:
        """Whether every request would now be served at steady speed: the language detector is loaded and the
        first request of every kind has run (warmup.py). Always True when warm-up is off (the CLI, tests):
        nothing is being loaded ahead then."""
        return self._warm.is_set() and (not self.cfg.model.warmup or not self.cfg.routing.detect or detector_ready())

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until `ready` (Ray replicas do, so that Serve routes to a replica only once it is warm)."""
        return self._warm.wait(timeout) and self.ready

    def close(self) -> None:
        """Stop the engine and the memory monitor (tests, and the server on its way out)."""
        self._closing.set()
        if self.build is not None:
            self.build.close()
        self.memory.stop()
        self.versions.stop()
        self.engine.close()

    # ------------------------------------------------------------------ validation

    def clean_text(self, text: Any) -> str:
        """The text as it will be translated, or a typed error saying why it cannot be."""
        if not isinstance(text, str):
            raise InvalidInput(f"Text must be a string, got {type(text).__name__}.")
        limit = self.cfg.limits.max_chars
        if len(text) > limit:
            raise InputTooLarge(f"Text is {len(text)} characters, over the limit of {limit} (limits.max_chars).")
        # Lone surrogates cannot be encoded (and would break the tokenizer); mark them as replacement characters.
        text = SURROGATES.sub("\ufffd", text)
        text = CONTROL_CHARS.sub("", text)
        check_mark_runs(text, "Text")
        if not text.strip():
            raise InvalidInput("Text is empty." if not text else "Text is empty (only whitespace or control "
                                                               "characters).")
        return text

    def clean_context(self, context: Any) -> str | None:
        return prompts.clean_context(context, self.cfg.limits.max_chars)

    def _code(self, code: Any, role: str) -> str:
        if not isinstance(code, str) or not code.strip():
            raise UnsupportedLanguage(f"Missing {role} language code.",
                                      short=f"Invalid request: missing {role} parameter")
        try:
            return normalize_code(code)
        except UnsupportedLanguage:
            return normalize_code(code, served_codes(self.languages()))  # refused again, naming what is served

    def _check_batch(self, texts: Sequence[Any]) -> None:
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise InvalidInput("Batch must be a list of texts.")
        limit = self.cfg.limits.max_batch_items
        if len(texts) > limit:
            raise InputTooLarge(f"Batch has {len(texts)} texts, over the limit of {limit} (limits.max_batch_items).")
        if not texts:
            raise InvalidInput("Batch is empty.")

    # ------------------------------------------------------------------ detection and routing

    def detect_among(self) -> set[str] | None:
        """Languages auto-detection chooses among: those of registered adapters, or all (routing.detect_among)."""
        if self.cfg.routing.detect_among == "all" or self.cfg.routing.allow_base:
            return None
        codes = {c for p in self.registry.usable_pairs() for c in (p.src, p.tgt)}
        return codes or None

    def detect(self, text: str, top: int = 3) -> list[Detection]:
        """Best guesses among the languages the adapters serve; a text in none of them ("Привет мир" on the
        demo) gets the guesses among every language, so the caller learns what it is rather than nothing. []
        only for a text with no letters."""
        text = self.clean_text(text)
        self._check_detects()
        among = self.detect_among()
        found = detect_language(text, among=among, top=top)
        if not found and among is not None:
            found = detect_language(text, among=None, top=top)
        return found

    def _check_detects(self) -> None:
        if not self.cfg.routing.detect:
            # serve-ray's ingress never asks such a replica to detect (the long tail does): reaching here is a
            # caller that bypassed it, and it learns what to do instead of starting the detector after all.
            raise InvalidInput("Language detection is off on this server (routing.detect: false); give the source "
                               "language.")

    def resolve_source(self, text: str, src: Any) -> tuple[str, Detection | None]:
        """(source code, detection or None) for a cleaned text and a source that may be "auto"."""
        if isinstance(src, str) and src.strip().lower() == AUTO:
            self._check_detects()
            among = self.detect_among()
            found = detect_language(text, among=among, top=1)
            if among is not None:
                # Choosing among the adapters' languages sharpens short texts, but a text that is clearly in
                # another language must say so (the router then explains that no adapter serves it) rather
                # than be translated as the nearest language that has one.
                wide = detect_language(text, among=None, top=1)
                if wide and wide[0].code not in among and (not found or wide[0].confidence >= _CLEARLY):
                    found = wide
            if not found:
                raise InvalidInput("Could not detect the language of the text; give the source language.")
            return found[0].code, found[0]
        return self._code(src, "source"), None

    def plan(self, src: str, tgt: str) -> RoutePlan:
        return self.router.plan(src, tgt)

    # ------------------------------------------------------------------ translation

    def translate(self, text: str, src: str, tgt: str, glossary: Glossary | None = None,
                  context: str | None = None) -> TranslationResult:
        return self.translate_batch([text], src, tgt, glossary=glossary, context=context, _single=True)[0]

    def translate_batch(self, texts: Sequence[str], src: str, tgt: str, *, alternatives: int = 0,
                        glossary: Glossary | None = None, ticket: Ticket | None = None, context: str | None = None,
                        token_logprobs: bool = False, _single: bool = False, _warmup: bool = False,
                        _listen: Callable[..., None] | None = None) -> list[TranslationResult]:
        """Translate several texts at once; all their sentences share engine batches.

        `alternatives` > 0 also asks for up to that many other translations of each text: the last hop's
        sentences are searched again with beam search, and the k-th alternative puts each sentence's k-th best
        output that differs from the main translation in place. The main translation is the one a request without
        alternatives gets. `glossary` terms found in a text come out as the glossary's target terms. `ticket`
        cancels the request's rows (the edges cancel it when the client goes away). `context` is text that shapes
        every segment's translation and is not translated (a decoder-only backbone reads it in its prompt;
        encoder-decoder models have no prompt and ignore it). `token_logprobs` fills each result's
        `segment_tokens` (the OpenAI endpoint's per-token `logprobs`; a decode per token, so only when asked)."""
        t0 = time.perf_counter()
        try:
            self._check_alternatives(alternatives)
            if not _single:
                self._check_batch(texts)
            cleaned = [self.clean_text(t) for t in texts]
            context = self.clean_context(context)
            target = self._code(tgt, "target")
            t_detect = time.perf_counter()
            sources = [self.resolve_source(t, src) for t in cleaned]
            detect_ms = (time.perf_counter() - t_detect) * 1000
            plans = [self.router.plan(s, target) for s, _ in sources]
            # With alternatives, segments the memory knows still go to the model: its n best are the alternatives.
            jobs = [self._job(text, plan, glossary, model_too=bool(alternatives), context=context,
                              scored=not _warmup) for text, plan in zip(cleaned, plans)]
            if _listen is not None:
                for job in jobs:
                    _listen(job, -1, [], False)
            t_run = time.perf_counter()
            jobs = self._run_enforcing(jobs, cleaned, glossary, bool(alternatives),
                                       alternatives + 1 if alternatives else 1, ticket, _listen)
            run_ms = (time.perf_counter() - t_run) * 1000
        except Exception:
            with self._lock:
                self._counts["errors"] += 1
            raise
        total_ms = (time.perf_counter() - t0) * 1000
        results: list[TranslationResult] = []
        for job, (source, detection) in zip(jobs, sources):
            timings = {"total": round(total_ms, 2), "translate": round(run_ms, 2)}
            if detection is not None:
                timings["detect"] = round(detect_ms, 2)
            results.append(TranslationResult(
                text=job.render(job.current), source=source, target=target, detected=detection,
                route=job.plan.route, route_kind=job.plan.kind, adapters=job.plan.adapters, timings_ms=timings,
                alternatives=alternatives_of(job, alternatives), memory_segments=len(job.memory),
                memory_near_segments=len(job.near),
                glossary_terms=job.terms, memory_matches=fuzzy_matches(job),
                segments=len(job.current), segment_confidences=job.confidences(), segment_texts=list(job.current),
                segment_tokens=self._token_pieces(job) if token_logprobs else []))
        if not _warmup:  # the warm-up's requests are nobody's: they stay out of the counts and latencies
            self._record(total_ms, sum(len(j.todo) for j in jobs), sum(len(t) for t in cleaned), len(texts), "text")
        return results

    def translate_stream(self, text: str, src: str, tgt: str, *, glossary: Glossary | None = None,
                         ticket: Ticket | None = None, context: str | None = None,
                         _warmup: bool = False) -> Iterator[str | TranslationResult]:
        """Translate one text, yielding it as it grows (str: the text so far, see streaming.py), then the
        TranslationResult. Closing the generator early (a client that went away) cancels the rows at the
        engine's next step."""
        ticket = ticket or Ticket()
        stream = TextStream(self.backbone.decode)
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["result"] = self.translate_batch([text], src, tgt, glossary=glossary, ticket=ticket,
                                                     context=context, _single=True, _listen=stream.listen,
                                                     _warmup=_warmup)[0]
            except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer's thread
                box["error"] = exc
            finally:
                stream.close()

        worker = threading.Thread(target=work, name="hmt-stream", daemon=True)
        worker.start()
        try:
            yield from stream.snapshots()
            worker.join()
            if "error" in box:
                raise box["error"]
            yield box["result"]
        finally:
            if worker.is_alive():
                ticket.cancel("the stream was closed before the end")

    def translate_segments(self, segments: Sequence[str], src: str, tgt: str,
                           progress: Callable[[int, int], None] | None = None,
                           glossary: Glossary | None = None, ticket: Ticket | None = None,
                           context: str | None = None, origins: dict[str, str] | None = None,
                           finished: Callable[[list[int], list[str]], None] | None = None,
                           chunk: int = _DOC_CHUNK) -> list[str]:
        """Documents: translate each segment (already split by the document reader), keeping its layout.
        `origins`, when given, gets each segment's origin (documents.base.ORIGIN_*): the memory's, exact or near,
        when every sentence of it came from the memory, else the model's. `finished(positions, translations)` is
        told each round of `chunk` segments as it ends (a job writes them down, to skip them after a restart).

        Whitespace-only segments come back unchanged. `progress(done, total)` is called as chunks finish. The
        rows are background rows (they yield to interactive requests); `ticket` can cancel them. `context` shapes
        every segment's translation (what the document is about), as for `translate_batch`.
        """
        ticket = ticket or Ticket(background=True)
        target = self._code(tgt, "target")
        context = self.clean_context(context)
        texts = [CONTROL_CHARS.sub("", SURROGATES.sub("\ufffd", s)) if isinstance(s, str) else "" for s in segments]
        if isinstance(src, str) and src.strip().lower() == AUTO:
            sample = "\n".join(t for t in texts if t.strip())[:2000]
            source, _ = self.resolve_source(sample, AUTO) if sample.strip() else (target, None)
        else:
            source = self._code(src, "source")
        plan = self.router.plan(source, target)
        out = list(texts)
        todo = [i for i, t in enumerate(texts) if t.strip()]
        total = len(todo)
        if progress:
            progress(0, total)
        t0 = time.perf_counter()
        counted = _RowCounter(progress, total) if progress else None
        for start in range(0, total, chunk):
            part = todo[start:start + chunk]
            # Documents report no memory suggestions: nobody would read them. They are scored when their origins
            # are kept: the formats with a place for it say how sure the model was.
            jobs = [self._job(texts[i], plan, glossary, suggest=False, context=context, scored=origins is not None)
                    for i in part]
            if counted is not None:
                counted.limit = start + len(part)
            jobs = self._run_enforcing(jobs, [texts[i] for i in part], glossary, ticket=ticket, listen=counted)
            for i, job in zip(part, jobs):
                out[i] = job.render(job.current)
                if origins is not None and (job.todo or job.memory):
                    origins[texts[i]] = self._model_origin(job) if job.todo else \
                        ORIGIN_MEMORY_NEAR if job.near else ORIGIN_MEMORY
            if finished is not None:
                finished(part, [out[i] for i in part])
            if progress:
                progress(min(start + chunk, total), total)
        self._record((time.perf_counter() - t0) * 1000, total, sum(len(texts[i]) for i in todo), 1, "document")
        return out

    def _job(self, text: str, plan: RoutePlan, glossary: Glossary | None = None, model_too: bool = False,
             visible: bool | None = None, suggest: bool = True, context: str | None = None,
             scored: bool = False) -> TextJob:
        if plan.kind == "identity":
            return TextJob(plan, None, [], [text], [])
        # "prompt": the terms into a decoder-only model's prompt, where the route has one hop (a pivot's first hop
        # would need the terms in the pivot language); elsewhere "visible".
        in_prompt = (visible is None and self.cfg.glossary.mode == "prompt" and len(plan.hops) == 1
                     and self.backbone.arch == "decoder-only")
        if visible is None:
            visible = self.cfg.glossary.mode in ("visible", "prompt")
        # Mask before splitting: a URL's "?" or a version's "." must not end a sentence.
        masked = _masking.protect(text)
        required: list[str] = []
        if masked is not None and glossary is not None:
            required = glossary.targets(masked)
            # Each term found becomes a span that restores as its target term, or (visible) that term itself; in
            # the prompt, the source keeps its words.
            if not in_prompt:
                masked = glossary.apply(masked, visible=visible and bool(required))
        first = plan.hops[0]
        # A segment is cut to what the model can take in and also give back whole: its translation has at most
        # limits.max_new_tokens tokens, and translations run up to a quarter longer than their source. A sentence
        # of up to MIN_CUT_TOKENS is never cut, whatever a small max_new_tokens says.
        budget = max(MIN_CUT_TOKENS, int(self.cfg.limits.max_new_tokens * 0.8))

        @functools.lru_cache(maxsize=None)  # the splitter and the filter below ask about the same segments
        def fits(segment: str) -> bool:
            return self.backbone.fits(segment, first.src, first.tgt, budget)

        layout = split_text(masked.text if masked else text, plan.src, sentences=self.cfg.engine.split_sentences,
                            fits=fits)
        segments = layout.segments
        protected = [local_spans(s, masked.spans) if masked else None for s in segments]
        # Every segment carries its own renumbered sentinels, translated or not: restore() reads them against the
        # segment's local spans (the text-wide numbering would put back the wrong span, or none past ⟦999⟧).
        current = [p.text if p is not None else seg for seg, p in zip(segments, protected)]
        # A segment that is nothing but protected spans, numbers or symbols has nothing to translate.
        # So is one the splitter could not cut to the model's size: a run with no boundary (a checksum, a key) comes
        # back unchanged rather than failing the whole text.
        todo = [i for i, (seg, p) in enumerate(zip(segments, protected))
                if (p.has_words if p is not None else _LETTER.search(seg))
                and fits(seg)]
        memory: dict[int, str] = {}
        near_exact: set[int] = set()
        matches: dict[int, Any] = {}
        for i in list(todo):
            found = self.tm.match(plan.src, plan.tgt, protected[i]) if protected[i] is not None else None
            if found is not None:  # the memory's translation, with this segment's own spans put back
                if found.near is not None:  # near-exact: applied, and flagged as such
                    near_exact.add(i)
                memory[i] = _masking.restore(found.target, protected[i])
                if not model_too:
                    current[i] = memory[i]
                    todo.remove(i)
            elif suggest and protected[i] is not None:
                near = self.tm.suggest(plan.src, plan.tgt, protected[i], self.cfg.tm.fuzzy_threshold)
                if near is not None:
                    matches[i] = near
        prompt_terms = {}
        if in_prompt and required:
            prompt_terms = {i: found for i in todo if protected[i] is not None
                            and (found := glossary.pairs(protected[i]))}  # type: ignore[union-attr]
        return TextJob(plan, layout, protected, current, todo, memory=memory, near=near_exact, required=required,
                    visible=visible and bool(required), matches=matches, context=context, prompt_terms=prompt_terms,
                    scored=scored)

    def _token_pieces(self, job: TextJob) -> list[list[tuple[str, float]] | None]:
        """`TranslationResult.segment_tokens` of a job: each token's text is what decoding it adds to the tokens
        before it, with complete placeholders put back; a segment whose pieces do not join into its translation
        exactly (a sentinel the model dropped and restore appended, a repaired spacing) gets None."""
        out: list[list[tuple[str, float]] | None] = []
        for i, text in enumerate(job.current):
            found = job.tokens.get(i)
            if found is None or i in job.memory:
                out.append(None)
                continue
            ids, logprobs = found
            spans = job.protected[i].spans if job.protected[i] is not None else []
            pieces: list[tuple[str, float]] = []
            before = ""
            for n, logprob in enumerate(logprobs):
                decoded = self.backbone.decode(ids[:n + 1])
                piece = decoded[len(before):] if decoded.startswith(before) else None
                if piece is None:
                    break
                pieces.append((_masking.SENTINEL.sub(lambda m: spans[int(m.group(1))] if int(m.group(1)) < len(spans)
                                                     else m.group(0), piece), logprob))
                before = decoded
            joined = "".join(p for p, _ in pieces)
            out.append(pieces if len(pieces) == len(logprobs) and joined.strip() == text.strip() else None)
        return out

    def _model_origin(self, job: TextJob) -> str:
        """A segment the model translated: ORIGIN_MODEL_SURE when every sentence of it scored at least
        `quality.review_below` and none came back as its source, else ORIGIN_MODEL (to review)."""
        review_below = self.cfg.quality.review_below
        confidences = job.confidences()
        scores = [confidences[i] for i in job.todo]
        # 1.0 marks every one, even a segment whose confidence rounds to 1.0.
        sure = review_below < 1.0 and bool(scores) and all(c is not None and c >= review_below for c in scores) \
            and not any(i in job.unchanged for i in job.todo)
        return ORIGIN_MODEL_SURE if sure else ORIGIN_MODEL

    def _check_alternatives(self, alternatives: Any) -> None:
        limit = self.cfg.limits.max_alternatives
        if isinstance(alternatives, bool) or not isinstance(alternatives, int) or alternatives < 0:
            raise InvalidInput(f"Invalid request: alternatives must be a whole number from 0 to {limit}.")
        if alternatives > limit:
            raise InvalidInput(f"Invalid request: alternatives ({alternatives}) exceeds the limit of {limit} "
                               "(limits.max_alternatives).")

    def _run_enforcing(self, jobs: list[TextJob], texts: list[str], glossary: Glossary | None, model_too: bool = False,
                       n_best: int = 1, ticket: Ticket | None = None,
                       listen: Callable[..., None] | None = None) -> list[TextJob]:
        """Run `jobs` (memory answers merged in); a text whose glossary terms went in visible and did not all come
        out is translated again with sentinels, which cannot lose a term. Returns the jobs that answer."""
        self._run_jobs(jobs, n_best, ticket, listen)
        for job in jobs:
            job.current = [job.memory.get(i, text) for i, text in enumerate(job.current)]
        missed = [n for n, job in enumerate(jobs) if job.visible and not has_terms(job.render(job.current),
                                                                                   job.required)]
        if missed:
            # The same text and memory: its suggestions are the first run's, not looked up again.
            again = [self._job(texts[n], jobs[n].plan, glossary, model_too, visible=False, suggest=False,
                               context=jobs[n].context, scored=jobs[n].scored) for n in missed]
            self._run_jobs(again, n_best, ticket, listen)
            for n, job in zip(missed, again):
                job.current = [job.memory.get(i, text) for i, text in enumerate(job.current)]
                job.matches = jobs[n].matches
                jobs[n] = job
        return jobs

    def _run_jobs(self, jobs: list[TextJob], n_best: int = 1, ticket: Ticket | None = None,
                  listen: Callable[..., None] | None = None) -> None:
        """Run every hop of every job; hop k of all jobs goes to the engine together (one round per hop).
        With `n_best` > 1, each segment's last hop is also searched for its n best outputs (`TextJob.nbest`).
        `listen(job, segment, ids, done)` hears the last hop's tokens as they are decoded (streaming.py)."""
        hops = max((len(j.plan.hops) for j in jobs), default=0)
        for k in range(hops):
            rows: list[Row] = []
            where: list[tuple[TextJob, int]] = []
            for job in jobs:
                if k >= len(job.plan.hops):
                    continue
                hop = job.plan.hops[k]
                for i in job.todo:
                    prot = job.protected[i]
                    rows.append(Row(job.current[i], hop.src, hop.tgt, hop.adapter, context=job.context,
                                    terms=job.prompt_terms.get(i, ()), scored=job.scored,
                                    markup=inline.markup_indices(prot.spans) if prot is not None else ()))
                    where.append((job, i))
            if not rows:
                continue
            last = [n for n, (job, _) in enumerate(where) if n_best > 1 and k == len(job.plan.hops) - 1]
            # The n-best rows go in the same round as the plain ones: the engine runs both together.
            extra = [dataclasses.replace(rows[n], n_best=n_best) for n in last]
            if listen is not None and not getattr(listen, "final_only", False) and len(rows) > 1:
                futures = self._first_alone(rows, extra, where, k, ticket, listen)
            else:
                futures = self.engine.submit(rows + extra, self._round_ticket(ticket, listen, where, k))
            outs = [f.result() for f in futures]
            for (job, i), text, score, tokens, row in zip(where, outs, future_scores(futures), future_tokens(futures),
                                                          rows):
                job.current[i] = self.backbone.read_output(text, row.text, row.markup)
                if tokens is not None and k == len(job.plan.hops) - 1:
                    job.tokens[i] = tokens
                if job.scored:
                    before = job.logprob.get(i, 0.0)
                    job.logprob[i] = None if before is None or score is None else before + score
            for n, hypotheses in zip(last, outs[len(rows):]):
                job, i = where[n]
                job.nbest[i] = [self.backbone.read_output(h, rows[n].text, rows[n].markup) for h in hypotheses]
        for job in jobs:
            if job.layout is None:
                continue
            self._finish_outputs(job)
            for i, prot in enumerate(job.protected):
                if prot is not None:
                    job.current[i] = _masking.restore(job.current[i], prot)
                    if i in job.nbest:
                        job.nbest[i] = [_masking.restore(h, prot) for h in job.nbest[i]]

    @staticmethod
    def _finish_outputs(job: TextJob) -> None:
        """The model's outputs of a job before their spans go back in: the target's punctuation (a space before
        "。", an ASCII comma between Chinese words), and which came back as their source (`TextJob.unchanged`)."""
        target = job.plan.tgt
        for i in job.todo:
            job.current[i] = punctuation.tidy(job.current[i], target)
            if i in job.nbest:
                job.nbest[i] = [punctuation.tidy(h, target) for h in job.nbest[i]]
            prot = job.protected[i]
            source = prot.text if prot is not None else job.layout.segments[i]
            if review.unchanged(source, job.current[i]):
                job.unchanged.add(i)

    def _first_alone(self, rows: list[Row], extra: list[Row], where: list[tuple[TextJob, int]], k: int,
                     ticket: Ticket | None, listen: Callable[..., None]) -> list[Future]:
        """A stream's round: its first sentence enters alone, and the others once it has its first token, so the
        reader waits for one row's prefill before the first words, not for every row's (they join a step later)."""
        started = threading.Event()

        def first(job: TextJob, i: int, ids: list[int], done: bool) -> None:
            started.set()
            listen(job, i, ids, done)

        futures = self.engine.submit(rows[:1], self._round_ticket(ticket, first, where[:1], k))
        started.wait(_STREAM_HEAD_START_S)
        return futures + self.engine.submit(rows[1:] + extra, self._round_ticket(ticket, listen, where[1:], k))

    @staticmethod
    def _round_ticket(ticket: Ticket | None, listen: Callable[..., None] | None, where: list[tuple[TextJob, int]],
                      k: int) -> Ticket | None:
        """The ticket for hop `k`'s rows: the request's, with a listener for the rows on their last hop."""
        if listen is None:
            return ticket

        def heard(index: int, ids: list[int], done: bool) -> None:
            if index < len(where):  # the n-best rows that follow are not streamed
                job, i = where[index]
                if k == len(job.plan.hops) - 1:
                    listen(job, i, ids, done)

        return (ticket or Ticket()).with_listener(heard, final_only=getattr(listen, "final_only", False))

    # ------------------------------------------------------------------ admin

    @staticmethod
    def _pair(pair: Pair | str) -> Pair:
        return pair if isinstance(pair, Pair) else Pair.parse(pair)

    def import_memory(self, data: bytes, filename: str, pair: Pair | str) -> dict[str, Any]:
        """Add a TSV or TMX file's entries to the translation memory of `pair` (they win over the shipped ones)."""
        from ..store.tm import read_rows

        parsed = self._pair(pair)
        self.router.plan(parsed.src, parsed.tgt)  # UnreachablePair: a memory no request could ever use
        result = self.tm.add(parsed, read_rows(data, filename, parsed.src, parsed.tgt))
        return asdict(result)

    def correct(self, text: Any, source: Any, target: Any, translation: Any, context: Any = None,
                machine: Any = None, who: str | None = None) -> dict[str, Any]:
        """Record that `translation` is the right translation of `text` from `source` to `target`: kept as a
        correction (for adapter training), with who sent it and what route and adapters serve the pair now, and
        put in the memory, where it answers the same text at once (exact and fuzzy) on every process that shares
        the store. InvalidInput when the two sides do not carry the same placeholders: the memory could not put
        the query's own back."""
        text, translation = self.clean_text(text), self.clean_text(translation)
        src, tgt = self._code(source, "source"), self._code(target, "target")
        if src == tgt:
            raise InvalidInput("A correction needs two different languages.")
        plan = self.router.plan(src, tgt)  # UnreachablePair: a correction no request could ever use
        if protect_pair(text, translation) is None:
            raise InvalidInput("The correction does not keep the text's placeholders, numbers and links as they "
                               "are; put each one back in the translation.")
        machine = self.clean_text(machine) if isinstance(machine, str) and machine.strip() else None
        found = self.tm.correct(Correction(f"{src}2{tgt}", " ".join(text.split()), " ".join(translation.split()),
                                           machine, self.clean_context(context)),
                                Provenance("correction", who, plan.label, ",".join(plan.adapters) or None))
        return {"id": found, "source": src, "target": tgt, "route": plan.route}

    def promote(self, pair: Pair | str, version: str) -> dict[str, str]:
        """Serve `version` of the pair's adapter from now on: a hot swap (rows in flight finish on the version they
        started with; new rows get the new one). {"pair", "from", "to"}."""
        parsed = self._pair(pair)
        before = self.store.adapters.promote(parsed.key, version)
        self.rescan()
        log.info("adapter %s: %s promoted (was %s)", parsed.key, version, before)
        return {"pair": parsed.key, "from": before, "to": version}

    def rollback(self, pair: Pair | str) -> dict[str, str]:
        """Serve the version that served before the current one (the current one is marked rejected)."""
        parsed = self._pair(pair)
        left, back = self.store.adapters.rollback(parsed.key)
        self.rescan()
        log.info("adapter %s: rolled back from %s to %s", parsed.key, left, back)
        return {"pair": parsed.key, "from": left, "to": back}

    def adapter_versions(self) -> dict[str, dict[str, Any]]:
        """Per pair: the version serving, and each version the store knows with its state and shadow scores."""
        out: dict[str, dict[str, Any]] = {i.key: {"version": i.version, "versions": []}
                                          for i in self.registry.infos() if i.usable}
        for v in self.store.adapters.all():
            entry = out.setdefault(v.pair, {"version": None, "versions": []})
            entry["versions"].append({"version": v.version, "state": v.state, "parent": v.parent,
                                      "scores": (v.report or {}).get("scores"),
                                      "decision": (v.report or {}).get("decision")})
        return out

    def export_memory(self, pair: Pair | str) -> bytes:
        """The translation memory of `pair` as TMX (the user's entries over the shipped ones, with who made each
        and when; see TranslationMemory.export_entries)."""
        from ..store.tm import tmx_bytes

        parsed = self._pair(pair)
        return tmx_bytes(self.tm.export_entries(parsed), parsed.src, parsed.tgt)

    def rescan(self) -> None:
        self.cache.rescan()

    def pin(self, pair: Pair | str) -> bool:
        return self.cache.pin(self._pair(pair))

    def unpin(self, pair: Pair | str) -> bool:
        return self.cache.unpin(self._pair(pair))

    def unload(self, pair: Pair | str) -> bool:
        return self.cache.unload(self._pair(pair))

    # ------------------------------------------------------------------ reporting

    def languages(self) -> list[LanguageInfo]:
        return [LanguageInfo(lang.code, lang.english, lang.native, self.router.reachable_targets(lang.code))
                for lang in LANGUAGES.values()]

    def _record(self, ms: float, segments: int, chars: int, requests: int, kind: str) -> None:
        """Count a request; `kind` "text" or "document" (the status plot shows documents apart: one of a
        minute would flatten every text request's point)."""
        hit_rate = self.cache.hit_rate()
        with self._lock:
            self._latency.append(ms)
            self._history.append((round(time.time(), 3), round(ms, 2), None if hit_rate is None else
                                  round(hit_rate, 4), kind))
            self._counts["requests"] += requests
            self._counts["segments"] += segments
            self._counts["characters"] += chars

    def latency(self) -> dict[str, Any]:
        with self._lock:
            values = sorted(self._latency)
        return {"count": len(values), "p50_ms": _pct(values, 0.5), "p95_ms": _pct(values, 0.95)}

    def status(self) -> dict[str, Any]:
        """Everything the status tab and /metrics show; JSON-able."""
        stats = self.cache.stats()
        reading = self.monitor.read()
        with self._lock:
            history = [list(point) for point in self._history]
            counts = dict(self._counts)
        cache = asdict(stats)
        cache["hit_rate"] = stats.hit_rate
        cache["lru_order"] = self.cache.lru_order()
        cache["registered"] = [
            {"pair": i.key, "usable": i.usable, "reason": i.reason, "rank": i.rank, "size_bytes": i.size_bytes,
             "version": i.version}
            for i in self.registry.infos()
        ]
        return {
            "profile": self.cfg.name,
            "ready": self.ready,
            "uptime_s": round(time.time() - self.started_at, 1),
            "startup_s": round(self.startup_s, 3),
            "warmup": None if self.warmup is None else {**asdict(self.warmup),
                                                        "seconds": round(self.warmup.seconds, 2)},
            "backbone": self.backbone.info(),
            "full_speed": self.full_speed(),
            "memory": {
                "rss_bytes": reading.rss_bytes,
                "host_fraction": round(reading.host_fraction, 4),
                "source": reading.source,
                "used_fraction": round(reading.used_fraction, 4),
                "gpu": self.monitor.gpu(),
                **self.memory.status(),
            },
            "cache": cache,
            "engine": self.engine.status(),
            "routing": {"pivot": self.router.pivot, "allow_base": self.cfg.routing.allow_base},
            "tm": {"enabled": self.tm.enabled, "hits": self.tm.hits, "near_hits": self.tm.near_hits,
                   "entries": self.tm.stats()},
            "latency": self.latency(),
            "counts": counts,
            "adapter_versions": self.adapter_versions(),
            "history": history,
        }


class _RowCounter:
    """A document's progress per segment: rows that finish their last hop, counted on the engine's thread and
    reported at most every `interval` seconds (a chunk's end reports too). Never past the current chunk's end
    (`limit`): a glossary retry's rows finish twice."""

    #: Only finished rows are of interest (the engine then skips the per-step calls).
    final_only = True

    def __init__(self, progress: Callable[[int, int], None], total: int, interval: float = 0.2) -> None:
        self.progress, self.total, self.interval = progress, total, interval
        self.limit = 0
        self._finished = 0
        self._last = 0.0

    def __call__(self, job: Any, index: int, ids: list[int], done: bool) -> None:
        if not done:
            return
        self._finished += 1
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self.progress(min(self._finished, self.limit), self.total)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 2)


_service: TranslationService | None = None
_service_lock = threading.Lock()


def close_service() -> None:
    """Close the process-wide service if one was built (a one-shot command on its way out)."""
    if _service is not None:
        _service.close()


def get_service(cfg: Config | None = None) -> TranslationService:
    """The process-wide service, built on first call (from `cfg`, or the default configuration)."""
    global _service
    if _service is None:
        with _service_lock:
            if _service is None:
                _service = TranslationService(cfg if cfg is not None else load_config())
    return _service
