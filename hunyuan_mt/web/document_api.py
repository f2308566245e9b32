"""The REST API's document routes: LibreTranslate's `translate_file` and `download_file`, and document jobs
(`/v1/documents`: submit, follow with a long poll, fetch the result, cancel, list).

`DocumentRoutes` is the part of `api.RestApi` that serves them; `create_app` registers its handlers."""

from __future__ import annotations

import asyncio
import functools
import math
import time
from typing import Any, Callable
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile

from ..errors import InputTooLarge, InvalidInput
from ..documents import distinct_segments
from ..service.jobs import ENDED, JobSpec, JobView, check_job_id
from ..text import prompts
from ..text.languages import normalize_code
from ..scheduler.ticket import Ticket
from .auth import Caller
from .doctranslate import check_document_route, job_spec, translate_upload
from .downloads import attachment, safe_filename
from .requests import MULTIPART, client_address, read_fields, source_field, text_field, wait_disconnected

#: Longest long poll (GET /v1/documents/<id>?wait=S), seconds.
MAX_WAIT_S = 30.0


class DocumentRoutes:
    """Uploads, downloads and document jobs (methods of `RestApi`; they use its access checks and thread pool)."""

    async def _read_upload(self, request: Request) -> tuple[Caller, bytes, str, str, str, Any, str | None]:
        """A document upload's fields, checked: (caller, the file's bytes, its safe name, source, target,
        glossary, context). The multipart spool is closed before this returns."""
        try:
            # A caller whose document reading is spent is told before its body is read: one that loops on its
            # refusals then costs the server a header's worth each time, not a multipart parse.
            self.parsers.check(self.policy.identify(self._api_key(request), client_address(request)).identity)
            fields = await read_fields(request, allow=(MULTIPART,))
            caller = self._authorize(request, fields)
            upload = fields.get("file")
            if not isinstance(upload, UploadFile):
                raise InvalidInput("Invalid request: missing file parameter")
            source = source_field(fields)
            target = text_field(fields, "target")
            await self._check_codes(source, target)
            glossary = self.glossaries.resolve(fields.get("glossary"), source, target)
            # Beyond LibreTranslate: what the document is about, shaping every segment (the Hunyuan prompt's
            # context); checked here, so a bad one is refused before a job exists, and charged once.
            context = prompts.clean_context(fields.get("context"), self.cfg.limits.max_chars)
            data = await upload.read(self.cfg.limits.max_file_bytes + 1)
            if len(data) > self.cfg.limits.max_file_bytes:
                raise InputTooLarge(f"File too large: more than {self.cfg.limits.max_file_bytes} bytes "
                                    f"(limit {self.cfg.limits.max_file_bytes}).")
            filename = safe_filename(upload.filename or "document.txt")
        finally:
            await request.close()  # removes python-multipart's spooled temp file
        return caller, data, filename, source, target, glossary, context

    async def translate_file(self, request: Request) -> JSONResponse:
        caller, data, filename, source, target, glossary, context = await self._read_upload(request)
        self.downloads.check_quota(caller)  # before any work: its link could not be kept
        charge = functools.partial(self.policy.spend_chars, caller, context=context)
        ticket = Ticket(background=True, owner=caller.identity)
        rendered, _ = await self._watched(request, ticket, "file", functools.partial(
            translate_upload, self.service, data, filename, source, target, self.cfg.limits, None, charge, glossary,
            ticket, context, None, self.parsers.reader(lambda: ticket.cancelled, caller.identity),
            self.cfg.quality.docx_comments))
        owner = caller if self.policy.downloads_owned else None
        token = self.downloads.put(rendered.data, rendered.filename, rendered.media_type, owner, caller)
        # Starlette puts path parameters in as they are: a name with spaces or non-ASCII letters made a link that
        # curl and urllib refuse. Percent-encoded, the route still receives the name decoded.
        url = str(request.url_for("download_file", token=token,
                                  filename=quote(safe_filename(rendered.filename), safe="")))
        body: dict[str, Any] = {"translatedFileUrl": url}
        if rendered.note:
            body["note"] = rendered.note
        return JSONResponse(body)

    async def _upload(self, request: Request) -> tuple[Caller, bytes, Any, JobSpec]:
        """A job's upload, read and checked: (caller, its bytes, the document read, what the job runs)."""
        caller, data, filename, source, target, glossary, context = await self._read_upload(request)
        # Read now: a file the server cannot take is refused here, not found out later as a failed job. A client
        # that leaves meanwhile stops the read.
        ticket = Ticket(background=True, owner=caller.identity)
        document = await self._watched(request, ticket, "file", functools.partial(
            self.parsers.read, data, filename, self.cfg.limits, lambda: ticket.cancelled, caller.identity))
        target = normalize_code(target)
        # ... and so is a pair no route serves (auto-detected now, on the document's first characters).
        source = await self._call(check_document_route, self.service, source, target, document.segments)
        return caller, data, document, job_spec(document.filename, source, target, glossary, context)

    def _may(self, request: Request) -> Callable[[Any], bool]:
        """Whether this request may see a job: its uploader's key, or its address for a job uploaded without one
        (`AccessPolicy.may_fetch`, keyed_by_address=False)."""
        key, address = self._api_key(request), client_address(request)
        return lambda owner: self.policy.may_fetch(owner, key, address, keyed_by_address=False)

    def _job_body(self, request: Request, view: JobView) -> dict[str, Any]:
        body = view.to_dict()
        if view.state == "done":
            body["result_url"] = str(request.url_for("document_result", job_id=view.id))
        return body

    async def submit_document(self, request: Request) -> JSONResponse:
        caller, data, document, spec = await self._upload(request)
        self.jobs.check_quota(caller)  # before the characters are charged
        self.policy.spend_chars(caller, sum(len(s) for s in document.segments), spec.context)
        view = await self._call(self.jobs.submit_upload, spec, data, document, distinct_segments(document),
                                caller if self.policy.downloads_owned else None, caller)
        url = str(request.url_for("document_job", job_id=view.id))
        return JSONResponse(self._job_body(request, view), status_code=202, headers={"Location": url})

    async def document_job(self, request: Request, job_id: str) -> JSONResponse:
        """A job's state; `?wait=S` holds the answer up to S seconds (at most 30) until it changes: a long poll."""
        check_job_id(job_id)
        wait = request.query_params.get("wait")
        may = self._may(request)
        if wait is None:
            view = self.jobs.view(job_id, may)
        else:
            try:
                seconds = float(wait)
            except ValueError:
                seconds = math.nan
            if math.isnan(seconds):
                raise InvalidInput(f"Invalid request: wait must be a number of seconds (at most {MAX_WAIT_S:g}).")
            view = await self._long_poll(request, job_id, may, min(MAX_WAIT_S, max(0.0, seconds)))
        return JSONResponse(self._job_body(request, view))

    async def _long_poll(self, request: Request, job_id: str, may: Callable[[Any], bool], seconds: float) -> JobView:
        """The job once it changes, or after `seconds`: awaited on the event loop (the job's listener wakes it),
        holding no thread. Checked like every job route (another caller's job is a 404, before anything waits),
        counted as a call (the rate limit) and within the caller's share of open polls (`shares.long_polls`,
        429 with the seconds until its soonest poll ends). A client that leaves ends its poll."""
        caller = self.policy.identify(self._api_key(request), client_address(request))
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()
        before, stop = self.jobs.watch(job_id, may, lambda: loop.call_soon_threadsafe(changed.set))
        try:
            if before.state in ENDED or seconds <= 0:
                return before
            self.policy.calls.hit(caller.identity)
            ends = loop.time() + seconds
            with self.policy.long_polls.hold(caller.identity, ends_at=time.monotonic() + seconds):
                gone = asyncio.ensure_future(wait_disconnected(request))
                try:
                    while not gone.done():
                        changed.clear()
                        now = self.jobs.view(job_id, may)
                        if now.state in ENDED or (now.state, now.done) != (before.state, before.done):
                            return now
                        left = ends - loop.time()
                        if left <= 0:
                            return now
                        woken = asyncio.ensure_future(changed.wait())
                        await asyncio.wait({woken, gone}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                        woken.cancel()
                finally:
                    gone.cancel()
            return self.jobs.view(job_id, may)
        finally:
            stop()

    async def document_result(self, request: Request, job_id: str) -> Response:
        check_job_id(job_id)
        rendered = self.jobs.result(job_id, self._may(request))
        return Response(rendered.data, media_type=rendered.media_type,
                        headers={"Content-Disposition": attachment(safe_filename(rendered.filename))})

    async def cancel_document(self, request: Request, job_id: str) -> JSONResponse:
        check_job_id(job_id)
        return JSONResponse(self._job_body(request, self.jobs.cancel(job_id, self._may(request))))

    async def document_jobs(self, request: Request) -> JSONResponse:
        return JSONResponse({"jobs": [self._job_body(request, v) for v in self.jobs.list(self._may(request))]})

    async def download_file(self, request: Request, token: str, filename: str) -> Response:
        stored = self.downloads.get(token)
        # Someone else's file answers exactly as a missing one: the link's existence is not confirmed.
        if stored is None or filename != stored.filename or not self.policy.may_fetch(
                stored.owner, self._api_key(request), client_address(request)):
            return JSONResponse({"error": "File not found or expired."}, status_code=404)
        if request.method == "GET":  # a HEAD only asks about the file
            self.downloads.taken(token)
        return Response(stored.data, media_type=stored.media_type,
                        headers={"Content-Disposition": attachment(stored.filename)})
