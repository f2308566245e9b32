"""The store on a real PostgreSQL (Debian's package, started for these tests by tests/postgres.py): the schema
migrated by processes starting together, two servers on one database answering each other's corrections and the
CLI's imports at once, and a document job left by one process finished by the next from its last segment."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import requests

from hunyuan_mt.config import JobsConfig, StoreConfig
from hunyuan_mt.documents import RenderedDocument
from hunyuan_mt.service.jobs import Checkpoint, DocumentJobs, JobSpec
from hunyuan_mt.store import Store
from postgres import postgres_server, fresh_database
from web_server import LiveServer, free_port, serve

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    with postgres_server(free_port()) as url:
        yield url


@pytest.fixture()
def database(postgres: str) -> str:
    return fresh_database(postgres, f"hmt_{uuid.uuid4().hex[:12]}")


def test_processes_starting_together_migrate_a_postgres_database_once(database: str) -> None:
    script = ("import sys; from hunyuan_mt.store import Store; "
              "Store.open(sys.argv[1]).memory.add('en2es', [('Open', 'Abrir')]); print('ok')")
    procs = [subprocess.Popen([sys.executable, "-c", script, database], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    store = Store.open(database)
    assert store.kind == "postgresql" and len(store.memory.since("en2es")) == 3
    with store.engine.connect() as db:
        assert db.exec_driver_sql("SELECT version_num FROM alembic_version").all() == [("0002",)]
    store.close()


@pytest.fixture()
def two_servers(live_server: LiveServer, database: str) -> Iterator[tuple[LiveServer, LiveServer]]:
    """Two servers, each its own service and memory, over one PostgreSQL database: replicas on two machines."""
    from hunyuan_mt.runtime.backbone import Backbone
    from hunyuan_mt.service.translation import TranslationService

    cfg = dataclasses.replace(live_server.cfg, store=StoreConfig(url=database))
    # A backbone each: a service takes its backbone's slot layers over (one service per backbone).
    services = [TranslationService(cfg, backbone=Backbone.load_uncached(cfg.model)) for _ in range(2)]
    try:
        with serve(services[0], cfg) as first, serve(services[1], cfg) as second:
            yield first, second
    finally:
        for service in services:
            service.close()


def test_a_correction_on_one_server_answers_on_the_other_at_once(two_servers: tuple[LiveServer, LiveServer],
                                                                 database: str, tmp_path: Path) -> None:
    first, second = two_servers
    text = "The nightly copy of the archive is finished."
    body = {"q": text, "source": "en", "target": "es"}
    machine = requests.post(second.url + "/translate", json=body, timeout=60).json()["translatedText"]
    posted = requests.post(first.url + "/v1/corrections", timeout=60,
                           json={**body, "translation": "La copia nocturna del archivo ha terminado."})
    assert posted.status_code == 201, posted.text
    answer = requests.post(second.url + "/translate", json=body, timeout=60).json()
    assert answer == {"translatedText": "La copia nocturna del archivo ha terminado.", "memorySegments": 1, "confidence": 1.0}
    assert machine != answer["translatedText"]
    # The CLI imports into the same database; both servers answer with it from their next request.
    rows = tmp_path / "rows.tsv"
    rows.write_text("Print preview\tVista previa de impresión\n", encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "hunyuan_mt", "tm", "import", str(rows), "--pair", "en2es",
                          "--set", f"store.url={database}"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    for server in two_servers:
        got = requests.post(server.url + "/translate", json={"q": "Print preview", "source": "en", "target": "es"},
                            timeout=60).json()
        assert got["translatedText"] == "Vista previa de impresión", got


class Held:
    """A job's work in two halves of 4 segments: it records the first, then waits until released; `dies`: then
    it fails as rows do when the engine closes under them."""

    def __init__(self, dies: bool) -> None:
        self.dies = dies
        self.release = threading.Event()
        self.first_half = threading.Event()
        self.sent: list[int] = []

    def runner(self, spec: JobSpec, upload: Any, checkpoint: Checkpoint) -> Callable[..., Any]:
        def work(progress: Callable[[int, int], None], ticket: Any) -> tuple[RenderedDocument, str]:
            done = checkpoint.finished()
            for half in ((0, 1, 2, 3), (4, 5, 6, 7)):
                todo = [i for i in half if i not in done]
                self.sent += todo
                checkpoint.record([(i, f"segmento {i}", "model") for i in todo])
                self.first_half.set()
                if todo and half[0] == 0:
                    self.release.wait(30)
                    if self.dies:
                        raise RuntimeError("the engine closed under the job")
            text = "\n".join(t for _, (t, _) in sorted(checkpoint.finished().items()))
            return RenderedDocument(text.encode(), "notes.es.txt", "text/plain", ""), spec.source
        return work


def _stop(jobs: DocumentJobs, held: Held) -> None:
    """A server stopping: the queue closes, then its engine fails the rows in flight (the held work dies)."""
    jobs.close()
    held.release.set()
    for worker in jobs._workers:
        worker.join(30)


def _restart_until_done(store: Store, held: Held, job_id: str) -> DocumentJobs:
    """The next start's queue on the same store, once it has finished `job_id`."""
    held.release.set()
    restarted = DocumentJobs(JobsConfig(workers=1), store=store, runner=held.runner)
    done = restarted.wait(job_id, None, 30, None)
    while done.state != "done":
        done = restarted.wait(job_id, None, 30, done)
    return restarted


def test_a_job_left_by_one_process_is_finished_by_the_next_from_postgres(database: str, tmp_path: Path) -> None:
    store = Store.open(database, tmp_path)
    first = Held(dies=True)
    jobs = DocumentJobs(JobsConfig(workers=1), store=store, runner=first.runner)
    view = jobs.submit_upload(JobSpec("notes.txt", "en", "es"), b"eight lines", None, 8, owner="alice")
    assert first.first_half.wait(30)
    _stop(jobs, first)
    assert not any(j.ticket.cancelled for j in jobs._jobs.values())  # shutting down left the job for the next start
    assert jobs.view(view.id).state == "translating"  # not "error": the next start runs it again
    again = Held(dies=False)
    restarted = _restart_until_done(store, again, view.id)
    assert first.sent == [0, 1, 2, 3] and again.sent == [4, 5, 6, 7]  # nothing sent twice, nothing lost
    assert restarted.result(view.id).data.decode() == "\n".join(f"segmento {i}" for i in range(8))
    with pytest.raises(Exception, match="not yours"):
        restarted.view(view.id, lambda owner: owner == "bob")
    restarted.close()
    store.close()


def test_a_job_is_run_by_one_process_at_a_time(database: str, tmp_path: Path) -> None:
    """Two job queues on one database (two ingress replicas): the second does not take over a job the first is
    running, and takes it over once the first has stopped."""
    store = Store.open(database, tmp_path)
    first = Held(dies=True)
    jobs = DocumentJobs(JobsConfig(workers=1), store=store, runner=first.runner)
    view = jobs.submit_upload(JobSpec("notes.txt", "en", "es"), b"eight lines", None, 8)
    assert first.first_half.wait(30)
    other = Held(dies=False)
    other.release.set()
    beside = DocumentJobs(JobsConfig(workers=1), store=store, runner=other.runner)
    with pytest.raises(Exception, match="does not exist"):
        beside.view(view.id)  # held by a live process: not this queue's to run or answer
    assert other.sent == []
    beside.close()
    _stop(jobs, first)
    third = Held(dies=False)
    restarted = _restart_until_done(store, third, view.id)
    assert first.sent + third.sent == list(range(8)) and other.sent == []
    restarted.close()
    store.close()
