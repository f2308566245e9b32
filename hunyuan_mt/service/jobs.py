"""Document jobs: an upload answers at once with an id; the document translates in the background.

A job is queued, then translating (with `done`/`total` segments and `seconds_remaining` from the rate measured so
far, or from the last documents' rate before its first segment is done), then done, error or cancelled. The
result is kept until the job expires (`jobs.ttl_s` after it ended). A job's rows are background rows (ticket.py):
they yield to interactive requests, and cancelling a job takes them out of the engine at its next step.

With a store (the server's), every job survives a restart, `kill -9` included: its upload, state and each
finished segment are written as they happen, a queued or running job is run again at the next start and sends only
the segments not yet done, and a finished one stays downloadable until it expires. Shutting down leaves running
jobs for the next start. Without a store (tests of the bookkeeping) jobs live in memory only.
"""

from __future__ import annotations

import itertools
import json
import math
import logging
import os
import queue
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..scheduler.callers import Caller, decode_owner, encode_owner
from ..config import JobsConfig
from ..documents import Document, RenderedDocument
from ..errors import Busy, Cancelled, InvalidInput, RateLimited, ServerStopping, TranslationError, http_status
from ..scheduler.ticket import Ticket

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger(__name__)

STATES = ("queued", "translating", "done", "error", "cancelled")
ENDED = ("done", "error", "cancelled")

#: A job's work: translate its document, reporting progress(done, total), under the job's ticket → (the translated
#: document, the source language used).
Work = Callable[[Callable[[int, int], None], Ticket], tuple[RenderedDocument, str]]


#: Whether the caller asking may see a job uploaded by `owner` (None: anyone with the id).
Access = Callable[[Any], bool] | None


@dataclass(frozen=True)
class JobSpec:
    """What a document job's work needs to run again after a restart, besides its upload."""

    filename: str
    #: The source as resolved at submission (an "auto" source was detected then).
    source: str
    target: str
    glossary_terms: tuple[tuple[str, str], ...] | None = None
    glossary_name: str | None = None
    context: str | None = None

    def to_json(self) -> str:
        return json.dumps({"glossary_terms": self.glossary_terms, "glossary_name": self.glossary_name,
                           "context": self.context})

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "JobSpec":
        options = json.loads(row["options"])
        terms = options.get("glossary_terms")
        return cls(row["filename"], row["source"], row["target"],
                   tuple((s, t) for s, t in terms) if terms is not None else None,
                   options.get("glossary_name"), options.get("context"))


class Checkpoint:
    """A job's finished segments, by index among its distinct segments: what its work skips when it runs again
    (`finished`), and where it writes each chunk as it finishes (`record`)."""

    def __init__(self, jobs: "DocumentJobs", job: "Job") -> None:
        self._jobs, self._job = jobs, job
        self._done: dict[int, tuple[str, str | None]] = (
            jobs.store.jobs.segments(job.id) if jobs.store is not None else {})

    def finished(self) -> dict[int, tuple[str, str | None]]:
        return dict(self._done)

    def record(self, done: list[tuple[int, str, str | None]]) -> None:
        fresh = [(i, text, origin) for i, text, origin in done if i not in self._done]
        for i, text, origin in fresh:
            self._done[i] = (text, origin)
        if self._jobs.store is not None:
            self._jobs.store.jobs.finish_segments(self._job.id, fresh, len(self._done))


#: A document job's work from its spec, its upload (bytes, or the document already read) and its checkpoint.
Runner = Callable[[JobSpec, "bytes | Document", Checkpoint], Work]


class JobNotFound(TranslationError):
    """No such job for this caller (never existed, expired, or someone else's: all answer the same)."""

    http_status = 404


class JobNotReady(TranslationError):
    """The job is queued or translating: its document comes later."""

    http_status = 409


class JobHasNoResult(TranslationError):
    """The job ended without a document (cancelled or failed): polling again will not change that."""

    http_status = 410


@dataclass(eq=False)
class Job:
    id: str
    filename: str
    source: str
    target: str
    #: Who uploaded it (the REST caller, the page's visitor), for the `may` check of every later call.
    owner: Any
    created: float
    #: Whose quota it counts against (jobs.per_caller): the caller, even where jobs are not owned.
    caller: Any = None
    state: str = "queued"
    done: int = 0
    total: int = 0
    started: float | None = None
    #: When the first segment was done: the rate is measured from there (reading the file is not translating).
    first_done: float | None = None
    ended: float | None = None
    detected_source: str | None = None
    result: RenderedDocument | None = None
    error: str | None = None
    error_status: int | None = None
    ticket: Ticket = field(default_factory=lambda: Ticket(background=True))
    #: Ordinal of submission, for the queue position.
    seq: int = 0
    #: Kept in the store (an upload's job): each change is written through, the result is a file.
    saved: bool = False
    result_path: Path | None = None


@dataclass(frozen=True)
class JobView:
    """What a client is told about a job (the REST body, the page's progress)."""

    id: str
    state: str
    filename: str
    source: str
    target: str
    done: int
    total: int
    seconds_remaining: float | None
    queue_position: int | None
    error: str | None
    note: str
    result_filename: str | None
    expires_in_s: float | None

    @property
    def progress(self) -> float:
        if self.state == "done":
            return 1.0
        return round(self.done / self.total, 4) if self.total else 0.0

    def to_dict(self) -> dict[str, Any]:
        body = {"id": self.id, "state": self.state, "filename": self.filename, "source": self.source,
                "target": self.target, "progress": self.progress, "done": self.done, "total": self.total,
                "seconds_remaining": self.seconds_remaining}
        if self.queue_position is not None:
            body["queue_position"] = self.queue_position
        if self.error is not None:
            body["error"] = self.error
        if self.note:
            body["note"] = self.note
        if self.result_filename is not None:
            body["result_filename"] = self.result_filename
        if self.expires_in_s is not None:
            body["expires_in_s"] = round(self.expires_in_s)
        return body


class DocumentJobs:
    """Jobs by id: submit, look up, download, cancel; `workers` run at once, ended jobs expire after `ttl_s`.

    `store` keeps jobs across restarts; `runner` makes an upload's work (`submit_upload`, and the jobs found in
    the store at start). Times are wall-clock seconds, so that they mean the same after a restart."""

    def __init__(self, cfg: JobsConfig, clock: Callable[[], float] = time.time, store: "Store | None" = None,
                 runner: Runner | None = None) -> None:
        self.cfg = cfg
        self.store = store
        self.runner = runner
        self._clock = clock
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Condition()
        #: Job id → what to call when it changes (`watch`: long polls awaiting it on an event loop).
        self._listeners: dict[str, set[Callable[[], None]]] = {}
        self._seq = itertools.count()
        self._closing = False
        # Daemon threads: a job left running does not hold the process at exit (the engine it waits on closes).
        self._queue: queue.Queue[tuple[Job, Work] | None] = queue.Queue()
        #: Segments per second of the last documents (an exponential average): the estimate before a job's own.
        self._rate: float | None = None
        #: This process, as the store knows who runs an unfinished job ("host:pid:token").
        self.runner_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._stopped = threading.Event()
        resumed = self._restore() if store is not None else []
        self._workers = [threading.Thread(target=self._work, name=f"hmt-job-{n}", daemon=True)
                         for n in range(cfg.workers)]
        for worker in self._workers:
            worker.start()
        for item in resumed:
            self._queue.put(item)
        if store is not None:
            threading.Thread(target=self._keep_alive, name="hmt-job-heartbeat", daemon=True).start()

    # ------------------------------------------------------------------ public

    def submit(self, work: Work, filename: str, source: str, target: str, total: int, owner: Any = None,
               caller: Any = None) -> JobView:
        """Queue a document already read and checked (`total` segments to translate); returns at once. The job
        lives in memory only (see `submit_upload`). RateLimited when `caller` already has `per_caller` jobs queued
        or translating; Busy when `max_jobs` are, in all. Finished jobs count against neither."""
        job = self._admit(filename, source, target, total, owner, caller)
        with self._lock:
            self._jobs[job.id] = job
        self._queue.put((job, work))
        log.info("job %s: %s queued (%s→%s, %d segments)", job.id, filename, source, target, total)
        return self.view(job.id)

    def submit_upload(self, spec: JobSpec, data: bytes, document: Document, total: int, owner: Any = None,
                      caller: Any = None) -> JobView:
        """Queue an upload (`data`, already read as `document` and checked); with a store, the upload and the job
        are written down before this returns, so the job survives a restart from here on."""
        if self.runner is None:
            raise RuntimeError("DocumentJobs needs a runner for uploads")
        job = self._admit(spec.filename, spec.source, spec.target, total, owner, caller)
        if self.store is not None:
            folder = self.store.files / job.id
            folder.mkdir(parents=True, exist_ok=True)
            partial = folder / "upload.partial"
            partial.write_bytes(data)
            partial.replace(folder / "upload")
            job.saved = True
            self.store.jobs.create(
                job.id, seq=job.seq, filename=spec.filename, source=spec.source, target=spec.target, owner=encode_owner(owner),
                caller=encode_owner(caller), state="queued", done=0, total=total, created=job.created,
                upload_path=str(folder / "upload"), options=spec.to_json(), runner=self.runner_id,
                heartbeat=self._clock())
        with self._lock:
            self._jobs[job.id] = job
        self._queue.put((job, self.runner(spec, document, Checkpoint(self, job))))
        log.info("job %s: %s queued (%s→%s, %d segments)", job.id, spec.filename, spec.source, spec.target, total)
        return self.view(job.id)

    def _admit(self, filename: str, source: str, target: str, total: int, owner: Any, caller: Any) -> Job:
        now = self._clock()
        with self._lock:
            self._expire(now)
            if caller is not None:
                self._check_quota(caller, now)
            unfinished = sum(1 for j in self._jobs.values() if j.state not in ENDED)
            if unfinished >= self.cfg.max_jobs:
                raise Busy(f"{unfinished} document jobs are queued or translating (jobs.max_jobs); try again when "
                           "one has finished.")
            return Job(secrets.token_hex(12), filename, source, target, owner, now, caller=caller, total=total,
                       seq=next(self._seq), ticket=Ticket(background=True, owner=_identity(caller)))

    def view(self, job_id: str, may: Access = None) -> JobView:
        with self._lock:
            return self._view(self._get(job_id, may), self._clock())

    def wait(self, job_id: str, may: Access = None, timeout: float | None = None,
             after: JobView | None = None) -> JobView:
        """The job once it has changed from `after` (or ended), at most `timeout` seconds later: a long poll."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._lock:
            while True:
                job = self._get(job_id, may)
                current = self._view(job, self._clock())
                if job.state in ENDED or after is None or (current.state, current.done) != (after.state, after.done):
                    return current
                left = None if deadline is None else deadline - self._clock()
                if left is not None and left <= 0:
                    return current
                self._lock.wait(left)

    def watch(self, job_id: str, may: Access, listener: Callable[[], None]) -> tuple[JobView, Callable[[], None]]:
        """(the job now, the function that stops the watch): `listener` is called, from the thread that changes
        it, each time the job changes. A long poll awaits that instead of holding a thread (`wait` does); the
        listener must be quick (an event loop's `call_soon_threadsafe`)."""
        with self._lock:
            view = self._view(self._get(job_id, may), self._clock())
            self._listeners.setdefault(job_id, set()).add(listener)

        def stop() -> None:
            with self._lock:
                listeners = self._listeners.get(job_id)
                if listeners is not None:
                    listeners.discard(listener)
                    if not listeners:
                        del self._listeners[job_id]
        return view, stop

    def result(self, job_id: str, may: Access = None) -> RenderedDocument:
        with self._lock:
            job = self._get(job_id, may)
            if job.state == "cancelled":
                raise JobHasNoResult(f"Job {job_id} was cancelled; it has no document to download.")
            if job.state == "error":
                raise JobHasNoResult(f"Job {job_id} failed ({job.error}); it has no document to download.")
            if job.state != "done" or job.result is None:
                raise JobNotReady(f"Job {job_id} is {job.state}; its document can be downloaded once it is done.")
            return job.result

    def cancel(self, job_id: str, may: Access = None) -> JobView:
        """Cancel a queued or running job (its rows leave the engine at the next step); an ended job is left as
        it is. Returns the job."""
        with self._lock:
            job = self._get(job_id, may)
            if job.state not in ENDED:
                job.ticket.cancel("job cancelled")
                if job.state == "queued":
                    self._end(job, "cancelled", self._clock())
            return self._view(job, self._clock())

    def list(self, may: Access = None) -> list[JobView]:
        with self._lock:
            now = self._clock()
            self._expire(now)
            return [self._view(j, now) for j in sorted(self._jobs.values(), key=lambda j: j.seq)
                    if may is None or may(j.owner)]

    def close(self) -> None:
        """Stop the workers. A job kept in the store is left as it is, for the next start to run again (its
        rows leave the engine as it closes); a job in memory only is cancelled."""
        self._stopped.set()
        with self._lock:
            self._closing = True
            for job in self._jobs.values():
                if job.state not in ENDED and not job.saved:
                    job.ticket.cancel("server shutting down")
        for _ in self._workers:
            self._queue.put(None)
        if self.store is not None:
            self.store.jobs.release(self.runner_id)

    # ------------------------------------------------------------------ restarts

    def _restore(self) -> list[tuple[Job, Work]]:
        """Jobs the store kept: ended ones to answer for until they expire, unfinished ones of a process that is
        gone to run again (their finished segments are not sent again). Returns the work to queue, in submission
        order."""
        assert self.store is not None
        now = self._clock()
        queued: list[tuple[Job, Work]] = []
        gone: list[str] = []
        for row in self.store.jobs.load():
            job = _job_of(row)
            if job.ended is not None and now - job.ended > self.cfg.ttl_s:
                gone.append(job.id)
                continue
            if job.state == "done" and row["result_path"]:
                path = Path(row["result_path"])
                try:
                    job.result = RenderedDocument(path.read_bytes(), row["result_filename"], row["media_type"],
                                                  row["note"] or "")
                except OSError:
                    job.state, job.error, job.error_status = "error", "its translated file was lost", 500
                job.result_path = path
            elif job.state not in ENDED:
                item = self._take_over(job, row, now)
                if item is None:
                    continue  # a live process runs it
                queued.append(item)
            self._jobs[job.id] = job
        self._seq = itertools.count(max((j.seq for j in self._jobs.values()), default=0) + 1)
        self._forget(gone)
        return queued

    def _take_over(self, job: Job, row: dict[str, Any], now: float) -> tuple[Job, Work] | None:
        """An unfinished job's work, claimed for this process, when the process that held it is gone; None when
        a live one holds it, or another took it first."""
        assert self.store is not None
        if not _gone(row["runner"], row["heartbeat"], now) or \
                not self.store.jobs.claim(job.id, self.runner_id, now, row["runner"]):
            return None
        upload = Path(row["upload_path"])
        if self.runner is None or not upload.is_file():
            job.state, job.ended = "error", now
            job.error, job.error_status = "its upload was lost in a restart", 500
            self.store.jobs.save(job.id, state="error", ended=now, error=job.error, error_status=500)
            return None
        job.state, job.started = "queued", None
        self.store.jobs.save(job.id, state="queued", started=None)
        log.info("job %s: %s queued again after a restart (%d of %d segments done)", job.id, job.filename,
                 job.done, job.total)
        return job, self.runner(JobSpec.from_row(row), upload.read_bytes(), Checkpoint(self, job))

    def _keep_alive(self) -> None:
        """Every `HEARTBEAT_S`: this process's unfinished jobs marked alive, and the jobs of a process found gone
        since (another replica's, on a shared store) taken over."""
        assert self.store is not None
        while not self._stopped.wait(HEARTBEAT_S):
            try:
                now = self._clock()
                self.store.jobs.beat(self.runner_id, now)
                with self._lock:
                    known = set(self._jobs)
                for row in self.store.jobs.load(unfinished=True):
                    if row["id"] in known:
                        continue
                    job = _job_of(row)
                    item = self._take_over(job, row, now)
                    if item is not None:
                        with self._lock:
                            self._jobs[job.id] = job
                        self._queue.put(item)
            except Exception:  # noqa: BLE001 - a database hiccup must not end the heartbeat; the next beat retries
                log.exception("document jobs: the heartbeat failed")

    def _forget(self, job_ids: list[str]) -> None:
        """Expired jobs out of the store, and their files off the disk."""
        if self.store is None or not job_ids:
            return
        self.store.jobs.delete(job_ids)
        for job_id in job_ids:
            shutil.rmtree(self.store.files / job_id, ignore_errors=True)

    # ------------------------------------------------------------------ the work

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            self._run(*item)

    def _run(self, job: Job, work: Work) -> None:
        with self._lock:
            if job.state != "queued" or self._closing:  # cancelled while it waited, or shutting down
                return
            job.state, job.started = "translating", self._clock()
            self._changed(job)
        self._save(job, state="translating", started=job.started)

        def progress(done: int, total: int) -> None:
            with self._lock:
                if done > 0 and job.first_done is None:
                    job.first_done = self._clock()
                job.done, job.total = max(job.done, done), total
                self._changed(job)

        try:
            rendered, used = work(progress, job.ticket)
        except Exception as exc:  # noqa: BLE001 - a job's failure is reported in the job, the worker goes on
            with self._lock:
                stopping = self._closing or isinstance(exc, ServerStopping)  # a signal stops its reader first
                if stopping and job.saved and not (isinstance(exc, Cancelled) and job.ticket.cancelled
                                                   and job.ticket.reason == "job cancelled"):
                    log.info("job %s: left for the next start (%d of %d segments done)", job.id, job.done,
                             job.total)
                    return  # the engine closed under it: the next start runs it again
            self._fail(job, exc)
            return
        if job.saved and self.store is not None:
            path = self.store.files / job.id / "result"
            partial = path.with_suffix(".partial")
            partial.write_bytes(rendered.data)
            partial.replace(path)
            job.result_path = path
        with self._lock:
            job.result, job.detected_source = rendered, used
            job.done = job.total
            now = self._clock()
            if job.started is not None and job.total and now > job.started:
                rate = job.total / (now - job.started)
                self._rate = rate if self._rate is None else 0.5 * self._rate + 0.5 * rate
            self._end(job, "cancelled" if job.ticket.cancelled else "done", now)
            self._expire(now)  # its result may take the kept results past jobs.max_kept_bytes
        log.info("job %s: done, %d segments", job.id, job.total)

    def _fail(self, job: Job, exc: Exception) -> None:
        with self._lock:
            if isinstance(exc, Cancelled):
                self._end(job, "cancelled", self._clock())
                return
            if isinstance(exc, TranslationError):
                job.error, job.error_status = exc.message, http_status(exc)
                log.info("job %s: %s", job.id, exc.message)
            else:
                log.error("job %s failed", job.id, exc_info=exc)
                job.error, job.error_status = f"Internal error: {type(exc).__name__}.", 500
            self._end(job, "error", self._clock())

    def _save(self, job: Job, **fields: Any) -> None:
        if job.saved and self.store is not None:
            self.store.jobs.save(job.id, **fields)

    # ------------------------------------------------------------------ bookkeeping (caller holds _lock)

    def _end(self, job: Job, state: str, now: float) -> None:
        job.state, job.ended = state, now
        result = job.result
        self._save(job, state=state, ended=now, done=job.done, error=job.error, error_status=job.error_status,
                   detected_source=job.detected_source,
                   result_path=str(job.result_path) if job.result_path is not None else None,
                   result_filename=result.filename if result is not None else None,
                   media_type=result.media_type if result is not None else None,
                   note=result.note if result is not None else None)
        self._changed(job)

    def _changed(self, job: Job) -> None:
        """Wake whoever waits on a job: `wait` (a thread) and `watch`'s listeners (a long poll's event loop)."""
        self._lock.notify_all()
        for listener in list(self._listeners.get(job.id, ())):
            listener()

    def _get(self, job_id: str, may: Access) -> Job:
        self._expire(self._clock())
        job = self._jobs.get(job_id) if isinstance(job_id, str) else None
        if job is None or (may is not None and not may(job.owner)):
            raise JobNotFound(f"No job {str(job_id)[:40]!r}: it does not exist, has expired, or is not yours.")
        return job

    def check_quota(self, caller: Any) -> None:
        """RateLimited when `caller` has `per_caller` jobs queued or translating: asked before the upload is
        charged."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            self._check_quota(caller, now)

    def _check_quota(self, caller: Any, now: float) -> None:
        # A job restored from the store keeps its caller's key as a hash: compared as the store writes them.
        mine = [j for j in self._jobs.values() if j.state not in ENDED and _same_caller(j.caller, caller)]
        if len(mine) < self.cfg.per_caller:
            return
        # When the first of them is likely done: the soonest estimate (the jobs' own rates, else the last
        # documents'), or a minute before anything was measured.
        ends = [left for j in mine if (left := self._remaining(j, now)) is not None]
        wait = max(1, math.ceil(min(ends))) if ends else 60
        raise RateLimited(f"You have {len(mine)} document jobs queued or translating, the most one caller may "
                          f"(jobs.per_caller); try again in {wait} s, when the first of them is likely done.", wait)

    def _expire(self, now: float) -> None:
        gone = [k for k, j in self._jobs.items() if j.ended is not None and now - j.ended > self.cfg.ttl_s]
        gone += self._over_budget(set(gone))
        for k in gone:
            del self._jobs[k]
        self._forget(gone)

    def _over_budget(self, leaving: set[str]) -> list[str]:
        """Finished jobs to forget before they expire so that their results fit `max_kept_bytes`: the oldest of
        the caller who keeps the most, one at a time, so a caller who fills the budget loses its own first."""
        kept = {k: j for k, j in self._jobs.items() if k not in leaving and j.ended is not None}
        sizes = {k: len(j.result.data) if j.result is not None else 0 for k, j in kept.items()}
        total = sum(sizes.values())
        gone: list[str] = []
        while total > self.cfg.max_kept_bytes and kept:
            per_caller: dict[str | None, int] = {}
            for k, j in kept.items():
                per_caller[encode_owner(j.caller)] = per_caller.get(encode_owner(j.caller), 0) + sizes[k]
            largest = max(per_caller, key=lambda c: per_caller[c])
            oldest = min((k for k, j in kept.items() if encode_owner(j.caller) == largest),
                         key=lambda k: kept[k].ended or 0.0)
            total -= sizes[oldest]
            del kept[oldest]
            gone.append(oldest)
            log.info("job %s: its result expires early to keep results within jobs.max_kept_bytes", oldest)
        return gone

    def _view(self, job: Job, now: float) -> JobView:
        position = None
        if job.state == "queued":
            position = sum(1 for j in self._jobs.values() if j.state == "queued" and j.seq < job.seq) + 1
        note = ""
        if job.state == "done" and job.result is not None:
            note = job.result.note
        source = job.detected_source or job.source
        return JobView(job.id, job.state, job.filename, source, job.target, job.done, job.total,
                       self._remaining(job, now), position, job.error, note,
                       job.result.filename if job.result is not None else None,
                       None if job.ended is None else max(0.0, self.cfg.ttl_s - (now - job.ended)))

    def _remaining(self, job: Job, now: float) -> float | None:
        """Seconds left, from the job's own rate once a segment is done, else the last documents' rate."""
        if job.state in ENDED:
            return 0.0 if job.state == "done" else None
        if job.state == "translating" and job.first_done is not None and job.done and job.started is not None:
            rate = job.done / max(now - job.started, 1e-6)
            return round((job.total - job.done) / rate, 1)
        if self._rate is None:
            return None
        # Before its own rate is known: the jobs running ahead of it and its own segments, at the last rate.
        ahead = 0 if job.state == "translating" else sum(
            j.total - j.done for j in self._jobs.values() if j.state == "translating")
        return round((ahead + job.total - job.done) / self._rate, 1)



#: Seconds between two heartbeats of a process's unfinished jobs; a job whose heartbeat is `STALE_S` old is taken
#: over by another process on the store (at once, when its process ran on this machine and is gone).
HEARTBEAT_S = 10.0
STALE_S = 30.0


def _gone(runner: str | None, heartbeat: float | None, now: float) -> bool:
    """Whether the process that holds a job is gone: none holds it, it ran on this machine and its pid is not
    alive, or it has not beaten for `STALE_S`."""
    if not runner:
        return True
    host, _, rest = runner.partition(":")
    pid = rest.partition(":")[0]
    if host == socket.gethostname() and pid.isdigit():
        if int(pid) == os.getpid():
            return False  # this process (another DocumentJobs of it, or this one): it is not gone
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
    return heartbeat is None or now - heartbeat > STALE_S


def _job_of(row: dict[str, Any]) -> Job:
    caller = decode_owner(row["caller"])
    return Job(row["id"], row["filename"], row["source"], row["target"], decode_owner(row["owner"]), row["created"],
               caller=caller, state=row["state"], done=row["done"], total=row["total"],
               started=row["started"], ended=row["ended"], detected_source=row["detected_source"],
               error=row["error"], error_status=row["error_status"], seq=row["seq"], saved=True,
               ticket=Ticket(background=True, owner=_identity(caller)))


def _identity(caller: Any) -> str | None:
    """Whose rows a job's are, for the engine's turns between callers (ticket.py)."""
    if caller is None:
        return None
    return caller.identity if isinstance(caller, Caller) else str(caller)


def _same_caller(a: Any, b: Any) -> bool:
    return a == b or encode_owner(a) == encode_owner(b)


def check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not (1 <= len(job_id) <= 64) or not job_id.isalnum():
        raise InvalidInput("Invalid request: a job id is letters and digits.")
    return job_id
