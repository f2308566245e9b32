"""The Gradio Blocks page: Text, Document and Status tabs over the shared translation service.

Handlers are plain sync functions (the Text tab's a generator: the translation grows in its box as the engine
decodes it); Gradio runs them in its worker threads under the queue's concurrency limit, and they call the same
thread-safe service as the REST API. A document is a job in the same `DocumentJobs` as REST's /v1/documents: the
page remembers its id in the browser (localStorage), so a reload or a second tab follows it again. Domain errors
become `gr.Error` with the error's own message; anything unexpected is logged and shown as a short generic
message, never a traceback.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import re
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import gradio as gr
import pandas as pd

from ..text import prompts
from ..config import Config
from ..documents import LISTED_EXTENSIONS, SUPPORTED_EXTENSIONS, distinct_segments
from ..documents.parsers import DocumentParsers
from ..errors import TranslationError
from ..text.glossary import GlossaryStore
from ..service.jobs import ENDED, DocumentJobs, JobNotFound, JobView
from ..text.languages import LANGUAGES, normalize_code
from ..scheduler.ticket import Ticket
from .auth import AccessPolicy, who
from .doctranslate import check_document_route, document_runner, job_spec, jobs_store
from .downloads import OwnedPaths, safe_filename
from .status_view import PLOT_WINDOW_S, adapters_frame, cache_markdown, count_of, overview_markdown, plots
from .metrics import WebMetrics

log = logging.getLogger(__name__)

AUTO = "auto"
DOC_TYPES = list(LISTED_EXTENSIONS)
#: What the admin's Import memory field takes.
MEMORY_TYPES = [".tsv", ".tmx", ".txt"]
#: Every file the page's upload route stores (web/uploads.py): what the Document tab reads (its listed types and
#: their other spellings, .htm, .yml) and the memory files. Anything else is refused before it is written.
UPLOAD_TYPES = tuple(sorted(set(SUPPORTED_EXTENSIONS) | set(MEMORY_TYPES)))
#: Rendered documents older than this are removed from the UI's output folder (Gradio keeps its own copy).
_OUTPUT_TTL_S = 600.0
#: How often a page following a document job refreshes its progress bar when nothing else changed (the seconds
#: remaining go down), and how soon it notices that its page has gone.
_FOLLOW_POLL_S = 1.0
#: Pages following a document job at once (each holds a worker thread while it waits on its job); more wait in
#: Gradio's queue, which shows them their place.
_FOLLOWERS = 16
#: How often Gradio's queue looks for new page events while it has none (seconds). Its own default is 1 ms (50 ms
#: on Windows): a thousand wake-ups a second of the web server's event-loop thread, each needing the interpreter
#: lock that the engine's compiled steps hold, and each taking a core from one of a step's OpenMP threads for a
#: moment. At 20 ms a page event waits at most that much longer to start (a click or the status timer), and a short
#: REST request ran faster: 10.16 → 8.94 and 10.16 → 9.59 ms in-process, 12.31 → 11.10 ms over HTTP, alternated in
#: one process (BENCHMARKS.md, 2026-12-05).
PAGE_QUEUE_POLL_S = 0.02
#: The info line while a text is still being translated (the route, latency and glossary come with the end).
_TRANSLATING = "*Translating…*"

#: Ctrl+Enter (Cmd+Enter on macOS) in the source box clicks Translate; Gradio's textbox has no such binding.
UI_HEAD = """
<script>
document.addEventListener("keydown", (event) => {
  if ((event.ctrlKey || event.metaKey) && event.key === "Enter") {
    const box = document.getElementById("hmt-source");
    if (box && box.contains(document.activeElement)) {
      event.preventDefault();
      document.getElementById("hmt-translate")?.click();
    }
  }
});
</script>
"""
#: The page's fonts: the reader's own system fonts. Gradio's Soft theme asks Google Fonts for Montserrat; offline
#: (as here) Chromium drew a capital E as "Ɛ" in the text boxes, which a proofreader cannot have, and online
#: every visit told Google who opened the page.
UI_FONTS = ("ui-sans-serif", "system-ui", "Segoe UI", "Roboto", "Noto Sans", "DejaVu Sans", "Arial", "sans-serif")
UI_FONTS_MONO = ("ui-monospace", "SFMono-Regular", "Consolas", "DejaVu Sans Mono", "monospace")


def page_theme() -> Any:
    return gr.themes.Soft(font=UI_FONTS, font_mono=UI_FONTS_MONO)


def page_i18n() -> Any:
    """Words Gradio's own page lacks. Its status tracker announces a finished event to screen readers with the
    key `common.complete`, which its locales do not define (only `chatbot.complete`), so a reader heard
    "common.complete" each time a document or a translation was done."""
    return gr.I18n(**{locale: {"common.complete": word} for locale, word in UI_DONE.items()})


#: "Done", in the page's languages: what a screen reader says when a translation or a document is finished.
UI_DONE = {"en": "Done", "es": "Listo", "de": "Fertig", "fr": "Terminé", "zh-CN": "完成"}


UI_CSS = """
#hmt-info { min-height: 2.5em; } #hmt-pair-note { font-size: 0.9em; }
/* On a phone the source and its translation (and a document and its result) stack: two 160 px columns side by
   side left a few words per line. */
@media (max-width: 700px) {
  .hmt-stack { flex-direction: column !important; }
  .hmt-stack > * { width: 100% !important; min-width: 0 !important; }
}
"""


def _run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call into the service, turning domain errors into readable `gr.Error`s."""
    try:
        return fn(*args, **kwargs)
    except TranslationError as exc:
        raise gr.Error(exc.message, print_exception=False) from None
    except gr.Error:
        raise
    except Exception:
        log.exception("UI action failed")
        raise gr.Error("Internal error; the server log has the details.", print_exception=False) from None


def _address(request: gr.Request | None) -> str:
    """The caller's address, as the REST API sees it (`requests.client_address`)."""
    client = getattr(request, "client", None) if request is not None else None
    return getattr(client, "host", None) or "unknown"


def _session(request: gr.Request | None) -> str | None:
    """The page's session (one per loaded page: a reload is a new one); None for calls without a page."""
    return getattr(request, "session_hash", None) if request is not None else None


def _next(stream: Iterator[Any]) -> Any:
    """The service generator's next item (None at its end), its errors turned into `gr.Error` as `_run` does."""
    return _run(next, stream, None)


class PageVisits:
    """What to stop when a page goes away, by its session: the rows of a text still decoding, a document's
    follower waiting on its job. Gradio tells `leave` from its unload event (the tab was closed or reloaded: its
    heartbeat connection dropped), which arrives even while a handler is blocked and cannot be closed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hooks: dict[str, dict[int, Callable[[], None]]] = {}
        self._ids = itertools.count()

    @contextlib.contextmanager
    def watch(self, session: str | None, on_leave: Callable[[], None]) -> Iterator[None]:
        """Call `on_leave` if the page of `session` goes away before the block ends."""
        if not session:
            yield
            return
        key = next(self._ids)
        with self._lock:
            self._hooks.setdefault(session, {})[key] = on_leave
        try:
            yield
        finally:
            with self._lock:
                hooks = self._hooks.get(session)
                if hooks is not None:
                    hooks.pop(key, None)
                    if not hooks:
                        del self._hooks[session]

    def leave(self, session: str | None) -> int:
        """The page of `session` has gone: run its hooks. Returns how many there were."""
        with self._lock:
            hooks = self._hooks.pop(session, {}) if session else {}
        for hook in hooks.values():
            hook()
        return len(hooks)

    def watched(self) -> int:
        with self._lock:
            return sum(len(h) for h in self._hooks.values())


class TranslatorUI:
    """State shared by the handlers: the service, settings, access policy, reachability table and output folder."""

    def __init__(self, service: Any, cfg: Config, metrics: WebMetrics | None = None,
                 policy: AccessPolicy | None = None, jobs: DocumentJobs | None = None,
                 parsers: DocumentParsers | None = None) -> None:
        self.service = service
        self.cfg = cfg
        self.metrics = metrics
        infos = service.languages()
        # Languages the model can read or write at start; the dropdowns list these first.
        self.model_codes = [i.code for i in infos if i.targets] + sorted(
            {t for i in infos for t in i.targets} - {i.code for i in infos if i.targets})
        self.outputs = Path(tempfile.mkdtemp(prefix="hmt-ui-"))
        # Removed when the UI is garbage-collected or the process exits, whichever comes first.
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.outputs), True)
        # Shared with the REST API when the server mounts both: one budget per caller whichever door it uses.
        self.policy = policy or AccessPolicy(cfg.server, cfg.limits, cfg.shares)
        #: Translated documents handed out, by the path Gradio serves them at → who may fetch them.
        self.owned = OwnedPaths()
        self.doc_output: gr.File | None = None  # set by build_ui: its cache is where downloads are served from
        # The REST API's jobs when the server mounts both (one queue, one `jobs.max_jobs`); else the page's own.
        self._own_jobs = jobs is None
        #: The REST API's document helpers when the server mounts both; else the page's own.
        self._own_parsers = parsers is None
        self.parsers = parsers if parsers is not None else DocumentParsers(cfg.limits, cfg.shares)
        self.jobs = jobs if jobs is not None else DocumentJobs(
            cfg.jobs, store=jobs_store(cfg), runner=document_runner(service, cfg, self.parsers.reader()))
        # Stored glossaries are in the jobs' store (the REST API's), else the configured one.
        store = self.jobs.store if self.jobs.store is not None else jobs_store(cfg)
        self.glossaries = GlossaryStore(cfg.glossary.resolved_dir, cfg.glossary.max_terms, store.glossaries)
        self.visits = PageVisits()

    # ------------------------------------------------------------------ choices

    def source_choices(self) -> list[tuple[str, str]]:
        """Auto-detect and the languages the loaded model translates from (a language it cannot reach at all is
        left out: offering 38 when the demo translates 5 only led to refusals)."""
        return [("Auto-detect", AUTO)] + [(LANGUAGES[c].label, c) for c in self._codes(sources=True)]

    def target_choices(self, source: str) -> list[tuple[str, str]]:
        """The languages the model translates into; those unreachable from `source` are marked so the user sees
        why before clicking."""
        reachable = self._reachable(source)
        out = []
        for code in self._codes(sources=False):
            label = LANGUAGES[code].label
            if reachable is not None and code not in reachable and code != source:
                label += " — unreachable"
            out.append((label, code))
        return out

    def model_note(self) -> str:
        """For the embedded demo model, what it covers and where it stops, under the page's title: a visitor's
        first paragraph should not be how they learn that it was trained on interface strings. Empty for any other
        model. The demo is recognised by the build record only its build writes (`build.json`)."""
        if not (self.cfg.model.resolved_path / "build.json").is_file():
            return ""
        names = [LANGUAGES[c].english for c in self.model_codes if c in LANGUAGES]
        return (f"**Embedded demo model** — {len(names)} languages: {', '.join(names)}. It translates short texts "
                "and interface strings; paragraphs and everyday chat are beyond it. For real quality, serve "
                "HY-MT1.5-1.8B on this CPU (docs/HUNYUAN_CPU.md) or Hunyuan-MT-7B on a GPU (docs/GPU.md).")

    def takes_context(self) -> bool:
        """Whether the backbone reads a request's context: a decoder-only model's prompt holds it (prompts.py); an
        encoder-decoder model (the demo) has no place for it, so the page shows no field that would do nothing."""
        try:
            arch = (self.service.status().get("backbone") or {}).get("arch")
        except Exception:  # noqa: BLE001 - a status that cannot be read yet: offer the field, the service decides
            return True
        return arch != "encoder-decoder"

    def _codes(self, sources: bool) -> list[str]:
        """Codes the model reads (`sources`) or writes, in the language table's order, asked each time: an admin
        rescan can change them while the page is open (the lists themselves are built once, at start)."""
        infos = self.service.languages()
        codes = {i.code for i in infos if i.targets} if sources else {t for i in infos for t in i.targets}
        return [c for c in self.model_codes if c in codes] + sorted(codes - set(self.model_codes))

    def _reachable(self, source: str) -> set[str] | None:
        if source == AUTO:
            return None  # depends on what is detected; the service refuses with a reason if needed
        # Asked each time: an admin rescan or pin can change what is reachable while the page is open.
        return {t for info in self.service.languages() if info.code == source for t in info.targets}

    def pair_note(self, source: str, target: str) -> str:
        if source == AUTO or not target:
            return ""
        if source == target:
            return "Source and target are the same: the text is returned unchanged."
        reachable = self._reachable(source) or set()
        if target in reachable:
            return ""
        src, tgt = LANGUAGES[source].english, LANGUAGES[target].english
        if not reachable:
            return f"⚠ {src} → {tgt} is unreachable: this model has no adapter from {src}."
        return (f"⚠ {src} → {tgt} is unreachable: no adapter and no pivot route. "
                f"From {src} you can reach: {', '.join(sorted(reachable))}.")

    # ------------------------------------------------------------------ text tab

    def stream_text(self, text: str, source: str, target: str, glossary: str | None = None,
                    request: gr.Request | None = None,
                    context: str | None = None) -> Iterator[tuple[str, str, Any]]:
        """The page's Translate: (the translation so far, "Translating…", no change to the swap's language) each
        time it grows, then (translation, info line with route, detected language and latency, detected code for
        the swap). Segments the translation memory knows arrive at once.

        Closing the generator (Gradio does when a new click cancels it, or when its page has gone) cancels the
        text's rows: they leave the engine at its next step. A page's unload cancels them too, even while this
        waits on a held engine and cannot be closed."""
        if not text or not text.strip():
            raise gr.Error("Type or paste some text to translate.", print_exception=False)
        caller = _run(self.policy.page_caller, _address(request))
        if self.policy.max_chars < self.cfg.limits.max_chars:
            # server.char_limit, lower than limits.max_chars (which the service checks, in the page's words).
            _run(self.policy.check_chars, [text])
        context = _run(prompts.clean_context, context, self.cfg.limits.max_chars)
        _run(self.policy.spend_chars, caller, len(text), context)
        terms = _run(self.glossaries.resolve, glossary, source or AUTO, target)
        started = time.perf_counter()
        ticket = Ticket(owner=caller.identity)
        stream = self.service.translate_stream(text, source or AUTO, target, glossary=terms, ticket=ticket,
                                               context=context)
        result = None
        try:
            with self.visits.watch(_session(request), lambda: ticket.cancel("the page was closed")):
                while (item := _next(stream)) is not None:
                    if isinstance(item, str):
                        yield item, _TRANSLATING, gr.skip()
                    else:
                        result = item
        finally:
            stream.close()  # early (the visitor left or clicked again): translate_stream cancels the rows
            if result is None and ticket.cancelled and self.metrics is not None:
                self.metrics.count_cancelled("ui")
        if result is None:
            log.error("translate_stream ended without a result")
            raise gr.Error("Internal error; the server log has the details.", print_exception=False)
        elapsed = time.perf_counter() - started
        if self.metrics is not None:
            self.metrics.observe_translation(result.source, result.target, result.route_kind, elapsed, "ui")
        yield result.text, _info_line(result, terms, elapsed, self.cfg.quality.review_below), result.source

    def translate_text(self, text: str, source: str, target: str, glossary: str | None = None,
                       request: gr.Request | None = None, context: str | None = None) -> tuple[str, str, str | None]:
        """`stream_text`'s final answer, for callers that do not show the text growing."""
        final: tuple[str, str, Any] = ("", "", None)
        for final in self.stream_text(text, source, target, glossary, request, context):
            pass
        return final

    def save_correction(self, text: str, source: str, target: str, translation: str, last_source: str | None,
                        context: str | None = None, request: gr.Request | None = None) -> str:
        """The translation box, as the visitor edited it, kept as a correction of the text: it answers the same
        text from now on (here and on every replica of the store) and trains the pair's next adapter."""
        if not self.cfg.server.suggestions:
            raise gr.Error("Corrections are off on this server (server.suggestions).", print_exception=False)
        if not self.policy.page_corrections:
            # A correction changes what every key's /translate answers; the open page's visitor has shown no key.
            raise gr.Error("This server takes corrections from the page only from signed-in users (API keys are "
                           "on); send yours with your key: POST /v1/corrections.", print_exception=False)
        if not (text or "").strip() or not (translation or "").strip():
            raise gr.Error("Translate a text first, then edit the translation and save it.", print_exception=False)
        if source == AUTO:
            if not last_source:
                raise gr.Error("Choose the source language, or translate once, before saving a correction.",
                               print_exception=False)
            source = last_source
        caller = _run(self.policy.page_caller, _address(request))
        _run(self.policy.check_chars, [text, translation])
        saved = _run(self.service.correct, text, source, target, translation, context, None, who(caller))
        return (f"**Correction saved** ({saved['source']} → {saved['target']}): this text is translated so from "
                "now on.")

    def swap(self, source: str, target: str, text: str, result: str,
             last_source: str | None) -> tuple[Any, Any, Any, Any, str]:
        """Swap languages and texts; from Auto-detect, the language detected for the last translation is used.
        Without one there is nothing to swap to: one sentence under the languages says so, and every box keeps
        what it holds (an error raised here would put an error overlay on all four)."""
        if source == AUTO:
            if not last_source:
                return (gr.update(), gr.update(), gr.update(), gr.update(),
                        "Auto-detect has no language to swap to yet: choose the source language, or translate once.")
            source = last_source
        return (gr.update(value=target), gr.update(value=source, choices=self.target_choices(target)),
                result or text, "", self.pair_note(target, source))

    def on_source_change(self, source: str, target: str) -> tuple[Any, str]:
        # Only the choices change: setting the value too would race a swap, whose new target can land in the page
        # after this event read the old one (every code stays a choice, so the current value stays valid).
        return gr.update(choices=self.target_choices(source)), self.pair_note(source, target)

    # ------------------------------------------------------------------ document tab

    def submit_document(self, path: str | None, source: str, target: str, glossary: str | None = None,
                        request: gr.Request | None = None, context: str | None = None) -> JobView:
        """Read and check the upload, charge its characters, and queue it as a job. A file the server cannot take
        is refused here, at once, in the same words as REST's."""
        if not path:
            raise gr.Error(f"Drop a document first ({' '.join(DOC_TYPES)}).", print_exception=False)
        caller = _run(self.policy.page_caller, _address(request))
        upload = Path(path)
        limits = self.cfg.limits
        if not upload.is_file():
            # Uploads are deleted shares.upload_ttl_s after they came (web/uploads.py).
            raise gr.Error("The file is no longer on the server (uploads are kept "
                           f"{self.cfg.shares.upload_ttl_s / 60:g} minutes); drop it again.", print_exception=False)
        size = upload.stat().st_size
        if size > limits.max_file_bytes:
            raise gr.Error(f"File too large: {size} bytes, the limit is {limits.max_file_bytes}.",
                           print_exception=False)
        terms = _run(self.glossaries.resolve, glossary, source, target)
        context = _run(prompts.clean_context, context, limits.max_chars)
        data = upload.read_bytes()
        document = _run(self.parsers.read, data, safe_filename(upload.name), limits, None, caller.identity)
        target = _run(normalize_code, target)
        source = _run(check_document_route, self.service, source, target, document.segments)
        _run(self.jobs.check_quota, caller)
        _run(self.policy.spend_chars, caller, sum(len(s) for s in document.segments), context)
        # The owner is checked on every later look (`_may`): with the page login or keys on, only this address.
        owner = caller if self.policy.downloads_owned else None
        return _run(self.jobs.submit_upload, job_spec(document.filename, source, target, terms, context), data,
                    document, distinct_segments(document), owner, caller)

    def translate_document(self, path: str | None, source: str, target: str, glossary: str | None = None,
                           request: gr.Request | None = None, context: str | None = None,
                           progress: gr.Progress = gr.Progress()) -> tuple[str, str]:
        """The public `translate_document` endpoint (gradio_client): submit the job and wait for it, the progress
        reported per segment → (the translated file, a note)."""
        progress(0.0, desc="Reading the document")
        view = self.submit_document(path, source, target, glossary, request, context)
        address = _address(request)
        view = _run(self._follow, view, self._may(address), progress)
        if view.state != "done":
            # The job's own message (as REST's job reports it), or that it was cancelled.
            raise gr.Error(view.error or f"Cancelled: {view.filename} was not translated.", print_exception=False)
        return _run(self._deliver, view, address)

    # The page: a job the browser remembers (gr.BrowserState), followed by whichever page of it is open.

    def page_submit(self, path: str | None, source: str, target: str, glossary: str | None = None,
                    request: gr.Request | None = None, context: str | None = None) -> tuple[str, str, Any, Any]:
        """Translate document: queue the job → (its id for the browser to keep, a note, the Translate button
        disabled, the Cancel button shown)."""
        view = self.submit_document(path, source, target, glossary, request, context)
        return view.id, _job_note(view), gr.update(interactive=False), gr.update(visible=True)

    def resume_document(self, job_id: str | None, request: gr.Request | None = None
                        ) -> tuple[Any, Any, Any, Any, Any]:
        """On page load: the job this browser was following, if it is still there for this visitor → (the
        Document tab selected, a note, the id kept, Translate disabled, Cancel shown). An id that is gone
        (expired, the server restarted, someone else's) is forgotten without a word."""
        if not job_id:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        try:
            view = self.jobs.view(job_id, self._may(_address(request)))
        except JobNotFound:
            return gr.skip(), gr.skip(), "", gr.skip(), gr.skip()
        return (gr.update(selected="document"), _job_note(view, again=True), gr.skip(), gr.update(interactive=False),
                gr.update(visible=view.state not in ENDED))

    def follow_document(self, job_id: str | None, request: gr.Request | None = None,
                        progress: gr.Progress = gr.Progress()) -> tuple[Any, Any, Any, Any, Any]:
        """The page follows its job: the progress bar shows the job's segments and the seconds remaining; at the
        end → (the file or None, a note, the id forgotten, Translate enabled, Cancel hidden). If the page goes
        away first, this stops waiting (the job goes on; the next page load picks it up)."""
        if not job_id:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        address = _address(request)
        may = self._may(address)
        gone = threading.Event()
        try:
            with self.visits.watch(_session(request), gone.set):
                view = self._follow(self.jobs.view(job_id, may), may, progress, gone)
            if view.state not in ENDED:  # the page has gone: nobody reads what this returns
                return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
            if view.state == "done":
                served, note = _run(self._deliver, view, address)
            else:
                served, note = None, _ended_note(view)
        except JobNotFound:
            served, note = None, "That document job is no longer on the server (it expired, or the server restarted)."
        except gr.Error as exc:
            served, note = None, _markdown_text(exc.message)
        except Exception:  # noqa: BLE001 - said in the note: the page must get its buttons back either way
            log.exception("following document job %s failed", job_id)
            served, note = None, "Internal error; the server log has the details."
        return served, note, "", gr.update(interactive=True), gr.update(visible=False)

    def cancel_document(self, job_id: str | None, request: gr.Request | None = None) -> Any:
        """Cancel: the job's rows leave the engine at its next step; the follower then says it was cancelled."""
        if job_id:
            address = _address(request)
            _run(self.policy.page_caller, address)
            _run(self.jobs.cancel, job_id, self._may(address))
        return gr.update(visible=False)

    def page_left(self, request: gr.Request | None = None) -> None:
        """Gradio's unload: the page's text stops decoding, its document follower stops waiting."""
        self.visits.leave(_session(request))

    def _may(self, address: str) -> Callable[[Any], bool]:
        """Whether this page may see a job: its uploader's address when downloads are owned (as for the files the
        page hands out), anyone with the id otherwise; never a job uploaded with an API key."""
        return lambda owner: self.policy.may_fetch(owner, None, address, keyed_by_address=False)

    def _follow(self, view: JobView, may: Callable[[Any], bool], progress: Callable[..., Any],
                gone: threading.Event | None = None) -> JobView:
        """Wait for the job to end, reporting its progress; returns early (not ended) once `gone` is set."""
        while view.state not in ENDED:
            _report(progress, view)
            if gone is not None and gone.is_set():
                break
            view = self.jobs.wait(view.id, may, _FOLLOW_POLL_S, view)
        return view

    def _deliver(self, view: JobView, address: str) -> tuple[str, str]:
        """A finished job's document written where the page serves it → (its path, the note under it)."""
        rendered = self.jobs.result(view.id, self._may(address))
        self._sweep_outputs()
        folder = Path(tempfile.mkdtemp(dir=self.outputs))
        out = folder / safe_filename(rendered.filename)
        out.write_bytes(rendered.data)
        note = f"Translated {_english(view.source)} → {_english(view.target)}: **{_markdown_text(out.name)}**."
        if rendered.note:
            note += f" {rendered.note}"
        served = str(out)
        if self.policy.downloads_owned and self.doc_output is not None:
            # Put it where Gradio serves it from now, to know the exact path its link will name; the file route's
            # gate (web.server.PageGate) then lets only this caller's address fetch it.
            served = self.doc_output.move_resource_to_block_cache(served) or served
            self.owned.add(served, address)
        return served, note

    def _sweep_outputs(self) -> None:
        cutoff = time.time() - _OUTPUT_TTL_S
        for folder in self.outputs.iterdir():
            if folder.stat().st_mtime < cutoff:
                shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        if self._own_jobs:
            self.jobs.close()
        if self._own_parsers:
            self.parsers.close()
        self._cleanup()

    # ------------------------------------------------------------------ status tab

    def status_view(self, key: str | None = None) -> tuple[str, pd.DataFrame, str, Any, Any]:
        try:
            self.policy.check_status(key or None)
        except TranslationError as exc:
            # Shown in place of the status (the tab polls every 2 s: a pop-up each time would be unusable).
            empty = {"history": []}
            return (f"🔒 {exc.message}", adapters_frame({}), "", *plots(empty))
        status = self.service.status()
        return (overview_markdown(status), adapters_frame(status), cache_markdown(status), *plots(status))

    def import_memory(self, key: str, pair: str, path: str | None) -> str:
        """Admin: a TSV or TMX file into the translation memory of `pair`."""
        _run(self.policy.check_admin, key or None)
        if not path:
            raise gr.Error("Choose a .tsv or .tmx file to import.", print_exception=False)
        upload = Path(path)
        if upload.stat().st_size > self.cfg.limits.max_file_bytes:
            raise gr.Error(f"File too large: the limit is {self.cfg.limits.max_file_bytes} bytes.",
                           print_exception=False)
        result = _run(self.service.import_memory, upload.read_bytes(), upload.name, pair or "")
        return (f"Memory {result['pair']}: {result['added']} entries added, {result['replaced']} replaced, "
                f"{result['skipped']} skipped; "
                f"{result['entries']} in the memory now.")

    def admin(self, action: str, key: str, pair: str) -> str:
        from ..adapters.request import Pair

        _run(self.policy.check_admin, key or None)
        if action == "rescan":
            _run(self.service.rescan)
            return "Rescanned the adapters folder."
        parsed = _run(Pair.parse, pair or "")
        changed = _run(getattr(self.service, action), parsed)
        return f"{action} {parsed.key}: {'done' if changed else 'nothing to change'}."


def _markdown_text(text: str) -> str:
    """`text` shown as itself in Markdown: a file name like `my_final_report_.txt` must not turn italic."""
    return re.sub(r"([\\`*_\[\]<>~|])", r"\\\1", text)


def clear_text_result() -> tuple[str, str]:
    """Empties the translation and its route line as a new translation starts: after an error they would still
    show the previous text's, as if they belonged to this one."""
    return "", ""


def clear_document_result() -> tuple[None, str]:
    return None, ""


#: Sentences the line names for checking, at most (the least sure first).
_CHECK_AT_MOST = 3


def _info_line(result: Any, terms: Any, elapsed: float, review_below: float = 0.5) -> str:
    """The Text tab's line under a translation: route, detected language, latency, the model's confidence (and the
    sentences below `quality.review_below`, to check first), memory, glossary."""
    parts = [f"**Route:** {result.route_label}"]
    if result.detected is not None:
        lang = LANGUAGES.get(result.detected.code)
        name = lang.label if lang else result.detected.code
        parts.append(f"**Detected:** {name} ({result.detected.confidence:.0%})")
    total_ms = result.timings_ms.get("total", elapsed * 1000.0)
    parts.append(f"**Latency:** {total_ms:.0f} ms")
    if result.confidence is not None:
        unsure = sorted((c, i) for i, c in enumerate(result.segment_confidences) if c is not None and c < review_below)
        check = ""
        if unsure and len(result.segment_confidences) > 1:
            named = ", ".join(f"sentence {i + 1} ({c:.0%})" for c, i in unsure[:_CHECK_AT_MOST])
            more = f" and {len(unsure) - _CHECK_AT_MOST} more" if len(unsure) > _CHECK_AT_MOST else ""
            check = f" · **Check first:** {named}{more}"
        elif unsure:
            check = " (low: check it)"
        parts.append(f"**Confidence:** {result.confidence:.0%}{check}")
    if result.memory_segments:
        near = f" ({result.memory_near_segments} near-exact: case or closing punctuation differed)" \
            if result.memory_near_segments else ""
        parts.append(f"**From memory:** {result.memory_segments} of {count_of(result.segments, 'segment')}{near}")
    if result.memory_matches:
        best = result.memory_matches[0]
        parts.append(f"**Memory suggestion ({best['score']:.0%}):** {_markdown_text(best['source'])} → "
                     f"{_markdown_text(best['target'])}")
    if terms is not None:
        # What was enforced in this text, not the size of the list.
        parts.append(f"**Glossary:** {count_of(result.glossary_terms, 'term')} applied, of {len(terms)}")
    return " · ".join(parts)


def _english(code: str) -> str:
    lang = LANGUAGES.get(code)
    return lang.english if lang else code


def _time_left(seconds: float | None) -> str:
    if seconds is None:
        return "estimating the time left"
    if seconds < 90:
        return f"about {max(1, math.ceil(seconds))} s left"
    return f"about {round(seconds / 60)} min left"


def _report(progress: Callable[..., Any], view: JobView) -> None:
    """A job's state on the page's progress bar: its segments done of all, and the time left."""
    if view.state == "queued":
        ahead = (view.queue_position or 1) - 1
        waiting = f"Queued behind {count_of(ahead, 'document')}" if ahead else "Queued"
        progress(0.0, desc=f"{waiting} · {_time_left(view.seconds_remaining)}")
    else:
        progress((view.done, view.total), desc=f"Translating {view.filename} · {_time_left(view.seconds_remaining)}",
                 unit="segments")


def _job_note(view: JobView, again: bool = False) -> str:
    """The note while a job runs: what it is, and that it does not need the page open."""
    source = "detected language" if view.source == AUTO else _english(view.source)
    name = f"**{_markdown_text(view.filename)}** ({source} → {_english(view.target)}, {count_of(view.total, 'segment')})"
    if again:
        return f"{name}, sent from this browser before the page was loaded: its progress is shown again here."
    return (f"{name}: it runs on the server. Reload or close this page and it goes on; open the page again in this "
            "browser to get the file.")


def _ended_note(view: JobView) -> str:
    name = f"**{_markdown_text(view.filename)}**"
    if view.state == "cancelled":
        return f"Cancelled: {name} was not translated ({view.done} of {count_of(view.total, 'segment')} were done)."
    return f"{name} was not translated: {_markdown_text(view.error or 'the job failed.')}"


def _glossary_field(elem_id: str) -> gr.Textbox:
    """The folded-away Glossary field of a tab: inline terms, or a stored glossary's id."""
    with gr.Accordion("Glossary", open=False):
        return gr.Textbox(lines=3, label="Terms to enforce", elem_id=elem_id,
                          placeholder="One per line: Save = Guardar. Or the id of a stored glossary.")


def _context_field(elem_id: str, visible: bool) -> gr.Textbox:
    """The folded-away Context field of a tab: what the text is about, read by the model, never translated."""
    with gr.Accordion("Context", open=False, visible=visible):
        return gr.Textbox(lines=2, label="What the text is about (optional; not translated)", elem_id=elem_id,
                          placeholder="e.g. The File menu of a text editor. Or the sentences around the text.")


def build_ui(service: Any, cfg: Config, metrics: WebMetrics | None = None,
             policy: AccessPolicy | None = None, jobs: DocumentJobs | None = None,
             parsers: DocumentParsers | None = None) -> gr.Blocks:
    """The Blocks page. Mount it with `gr.mount_gradio_app(app, blocks, "/ui", head=UI_HEAD, css=UI_CSS)`.
    `jobs` and `parsers`: the REST API's document jobs and helpers, shared (the page makes its own without)."""
    ui = TranslatorUI(service, cfg, metrics, policy, jobs, parsers)
    default_target = "es" if "es" in ui.model_codes else (ui.model_codes[0] if ui.model_codes else "en")
    limits = cfg.limits
    takes_context = ui.takes_context()
    corrections = ui.policy.page_corrections
    with gr.Blocks(title="Hunyuan-MT translation", delete_cache=(600, 1800)) as demo:
        gr.Markdown("## Hunyuan-MT translation server")
        model_note = ui.model_note()
        gr.Markdown(model_note, elem_id="hmt-model-note", visible=bool(model_note))
        # The document job this browser follows, in localStorage: shared by its tabs, kept across reloads.
        job_store = gr.BrowserState("", storage_key="hmt-document-job")
        with gr.Tabs() as tabs:
            with gr.Tab("Text", id="text"):
                with gr.Row(equal_height=True):
                    src = gr.Dropdown(ui.source_choices(), value=AUTO, label="From", elem_id="hmt-src", scale=4)
                    swap = gr.Button("⇄", elem_id="hmt-swap", scale=0, min_width=60)
                    tgt = gr.Dropdown(ui.target_choices(AUTO), value=default_target, label="To", elem_id="hmt-tgt",
                                      scale=4)
                pair_note = gr.Markdown("", elem_id="hmt-pair-note")
                with gr.Row(elem_classes=["hmt-stack"]):
                    # No max_length: the box would cut a longer paste silently; the service refuses it instead.
                    source_box = gr.Textbox(lines=8, max_lines=30, label="Text", elem_id="hmt-source",
                                            placeholder=f"Type or paste text (up to {limits.max_chars:,} characters). "
                                                        "Ctrl+Enter translates.")
                    # Editable where corrections are on: the visitor fixes it and saves it as a correction.
                    result_box = gr.Textbox(lines=8, max_lines=30, elem_id="hmt-result", buttons=["copy"],
                                            label="Translation (edit it, then save a correction)" if corrections
                                            else "Translation", interactive=corrections)
                glossary_box = _glossary_field("hmt-glossary")
                context_box = _context_field("hmt-context", takes_context)
                with gr.Row():
                    translate_btn = gr.Button("Translate", variant="primary", elem_id="hmt-translate", scale=4)
                    correct_btn = gr.Button("Save correction", elem_id="hmt-correct", scale=1, min_width=160,
                                            visible=corrections)
                info = gr.Markdown("", elem_id="hmt-info")

                # The source used (detected or chosen) of the last translation; State stays out of the API.
                last_source = gr.State(None)
                # A generator: the translation grows in its box. gradio_client's predict returns the last output.
                streaming = translate_btn.click(
                    clear_text_result, None, [result_box, info], queue=False, show_progress="hidden",
                    api_visibility="private").then(
                    ui.stream_text, [source_box, src, tgt, glossary_box, context_box], [result_box, info, last_source],
                    api_name="translate", api_visibility="public", trigger_mode="multiple")
                # A new click (or Ctrl+Enter) stops the text still growing, whose rows then leave the engine: two
                # streams would write into one box, and the first is no longer wanted. The page cancels the run it
                # has when the click comes, before the new one is sent; "multiple" above lets the new one start
                # while the old is still marked running (Gradio's default, "once", would drop it, and
                # "always_last" would wait for an end that a cancel never reports).
                translate_btn.click(None, None, None, cancels=[streaming])
                # The line is cleared first: a refusal's error mark must not sit on the last save's "saved".
                correct_btn.click(lambda: "", None, [info], queue=False, show_progress="hidden",
                                  api_visibility="private").then(
                    ui.save_correction, [source_box, src, tgt, result_box, last_source, context_box], [info],
                    api_name="save_correction", api_visibility="public")
                swap.click(ui.swap, [src, tgt, source_box, result_box, last_source],
                           [src, tgt, source_box, result_box, pair_note], api_name="swap",
                           api_visibility="undocumented")
                src.change(ui.on_source_change, [src, tgt], [tgt, pair_note], api_name="source_changed",
                           api_visibility="undocumented")
                tgt.change(ui.pair_note, [src, tgt], [pair_note], api_name="pair_note", api_visibility="undocumented")

            with gr.Tab("Document", id="document"):
                gr.Markdown(
                    f"Drop a **{', '.join(DOC_TYPES[:-1])} or {DOC_TYPES[-1]}** file "
                    f"(up to {limits.max_file_bytes // 2**20} MiB, "
                    f"{limits.max_doc_chars:,} characters, {limits.max_segments:,} segments). The result keeps the "
                    f"format; a PDF's text layer comes back as a .docx."
                )
                # 240 px at least: at a phone's 390 px the two 160 px dropdowns stood side by side and cut the
                # target's name ("Español — Spa"); now each takes the width, as on the Text tab.
                with gr.Row(equal_height=True):
                    doc_src = gr.Dropdown(ui.source_choices(), value=AUTO, label="From", elem_id="hmt-doc-src",
                                          min_width=240)
                    doc_tgt = gr.Dropdown(ui.target_choices(AUTO), value=default_target, label="To",
                                          elem_id="hmt-doc-tgt", min_width=240)
                with gr.Row(elem_classes=["hmt-stack"]):
                    doc_in = gr.File(label="Document", file_types=DOC_TYPES, type="filepath", elem_id="hmt-doc-in")
                    doc_out = gr.File(label="Translated document", interactive=False, elem_id="hmt-doc-out")
                ui.doc_output = doc_out
                doc_glossary = _glossary_field("hmt-doc-glossary")
                doc_context = _context_field("hmt-doc-context", takes_context)
                with gr.Row():
                    doc_btn = gr.Button("Translate document", variant="primary", elem_id="hmt-doc-translate", scale=4)
                    cancel_btn = gr.Button("Cancel", variant="stop", elem_id="hmt-doc-cancel", visible=False, scale=1,
                                           min_width=100)
                doc_note = gr.Markdown("", elem_id="hmt-doc-note")
                doc_src.change(ui.on_source_change, [doc_src, doc_tgt], [doc_tgt, doc_note],
                               api_name="doc_source_changed", api_visibility="undocumented")
                doc_tgt.change(ui.pair_note, [doc_src, doc_tgt], [doc_note], api_name="doc_pair_note",
                               api_visibility="undocumented")
                # A new file (or a failed upload) takes the previous file's download and note away.
                doc_in.change(clear_document_result, None, [doc_out, doc_note], queue=False, show_progress="hidden",
                              api_visibility="private")
                # The page's document is a job: submitted (the file read and checked: a bad one is refused at once),
                # its id kept in the browser, then followed with the job's own progress until its file comes.
                followed = [doc_out, doc_note, job_store, doc_btn, cancel_btn]
                follow = {"show_progress_on": [doc_out], "api_visibility": "private",
                          "concurrency_id": "hmt-follow", "concurrency_limit": _FOLLOWERS}
                submitted = doc_btn.click(
                    clear_document_result, None, [doc_out, doc_note], queue=False, show_progress="hidden",
                    api_visibility="private").then(
                    ui.page_submit, [doc_in, doc_src, doc_tgt, doc_glossary, doc_context],
                    [job_store, doc_note, doc_btn, cancel_btn], api_visibility="private")
                submitted.success(ui.follow_document, [job_store], followed, **follow)
                cancel_btn.click(ui.cancel_document, [job_store], [cancel_btn], api_visibility="private",
                                 show_progress="hidden")
                # gradio_client's endpoint (no button of its own): submit and wait, the progress per segment.
                gr.on([], ui.translate_document, [doc_in, doc_src, doc_tgt, doc_glossary, doc_context],
                      [doc_out, doc_note],
                      api_name="translate_document", api_visibility="public")

            with gr.Tab("Status", id="status"):
                status_key = gr.Textbox(label="Status key", type="password", elem_id="hmt-status-key",
                                        visible=ui.policy.status_private,
                                        info="This server keeps its status private (server.status_key).")
                overview = gr.Markdown("", elem_id="hmt-overview")
                adapters = gr.Dataframe(headers=["adapter", "state", "leases"], label="Resident adapters",
                                        interactive=False, elem_id="hmt-adapters")
                counters = gr.Markdown("", elem_id="hmt-counters")
                with gr.Row():
                    window = {"x_title": f"time (last {PLOT_WINDOW_S // 60} minutes)"}
                    latency_plot = gr.ScatterPlot(x="time", y="latency_ms", title="Latency per request",
                                                  y_title="ms", y_lim=[0, 100], y_axis_format=",.0f",
                                                  elem_id="hmt-latency", **window)
                    hit_plot = gr.LinePlot(x="time", y="hit_rate", title="Adapter cache hit rate", y_lim=[0, 1],
                                           y_axis_format=".0%", y_title="hit rate", elem_id="hmt-hitrate", **window)
                with gr.Accordion("Admin (needs the admin key)", open=False):
                    admin_key = gr.Textbox(label="Admin key", type="password", elem_id="hmt-admin-key")
                    admin_pair = gr.Textbox(label="Pair (e.g. en2es)", elem_id="hmt-admin-pair")
                    with gr.Row():
                        buttons = {a: gr.Button(a.capitalize(), elem_id=f"hmt-admin-{a}")
                                   for a in ("rescan", "pin", "unpin", "unload")}
                    with gr.Row():
                        memory_file = gr.File(label="Translation memory (.tsv or .tmx) for the pair above",
                                              file_types=MEMORY_TYPES, type="filepath",
                                              elem_id="hmt-memory-file")
                        memory_btn = gr.Button("Import memory", elem_id="hmt-admin-memory")
                    admin_out = gr.Markdown("", elem_id="hmt-admin-out")
                    memory_btn.click(ui.import_memory, [admin_key, admin_pair, memory_file], [admin_out],
                                     api_name="admin_memory", api_visibility="undocumented")
                for action, button in buttons.items():
                    button.click(lambda k, p, _a=action: ui.admin(_a, k, p), [admin_key, admin_pair], [admin_out],
                                 api_name=f"admin_{action}", api_visibility="undocumented")
                status_outputs = [overview, adapters, counters, latency_plot, hit_plot]
                timer = gr.Timer(2.0)
                timer.tick(ui.status_view, [status_key], status_outputs, api_name="status", api_visibility="public",
                           show_progress="hidden", concurrency_limit=None)
        demo.load(ui.status_view, [status_key], status_outputs, api_name="status_on_load", api_visibility="private",
                  show_progress="hidden")
        # A reload, or another tab of this browser, follows the job again (its Document tab brought forward).
        demo.load(ui.resume_document, [job_store], [tabs, doc_note, job_store, doc_btn, cancel_btn],
                  api_visibility="private", show_progress="hidden").then(
            ui.follow_document, [job_store], followed, **follow)
        demo.unload(ui.page_left)
    # max_size: the whole queue's intake (Gradio answers 503 past it); each address's share of it is metered before
    # Gradio sees a join (web/pagequeue.py).
    demo.queue(default_concurrency_limit=max(4, cfg.engine.max_rows), max_size=cfg.shares.page_queue)
    queue = getattr(demo, "_queue", None)
    if queue is not None and hasattr(queue, "sleep_when_free"):  # Gradio's attribute; absent, its default stays
        queue.sleep_when_free = PAGE_QUEUE_POLL_S
    # Any value but Gradio's default (40) gives the UI its own thread pool instead of anyio's shared one,
    # which the REST routes would otherwise compete for. Followers of document jobs mostly wait: room for them.
    demo.max_threads = max(41, 2 * cfg.engine.max_rows) + _FOLLOWERS
    demo.hmt_ui = ui  # type: ignore[attr-defined]  # the server closes it on shutdown
    return demo
