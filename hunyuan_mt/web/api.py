"""The REST API: LibreTranslate-compatible routes, OpenAI chat completions, health, metrics, adapters and admin.

Every blocking service call runs in the threadpool, so slow translations never stall the event loop that also
serves the Gradio UI. Errors are typed below this layer and rendered here, once, as `{"error": message}` with
`errors.http_status(exc)`; unknown exceptions become a bare 500 without a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
import time
from typing import Any, Callable, Iterator, Protocol, Sequence

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..adapters.request import Pair
from ..config import Config
from ..documents import LISTED_EXTENSIONS
from ..errors import (FeatureDisabled, InputTooLarge, InvalidInput, RateLimited, TranslationError, UnreachablePair,
                      UnsupportedLanguage, http_status)
from ..text.detect import Detection
from ..documents.parsers import DocumentParsers
from ..text.glossary import Glossary, GlossaryStore
from ..service.jobs import DocumentJobs
from ..text.languages import LANGUAGES, normalize_code, served_codes
from ..scheduler.ticket import Ticket
from .auth import REST_THREADS, AccessPolicy, Caller, who
from .doctranslate import document_runner, jobs_store
from .downloads import DownloadStore, attachment
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import RequestCounter, WebMetrics
from .chat_api import ChatRoutes, openai_route
from .document_api import DocumentRoutes
from .requests import (FORM, JSON, MULTIPART, BodyLimitMiddleware, client_address, content_type, int_field,
                       read_fields, source_field, text_field, wait_disconnected)

log = logging.getLogger(__name__)

#: JSON bodies beyond this are refused before parsing; generous next to the character limit (UTF-8, escapes).
_JSON_OVERHEAD = 64 * 1024
#: /frontend/settings: how long LibreTranslate's page waits after the last keystroke before it translates.
FRONTEND_TIMEOUT_MS = 500

#: Who the request being handled is charged to, once `_authorize` knows: `_call` holds that caller's share of the
#: REST threads (`shares.requests`) for each blocking call it runs.
_CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("hmt_rest_caller", default=None)


class TranslationServiceLike(Protocol):  # the parts of service.TranslationService the web layer calls
    def translate_batch(self, texts: list[str], src: str, tgt: str, *, alternatives: int = 0,
                        glossary: Any = None, ticket: Ticket | None = None,
                        context: str | None = None) -> list[Any]: ...
    def translate_segments(self, segments: list[str], src: str, tgt: str, progress: Any = None,
                           glossary: Any = None, ticket: Ticket | None = None,
                           context: str | None = None) -> list[str]: ...
    def translate_stream(self, text: str, src: str, tgt: str, *, glossary: Any = None,
                         ticket: Ticket | None = None) -> Iterator[Any]: ...
    def detect(self, text: str) -> list[Any]: ...
    def languages(self) -> list[Any]: ...
    def status(self) -> dict[str, Any]: ...
    def rescan(self) -> Any: ...
    def import_memory(self, data: bytes, filename: str, pair: str) -> dict[str, Any]: ...
    def export_memory(self, pair: Any) -> bytes: ...
    def pin(self, pair: Pair) -> Any: ...
    def unpin(self, pair: Pair) -> Any: ...
    def unload(self, pair: Pair) -> Any: ...


def error_response(exc: BaseException, openai_style: bool = False) -> JSONResponse:
    """The one rendering of an error for REST callers: {"error": message}.

    Under /v1 the message sits in OpenAI's shape, {"error": {"message", "type", "code"}}, which its clients read.
    """
    status = http_status(exc)
    message = exc.message if isinstance(exc, TranslationError) else "Internal server error."
    short = exc.short if isinstance(exc, TranslationError) else None
    # LibreTranslate's wording as `error` where it defines one, our fuller explanation beside it.
    body: dict[str, Any] = {"error": short, "detail": message} if short else {"error": message}
    if isinstance(exc, UnreachablePair) and exc.reachable:
        body["reachable"] = exc.reachable
    if openai_style:
        kind = "invalid_request_error" if status < 500 else "server_error"
        body = {"error": {"message": message, "type": kind, "code": status}}
    return JSONResponse(body, status_code=status, headers=retry_headers(exc))


def retry_headers(exc: BaseException) -> dict[str, str] | None:
    """`Retry-After` for a refusal the caller may simply repeat: the rate limit's own wait, else one second."""
    if isinstance(exc, RateLimited):
        return {"Retry-After": str(exc.retry_after_s)}
    if isinstance(exc, TranslationError) and exc.retryable:
        return {"Retry-After": "1"}
    return None


def detection_json(detection: Any) -> dict[str, Any]:
    """LibreTranslate reports confidence as a percentage."""
    return {"confidence": round(float(detection.confidence) * 100.0, 1), "language": detection.code}


class RestApi(ChatRoutes, DocumentRoutes):
    """Route handlers over one service; kept as a class so the handlers share the policy, store and metrics."""

    def __init__(self, service: TranslationServiceLike, cfg: Config, metrics: WebMetrics,
                 policy: AccessPolicy | None = None) -> None:
        self.service = service
        self.cfg = cfg
        self.metrics = metrics
        self.policy = policy or AccessPolicy(cfg.server, cfg.limits, cfg.shares)
        self.downloads = DownloadStore()
        #: Document jobs, shared with the web page (web.server.build_app hands them to build_ui).
        #: What this app keeps (jobs, stored glossaries): the configured store.
        self.store = jobs_store(cfg)
        #: Where uploads are read and written: helper processes, under a deadline (shared with the page).
        self.parsers = DocumentParsers(cfg.limits, cfg.shares)
        self.jobs = DocumentJobs(cfg.jobs, store=self.store,
                                 runner=document_runner(service, cfg, self.parsers.reader()))
        self.glossaries = GlossaryStore(cfg.glossary.resolved_dir, cfg.glossary.max_terms, self.store.glossaries)
        self._limiter: anyio.CapacityLimiter | None = None  # made on first use: it needs the running loop

    def stopping(self) -> None:
        """The server was told to stop (a signal): stop the documents being read now, without waiting for the
        requests in progress to end (they answer 503). Called from the signal handler, so it only starts a thread."""
        threading.Thread(target=self.parsers.close, name="hmt-parsers-stop", daemon=True).start()

    def close(self) -> None:
        """After the server has stopped: the job workers stop (running jobs are left for the next start), the
        document helpers are killed, the store is let go."""
        self.jobs.close()
        self.parsers.close()

    async def _call(self, fn: Any, *args: Any, abandon_on_cancel: bool = False) -> Any:
        """Run a blocking service call in the REST thread pool, within the caller's share of it (`shares.requests`,
        429 beyond): one caller's flood of slow calls cannot take every thread from the others."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(REST_THREADS)
        caller = _CALLER.get()
        with self.policy.requests.hold(caller.identity) if caller is not None else contextlib.nullcontext():
            return await anyio.to_thread.run_sync(functools.partial(fn, *args), limiter=self._limiter,
                                                  abandon_on_cancel=abandon_on_cancel)

    async def _watched(self, request: Request, ticket: Ticket, front: str, fn: Callable[[], Any]) -> Any:
        """`fn()` in the thread pool, cancelling `ticket` if the client disconnects first: its rows then leave
        the engine at the next decode step instead of decoding for nobody. The body must have been read."""
        async with anyio.create_task_group() as group:
            async def watch() -> None:
                await wait_disconnected(request)
                ticket.cancel("client disconnected")
                self.metrics.count_cancelled(front)

            group.start_soon(watch)
            try:
                value = await self._call(fn)
            except Exception as exc:  # noqa: BLE001 - raised below, outside the group (not as an ExceptionGroup)
                error: Exception | None = exc
            else:
                error = None
            finally:
                group.cancel_scope.cancel()
        if error is not None:
            raise error
        return value

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _api_key(request: Request, fields: dict[str, Any] | None = None) -> str | None:
        """`api_key` from the fields (query, form, JSON), else an 'Authorization: Bearer' header."""
        key = (fields or {}).get("api_key")
        if not isinstance(key, str) or not key:
            key = request.query_params.get("api_key") or None
        auth = request.headers.get("authorization", "")
        if not key and auth.lower().startswith("bearer "):
            key = auth[7:].strip()
        return key

    def _authorize(self, request: Request, fields: dict[str, Any]) -> Caller:
        caller = self.policy.authorize(self._api_key(request, fields), client_address(request))
        _CALLER.set(caller)  # the request's own context: its blocking calls are held in this caller's share
        return caller

    def _check_status(self, request: Request) -> None:
        given = request.headers.get("x-admin-key") or self._api_key(request)
        self.policy.check_status(given)

    def _texts(self, q: Any) -> tuple[list[str], bool]:
        if q is None or q == "" or q == []:
            raise InvalidInput("Invalid request: missing q parameter")
        if isinstance(q, str):
            return [q], False
        if isinstance(q, list) and all(isinstance(item, str) for item in q):
            return list(q), True
        raise InvalidInput("Invalid request: q must be a string or a list of strings")

    def _observe(self, results: Sequence[Any], started: float, front: str) -> None:
        elapsed = time.perf_counter() - started
        for result in results:
            self.metrics.observe_translation(result.source, result.target, result.route_kind,
                                             elapsed / max(1, len(results)), front)

    def _translate_html(self, text: str, source: str, target: str, glossary: Glossary | None = None,
                        ticket: Ticket | None = None, context: str | None = None) -> tuple[str, Any]:
        """format=html: translate the text nodes only; tags and attributes come back untouched."""
        from ..documents import read_document, translate_keeping_markup

        document = read_document(text.encode("utf-8"), "fragment.html", self.cfg.limits)
        detected = None
        if source == "auto":
            detections = self.service.detect(" ".join(document.segments)[: self.policy.max_chars])
            if not detections:
                raise InvalidInput("Could not detect the source language; pass source explicitly.")
            detected = detections[0]
            source = detected.code
        # Which segments the memory answered: their formatted words are the translator's and stay as they are.
        origins: dict[str, str] = {}
        translations = translate_keeping_markup(
            # An interactive request's markup: its rows do not yield to documents.
            document, lambda segments, _progress: self.service.translate_segments(
                segments, source, target, glossary=glossary, ticket=ticket or Ticket(), context=context,
                origins=origins),
            glossary=glossary, origins=origins).translations
        html = document.render(translations, target).data.decode("utf-8")
        return html, detected

    # ------------------------------------------------------------------ LibreTranslate routes

    async def translate(self, request: Request) -> JSONResponse:
        try:
            fields = await read_fields(request)
            caller = self._authorize(request, fields)
            texts, as_list = self._texts(fields.get("q"))
            if content_type(request) != JSON:
                # Browsers send a form's line breaks as CRLF; count and translate them as LF, as LibreTranslate
                # does, so the character limit means the same whatever the encoding.
                texts = ["\n".join(t.splitlines()) if "\r" in t else t for t in texts]
            source = source_field(fields)
            target = text_field(fields, "target")
            await self._check_codes(source, target)
            fmt = text_field(fields, "format", required=False, default="text")
            if fmt not in ("text", "html"):
                raise InvalidInput(f"Invalid request: format must be 'text' or 'html', got {fmt[:20]!r}")
            alternatives = int_field(fields, "alternatives")
            if not 0 <= alternatives <= self.cfg.limits.max_alternatives:
                raise InvalidInput(f"Invalid request: alternatives must be from 0 to "
                                   f"{self.cfg.limits.max_alternatives}, got {alternatives}")
            glossary = self.glossaries.resolve(fields.get("glossary"), source, target)
            # Beyond LibreTranslate: text that shapes the translation and is not translated (the Hunyuan prompt's
            # context); charged like the text.
            context = fields.get("context")
            self.policy.check_chars(texts)
            self.policy.spend_chars(caller, sum(len(t) for t in texts), context if isinstance(context, str) else None)
            started = time.perf_counter()
            ticket = Ticket(owner=caller.identity)
            if fmt == "html":
                pairs = [await self._watched(request, ticket, "rest", functools.partial(
                    self._translate_html, t, source, target, glossary, ticket, context)) for t in texts]
                translated = [html for html, _ in pairs]
                detected = [d for _, d in pairs]
                others: list[list[str]] = [[] for _ in texts]  # markup has no alternatives (nor in LibreTranslate)
                confidence: list[float | None] = [None for _ in texts]
                memory = [0 for _ in texts]
                close = [0 for _ in texts]
                near = [[] for _ in texts]
            else:
                results = await self._watched(request, ticket, "rest", functools.partial(
                    self.service.translate_batch, texts, source, target, alternatives=alternatives,
                    glossary=glossary, ticket=ticket, context=context))
                self._observe(results, started, "rest")
                translated = [r.text for r in results]
                detected = [r.detected for r in results]
                others = [list(r.alternatives) for r in results]
                confidence = [r.confidence for r in results]
                memory = [r.memory_segments for r in results]
                close = [r.memory_near_segments for r in results]
                near = [list(r.memory_matches) for r in results]
        finally:
            await request.close()
        body: dict[str, Any] = {"translatedText": translated if as_list else translated[0]}
        if any(c is not None for c in confidence):
            # Beyond LibreTranslate's shape (its clients ignore it): how sure the model was, in (0, 1], of each
            # text's least sure sentence (the geometric mean of its tokens' probabilities; 1 from the memory).
            body["confidence"] = confidence if as_list else confidence[0]
        if any(memory):
            # Beyond LibreTranslate's shape (its clients ignore it): how many segments the memory answered, and
            # how many of those near-exactly (an entry that differed in case or closing punctuation).
            body["memorySegments"] = memory if as_list else memory[0]
            if any(close):
                body["memoryNearSegments"] = close if as_list else close[0]
        if any(near):
            # Near entries of the memory for segments it did not know exactly: suggestions with their score.
            body["memoryMatches"] = near if as_list else near[0]
        if source == "auto":
            found = [detection_json(d) if d else {"confidence": 0.0, "language": None} for d in detected]
            body["detectedLanguage"] = found if as_list else found[0]
        if alternatives:
            body["alternatives"] = others if as_list else others[0]
        return JSONResponse(body)

    async def detect(self, request: Request) -> JSONResponse:
        try:
            fields = await read_fields(request)
            caller = self._authorize(request, fields)
            q = text_field(fields, "q")
            self.policy.check_chars([q])
            self.policy.spend_chars(caller, len(q))
            detections = await self._call(self.service.detect, q)
            if not detections:
                # A text with no letters ("123", "😀"): LibreTranslate's clients read the answer's [0], so the
                # best guess is given with the confidence it deserves, none (as LibreTranslate itself does).
                served = [i.code for i in await self._served_languages()]
                detections = [Detection("en" if "en" in served or not served else served[0], 0.0)]
        finally:
            await request.close()
        return JSONResponse([detection_json(d) for d in detections])

    async def _served_languages(self) -> list[Any]:
        infos = await self._call(self.service.languages)
        # Only what this model can read or write: LibreTranslate clients offer every listed language.
        used = set(served_codes(infos))
        return [i for i in infos if i.code in used]

    async def _check_codes(self, *codes: str) -> None:
        """Each code known (or "auto"), before any work: an unknown one is refused naming the codes this server
        serves (the same words on the single-process service and on the Ray ingress)."""
        for code in codes:
            if code == "auto" or not code.strip():
                continue  # missing: the service's own check says which parameter
            try:
                normalize_code(code)
            except UnsupportedLanguage:
                normalize_code(code, [i.code for i in await self._served_languages()])

    async def languages(self) -> JSONResponse:
        return JSONResponse([{"code": i.code, "name": i.english, "native": i.native, "targets": list(i.targets)}
                             for i in await self._served_languages()])

    async def frontend_settings(self) -> JSONResponse:
        """What LibreTranslate's web page and browser extensions read before anything else."""
        from ..documents import SUPPORTED_EXTENSIONS

        infos = await self._served_languages()
        codes = [i.code for i in infos]
        target = "es" if "es" in codes else (codes[0] if codes else "en")
        name = next((i.english for i in infos if i.code == target), target)
        return JSONResponse({
            "charLimit": self.policy.max_chars,
            "frontendTimeout": FRONTEND_TIMEOUT_MS,
            "apiKeys": self.policy.keys_required,
            "keyRequired": self.policy.keys_required,
            "suggestions": self.cfg.server.suggestions,
            "filesTranslation": True,
            "supportedFilesFormat": list(SUPPORTED_EXTENSIONS),
            "language": {"source": {"code": "auto", "name": "Auto Detect"},
                         "target": {"code": target, "name": name}},
        })

    async def suggest(self, request: Request) -> JSONResponse:
        """LibreTranslate's suggestion (`q`, `s`, `source`, `target`): recorded as a correction, which answers the
        same text from then on. 403 as LibreTranslate's when suggestions are off (server.suggestions)."""
        if not self.cfg.server.suggestions:
            await request.close()
            raise FeatureDisabled("Suggestions are disabled on this server.")
        await self._correct(request, "s")
        return JSONResponse({"success": True})

    async def corrections(self, request: Request) -> JSONResponse:
        """`{"q", "source", "target", "translation"}` (and `context`, `machine`: what the server had answered):
        201 with the correction's id; the memory answers `q` with it from now on."""
        return JSONResponse(await self._correct(request, "translation"), status_code=201)

    async def _correct(self, request: Request, field: str) -> dict[str, Any]:
        """A correction from the request's fields (its translation in `field`), under the access policy and
        charged as characters like a translation: the service's answer."""
        try:
            fields = await read_fields(request)
            caller = self._authorize(request, fields)
            q, translation = text_field(fields, "q"), text_field(fields, field)
            source, target = text_field(fields, "source"), text_field(fields, "target")
            self.policy.check_chars([q, translation])
            self.policy.spend_chars(caller, len(q) + len(translation))
            return await self._call(functools.partial(
                self.service.correct, q, source, target, translation, fields.get("context"), fields.get("machine"),
                who(caller)))
        finally:
            await request.close()


    # ------------------------------------------------------------------ document jobs


    # ------------------------------------------------------------------ service routes

    async def health(self) -> JSONResponse:
        # LibreTranslate's exact answer, which its clients and tests compare whole. 503 "starting" until a request
        # would be served at steady speed (warmup.py): load balancers and scripts wait for 200. The details are
        # at /status.
        ready = bool((await self._call(self.service.status)).get("ready", True))
        return JSONResponse({"status": "ok" if ready else "starting"}, status_code=200 if ready else 503)

    async def status_route(self) -> JSONResponse:
        status = await self._call(self.service.status)
        backbone = status.get("backbone") or {}
        memory = status.get("memory") or {}
        ready = bool(status.get("ready", True))
        body: dict[str, Any] = {
            "status": "ok" if ready else "starting", "ready": ready, "version": __version__,
            "model": backbone.get("name"), "device": backbone.get("device"),
            # What the weights run as, and why when the service chose it (model.quantization: auto).
            "quantization": backbone.get("quantization"),
            **({"int8_kernel": backbone["int8_kernel"]} if backbone.get("int8_kernel") else {}),
            **({"quantization_note": backbone["quantization_note"]} if backbone.get("quantization_note") else {}),
            "mode": memory.get("mode", "normal"),
            "uptime_s": status.get("uptime_s"), "startup_s": status.get("startup_s"), "warmup": status.get("warmup")}
        if status.get("full_speed"):
            # Whether the fast step (kernels, compiled packages) serves yet, or how far its background build is.
            body["full_speed"] = status["full_speed"]
        if status.get("adapter_versions"):
            # Each pair's serving adapter version, and the shadow scores of every version trained from corrections.
            body["adapters"] = status["adapter_versions"]
        if "ray" in status:
            body["ray"] = {"groups": [{k: g.get(k) for k in ("name", "replicas", "running", "up")}
                                      for g in status["ray"]["groups"]]}
        return JSONResponse(body)

    async def glossaries_route(self) -> JSONResponse:
        return JSONResponse(await self._call(self.glossaries.available))

    async def metrics_route(self, request: Request) -> Response:
        self._check_status(request)
        data = await self._call(self.metrics.render)
        return Response(data, media_type=METRICS_CONTENT_TYPE)

    async def adapters(self, request: Request) -> JSONResponse:
        self._check_status(request)
        status = await self._call(self.service.status)
        cache = status.get("cache") or {}
        return JSONResponse({key: cache.get(key) for key in (
            "registered", "resident", "ram_tier", "lru_order", "failed", "slots")})

    # ------------------------------------------------------------------ admin

    async def admin(self, request: Request, action: str) -> JSONResponse:
        data = b""
        try:
            fields = await read_fields(request)
            given = request.headers.get("x-admin-key") or (fields.get("admin_key") if isinstance(
                fields.get("admin_key"), str) else None)
            self.policy.check_admin(given)
            upload = fields.get("file")
            if action == "memory":
                if not isinstance(upload, UploadFile):
                    raise InvalidInput("Invalid request: send the memory as a multipart 'file' (.tsv or .tmx) "
                                       "with 'pair'")
                data = await upload.read(self.cfg.limits.max_file_bytes + 1)
                if len(data) > self.cfg.limits.max_file_bytes:
                    raise InputTooLarge(f"File too large: the limit is {self.cfg.limits.max_file_bytes} bytes.")
            elif action == "glossary" and isinstance(upload, UploadFile):
                data = await upload.read(self.cfg.limits.max_file_bytes + 1)
        finally:
            await request.close()
        if action == "memory":
            name = upload.filename if isinstance(upload, UploadFile) and upload.filename else "memory.tsv"
            result = await self._call(self.service.import_memory, data, name, text_field(fields, "pair"))
            return JSONResponse({"ok": True, "action": "memory", **result})
        if action == "rescan":
            await self._call(self.service.rescan)
            return JSONResponse({"ok": True, "action": "rescan"})
        name = text_field(fields, "pair")
        pair = Pair.parse(name)  # pure string parsing: a path or "../" never gets further than this
        if action == "glossary":
            terms = data.decode("utf-8", "replace") if isinstance(upload, UploadFile) else fields.get("terms")
            stored = await self._call(self.glossaries.put, text_field(fields, "id"), pair.key, terms)
            return JSONResponse({"ok": True, "action": action, "id": text_field(fields, "id"), "pair": pair.key,
                                 "terms": len(stored.terms)})
        if action == "promote":
            result = await self._call(self.service.promote, pair, text_field(fields, "version"))
            return JSONResponse({"ok": True, "action": action, **result})
        if action == "rollback":
            result = await self._call(self.service.rollback, pair)
            return JSONResponse({"ok": True, "action": action, **result})
        changed = await self._call(getattr(self.service, action), pair)
        return JSONResponse({"ok": True, "action": action, "pair": pair.key, "changed": bool(changed)})

    async def export_memory(self, request: Request) -> Response:
        """GET /admin/memory?pair=en2es: the pair's translation memory as a TMX download (admin key)."""
        fields = dict(request.query_params)
        self.policy.check_admin(request.headers.get("x-admin-key") or fields.get("admin_key"))
        pair = Pair.parse(text_field(fields, "pair"))  # pure string parsing: never a path
        data = await self._call(self.service.export_memory, pair)
        return Response(data, media_type="application/x-tmx+xml",
                        headers={"Content-Disposition": attachment(f"{pair.key}.tmx")})

    # ------------------------------------------------------------------ OpenAI-compatible


_TRANSLATE_SCHEMA = {
    "type": "object",
    "required": ["q", "target"],
    "properties": {
        "q": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
              "description": "Text to translate, or a list of texts."},
        "source": {"type": "string", "default": "auto", "description": "Source code, or 'auto' to detect."},
        "target": {"type": "string", "description": "Target language code."},
        "format": {"type": "string", "enum": ["text", "html"], "default": "text"},
        "alternatives": {"type": "integer", "default": 0, "minimum": 0,
                         "description": "How many other translations to return as well (limits.max_alternatives)."},
        "glossary": {"description": "Terms to enforce: the id of a stored glossary, an object {source: target}, "
                                    "a list of [source, target] pairs, or lines 'source = target'."},
        "api_key": {"type": "string"},
    },
}


_DOCUMENT_SCHEMA = {
    "type": "object",
    "required": ["file", "target"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "The document (see /frontend/settings for the "
                                                                      "file types)."},
        "source": {"type": "string", "default": "auto"},
        "target": {"type": "string"},
        "glossary": {"description": "Terms to enforce, as for /translate."},
        "api_key": {"type": "string"},
    },
}


async def paced(policy: AccessPolicy, identity: str, exc: RateLimited) -> RateLimited:
    """A refusal held for the rest of the wait its caller was already given, if it came back early
    (`AccessPolicy.pace`): then answered with what is left of its new wait."""
    delay = policy.pace.delay(identity, exc.retry_after_s)
    if delay <= 0:
        return exc
    await asyncio.sleep(delay)
    return exc.later(delay)


def _refused_caller(api: RestApi, request: Request) -> str:
    """Who a refusal is for: the caller the route authorized, else the key the request shows or its address."""
    caller = _CALLER.get()
    if caller is None:
        caller = api.policy.identify(api._api_key(request), client_address(request))
    return caller.identity


def body_caps(limits: Any) -> tuple[int, int]:
    """(the cap on a JSON or form body, the cap on an upload's body), bytes: what the largest accepted request
    needs (limits.max_chars of UTF-8 in JSON escapes per item; limits.max_file_bytes) and an allowance."""
    return (limits.max_chars * 4 * max(1, min(limits.max_batch_items, 16)) + _JSON_OVERHEAD,
            limits.max_file_bytes + _JSON_OVERHEAD)


def _body_doc(schema: dict[str, Any], types: tuple[str, ...] = (JSON, FORM)) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {t: {"schema": schema} for t in types}}}


def create_app(service: TranslationServiceLike, cfg: Config, metrics: WebMetrics | None = None,
               policy: AccessPolicy | None = None) -> FastAPI:
    """The REST app. `app.state.metrics` and `app.state.api` are exposed for the UI and the tests; `policy` is
    shared with the web page when `web.server.build_app` mounts one."""
    metrics = metrics or WebMetrics(service)
    api = RestApi(service, cfg, metrics, policy)
    # Swagger UI and ReDoc served from the package, not a CDN: the server often runs without internet.
    app = FastAPIOffline(title="Hunyuan-MT translation server", version=__version__,
                  description="LibreTranslate-compatible translation API, OpenAI-compatible chat completions, "
                              "adapter administration and metrics. The web UI is at /ui.")
    app.state.metrics = metrics
    app.state.api = api
    # The connection caps and header deadline uvicorn_config reads (the REST app alone, as the Ray ingress without
    # the page and the tests serve it, took the defaults whatever the config said).
    app.state.server_config = cfg.server

    json_cap, file_cap = body_caps(cfg.limits)
    app.add_middleware(BodyLimitMiddleware, limits={
        "/translate": json_cap, "/detect": json_cap, "/v1": json_cap, "/admin": _JSON_OVERHEAD,
        "/suggest": _JSON_OVERHEAD, "/translate_file": file_cap, "/admin/memory": file_cap,
        "/v1/documents": file_cap,
    })
    if cfg.server.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(cfg.server.cors_origins), allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["*"])

    # Outermost: it sees every response, the body cap's 413s included.
    app.add_middleware(RequestCounter, counter=metrics.http_requests)

    @app.exception_handler(TranslationError)
    async def on_translation_error(request: Request, exc: TranslationError) -> JSONResponse:
        if isinstance(exc, RateLimited):
            exc = await paced(api.policy, _refused_caller(api, request), exc)
        return error_response(exc, openai_style=openai_route(request.url.path))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "Request failed."
        if exc.status_code == 404:
            message = f"Not found: {request.url.path[:80]}"
        elif exc.status_code == 405:
            message = f"Method {request.method} not allowed on {request.url.path[:80]}"
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return JSONResponse({"error": f"Invalid request: {where} {first.get('msg', '')}".strip()}, status_code=400)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(exc, openai_style=openai_route(request.url.path))

    app.add_api_route("/translate", api.translate, methods=["POST"], tags=["LibreTranslate"],
                      summary="Translate text", openapi_extra=_body_doc(_TRANSLATE_SCHEMA))
    app.add_api_route("/detect", api.detect, methods=["POST"], tags=["LibreTranslate"],
                      summary="Detect the language of a text",
                      openapi_extra=_body_doc({"type": "object", "required": ["q"], "properties": {
                          "q": {"type": "string"}, "api_key": {"type": "string"}}}))
    app.add_api_route("/languages", api.languages, methods=["GET"], tags=["LibreTranslate"],
                      summary="Languages and the targets each one can reach")
    app.add_api_route("/translate_file", api.translate_file, methods=["POST"], tags=["LibreTranslate"],
                      summary=f"Translate a document ({' '.join(LISTED_EXTENSIONS)})",
                      openapi_extra=_body_doc({"type": "object", "required": ["file", "target"], "properties": {
                          "file": {"type": "string", "format": "binary"}, "source": {"type": "string"},
                          "target": {"type": "string"}, "glossary": {"type": "string"},
                          "api_key": {"type": "string"}}}, (MULTIPART,)))
    app.add_api_route("/glossaries", api.glossaries_route, methods=["GET"], tags=["Service"],
                      summary="Stored glossaries: id → the language pairs each has")
    app.add_api_route("/download_file/{token}/{filename}", api.download_file, methods=["GET"],
                      name="download_file", tags=["LibreTranslate"], summary="Download a translated document")
    app.add_api_route("/frontend/settings", api.frontend_settings, methods=["GET"], tags=["LibreTranslate"],
                      summary="Settings LibreTranslate front ends read first (limits, keys, defaults)")
    app.add_api_route("/suggest", api.suggest, methods=["POST"], tags=["LibreTranslate"],
                      summary="Suggest a better translation (q, s, source, target): kept as a correction; 403 "
                              "when server.suggestions is off",
                      openapi_extra=_body_doc({"type": "object", "required": ["q", "s", "source", "target"],
                                               "properties": {k: {"type": "string"} for k in
                                                              ("q", "s", "source", "target", "api_key")}}))
    app.add_api_route("/v1/corrections", api.corrections, methods=["POST"], tags=["Service"], status_code=201,
                      summary="Record the right translation of a text: it answers that text from now on, and "
                              "trains the pair's next adapter",
                      openapi_extra=_body_doc({"type": "object", "required": ["q", "source", "target", "translation"],
                                               "properties": {k: {"type": "string"} for k in
                                                              ("q", "source", "target", "translation", "context",
                                                               "machine", "api_key")}}))

    async def spec() -> JSONResponse:
        return JSONResponse(app.openapi())

    app.add_api_route("/spec", spec, methods=["GET"], tags=["LibreTranslate"],
                      summary="This API's OpenAPI document (also at /openapi.json)")
    app.add_api_route("/health", api.health, methods=["GET"], tags=["Service"],
                      summary='{"status": "ok"} once warm (LibreTranslate\'s answer); 503 "starting" before')
    app.add_api_route("/status", api.status_route, methods=["GET"], tags=["Service"],
                      summary="Readiness, version, model, device, memory mode, warm-up report")
    app.add_api_route("/metrics", api.metrics_route, methods=["GET"], tags=["Service"],
                      summary="Prometheus metrics")
    app.add_api_route("/adapters", api.adapters, methods=["GET"], tags=["Service"],
                      summary="Known adapters and the resident ones")

    pair_doc = _body_doc({"type": "object", "required": ["pair"], "properties": {"pair": {"type": "string"}}})
    memory_doc = _body_doc({"type": "object", "required": ["file", "pair"], "properties": {
        "file": {"type": "string", "format": "binary", "description": ".tsv (source<TAB>target) or .tmx"},
        "pair": {"type": "string", "description": "the direction, e.g. en2es"}}}, (MULTIPART,))
    promote_doc = _body_doc({"type": "object", "required": ["pair", "version"], "properties": {
        "pair": {"type": "string"}, "version": {"type": "string", "description": "e.g. v2 (see /status adapters)"}}})
    glossary_doc = _body_doc({"type": "object", "required": ["id", "pair", "terms"], "properties": {
        "id": {"type": "string"}, "pair": {"type": "string"},
        "terms": {"type": "string", "description": "one 'source = target' (or source<TAB>target) per line"}}})
    for action in ("rescan", "pin", "unpin", "unload", "memory", "promote", "rollback", "glossary"):
        async def handler(request: Request, _action: str = action) -> JSONResponse:
            return await api.admin(request, _action)

        app.add_api_route(f"/admin/{action}", handler, methods=["POST"], tags=["Admin"],
                          summary=f"{action.capitalize()} (needs the X-Admin-Key header)",
                          openapi_extra={"rescan": None, "memory": memory_doc, "promote": promote_doc,
                                         "glossary": glossary_doc}.get(action, pair_doc))

    app.add_api_route("/admin/memory", api.export_memory, methods=["GET"], tags=["Admin"],
                      summary="A pair's translation memory as TMX (?pair=en2es; needs the X-Admin-Key header)")
    app.add_api_route("/v1/documents", api.submit_document, methods=["POST"], tags=["Documents"], status_code=202,
                      summary="Translate a document as a job: answers at once with its id",
                      openapi_extra=_body_doc(_DOCUMENT_SCHEMA, (MULTIPART,)))
    app.add_api_route("/v1/documents", api.document_jobs, methods=["GET"], tags=["Documents"],
                      summary="Your document jobs")
    app.add_api_route("/v1/documents/{job_id}", api.document_job, methods=["GET"], tags=["Documents"],
                      name="document_job", summary="A job's state, progress and seconds remaining (?wait=S: long poll)")
    app.add_api_route("/v1/documents/{job_id}", api.cancel_document, methods=["DELETE"], tags=["Documents"],
                      summary="Cancel a job")
    app.add_api_route("/v1/documents/{job_id}/result", api.document_result, methods=["GET"], tags=["Documents"],
                      name="document_result", summary="Download a finished job's document")
    # Downloads answer HEAD too (curl -I, download managers and link checkers ask it first): the same headers, no
    # body. Kept out of the OpenAPI document, where HEAD is implied by GET.
    for path, handler in (("/download_file/{token}/{filename}", api.download_file),
                          ("/v1/documents/{job_id}/result", api.document_result),
                          ("/admin/memory", api.export_memory)):
        app.add_api_route(path, handler, methods=["HEAD"], include_in_schema=False)
    app.add_api_route("/v1/chat/completions", api.chat_completions, methods=["POST"], tags=["OpenAI"],
                      summary="Translate the last user message; model = target ('es') or pair ('en2es')")
    app.add_api_route("/v1/models", api.models, methods=["GET"], tags=["OpenAI"], summary="Targets and pairs")
    return app


__all__ = ["create_app", "error_response", "RestApi", "LANGUAGES"]
