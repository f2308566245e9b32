"""Document jobs: states, progress and estimates, cancel, expiry and access (with a scripted worker and a fake
clock), then the REST routes on the live server with a real client, and what a client that goes away frees.

The engine is held where a test needs it with its `before_generate` seam (called with the rows of every forward),
so a cancel or a disconnect lands between two known steps; assertions read the forwards' rows, never timings.
"""

from __future__ import annotations

import io
import threading
import time
from typing import Any, Callable

import docx
import httpx
import pytest

from hunyuan_mt.config import JobsConfig
from hunyuan_mt.documents import RenderedDocument
from hunyuan_mt.errors import Busy, Cancelled, RateLimited
from hunyuan_mt.service.jobs import DocumentJobs, JobHasNoResult, JobNotFound, JobNotReady
from hunyuan_mt.scheduler.ticket import Ticket
from seams import eventually, hold, leases
from web_server import LiveServer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Script:
    """A job's work that stops where the test says: `steps` are (done, total) reports, each after `go` is set."""

    def __init__(self, steps: list[tuple[int, int]]) -> None:
        self.steps = steps
        self.go = threading.Semaphore(0)
        self.reached = threading.Semaphore(0)
        self.ran = False

    def __call__(self, progress: Callable[[int, int], None], ticket: Ticket) -> tuple[RenderedDocument, str]:
        self.ran = True
        for done, total in self.steps:
            self.reached.release()
            assert self.go.acquire(timeout=30)
            if ticket.cancelled:
                raise Cancelled(f"Cancelled: {ticket.reason}.")
            progress(done, total)
        return RenderedDocument(b"translated", "notes.es.txt", "text/plain", "a note"), "en"

    def step(self) -> None:
        assert self.reached.acquire(timeout=30)
        self.go.release()


def settle(jobs: DocumentJobs, job_id: str, until: Callable[[Any], bool]) -> Any:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        view = jobs.view(job_id)
        if until(view):
            return view
        time.sleep(0.005)
    raise AssertionError(f"job {job_id} never got there: {jobs.view(job_id)}")


def test_a_job_goes_queued_translating_done_with_progress_and_an_estimate() -> None:
    clock = Clock()
    jobs = DocumentJobs(JobsConfig(workers=1), clock=clock)
    work = Script([(0, 8), (2, 8), (8, 8)])
    view = jobs.submit(work, "notes.txt", "en", "es", total=8)
    assert (view.state, view.total, view.done) in {("queued", 8, 0), ("translating", 8, 0)}
    work.step()
    settle(jobs, view.id, lambda v: v.state == "translating")
    assert jobs.view(view.id).seconds_remaining is None  # no rate known yet: no made-up number
    clock.now += 10
    work.step()
    got = settle(jobs, view.id, lambda v: v.done == 2)
    assert got.progress == 0.25 and got.seconds_remaining == 30.0  # 2 segments in 10 s, 6 left
    with pytest.raises(JobNotReady, match="is translating"):
        jobs.result(view.id)
    work.step()
    done = settle(jobs, view.id, lambda v: v.state == "done")
    assert (done.done, done.total, done.progress, done.seconds_remaining) == (8, 8, 1.0, 0.0)
    assert done.result_filename == "notes.es.txt" and done.note == "a note"
    assert jobs.result(view.id).data == b"translated"
    assert done.to_dict()["expires_in_s"] == 3600


def test_a_queued_job_knows_its_place_and_the_last_documents_rate() -> None:
    clock = Clock()
    jobs = DocumentJobs(JobsConfig(workers=1), clock=clock)
    first, second, third = Script([(10, 10)]), Script([(5, 5)]), Script([(5, 5)])
    a = jobs.submit(first, "a.txt", "en", "es", total=10)
    settle(jobs, a.id, lambda v: v.state == "translating")
    b = jobs.submit(second, "b.txt", "en", "es", total=5)
    c = jobs.submit(third, "c.txt", "en", "es", total=5)
    assert (jobs.view(b.id).queue_position, jobs.view(c.id).queue_position) == (1, 2)
    assert jobs.view(b.id).seconds_remaining is None  # nothing measured yet
    clock.now += 5
    first.step()
    settle(jobs, a.id, lambda v: v.state == "done")  # 10 segments in 5 s
    settle(jobs, b.id, lambda v: v.state == "translating")
    # c waits behind b's 5 segments and has 5 of its own: 10 segments at 2 a second.
    assert jobs.view(c.id).seconds_remaining == 5.0 and jobs.view(c.id).queue_position == 1
    second.step()
    third.step()
    settle(jobs, c.id, lambda v: v.state == "done")


def test_cancelling_a_queued_job_means_it_never_runs_and_a_running_one_stops() -> None:
    jobs = DocumentJobs(JobsConfig(workers=1), clock=Clock())
    running, waiting = Script([(1, 4), (2, 4)]), Script([(1, 1)])
    a = jobs.submit(running, "a.txt", "en", "es", total=4)
    b = jobs.submit(waiting, "b.txt", "en", "es", total=1)
    assert jobs.cancel(b.id).state == "cancelled"
    running.step()
    settle(jobs, a.id, lambda v: v.done == 1)
    assert jobs.cancel(a.id).state == "translating"  # its rows leave at the engine's next step
    running.go.release()
    assert settle(jobs, a.id, lambda v: v.state == "cancelled").done == 1
    assert not waiting.ran
    assert jobs.cancel(a.id).state == "cancelled"  # an ended job stays as it is
    with pytest.raises(JobHasNoResult, match="was cancelled"):
        jobs.result(a.id)


def test_jobs_expire_and_are_bounded_and_private() -> None:
    """`max_jobs` bounds the jobs queued or translating; finished ones stay downloadable until they expire and
    take no place (four keys' finished jobs held every slot for an hour, and a fifth key got 503)."""
    clock = Clock()
    jobs = DocumentJobs(JobsConfig(workers=1, ttl_s=60, max_jobs=2), clock=clock)
    a = jobs.submit(Script([]), "a.txt", "en", "es", total=1, owner="alice")
    settle(jobs, a.id, lambda v: v.state == "done")
    running, waiting = Script([(1, 1)]), Script([])
    b = jobs.submit(running, "b.txt", "en", "es", total=1, owner="bob")
    c = jobs.submit(waiting, "c.txt", "en", "es", total=1, owner="bob")  # a's finished job took no place
    with pytest.raises(Busy, match=r"2 document jobs are queued or translating \(jobs.max_jobs\)"):
        jobs.submit(Script([]), "d.txt", "en", "es", total=1)
    assert jobs.result(a.id).data == b"translated"  # still there
    mine = lambda owner: owner == "alice"  # noqa: E731
    assert [v.id for v in jobs.list(mine)] == [a.id]
    with pytest.raises(JobNotFound) as other:
        jobs.view(b.id, mine)
    with pytest.raises(JobNotFound) as missing:
        jobs.view("0" * 24, mine)
    assert str(other.value).replace(b.id, "X") == str(missing.value).replace("0" * 24, "X")  # no hint it exists
    running.step()
    settle(jobs, c.id, lambda v: v.state == "done")
    jobs.submit(Script([]), "d.txt", "en", "es", total=1)  # room again
    clock.now += 61
    with pytest.raises(JobNotFound):
        jobs.view(a.id)


def test_each_caller_has_its_share_of_unfinished_jobs_and_the_wait_is_its_estimate() -> None:
    """`per_caller` counts a caller's jobs queued or translating; the refusal's wait is the soonest estimate of
    when one of them is done (the last documents' rate), and another caller is not touched."""
    clock = Clock()
    jobs = DocumentJobs(JobsConfig(workers=1, ttl_s=60, per_caller=2), clock=clock)
    timed = Script([(1, 10), (10, 10)])
    first = jobs.submit(timed, "first.txt", "en", "es", total=10, caller="k1")
    timed.step()
    settle(jobs, first.id, lambda v: v.done == 1)
    clock.now += 20  # 10 segments in 20 s: the rate the estimates use next
    timed.step()
    settle(jobs, first.id, lambda v: v.state == "done")
    held = Script([(1, 4)])
    jobs.submit(held, "a.txt", "en", "es", total=4, caller="k1")
    jobs.submit(Script([]), "b.txt", "en", "es", total=4, caller="k1")
    with pytest.raises(RateLimited, match=r"2 document jobs queued or translating") as refused:
        jobs.submit(Script([]), "c.txt", "en", "es", total=1, caller="k1")
    # The running job's 4 segments at 0.5 segments a second: 8 s (its own rate is not known before a segment).
    assert refused.value.retry_after_s == 8
    other = jobs.submit(Script([]), "other.txt", "en", "es", total=1, caller="k2")
    assert other.state == "queued"
    held.step()


def test_finished_results_stay_within_the_kept_bytes_the_largest_keepers_oldest_first() -> None:
    """Past `max_kept_bytes`, the oldest result of the caller who keeps the most expires first: a caller that
    fills the budget with its own results loses those, not another caller's."""
    clock = Clock()
    jobs = DocumentJobs(JobsConfig(workers=1, ttl_s=600, max_kept_bytes=25), clock=clock)  # "translated": 10 bytes
    mine = jobs.submit(Script([]), "mine.txt", "en", "es", total=1, caller="k2")
    settle(jobs, mine.id, lambda v: v.state == "done")
    flood = []
    for n in range(3):
        clock.now += 1
        flood.append(jobs.submit(Script([]), f"f{n}.txt", "en", "es", total=1, caller="k1"))
        settle(jobs, flood[-1].id, lambda v: v.state == "done")
    assert [v.id for v in jobs.list()] == [mine.id, flood[2].id]
    assert jobs.result(mine.id).data == b"translated"


# ------------------------------------------------------------------------------------------------------------------
# Over HTTP, on the live server.


def make_docx(paragraphs: list[str]) -> bytes:
    d = docx.Document()
    for text in paragraphs:
        d.add_paragraph(text)
    buf = io.BytesIO()
    d.save(buf)
    return buf.getvalue()


def docx_texts(data: bytes) -> list[str]:
    return [p.text for p in docx.Document(io.BytesIO(data)).paragraphs]


PARAGRAPHS = [f"Open the file number {n} and save the document." for n in range(100)]


def test_a_docx_job_over_rest_reports_progress_and_gives_the_synchronous_routes_document(
        live_server: LiveServer) -> None:
    data = make_docx(PARAGRAPHS)
    with httpx.Client(base_url=live_server.url, timeout=60) as c:
        response = c.post("/v1/documents", files={"file": ("report.docx", data)}, data={"source": "en", "target": "es"})
        assert response.status_code == 202, response.text
        job = response.json()
        assert job["state"] in ("queued", "translating", "done") and job["total"] == 100
        assert response.headers["location"].endswith(f"/v1/documents/{job['id']}")
        seen = [job]
        while job["state"] not in ("done", "error", "cancelled"):
            job = c.get(f"/v1/documents/{job['id']}", params={"wait": 10}).json()
            seen.append(job)
        assert job["state"] == "done", job
        assert [s["done"] for s in seen] == sorted(s["done"] for s in seen)  # progress only grows
        result = c.get(job["result_url"])
        assert result.status_code == 200
        assert result.headers["content-disposition"].endswith("report.es.docx")
        sync = c.post("/translate_file", files={"file": ("report.docx", data)}, data={"source": "en", "target": "es"})
        reference = c.get(sync.json()["translatedFileUrl"]).content
    assert docx_texts(result.content) == docx_texts(reference)
    assert docx_texts(result.content) != PARAGRAPHS


def test_rest_job_errors(live_server: LiveServer) -> None:
    with httpx.Client(base_url=live_server.url, timeout=60) as c:
        bad = c.post("/v1/documents", files={"file": ("report.docx", b"not a zip")}, data={"target": "es"})
        assert bad.status_code == 415 and "not a Word document" in bad.json()["error"]  # refused at upload
        missing = c.get("/v1/documents/" + "0" * 24)
        assert missing.status_code == 404 and "does not exist, has expired" in missing.json()["error"]
        assert c.get("/v1/documents/not-an-id!").status_code in (400, 404)
        assert c.delete("/v1/documents/" + "0" * 24).status_code == 404


def _counter(live_server: LiveServer, front: str) -> float:
    return live_server.app.state.metrics.cancelled_requests.labels(front)._value.get()


def test_a_rest_client_that_goes_away_frees_its_rows_at_the_next_step(live_server: LiveServer) -> None:
    engine = live_server.service.engine
    marker = "Zebra"
    text = f"{marker} files are copied to the folder and the window shows how many of them are left to copy."
    reached, go, after = hold(engine, marker)
    before = (engine.stats.cancelled_running, _counter(live_server, "rest"))
    errors: list[BaseException] = []

    def call() -> None:
        try:
            with httpx.Client(base_url=live_server.url, timeout=httpx.Timeout(60, read=1.0)) as c:
                c.post("/translate", json={"q": text, "source": "en", "target": "es"})
        except httpx.ReadTimeout as exc:  # the client gives up and closes its connection mid-decode
            errors.append(exc)

    caller = threading.Thread(target=call)
    try:
        caller.start()
        assert reached.wait(30)
        caller.join(30)
        assert errors, "the client should have timed out while its rows decoded"
        eventually(lambda: _counter(live_server, "rest") == before[1] + 1, "the disconnect counted")
    finally:
        go.set()
    eventually(lambda: engine.stats.cancelled_running > before[0], "the rows cancelled")
    engine.before_generate = None
    assert not any(marker in r.text for rows in after for r in rows)  # not in the very next forward, nor later
    assert leases(live_server.service) == 0
    metrics = httpx.get(live_server.url + "/metrics").text
    assert f'hmt_cancelled_requests_total{{front="rest"}} {before[1] + 1}' in metrics
    assert "hmt_engine_cancelled_running_total" in metrics


def test_cancelling_a_job_over_rest_takes_its_rows_out_of_the_engine(live_server: LiveServer) -> None:
    engine = live_server.service.engine
    marker = "Quokka"
    data = make_docx([f"{marker} number {n} opens the file and saves the document." for n in range(40)])
    reached, go, after = hold(engine, marker)
    before = engine.stats.cancelled
    try:
        with httpx.Client(base_url=live_server.url, timeout=60) as c:
            job = c.post("/v1/documents", files={"file": ("q.docx", data)}, data={"source": "en", "target": "es"}).json()
            assert reached.wait(30)
            assert c.delete(f"/v1/documents/{job['id']}").json()["state"] == "translating"
            go.set()
            while job["state"] == "translating" or job["state"] == "queued":
                job = c.get(f"/v1/documents/{job['id']}", params={"wait": 10}).json()
            assert job["state"] == "cancelled" and job["done"] < job["total"]
            gone = c.get(f"/v1/documents/{job['id']}/result")
            assert gone.status_code == 410 and "was cancelled; it has no document" in gone.json()["error"]
    finally:
        go.set()
        engine.before_generate = None
    assert engine.stats.cancelled > before
    assert not any(marker in r.text for rows in after for r in rows)
    assert leases(live_server.service) == 0


LONG = ("The file manager shows the files in your home folder. You can open, copy and move them, and the trash keeps "
        "what you delete until you empty it. Settings are saved when you close the window, and the next time you "
        "open it the same folder is shown. To search for a file, type its name in the search box at the top of the "
        "window. Files that you open often are listed under Recent, so you can find them again quickly.")


def test_a_chat_stream_sends_the_translation_as_it_grows(live_server: LiveServer) -> None:
    """The openai client reads a stream of many deltas whose sum is the non-streamed translation."""
    import openai

    client = openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", max_retries=0)
    pieces = []
    stream = client.chat.completions.create(model="en2es", stream=True,
                                            messages=[{"role": "user", "content": LONG}])
    for chunk in stream:
        delta = chunk.choices[0].delta.content
        if delta:
            pieces.append(delta)
    whole = client.chat.completions.create(model="en2es", messages=[{"role": "user", "content": LONG}])
    assert "".join(pieces) == whole.choices[0].message.content == live_server.reference(LONG, "en", "es")
    assert len(pieces) >= 20, pieces


def test_a_chat_stream_closed_mid_decode_cancels_its_rows(live_server: LiveServer) -> None:
    """The reader sees the first words, then goes away while the engine is held mid-decode: the rows are not in
    the next forward, and their leases are back."""
    import openai

    engine = live_server.service.engine
    reached, go, after = hold(engine, "Kiwi", nth=6)
    before = (engine.stats.cancelled_running, _counter(live_server, "openai-stream"))
    client = openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", max_retries=0)
    try:
        stream = client.chat.completions.create(model="en2es", stream=True,
                                                messages=[{"role": "user", "content": "Kiwi " + LONG}])
        words = ""
        for chunk in stream:
            words += chunk.choices[0].delta.content or ""
            if words.strip():
                break  # the reader has seen the first words and goes away
        assert reached.wait(30)
        stream.close()
        eventually(lambda: _counter(live_server, "openai-stream") == before[1] + 1, "the closed stream counted")
    finally:
        go.set()
    eventually(lambda: engine.stats.cancelled_running > before[0], "the rows cancelled")
    engine.before_generate = None
    assert not any("Kiwi" in r.text for rows in after for r in rows)
    assert leases(live_server.service) == 0
