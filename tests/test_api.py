"""REST API over HTTP against the real app on 127.0.0.1 (see web_server.py for the model behind it)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.markup import tag_sequence
from hunyuan_mt.documents import read_document, translate_keeping_markup
from hunyuan_mt.text.languages import LANGUAGES
from hunyuan_mt.web.chat_api import resolve_model_id
from hunyuan_mt.web.doctranslate import translate_upload
from sample_docs import HTML, MD, PDF_LINES, SRT, TXT, docx_structure, make_docx, make_pdf
from web_server import ADMIN_KEY, LiveServer


@pytest.fixture()
def client(live_server: LiveServer) -> httpx.Client:
    with httpx.Client(base_url=live_server.url, timeout=120) as c:
        yield c


def assert_error(response: httpx.Response, status: int, contains: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) >= {"error"}, body
    # LibreTranslate's wording is the `error`; where it has one, our fuller explanation is the `detail`.
    assert contains in body["error"] or contains in body.get("detail", ""), body
    assert "Traceback" not in response.text and 'File "' not in response.text


# ---------------------------------------------------------------------------------------------------- translate


def test_translate_json_returns_the_services_translation(client: httpx.Client, live_server: LiveServer) -> None:
    response = client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "es"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["translatedText"] == live_server.reference("Open the file.", "en", "es")
    # Beside it, only the model's confidence and the memory's near entries for segments it did not know
    # (suggestions, tm.fuzzy_threshold).
    reference = live_server.service.translate_batch(["Open the file."], "en", "es")[0]
    assert body == {"translatedText": reference.text, "confidence": reference.confidence,
                    **({"memoryMatches": reference.memory_matches} if reference.memory_matches else {})}


def test_translate_form_body_is_accepted(client: httpx.Client, live_server: LiveServer) -> None:
    response = client.post("/translate", data={"q": "Close the window.", "source": "es", "target": "en"})
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"] == live_server.reference("Close the window.", "es", "en")


def test_translate_list_with_auto_detect(client: httpx.Client, live_server: LiveServer) -> None:
    texts = ["Open the file and save the document.", "Close the window now, please."]
    response = client.post("/translate", json={"q": texts, "source": "auto", "target": "es"})
    assert response.status_code == 200, response.text
    body = response.json()
    detected = [live_server.service.detect(t)[0].code for t in texts]
    assert body["translatedText"] == [live_server.reference(t, d, "es") for t, d in zip(texts, detected)]
    assert [d["language"] for d in body["detectedLanguage"]] == detected
    assert all(0 < d["confidence"] <= 100 for d in body["detectedLanguage"])


def test_translate_html_keeps_tags(client: httpx.Client, live_server: LiveServer) -> None:
    html = '<p>Open the <b>file</b> and <a href="https://example.org/x">save it</a>.</p>'
    response = client.post("/translate", json={"q": html, "source": "en", "target": "es", "format": "html"})
    assert response.status_code == 200, response.text
    out = response.json()["translatedText"]
    assert out.startswith("<p>") and "<b>" in out and 'href="https://example.org/x"' in out
    document = read_document(html.encode(), "q.html", live_server.cfg.limits)
    expected = translate_keeping_markup(
        document, lambda segments, _p: live_server.service.translate_segments(segments, "en", "es")).translations
    assert out == document.render(expected, "es").data.decode("utf-8")
    assert tag_sequence(out) == tag_sequence(html)  # in order and validly nested, whatever the model did


def test_same_language_passes_through(client: httpx.Client) -> None:
    response = client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "en"})
    assert response.json() == {"translatedText": "Open the file."}


def test_case_variants_of_codes_are_accepted(client: httpx.Client, live_server: LiveServer) -> None:
    response = client.post("/translate", json={"q": "Open the file.", "source": "EN", "target": "Es"})
    assert response.status_code == 200
    assert response.json()["translatedText"] == live_server.reference("Open the file.", "en", "es")


# ---------------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("body, status, message", [
    ({"source": "en", "target": "es"}, 400, "missing q parameter"),
    ({"q": "hi", "source": "en"}, 400, "missing target parameter"),
    ({"q": "   ", "source": "en", "target": "es"}, 400, ""),
    ({"q": "hi", "source": "en", "target": "xx"}, 400, "xx is not supported"),
    ({"q": "hi", "source": "en", "target": "xx"}, 400, "Unsupported language code 'xx'"),
    ({"q": "hi", "source": "en", "target": "../es"}, 400, "Malformed language code"),
    ({"q": 5, "source": "en", "target": "es"}, 400, "q must be a string"),
    ({"q": "hi", "source": "en", "target": "es", "format": "pdf"}, 400, "format must be"),
])
def test_bad_translate_requests(client: httpx.Client, body: dict[str, Any], status: int, message: str) -> None:
    assert_error(client.post("/translate", json=body), status, message)


def test_unreachable_pair_is_refused_with_reason(client: httpx.Client, live_server: LiveServer) -> None:
    reachable = {i.code: set(i.targets) for i in live_server.service.languages()}
    src = "en"
    unreachable = next(code for code in ("ko", "ja", "ar", "th") if code not in reachable.get(src, set()))
    refusal = client.post("/translate", json={"q": "Hello", "source": src, "target": unreachable})
    assert_error(refusal, 400, f"No route from {src} to {unreachable}")
    # LibreTranslate's sentence for it, with its language names.
    assert refusal.json()["error"] == f"{LANGUAGES[unreachable].english} ({unreachable}) is not available as a " \
                                      f"target language from English (en)"


def test_character_and_batch_limits_are_400_in_libretranslate_words(client: httpx.Client,
                                                                     live_server: LiveServer) -> None:
    limits = live_server.cfg.limits
    too_long = "a" * (limits.max_chars + 1)
    assert_error(client.post("/translate", json={"q": too_long, "source": "en", "target": "es"}), 400,
                 f"Invalid request: request ({limits.max_chars + 1} characters) exceeds text limit "
                 f"({limits.max_chars} characters)")
    too_many = ["hi"] * (limits.max_batch_items + 1)
    assert_error(client.post("/translate", json={"q": too_many, "source": "en", "target": "es"}), 400,
                 f"exceeds text limit ({limits.max_batch_items} texts)")


def test_wrong_content_type_is_415(client: httpx.Client) -> None:
    response = client.post("/translate", content=b"q=hi", headers={"content-type": "text/plain"})
    assert_error(response, 415, "Unsupported Content-Type 'text/plain'")
    response = client.post("/translate_file", json={"q": "hi", "target": "es"})
    assert_error(response, 415, "multipart/form-data")


def test_malformed_and_huge_json(client: httpx.Client) -> None:
    bad = client.post("/translate", content=b'{"q": "hi", ', headers={"content-type": "application/json"})
    assert_error(bad, 400, "Invalid JSON body")
    not_object = client.post("/translate", content=b'["hi"]', headers={"content-type": "application/json"})
    assert_error(not_object, 400, "expected an object")
    huge = b'{"q": "' + b"a" * (8 * 1024 * 1024) + b'", "source": "en", "target": "es"}'
    assert_error(client.post("/translate", content=huge, headers={"content-type": "application/json"}), 413,
                 "Request body too large")


def test_huge_chunked_body_without_length_is_413(client: httpx.Client) -> None:
    """No Content-Length to refuse up front: the cap is enforced while the body streams in."""
    def chunks():
        yield b'{"q": "'
        for _ in range(64):
            yield b"a" * (128 * 1024)
        yield b'", "source": "en", "target": "es"}'

    response = client.post("/translate", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in response.request.headers
    assert_error(response, 413, "Request body too large")
    assert client.get("/health").json()["status"] == "ok"


@pytest.mark.parametrize("raw", [
    '"Open\\u0000 the file \\u0007 now"',          # NUL and control characters
    '"Open the \\ud800 file"',                        # a lone surrogate (valid JSON, invalid Unicode)
    '"Open the file 😀 \\u202e שלום مرحبا"',          # emoji, RTL override, mixed scripts
])
def test_hostile_text_is_served_or_refused_cleanly(client: httpx.Client, raw: str) -> None:
    body = ('{"q": ' + raw + ', "source": "en", "target": "es"}').encode("utf-8")
    response = client.post("/translate", content=body, headers={"content-type": "application/json"})
    assert response.status_code in (200, 400), response.text
    assert ("translatedText" if response.status_code == 200 else "error") in response.json()
    assert client.get("/health").json()["status"] == "ok"
    assert client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "es"}).status_code == 200


def test_ten_thousand_lines_are_refused_over_the_limit(client: httpx.Client, live_server: LiveServer) -> None:
    text = "\n".join(f"line {i}" for i in range(10_000))
    response = client.post("/translate", json={"q": text, "source": "en", "target": "es"})
    assert_error(response, 400, f"exceeds text limit ({live_server.cfg.limits.max_chars} characters)")


def test_unknown_route_and_method_are_json(client: httpx.Client) -> None:
    assert_error(client.get("/nope"), 404, "Not found: /nope")
    assert_error(client.get("/translate"), 405, "Method GET not allowed")


# ---------------------------------------------------------------------------------------------------- other routes


def test_languages_lists_targets(client: httpx.Client, live_server: LiveServer) -> None:
    body = client.get("/languages").json()
    infos = live_server.service.languages()
    used = {i.code for i in infos if i.targets} | {t for i in infos for t in i.targets}
    expected = {i.code: sorted(i.targets) for i in infos if i.code in used}
    assert {entry["code"]: sorted(entry["targets"]) for entry in body} == expected
    assert "ko" not in expected  # no adapter reads or writes Korean in the test profiles
    assert all(entry["name"] for entry in body)
    assert any(entry["targets"] for entry in body)


def test_detect(client: httpx.Client, live_server: LiveServer) -> None:
    text = "Open the file and save the document before you close the window."
    body = client.post("/detect", json={"q": text}).json()
    assert body[0]["language"] == live_server.service.detect(text)[0].code
    assert 0 < body[0]["confidence"] <= 100
    assert_error(client.post("/detect", json={}), 400, "missing q parameter")


def test_health_adapters_and_openapi(client: httpx.Client, live_server: LiveServer) -> None:
    assert client.get("/health").json() == {"status": "ok"}  # LibreTranslate's exact answer
    status = client.get("/status").json()
    assert status["status"] == "ok" and status["ready"] is True and status["model"] and status["version"]
    assert status["quantization"] == live_server.service.backbone.info()["quantization"]
    adapters = client.get("/adapters").json()
    resident = {entry["key"] for entry in adapters["resident"]}
    assert {"en2es", "es2en"} <= resident  # pinned at start in both test profiles
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    for route in ("/translate", "/languages", "/detect", "/translate_file", "/health", "/status", "/metrics",
                  "/adapters",
                  "/admin/pin", "/v1/chat/completions", "/v1/models"):
        assert route in paths


def test_metrics_count_requests_pairs_and_cache(client: httpx.Client) -> None:
    client.post("/translate", json={"q": "Save the document.", "source": "en", "target": "es"})
    client.post("/translate", json={"q": "x", "source": "en", "target": "xx"})
    client.get("/no/such/page")
    text = client.get("/metrics").text
    assert 'hmt_http_requests_total{method="POST",route="/translate",status="200"}' in text
    assert 'hmt_http_requests_total{method="POST",route="/translate",status="400"}' in text
    assert 'hmt_http_requests_total{method="GET",route="unmatched",status="404"}' in text
    assert 'hmt_translations_total{front="rest",pair="en2es",route_kind="direct"}' in text
    assert 'hmt_translation_seconds_count{pair="en2es"}' in text
    assert 'hmt_resident_adapters{adapter="en2es",state="pinned"} 1.0' in text
    assert 'hmt_adapter_cache_events_total{event="hits"}' in text
    assert 'hmt_memory_bytes{kind="rss"}' in text
    assert "hmt_engine_prefilling_rows 0.0" in text   # none between requests
    # What runs: the weights' quantization and kernel and the attention cache's dtype are labels of the info gauge.
    info = next(line for line in text.splitlines() if line.startswith("hmt_backbone_info{"))
    assert all(f'{label}="' in info for label in ("quantization", "int8_kernel", "kv_cache")), info


@pytest.mark.parametrize("model, expected", [
    ("es", (None, "es")), ("zh-hant", (None, "zh-Hant")), ("en2es", ("en", "es")), ("en-es", ("en", "es")),
    ("zh-Hant2en", ("zh-Hant", "en")), ("en-zh-Hant", ("en", "zh-Hant")), ("zh-Hant-en", ("zh-Hant", "en")),
    ("en:es", ("en", "es")), ("hunyuan-mt", (None, None)), ("gpt-4", (None, None)), ("../es", (None, None)),
])
def test_openai_model_ids(model: str, expected: tuple[str | None, str | None]) -> None:
    assert resolve_model_id(model) == expected


# ---------------------------------------------------------------------------------------------------- documents


def _round_trip(client: httpx.Client, name: str, data: bytes, media: str) -> httpx.Response:
    response = client.post("/translate_file", files={"file": (name, data, media)},
                           data={"source": "en", "target": "es"})
    assert response.status_code == 200, response.text
    url = response.json()["translatedFileUrl"]
    assert url.startswith(str(client.base_url)) and "/download_file/" in url
    download = client.get(url)
    assert download.status_code == 200
    return download


@pytest.mark.parametrize("name, data, media", [
    ("notes.txt", TXT.encode(), "text/plain"),
    ("readme.md", MD.encode(), "text/markdown"),
    ("movie.srt", SRT.encode(), "application/x-subrip"),
    ("page.html", HTML.encode(), "text/html"),
])
def test_text_documents_round_trip(client: httpx.Client, live_server: LiveServer, name: str, data: bytes,
                                   media: str) -> None:
    download = _round_trip(client, name, data, media)
    expected, _ = translate_upload(live_server.service, data, name, "en", "es", live_server.cfg.limits)
    assert download.content == expected.data
    assert name.rsplit(".", 1)[0] + ".es." in download.headers["content-disposition"]
    text = download.content.decode("utf-8")
    if name.endswith(".md"):
        assert "```python\nprint('keep me')\n```" in text and text.startswith("# ")
    if name.endswith(".srt"):
        assert "00:00:01,000 --> 00:00:02,500" in text and "00:00:03,000 --> 00:00:04,000" in text
    if name.endswith(".html"):
        assert '<a href="https://example.org/x">' in text and "<h1>" in text


def test_docx_round_trip_keeps_heading_bold_and_table(client: httpx.Client, live_server: LiveServer) -> None:
    data = make_docx()
    download = _round_trip(client, "report.docx", data, "application/octet-stream")
    got = docx_structure(download.content)
    expected, _ = translate_upload(live_server.service, data, "report.docx", "en", "es", live_server.cfg.limits)
    assert got == docx_structure(expected.data)
    original = docx_structure(data)
    assert [style for style, _ in got["paragraphs"]] == [style for style, _ in original["paragraphs"]]
    assert got["paragraphs"][0][0] == "Heading 1"
    assert len(got["bold"]) == 1
    assert [len(row) for row in got["tables"][0]] == [2, 2]


def test_pdf_comes_back_as_docx_with_a_note(client: httpx.Client, live_server: LiveServer) -> None:
    data = make_pdf(PDF_LINES)
    response = client.post("/translate_file", files={"file": ("scan.pdf", data, "application/pdf")},
                           data={"source": "en", "target": "es"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert ".docx" in body["note"] or "docx" in body["note"].lower()
    download = client.get(body["translatedFileUrl"])
    assert download.headers["content-type"].startswith("application/vnd.openxmlformats")
    expected, _ = translate_upload(live_server.service, data, "scan.pdf", "en", "es", live_server.cfg.limits)
    assert docx_structure(download.content)["paragraphs"] == docx_structure(expected.data)["paragraphs"]


@pytest.mark.parametrize("name, data, status", [
    ("virus.exe", b"MZ\x90\x00", 415),
    ("fake.docx", b"this is not a zip", 415),
    ("empty.txt", b"", 400),
])
def test_bad_uploads(client: httpx.Client, name: str, data: bytes, status: int) -> None:
    response = client.post("/translate_file", files={"file": (name, data)}, data={"target": "es"})
    assert response.status_code == status, response.text
    assert response.json()["error"]


def test_upload_limits_and_missing_file(client: httpx.Client, live_server: LiveServer) -> None:
    assert_error(client.post("/translate_file", files={"other": ("a.txt", b"hi")}, data={"target": "es"}), 400,
                 "missing file parameter")
    big = b"a" * (live_server.cfg.limits.max_file_bytes + 1)
    response = client.post("/translate_file", files={"file": ("big.txt", big)}, data={"target": "es"})
    assert response.status_code == 413, response.text


def test_upload_temp_files_are_released(client: httpx.Client) -> None:
    """A 3 MiB multipart upload spools to a temporary file; after the request the server holds none open.

    (Only this process's open files are compared: other processes may create files in /tmp meanwhile.)"""
    import tempfile

    import psutil

    tmp = Path(tempfile.gettempdir())
    me = psutil.Process()
    before_open = {f.path for f in me.open_files()}
    response = client.post("/translate_file", files={"file": ("big.exe", b"MZ" + b"\0" * (3 * 2**20))},
                           data={"target": "es"})
    assert response.status_code == 415, response.text
    leaked_open = {f.path for f in me.open_files()} - before_open
    assert not [p for p in leaked_open if p.startswith(str(tmp))], leaked_open


def test_unknown_download_is_404(client: httpx.Client) -> None:
    assert_error(client.get("/download_file/" + "0" * 32 + "/x.txt"), 404, "not found")
    assert_error(client.get("/download_file/..%2F..%2Fetc/passwd"), 404, "")


# ---------------------------------------------------------------------------------------------------- admin


def test_admin_routes_need_the_key(client: httpx.Client) -> None:
    assert_error(client.post("/admin/rescan"), 403, "Missing admin key")
    assert_error(client.post("/admin/rescan", headers={"X-Admin-Key": "wrong"}), 403, "Invalid admin key")


def test_admin_pin_unpin_unload(client: httpx.Client, live_server: LiveServer) -> None:
    headers = {"X-Admin-Key": ADMIN_KEY}
    client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "de"})
    assert client.post("/admin/rescan", headers=headers).json() == {"ok": True, "action": "rescan"}
    pinned = client.post("/admin/pin", headers=headers, json={"pair": "en2de"}).json()
    assert pinned == {"ok": True, "action": "pin", "pair": "en2de", "changed": True}
    resident = {e["key"]: e for e in client.get("/adapters").json()["resident"]}
    assert resident["en2de"]["pinned"] is True
    assert client.post("/admin/unpin", headers=headers, json={"pair": "en2de"}).json()["changed"] is True
    state = client.get("/adapters").json()
    assert "en2de" not in {e["key"] for e in state["resident"]} and "en2de" in state["ram_tier"]
    client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "de"})  # back into a slot
    assert "en2de" in {e["key"] for e in client.get("/adapters").json()["resident"]}
    assert client.post("/admin/unload", headers=headers, data={"pair": "en2de"}).json()["changed"] is True
    assert "en2de" not in {e["key"] for e in client.get("/adapters").json()["resident"]}
    assert client.post("/admin/unload", headers=headers, data={"pair": "en2de"}).json()["changed"] is False
    assert_error(client.post("/admin/pin", headers=headers, json={"pair": "en2ko"}), 404, "en2ko")
    assert_error(client.post("/admin/pin", headers=headers, json={}), 400, "missing pair parameter")


# ---------------------------------------------------------------------------------------------------- concurrency


def test_ui_job_does_not_block_rest(live_server: LiveServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A UI document translation held open inside the service; REST keeps answering meanwhile."""
    from gradio_client import Client, handle_file

    entered, release = threading.Event(), threading.Event()
    real = live_server.service.translate_segments

    def held(segments: list[str], src: str, tgt: str, progress: Any = None, **kwargs: Any) -> list[str]:
        entered.set()
        assert release.wait(60), "test never released the held job"
        return real(segments, src, tgt, progress=progress, **kwargs)

    monkeypatch.setattr(live_server.service, "translate_segments", held)
    ui = Client(live_server.url + "/ui/", verbose=False)
    upload = tmp_path / "notes.txt"
    upload.write_text(TXT, encoding="utf-8")
    job = ui.submit(handle_file(str(upload)), "en", "es", api_name="/translate_document")
    try:
        assert entered.wait(60), "the UI job never reached the service"
        with httpx.Client(base_url=live_server.url, timeout=60) as c:
            response = c.post("/translate", json={"q": "Close the window.", "source": "en", "target": "es"})
            assert response.json()["translatedText"] == live_server.reference("Close the window.", "en", "es")
            assert c.get("/health").status_code == 200
        assert not job.done()
    finally:
        release.set()
    out_path, note = job.result(timeout=120)
    assert "Spanish" in note
    expected, _ = translate_upload(live_server.service, TXT.encode(), "notes.txt", "en", "es",
                                   live_server.cfg.limits)
    with open(out_path, "rb") as fh:
        assert fh.read() == expected.data


def test_health_is_503_until_nothing_is_left_to_load(client: httpx.Client, live_server: LiveServer,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """/health answers 503 "starting" while a request could still wait for something loading (the language
    detector, the warm-up's first requests), then exactly LibreTranslate's 200 {"status": "ok"}."""
    import hunyuan_mt.service.translation as service_mod

    monkeypatch.setattr(live_server.service.cfg.model, "warmup", True)
    monkeypatch.setattr(service_mod, "detector_ready", lambda: False)
    starting = client.get("/health")
    assert starting.status_code == 503 and starting.json() == {"status": "starting"}
    assert client.get("/status").json()["ready"] is False
    monkeypatch.setattr(service_mod, "detector_ready", lambda: True)
    ok = client.get("/health")
    assert ok.status_code == 200 and ok.json() == {"status": "ok"}
    assert client.get("/status").json()["ready"] is True


def test_language_detection_runs_outside_the_server_process() -> None:
    """lingua loads its models in a helper process: loading them holds the GIL for seconds, which would freeze
    the server's threads (the decode loop included)."""
    import os

    from hunyuan_mt.text import detect

    detect.warm(timeout=120)
    assert detect.ready() and detect._CHILD is None  # this process never built lingua's detector
    pids = {p.pid for p in detect.get_detector()._pool._processes.values()}
    assert pids and os.getpid() not in pids
    assert detect.detect("Das ist ein schöner Tag, sagte sie.")[0].code == "de"


def test_console_access_log_leaves_out_the_pages_own_polling(web_service: Any, live_server: LiveServer) -> None:
    """uvicorn at info level, as app.py runs it: REST calls and failures are logged, the page's successful
    requests (assets, the Status tab's polling every 2 s) are not."""
    import logging

    from hunyuan_mt.web.server import ServerThread, build_app, quiet_page_polling
    from web_server import free_port, with_server

    port = free_port()
    thread = ServerThread(build_app(web_service, with_server(live_server.cfg, port=port)), "127.0.0.1", port,
                          log_level="info").start()
    quiet_page_polling()
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep()
    logging.getLogger("uvicorn.access").addHandler(handler)
    try:
        with httpx.Client(base_url=thread.url, timeout=60) as c:
            assert c.get("/ui/").status_code == 200
            assert c.get("/ui/config").status_code == 200
            assert c.get("/ui/no-such-page").status_code == 404
            assert c.get("/health").status_code == 200
            c.get("/languages", params={"api_key": "s3cret-key", "x": "1"})
    finally:
        logging.getLogger("uvicorn.access").removeHandler(handler)
        thread.stop()
    paths = [m.split('"')[1].split()[1] for m in seen]
    # A key in the query string never reaches the log.
    assert paths == ["/ui/no-such-page", "/health", "/languages?api_key=[redacted]&x=1"], seen
    assert not any("s3cret" in m for m in seen)
