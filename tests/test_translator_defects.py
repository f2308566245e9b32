"""Defects found by hand, each pinned by a test that failed before its fix: over HTTP on the
live server with the clients people use (httpx, curl, libretranslatepy), or on the part that was wrong."""

from __future__ import annotations

import gzip
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from hunyuan_mt.config import JobsConfig
from hunyuan_mt.documents import RenderedDocument, read_document
from hunyuan_mt.errors import Cancelled, InvalidInput, UnreachablePair
from hunyuan_mt.service.jobs import DocumentJobs, JobHasNoResult, JobNotReady
from hunyuan_mt.text.masking import protect
from hunyuan_mt.text.segment import split_text
from hunyuan_mt.scheduler.ticket import Ticket
from seams import memory_in
from web_server import LiveServer

UNREACHABLE = "ja"  # a known code that neither the demo's nor the tiny model's adapters reach


@pytest.fixture()
def client(live_server: LiveServer) -> httpx.Client:
    with httpx.Client(base_url=live_server.url, timeout=120) as c:
        yield c


def served(live_server: LiveServer) -> list[str]:
    infos = live_server.service.languages()
    used = {i.code for i in infos if i.targets} | {t for i in infos for t in i.targets}
    return [i.code for i in infos if i.code in used]


# ---------------------------------------------------------------------------------------------------- jobs


def test_a_job_no_route_serves_is_refused_at_submit_as_translate_file_refuses_it(client: httpx.Client) -> None:
    files = {"file": ("notes.txt", b"Open the file and save it.", "text/plain")}
    job = client.post("/v1/documents", data={"source": "en", "target": UNREACHABLE}, files=files)
    direct = client.post("/translate_file", data={"source": "en", "target": UNREACHABLE}, files=files)
    assert job.status_code == direct.status_code == 400, (job.text, direct.text)
    assert "Japanese (ja) is not available as a target language from English (en)" in job.json()["error"]
    assert UNREACHABLE not in job.json()["reachable"] and job.json()["reachable"]
    # Nothing was queued for it.
    assert all(j["target"] != UNREACHABLE for j in client.get("/v1/documents").json()["jobs"])


def test_an_auto_detected_job_is_checked_against_the_language_found() -> None:
    from hunyuan_mt.web.doctranslate import check_document_route

    class Service:
        def detect(self, text: str) -> list[Any]:
            from hunyuan_mt.text.detect import Detection
            return [Detection("de", 0.9)]

        def languages(self) -> list[Any]:
            from hunyuan_mt.service.translation import LanguageInfo
            return [LanguageInfo("de", "German", "Deutsch", ["en"]), LanguageInfo("en", "English", "English", ["de"])]

    assert check_document_route(Service(), "auto", "en", ["Öffnen Sie die Datei."]) == "de"
    with pytest.raises(UnreachablePair, match="No route from de to fr; reachable from de: en"):
        check_document_route(Service(), "auto", "fr", ["Öffnen Sie die Datei."])


class Held:
    """A job's work that waits until released, then fails or finishes as told."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, progress: Callable[[int, int], None], ticket: Ticket) -> tuple[RenderedDocument, str]:
        self.started.set()
        assert self.release.wait(30)
        if ticket.cancelled:
            raise Cancelled(f"Cancelled: {ticket.reason}.")
        raise InvalidInput("the model refused")


def _ended(jobs: DocumentJobs, job_id: str) -> None:
    deadline = time.monotonic() + 30
    while jobs.view(job_id).state not in ("cancelled", "error"):
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_a_cancelled_or_failed_job_says_it_has_no_document_not_to_wait() -> None:
    jobs = DocumentJobs(JobsConfig(workers=1))
    try:
        work = Held()
        view = jobs.submit(work, "notes.txt", "en", "es", total=1)
        assert work.started.wait(30)
        with pytest.raises(JobNotReady, match="can be downloaded once it is done"):
            jobs.result(view.id)
        jobs.cancel(view.id)
        work.release.set()
        _ended(jobs, view.id)
        with pytest.raises(JobHasNoResult, match=f"Job {view.id} was cancelled; it has no document") as cancelled:
            jobs.result(view.id)
        assert cancelled.value.http_status == 410 and "once it is done" not in cancelled.value.message

        failing = Held()
        failing.release.set()
        view = jobs.submit(failing, "notes.txt", "en", "es", total=1)
        _ended(jobs, view.id)
        with pytest.raises(JobHasNoResult, match=r"failed \(the model refused\); it has no document"):
            jobs.result(view.id)
    finally:
        jobs.close()


def test_curl_saves_a_download_under_its_own_name(client: httpx.Client, tmp_path: Path) -> None:
    """`curl -OJ` reads only the plain `filename=` of Content-Disposition; with `filename*` alone it saved
    the translation as "result"."""
    files = {"file": ("Résumé notes.txt", b"Open the file.", "text/plain")}
    view = client.post("/v1/documents", data={"source": "en", "target": "es"}, files=files).json()
    done = client.get(f"/v1/documents/{view['id']}", params={"wait": 30}).json()
    while done["state"] not in ("done", "error", "cancelled"):
        done = client.get(f"/v1/documents/{view['id']}", params={"wait": 30}).json()
    assert done["state"] == "done", done
    header = client.get(done["result_url"]).headers["content-disposition"]
    assert header == "attachment; filename=\"Resume notes.es.txt\"; filename*=UTF-8''R%C3%A9sum%C3%A9%20notes.es.txt"
    subprocess.run(["curl", "-sS", "-f", "-O", "-J", done["result_url"]], cwd=tmp_path, check=True, timeout=60)
    assert [p.name for p in tmp_path.iterdir()] == ["Resume notes.es.txt"]


# ---------------------------------------------------------------------------------------------------- formats


def test_a_po_string_left_open_is_refused_with_its_line(client: httpx.Client) -> None:
    po = b'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\nmsgid "Open the file\nmsgstr ""\n'
    response = client.post("/translate_file", data={"source": "en", "target": "es"},
                           files={"file": ("app.po", po, "text/x-gettext-translation")})
    assert response.status_code == 400, response.text
    assert "app.po: line 5: unterminated or malformed string" in response.json()["error"]
    # A well-formed catalogue with escapes, continuations, plural and obsolete entries still reads.
    good = ('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
            'msgid "Say \\"hi\\"\\n"\n"and go"\nmsgstr ""\n\n'
            'msgid "One file"\nmsgid_plural "%d files"\nmsgstr[0] ""\nmsgstr[1] ""\n\n'
            '#~ msgid "Gone"\n#~ msgstr "Weg"\n')
    assert read_document(good.encode(), "app.po", _limits()).segments == ['Say "hi"\nand go', "One file", "%d files"]


def _limits() -> Any:
    from hunyuan_mt.config import LimitsConfig
    return LimitsConfig()


@pytest.mark.parametrize("name, text, expected", [
    ("fr.yml", "en:\n  greeting: Open the file\n", "fr:\n  greeting:"),
    ("app.yml", "# app strings\nen: # the locale\n  a: Open the file\n", "# app strings\nfr: # the locale\n"),
    ("fr.json", '{"en": {"a": "Open the file"}}', '{"fr": {"a": '),
])
def test_a_catalogue_named_by_its_locale_answers_to_the_target(name: str, text: str, expected: str) -> None:
    document = read_document(text.encode(), name, _limits())
    assert document.render(document.segments, "fr").data.decode().startswith(expected)


@pytest.mark.parametrize("name, text", [
    ("a.yml", "title:\n  a: Open the file\n"),            # not a locale
    ("a.yml", "en:\n  a: Open\nfr:\n  a: Ouvrir\n"),       # two keys: both locales stay as they are
    ("a.json", '{"en": "Open the file"}'),                 # a string, not a catalogue under a locale
])
def test_other_roots_are_left_alone(name: str, text: str) -> None:
    document = read_document(text.encode(), name, _limits())
    out = document.render(document.segments, "fr").data.decode()
    assert out.split(":")[0].strip('{"\n') == text.split(":")[0].strip('{"\n')


# ---------------------------------------------------------------------------------------------------- memory


def test_a_memory_imported_by_another_process_is_used_without_a_restart(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import hunyuan_mt.store.tm as tm

    server = memory_in(tmp_path)
    server.preload(["en2es"], fuzzy=True)
    assert server.lookup("en", "es", protect("Print preview")) is None
    # What `python -m hunyuan_mt tm import` does: its own memory over the same store.
    memory_in(tmp_path).add("en2es", [("Print preview", "Vista previa de impresión")])
    time.sleep(tm.FRESH_S)  # a pair's rows are asked for again at most this often (one query per request)
    assert server.lookup("en", "es", protect("Print preview")) == "Vista previa de impresión"
    assert server.suggest("en", "es", protect("Print previews"), 0.8) is not None  # the fuzzy index came along
    # Its own imports, and another's, are read as new rows: the memory in use is not read again whole.
    before = server._pairs["en2es"]
    server.add("en2es", [("Close", "Cerrar")])
    server.lookup("en", "es", protect("Close"))
    assert server._pairs["en2es"] is before


def test_the_cli_import_says_a_running_server_picks_it_up(tmp_path: Path) -> None:
    import sys

    rows = tmp_path / "rows.tsv"
    rows.write_text("Print preview\tVista previa de impresión\n", encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "hunyuan_mt", "tm", "import", str(rows), "--pair", "en2es",
                          "--set", f"store.dir={tmp_path / 'data'}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "A server on the same store answers with them from its next request; no restart is needed" in out.stdout


# ---------------------------------------------------------------------------------------------------- detect


def test_detect_always_answers_a_best_guess(client: httpx.Client, live_server: LiveServer) -> None:
    from libretranslatepy import LibreTranslateAPI

    api = LibreTranslateAPI(live_server.url + "/")
    for text in ("123", "😀 👍", "---"):
        found = api.detect(text)
        assert found and found[0]["confidence"] == 0.0, (text, found)
        assert found[0]["language"] in served(live_server)
    # A text in a language the adapters do not serve says what it is, rather than nothing.
    assert api.detect("Привет, как дела? Это мой новый дом.")[0]["language"] == "ru"


def test_an_unknown_code_is_refused_naming_the_codes_this_server_serves(client: httpx.Client,
                                                                        live_server: LiveServer) -> None:
    codes = served(live_server)
    listed = f"Unsupported language code 'xx'. Codes this server translates: {', '.join(codes)}."
    for route, kwargs in (("/translate", {"json": {"q": "Open", "source": "en", "target": "xx"}}),
                          ("/translate", {"json": {"q": "Open", "source": "xx", "target": "en"}}),
                          ("/translate_file", {"data": {"source": "en", "target": "xx"},
                                               "files": {"file": ("a.txt", b"Open the file.", "text/plain")}}),
                          ("/v1/documents", {"data": {"source": "xx", "target": "en"},
                                             "files": {"file": ("a.txt", b"Open the file.", "text/plain")}})):
        response = client.post(route, **kwargs)
        assert response.status_code == 400, response.text
        body = response.json()
        assert listed in body["error"] + body.get("detail", ""), (route, body)
    assert len(codes) < 38


# ---------------------------------------------------------------------------------------------------- text


@pytest.mark.parametrize("text", ["¿Dónde está el archivo?", "Öffnen Sie die Datei", "打开文件"])
def test_a_raw_utf8_form_body_reads_as_json_does(client: httpx.Client, live_server: LiveServer, text: str) -> None:
    source = {"¿": "es", "Ö": "de", "打": "zh"}[text[0]]
    as_json = client.post("/translate", json={"q": text, "source": source, "target": "en"})
    # curl -d q="..." sends the letters unescaped: the bytes as they are.
    out = subprocess.run(["curl", "-sS", "-f", "-d", f"q={text}", "-d", f"source={source}", "-d", "target=en",
                          f"{live_server.url}/translate"], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert httpx.Response(200, content=out.stdout).json() == as_json.json()
    # A form that names its charset is read in it: UTF-8 said outright, and Latin-1 where the text fits it.
    declared = client.post("/translate", content=f"q={text}&source={source}&target=en".encode("utf-8"),
                           headers={"content-type": "application/x-www-form-urlencoded; charset=utf-8"})
    assert declared.json() == as_json.json()
    if source != "zh":
        legacy = client.post("/translate", content=f"q={text}&source={source}&target=en".encode("latin-1"),
                             headers={"content-type": "application/x-www-form-urlencoded; charset=latin-1"})
        assert legacy.json() == as_json.json()


@pytest.mark.parametrize("version", ["v3.0.0-beta.2", "2.1.0+build.5", "1.0.0-rc.1", "v2", "v10.4.1",
                                     "3.0.0-alpha+exp.sha.5114f85"])
def test_a_version_string_is_one_protected_span(version: str) -> None:
    masked = protect(f"Update to {version} now!")
    assert masked.spans == [version] and masked.text == "Update to ⟦0⟧ now!"


def test_version_strings_come_back_whole(live_server: LiveServer) -> None:
    for target in ("es", "de", "fr", "zh"):
        if target not in served(live_server):
            continue
        out = live_server.reference("Update to v3.0.0-beta.2 now!", "en", target)
        assert "v3.0.0-beta.2" in out, (target, out)


@pytest.mark.parametrize("source, target, translations, expected", [
    ("en", "zh", ["导出为 PDF。", "文件已保存。"], "导出为 PDF。文件已保存。"),
    ("zh", "en", ["Export to PDF.", "The file is saved."], "Export to PDF. The file is saved."),
    ("en", "de", ["Exportieren.", "Gespeichert."], "Exportieren. Gespeichert."),
])
def test_sentences_are_joined_in_the_targets_habit(source: str, target: str, translations: list[str],
                                                   expected: str) -> None:
    text = {"en": "Export to PDF. The file is saved.", "zh": "导出为PDF。文件已保存。"}[source]
    layout = split_text(text, source)
    assert layout.segments and len(layout.segments) == 2
    assert layout.render(translations, source, target) == expected
    # A line break between them stays.
    broken = split_text(text.replace(" The", "\nThe").replace("。文", "。\n文"), source)
    assert "\n" in broken.render(translations, source, target)


def test_the_services_chinese_output_has_no_space_between_sentences(live_server: LiveServer) -> None:
    if "zh" not in served(live_server):
        pytest.skip("the tiny model serves no Chinese")
    assert "。 " not in live_server.reference("Export to PDF. The file is saved.", "en", "zh")
    out = live_server.reference("导出为PDF。文件已保存。", "zh", "en")
    assert ". " in out and not any(f".{c}" in out for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"), out


def test_the_shipped_german_memory_has_no_compound_accelerator_marks() -> None:
    memory = Path(__file__).resolve().parents[1] / "models" / "demo" / "memory" / "en2de.tsv.gz"
    if not memory.exists():
        pytest.skip("no shipped memory")
    rows = dict(line.rstrip("\n").split("\t", 1) for line in gzip.open(memory, "rt", encoding="utf-8"))
    assert rows["Print Preview"] == "Druckvorschau" and rows["Output tray:"] == "Ausgabeschacht:"
