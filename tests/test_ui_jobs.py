"""The page's handlers for growing texts and document jobs, called as Gradio calls them (no browser): a job is only
its visitor's, a follower whose page has gone stops waiting while the job goes on, and a text whose page has gone
or whose generator is closed leaves the engine at its next step.

The engine is held with its `before_generate` seam at a named forward, so each step lands between two known
forwards; assertions read the forwards' rows and the engine's counters, never timings.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import gradio as gr
import pytest

from hunyuan_mt.web.doctranslate import document_runner
from hunyuan_mt.service.jobs import DocumentJobs
from hunyuan_mt.web.metrics import WebMetrics
from hunyuan_mt.web.ui import build_ui
from seams import eventually, hold
from web_server import LiveServer, with_server

LONG = ("The file manager shows the files in your home folder. You can open, copy and move them, and the trash keeps "
        "what you delete until you empty it. Settings are saved when you close the window.")
SKIP = {"__type__": "update"}


def visitor(address: str, session: str) -> Any:
    """What the handlers read of a gr.Request: the client's address and the page's session."""
    return SimpleNamespace(client=SimpleNamespace(host=address), session_hash=session)


def no_progress(*args: Any, **kwargs: Any) -> None:
    return None


@pytest.fixture()
def page(live_server: LiveServer) -> Iterator[Any]:
    """The page's handlers with the page login on (so downloads and jobs are owned), over its own job queue."""
    cfg = with_server(live_server.cfg, auth="user:secret")
    jobs = DocumentJobs(cfg.jobs, runner=document_runner(live_server.service, cfg))
    demo = build_ui(live_server.service, cfg, WebMetrics(live_server.service), jobs=jobs)
    ui = demo.hmt_ui
    try:
        yield ui
    finally:
        live_server.service.engine.before_generate = None
        ui.close()
        jobs.close()


def document(tmp_path: Path, name: str, marker: str = "Open") -> str:
    path = tmp_path / name
    path.write_text("\n\n".join(f"{marker} {n}: the file is saved in the folder." for n in range(3)) + "\n",
                    encoding="utf-8")
    return str(path)


def test_a_page_job_is_only_its_visitors(page: Any, tmp_path: Path) -> None:
    alice, bob = visitor("10.0.0.1", "alice"), visitor("10.0.0.2", "bob")
    job_id, note, translate, cancel = page.page_submit(document(tmp_path, "mine.txt"), "en", "es", None, alice)
    assert "mine.txt" in note and translate["interactive"] is False and cancel["visible"] is True
    # Bob holds the id (a shared browser's storage, say): to him the job does not exist.
    assert page.resume_document(job_id, bob) == (SKIP, SKIP, "", SKIP, SKIP)
    served, said, stored, *_ = page.follow_document(job_id, bob, progress=no_progress)
    assert served is None and stored == "" and "no longer on the server" in said
    with pytest.raises(gr.Error) as refused:
        page.cancel_document(job_id, bob)
    assert "does not exist, has expired, or is not yours" in refused.value.message
    # Alice's page picks it up and gets the file, which only her address may fetch.
    tabs, again, kept, *_ = page.resume_document(job_id, alice)
    assert tabs["selected"] == "document" and "before the page was loaded" in again and kept == SKIP
    served, said, stored, translate, cancel = page.follow_document(job_id, alice, progress=no_progress)
    assert Path(served).read_bytes() == page.jobs.result(job_id).data
    assert "English → Spanish" in said and stored == ""
    assert translate["interactive"] is True and cancel["visible"] is False
    assert page.owned.allowed(served, "10.0.0.1") and not page.owned.allowed(served, "10.0.0.2")


def test_a_follower_stops_when_its_page_goes_and_the_job_goes_on(page: Any, live_server: LiveServer,
                                                                  tmp_path: Path) -> None:
    alice = visitor("10.0.0.1", "first-tab")
    reached, go, _ = hold(live_server.service.engine, "Wombat", nth=2)
    job_id = page.page_submit(document(tmp_path, "wombat.txt", "Wombat"), "en", "es", None, alice)[0]
    assert reached.wait(30)
    got: dict[str, Any] = {}
    follower = threading.Thread(target=lambda: got.update(out=page.follow_document(job_id, alice,
                                                                                   progress=no_progress)))
    try:
        follower.start()
        eventually(lambda: page.visits.watched() == 1, "the follower never watched its page")
        assert page.visits.leave("first-tab") == 1  # Gradio's unload: the tab was closed or reloaded
        follower.join(10)
        assert not follower.is_alive(), "the follower kept waiting for a page that has gone"
        assert got["out"] == (SKIP,) * 5
        assert page.jobs.view(job_id).state == "translating"  # the job itself goes on
    finally:
        go.set()
    served, *_ = page.follow_document(job_id, visitor("10.0.0.1", "reloaded"), progress=no_progress)
    assert Path(served).read_bytes() == page.jobs.result(job_id).data


def test_closing_the_text_stream_cancels_its_rows(page: Any, live_server: LiveServer) -> None:
    """What Gradio does to a generator when a new click cancels it: close it between two yields."""
    engine = live_server.service.engine
    before = (engine.stats.cancelled_running, page.metrics.cancelled_requests.labels("ui")._value.get())
    reached, go, after = hold(engine, "Okapi", nth=6)
    stream = page.stream_text("Okapi " + LONG, "en", "es", None, visitor("10.0.0.3", "okapi"))
    try:
        partial, info, kept = next(stream)
        assert partial and "Translating" in info and kept == SKIP
        assert reached.wait(30)
        stream.close()
    finally:
        go.set()
    eventually(lambda: engine.stats.cancelled_running > before[0], "the closed stream's rows were not cancelled")
    assert not any("Okapi" in r.text for rows in after for r in rows)
    assert page.metrics.cancelled_requests.labels("ui")._value.get() == before[1] + 1
    assert page.visits.watched() == 0


def test_a_text_whose_page_goes_leaves_the_engine_while_the_handler_waits(page: Any,
                                                                         live_server: LiveServer) -> None:
    """The handler is blocked on the held engine (Gradio cannot close it there); the page's unload cancels the
    rows anyway, and they never run again."""
    engine = live_server.service.engine
    before = engine.stats.cancelled_running
    reached, go, after = hold(engine, "Tapir", nth=4)
    said: dict[str, str] = {}

    def read() -> None:
        try:
            for _ in page.stream_text("Tapir " + LONG, "en", "es", None, visitor("10.0.0.4", "tapir")):
                pass
        except gr.Error as exc:
            said["error"] = exc.message

    reader = threading.Thread(target=read)
    try:
        reader.start()
        assert reached.wait(30)
        eventually(lambda: page.visits.watched() == 1, "the stream never watched its page")
        page.page_left(visitor("10.0.0.4", "tapir"))
    finally:
        go.set()
    reader.join(30)
    assert said["error"].startswith("Cancelled"), said
    assert engine.stats.cancelled_running > before
    assert not any("Tapir" in r.text for rows in after for r in rows)


def test_the_page_queue_polls_at_the_projects_pace_not_every_millisecond(live_server: LiveServer) -> None:
    """Gradio's queue wakes the server's event loop every 1 ms while idle by default; the mounted page keeps ours."""
    from hunyuan_mt.web.ui import PAGE_QUEUE_POLL_S

    assert PAGE_QUEUE_POLL_S >= 0.01
    assert live_server.app.state.blocks._queue.sleep_when_free == PAGE_QUEUE_POLL_S
