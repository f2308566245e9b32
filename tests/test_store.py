"""The store: a real database for what the server learns. The schema migrated at start (SQLite, and PostgreSQL
from Debian's packages in test_store_postgres.py); corrections over REST (requests, LibreTranslate's /suggest in
test_clients.py) and the page (gradio_client), answering at once; document jobs that survive a real SIGKILL of
`python app.py` and finish with no segment lost or sent twice."""

from __future__ import annotations

import io
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import docx
import pytest
import requests
from gradio_client import Client
from prometheus_client.parser import text_string_to_metric_families

from hunyuan_mt.store import Store
from hunyuan_mt.store.db import migrate
from seams import memory_in
from web_server import LiveServer, free_port

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------------- schema


def test_the_memory_check_keeps_its_connection_and_survives_losing_it(tmp_path: Path) -> None:
    """`MemoryRows.stamp` runs on a connection it keeps (every request asks); a write by another connection is seen
    at once (no snapshot held), and a connection that died under it is replaced without an error."""
    store = Store.open(folder=tmp_path)
    other = Store.open(folder=tmp_path)
    try:
        assert store.memory.stamp("en2es") == (0, 0)
        kept = store.memory._stamp_connection
        other.memory.add("en2es", [("Print", "Imprimir")])
        assert store.memory.stamp("en2es")[1] == 1 and store.memory._stamp_connection is kept
        kept.connection.dbapi_connection.close()          # what a database restart does to it
        other.memory.add("en2es", [("Close", "Cerrar")])
        assert store.memory.stamp("en2es")[1] == 2
        assert store.memory.stamp("en2es")[1] == 2 and store.memory._stamp_connection is not kept
    finally:
        store.close()
        other.close()
    assert store.memory._stamp_connection is None


def test_a_new_database_is_migrated_to_the_newest_schema_once(tmp_path: Path) -> None:
    store = Store.open("", tmp_path)
    assert store.kind == "sqlite" and (tmp_path / "hunyuan.db").is_file()
    with sqlite3.connect(tmp_path / "hunyuan.db") as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [("0002",)]
    assert {"memory_entries", "corrections", "jobs", "job_segments", "imports", "adapter_versions",
            "alembic_version"} <= tables
    assert migrate(store.engine) == "0002"  # again: nothing to do
    store.close()


def test_processes_starting_together_migrate_one_after_the_other(tmp_path: Path) -> None:
    script = ("import sys; from hunyuan_mt.store import Store; "
              "Store.open('', sys.argv[1]).memory.add('en2es', [('Open', 'Abrir')]); print('ok')")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert len(Store.open("", tmp_path).memory.since("en2es")) == 3


def test_a_database_that_cannot_be_opened_is_one_clear_line(tmp_path: Path) -> None:
    from hunyuan_mt.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^store.url: not a database URL: 'nonsense'$"):
        Store.open("nonsense")
    with pytest.raises(ConfigError, match=r"^store.url: cannot open postgresql\+psycopg://hmt:\*\*\*@127.0.0.1:9/x: "):
        Store.open("postgresql+psycopg://hmt:secret@127.0.0.1:9/x")


def test_a_legacy_tm_folder_is_imported_once_with_its_provenance(tmp_path: Path) -> None:
    from hunyuan_mt.store.schema import memory_entries
    from hunyuan_mt.store.tm import TranslationMemory

    legacy = tmp_path / "tm"
    legacy.mkdir()
    (legacy / "en2es.tsv").write_text("Print preview\tVista previa\n", encoding="utf-8")
    store = Store.open("", tmp_path / "data")
    memory = TranslationMemory(store.memory, legacy_dir=legacy)
    again = TranslationMemory(store.memory, legacy_dir=legacy)  # the next start: not imported twice
    assert again.export_rows("en2es") == [("Print preview", "Vista previa")]
    with store.engine.connect() as db:
        rows = db.execute(memory_entries.select()).mappings().all()
    assert [(r["origin"], r["who"]) for r in rows] == [("legacy", "file")]
    assert memory.stats() == {"en2es": 1}


# ---------------------------------------------------------------------------------------------------- corrections


@pytest.fixture()
def own_memory(live_server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    """The live server with a memory of this test's own: corrections here must not answer other tests."""
    monkeypatch.setattr(live_server.service, "tm", memory_in(tmp_path))
    return live_server


def test_a_correction_answers_its_text_at_once_exact_and_fuzzy(own_memory: LiveServer) -> None:
    url = own_memory.url
    text = "The backup of the shared folder has finished."
    machine = requests.post(url + "/translate", json={"q": text, "source": "en", "target": "es"},
                            timeout=60).json()["translatedText"]
    posted = requests.post(url + "/v1/corrections", timeout=60, json={
        "q": text, "source": "en", "target": "es", "translation": "La copia de la carpeta compartida ha terminado.",
        "machine": machine, "context": "a backup tool"})
    assert posted.status_code == 201, posted.text
    assert posted.json() == {"id": 1, "source": "en", "target": "es", "route": ["en", "es"]}
    again = requests.post(url + "/translate", json={"q": text, "source": "en", "target": "es"}, timeout=60).json()
    assert again == {"translatedText": "La copia de la carpeta compartida ha terminado.", "memorySegments": 1, "confidence": 1.0}
    near = requests.post(url + "/translate", json={"q": "The backup of the shared folders has finished.",
                                                   "source": "en", "target": "es"}, timeout=60).json()
    assert near["memoryMatches"][0]["target"] == "La copia de la carpeta compartida ha terminado."
    [kept] = own_memory.service.tm.rows.corrections("en2es")
    assert (kept.machine, kept.context) == (machine, "a backup tool")
    with own_memory.service.tm.rows.engine.connect() as db:
        route, adapter = db.exec_driver_sql("SELECT route, adapter_version FROM corrections").one()
    assert route == "en → es (direct)" and adapter == "en2es"


@pytest.mark.parametrize("body, status, message", [
    ({"q": "Delete {0}?", "source": "en", "target": "es", "translation": "¿Eliminar?"}, 400,
     "does not keep the text's placeholders"),
    ({"q": "Open", "source": "en", "target": "xx", "translation": "Abrir"}, 400, "xx is not supported"),
    ({"q": "Open", "source": "en", "target": "es"}, 400, "missing translation parameter"),
    ({"q": "Open", "source": "en", "target": "en", "translation": "Open"}, 400, "two different languages"),
])
def test_a_correction_that_cannot_be_used_is_refused_with_why(own_memory: LiveServer, body: dict[str, str],
                                                               status: int, message: str) -> None:
    answer = requests.post(own_memory.url + "/v1/corrections", json=body, timeout=60)
    assert answer.status_code == status and message in answer.json()["error"], answer.text
    assert own_memory.service.tm.rows.corrections("en2es") == []


def test_the_page_saves_an_edited_translation_as_a_correction(own_memory: LiveServer) -> None:
    page = Client(own_memory.url + "/ui/", verbose=False)
    text = "Your subscription ends tomorrow."
    # (The last source the page detected is the page's state, not a parameter.)
    note = page.predict(text, "en", "es", "Su suscripción termina mañana.", "", api_name="/save_correction")
    assert note.startswith("**Correction saved** (en → es)")
    translated, info = page.predict(text, "en", "es", api_name="/translate")
    assert translated == "Su suscripción termina mañana." and "From memory" in info
    # From Auto-detect, the language detected by this page's last translation is the source; a fresh page has none.
    with pytest.raises(Exception, match="Choose the source language, or translate once"):
        Client(own_memory.url + "/ui/", verbose=False).predict(text, "auto", "es", "Algo", "",
                                                              api_name="/save_correction")
    [kept] = own_memory.service.tm.rows.corrections("en2es")
    assert kept.translation == "Su suscripción termina mañana."


# ---------------------------------------------------------------------------------------------------- jobs


SEGMENTS = 300


def _document(path: Path) -> list[str]:
    lines = [f"Report {n}: the shared folder was copied to the backup disk." for n in range(SEGMENTS)]
    document = docx.Document()
    for line in lines:
        document.add_paragraph(line)
    document.save(path)
    return lines


class App:
    """`python app.py` over a data folder, its output kept."""

    def __init__(self, data: Path, port: int) -> None:
        env = dict(os.environ, HMT_DATA=str(data), PYTHONUNBUFFERED="1")
        # No warm-up: ready at once (the job's own first rows are what this test times nothing of).
        self.proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--set", "jobs.workers=1",
                                      "--set", "model.warmup=false"],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.url = f"http://127.0.0.1:{port}"
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stdout.readline, "")),  # type: ignore
                         daemon=True).start()

    def ready(self) -> "App":
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "".join(self.lines)
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return self
            except requests.ConnectionError:
                pass
            time.sleep(0.25)
        raise AssertionError("".join(self.lines))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture()
def apps(tmp_path: Path) -> Iterator[list[App]]:
    started: list[App] = []
    yield started
    for app in started:
        app.stop()


def _recorded(data: Path, job_id: str) -> int:
    with sqlite3.connect(data / "hunyuan.db") as db:
        return db.execute("SELECT count(*) FROM job_segments WHERE job_id = ?", (job_id,)).fetchone()[0]


def test_a_job_killed_mid_way_finishes_after_a_restart_with_no_segment_lost_or_sent_twice(
        tmp_path: Path, apps: list[App]) -> None:
    data, port = tmp_path / "data", free_port()
    upload = tmp_path / "reports.docx"
    lines = _document(upload)
    first = App(data, port)
    apps.append(first)
    first.ready()
    with upload.open("rb") as handle:
        submitted = requests.post(first.url + "/v1/documents", files={"file": handle},
                                  data={"source": "en", "target": "es"}, timeout=60)
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    correction = {"q": "The archive was copied.", "source": "en", "target": "es",
                  "translation": "El archivo se ha copiado."}
    assert requests.post(first.url + "/v1/corrections", json=correction, timeout=60).status_code == 201
    deadline = time.monotonic() + 300
    while _recorded(data, job_id) < 48:  # three rounds written down; then the process dies at once
        assert time.monotonic() < deadline, "".join(first.lines)
        time.sleep(0.05)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(30)
    before = _recorded(data, job_id)
    assert 48 <= before < SEGMENTS, before

    second = App(data, port)
    apps.append(second)
    second.ready()
    view = requests.get(f"{second.url}/v1/documents/{job_id}", timeout=60).json()
    assert view["state"] in ("queued", "translating") and view["total"] == SEGMENTS
    while view["state"] != "done":
        assert view["state"] in ("queued", "translating"), view
        view = requests.get(f"{second.url}/v1/documents/{job_id}", params={"wait": 10}, timeout=60).json()
    assert _recorded(data, job_id) == SEGMENTS
    # The restarted server translated only what was not written down: its own count of document segments.
    metrics = text_string_to_metric_families(requests.get(second.url + "/metrics", timeout=60).text)
    [sent] = [s.value for f in metrics for s in f.samples if s.name == "hmt_service_segments_total"]
    assert sent == SEGMENTS - before, (sent, before)
    print(f"killed with {before} of {SEGMENTS} segments written down; {sent:g} sent after the restart")
    result = requests.get(f"{second.url}/v1/documents/{job_id}/result", timeout=60)
    paragraphs = [p.text for p in docx.Document(io.BytesIO(result.content)).paragraphs]
    assert len(paragraphs) == len(lines) and all(p and p != src for p, src in zip(paragraphs, lines))
    # Each paragraph is its own line's translation, in its place: the numbers say which line it was.
    assert all(f"{n}" in p for n, p in enumerate(paragraphs))
    assert any("queued again after a restart" in line for line in second.lines), "".join(second.lines)
    # What was learnt before the kill is all there: the correction and its memory entry.
    again = requests.post(second.url + "/translate", json={k: correction[k] for k in ("q", "source", "target")},
                          timeout=60).json()
    assert again == {"translatedText": "El archivo se ha copiado.", "memorySegments": 1, "confidence": 1.0}
    with sqlite3.connect(data / "hunyuan.db") as db:
        assert db.execute("SELECT count(*) FROM corrections").fetchone() == (1,)


def test_a_keyed_job_restored_from_the_store_is_still_its_keys_alone_and_the_key_is_not_stored(
        tmp_path: Path) -> None:
    from hunyuan_mt.scheduler.callers import Caller
    from hunyuan_mt.config import JobsConfig, LimitsConfig, ServerConfig
    from hunyuan_mt.documents import RenderedDocument
    from hunyuan_mt.service.jobs import DocumentJobs, JobSpec
    from hunyuan_mt.web.auth import AccessPolicy

    def runner(spec: JobSpec, upload: object, checkpoint: object) -> object:
        return lambda progress, ticket: (RenderedDocument(b"hecho", "a.es.txt", "text/plain", ""), "en")

    store = Store.open("", tmp_path)
    owner = Caller("key:s3cret-key", "10.0.0.7")
    first = DocumentJobs(JobsConfig(workers=1), store=store, runner=runner)
    view = first.submit_upload(JobSpec("a.txt", "en", "es"), b"done", None, 1, owner, owner)
    while view.state != "done":
        view = first.wait(view.id, None, 30, view)
    job_id = view.id
    first.close()
    restarted = DocumentJobs(JobsConfig(workers=1, per_caller=1), store=store, runner=runner)
    policy = AccessPolicy(ServerConfig(api_keys=["s3cret-key", "other-key"]), LimitsConfig())
    assert restarted.result(job_id, lambda o: policy.may_fetch(o, "s3cret-key", "10.9.9.9", False)).data == b"hecho"
    with pytest.raises(Exception, match="not yours"):
        restarted.view(job_id, lambda o: policy.may_fetch(o, "other-key", "10.0.0.7", False))
    restarted.check_quota(owner)  # a finished job, restored or not, takes none of its caller's share
    with sqlite3.connect(tmp_path / "hunyuan.db") as db:
        assert "s3cret-key" not in repr(db.execute("SELECT * FROM jobs").fetchall())
    restarted.close()
