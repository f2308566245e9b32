"""Clients written elsewhere, unchanged, against the live server: three LibreTranslate clients (libretranslatepy,
deep-translator, libretranslate-aio), gradio_client and openai."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import libretranslate_aio
import openai
import pytest
from deep_translator import LibreTranslator
from deep_translator.exceptions import AuthorizationException
from gradio_client import Client, handle_file
from libretranslatepy import LibreTranslateAPI

from hunyuan_mt.text import prompts
from hunyuan_mt.web.doctranslate import translate_upload
from sample_docs import docx_structure, make_docx
from seams import memory_in
from web_server import ADMIN_KEY, LiveServer, serve, with_server

TEXT = "Open the file and save the document."


# ---------------------------------------------------------------------------------------------------- LibreTranslate


def test_libretranslatepy_translates_detects_and_lists(live_server: LiveServer) -> None:
    lt = LibreTranslateAPI(live_server.url)
    assert lt.translate("Unknown error", "en", "es") == live_server.expected("Unknown error", "en", "es")
    assert lt.translate(TEXT, "en", "es") == live_server.reference(TEXT, "en", "es")
    detected = lt.detect(TEXT)
    assert detected[0]["language"] == live_server.service.detect(TEXT)[0].code
    codes = {entry["code"] for entry in lt.languages()}
    assert {"en", "es"} <= codes


def test_libretranslatepy_auto_source(live_server: LiveServer) -> None:
    lt = LibreTranslateAPI(live_server.url)
    source = live_server.service.detect(TEXT)[0].code
    assert lt.translate(TEXT, "auto", "es") == live_server.reference(TEXT, source, "es")


def test_deep_translator_posts_everything_in_the_query_string(live_server: LiveServer) -> None:
    """deep-translator sends `POST /translate?q=...&source=en&target=es&format=text&api_key=...` with no body; its
    api_key is mandatory client-side, and a server without keys ignores it (as LibreTranslate does)."""
    translator = LibreTranslator(source="en", target="es", api_key="any", custom_url=live_server.url + "/")
    assert translator.translate("Unknown error") == live_server.expected("Unknown error", "en", "es")
    assert translator.translate_batch(["Unknown error", TEXT]) == [
        live_server.expected("Unknown error", "en", "es"), live_server.reference(TEXT, "en", "es")]


def test_deep_translator_sees_a_wrong_key_as_its_authorization_error(web_service: Any, live_server: LiveServer
                                                                      ) -> None:
    with serve(web_service, with_server(live_server.cfg, api_keys=["right-key"])) as keyed:
        wrong = LibreTranslator(source="en", target="es", api_key="wrong-key", custom_url=keyed.url + "/")
        with pytest.raises(AuthorizationException):
            wrong.translate("Unknown error")
        right = LibreTranslator(source="en", target="es", api_key="right-key", custom_url=keyed.url + "/")
        assert right.translate("Unknown error") == live_server.expected("Unknown error", "en", "es")


@pytest.fixture()
def lt_aio(live_server: LiveServer) -> Any:
    with libretranslate_aio.LibreTranslate(live_server.url, timeout=120) as client:
        yield client


def test_libretranslate_aio_translates_with_alternatives(lt_aio: Any, live_server: LiveServer) -> None:
    """libretranslate-aio posts forms (a batch as repeated q fields) and reads `alternatives`."""
    one = lt_aio.translate("Unknown error", "en", "es", alternatives=2)
    assert one.translated_text == live_server.expected("Unknown error", "en", "es")
    wanted = live_server.service.translate_batch(["Unknown error"], "en", "es", alternatives=2)[0].alternatives
    assert one.alternatives == wanted and len(wanted) >= 1
    assert one.translated_text not in one.alternatives
    both = lt_aio.translate(["Unknown error", TEXT], "en", "es", alternatives=1)
    assert both.translated_text == [live_server.expected("Unknown error", "en", "es"),
                                    live_server.reference(TEXT, "en", "es")]
    assert isinstance(both.alternatives, list) and len(both.alternatives) == 2
    assert all(isinstance(a, list) and len(a) <= 1 for a in both.alternatives)
    plain = lt_aio.translate("Unknown error", "en", "es")
    assert plain.alternatives is None  # not asked for, not sent


def test_libretranslate_aio_auto_detect_html_and_languages(lt_aio: Any, live_server: LiveServer) -> None:
    auto = lt_aio.translate(TEXT, "auto", "es")
    detected = live_server.service.detect(TEXT)[0].code
    assert auto.detected_language.language == detected
    assert auto.translated_text == live_server.reference(TEXT, detected, "es")
    html = lt_aio.translate('<p class="x">Unknown error</p>', "en", "es", format="html")
    assert html.translated_text == f'<p class="x">{live_server.expected("Unknown error", "en", "es")}</p>'
    assert lt_aio.detect(TEXT)[0].language == detected
    codes = {lang.code: lang for lang in lt_aio.languages()}
    assert "es" in codes["en"].targets


def test_libretranslate_aio_frontend_settings_suggest_and_health(lt_aio: Any, live_server: LiveServer,
                                                                 tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # A memory of this test's own: the suggestion below must not answer the other tests' "Hello".
    monkeypatch.setattr(live_server.service, "tm", memory_in(tmp_path))
    settings = lt_aio.frontend_settings()
    assert settings.char_limit == live_server.cfg.limits.max_chars
    assert (settings.api_keys, settings.key_required, settings.suggestions) == (False, False, True)
    assert ".docx" in settings.supported_files_format and ".srt" in settings.supported_files_format
    assert settings.language.source.code == "auto" and settings.language.target.code == "es"
    # A suggestion is a correction: it answers the same text at once, and is kept as said.
    assert lt_aio.suggest("Hello there", "Hola a todos", "en", "es") is True
    assert lt_aio.translate("Hello there", "en", "es").translated_text == "Hola a todos"
    [kept] = live_server.service.tm.rows.corrections("en2es")
    assert (kept.source, kept.translation) == ("Hello there", "Hola a todos")
    monkeypatch.setattr(live_server.app.state.api.cfg.server, "suggestions", False)
    assert lt_aio.frontend_settings().suggestions is False
    with pytest.raises(libretranslate_aio.ForbiddenError, match="Suggestions are disabled on this server."):
        lt_aio.suggest("Hello", "Hola", "en", "es")
    assert lt_aio.health() is True


def test_libretranslate_aio_errors_are_its_typed_exceptions(lt_aio: Any, live_server: LiveServer) -> None:
    with pytest.raises(libretranslate_aio.BadRequestError, match="exceeds text limit"):
        lt_aio.translate("a" * (live_server.cfg.limits.max_chars + 1), "en", "es")
    with pytest.raises(libretranslate_aio.BadRequestError, match="^xx is not supported$"):
        lt_aio.translate("Hello", "en", "xx")
    with pytest.raises(libretranslate_aio.BadRequestError, match="alternatives must be from 0 to 3"):
        lt_aio.translate("Hello", "en", "es", alternatives=9)


def test_libretranslate_aio_translates_a_file(lt_aio: Any, live_server: LiveServer, tmp_path: Path) -> None:
    source = tmp_path / "note.txt"
    source.write_text("Unknown error\n", encoding="utf-8")
    done = lt_aio.translate_file(source, "en", "es")
    body = httpx.get(done.translated_file_url, timeout=60).text
    assert body == live_server.expected("Unknown error", "en", "es") + "\n"


def test_query_string_and_body_merge_as_in_libretranslate(live_server: LiveServer) -> None:
    """Query string, form and JSON are read together: the body's fields win where both give one."""
    url = live_server.url
    want = live_server.expected("Unknown error", "en", "es")
    # "Unknown error" is in the demo's translation memory: the answer says so, beyond LibreTranslate's shape.
    query_only = httpx.post(f"{url}/translate", params={"q": "Unknown error", "source": "en", "target": "es"})
    assert query_only.json() == {"translatedText": want, "memorySegments": 1, "confidence": 1.0}
    mixed = httpx.post(f"{url}/translate", params={"source": "en", "target": "de"},
                       json={"q": "Unknown error", "target": "es"})
    assert mixed.json() == {"translatedText": want, "memorySegments": 1, "confidence": 1.0}
    form = httpx.post(f"{url}/translate?target=es", data={"q": "Unknown error", "source": "en"})
    assert form.json() == {"translatedText": want, "memorySegments": 1, "confidence": 1.0}
    crlf = httpx.post(f"{url}/translate", data={"q": "Unknown error\r\nUnknown error", "source": "en",
                                                  "target": "es"})
    assert crlf.json() == {"translatedText": f"{want}\n{want}", "memorySegments": 2, "confidence": 1.0}
    detect = httpx.post(f"{url}/detect", params={"q": TEXT})
    assert detect.json()[0]["language"] == live_server.service.detect(TEXT)[0].code


def test_spec_is_the_openapi_document(live_server: LiveServer) -> None:
    spec = httpx.get(live_server.url + "/spec").json()
    assert spec == httpx.get(live_server.url + "/openapi.json").json()
    assert {"/translate", "/detect", "/languages", "/translate_file", "/frontend/settings"} <= set(spec["paths"])
    translate = spec["paths"]["/translate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "alternatives" in translate["properties"]


# ---------------------------------------------------------------------------------------------------- gradio_client


@pytest.fixture(scope="module")
def ui(live_server: LiveServer) -> Client:
    return Client(live_server.url + "/ui/", verbose=False)


def test_gradio_translate_endpoint(ui: Client, live_server: LiveServer) -> None:
    text, info = ui.predict(TEXT, "en", "es", api_name="/translate")
    assert text == live_server.reference(TEXT, "en", "es")
    assert "en → es (direct)" in info and "ms" in info


def test_gradio_auto_detect_and_pivot_route(ui: Client, live_server: LiveServer) -> None:
    text, info = ui.predict(TEXT, "auto", "es", api_name="/translate")
    detected = live_server.service.detect(TEXT)[0].code
    assert text == live_server.reference(TEXT, detected, "es")
    assert "Detected:" in info
    # es → de has no direct adapter in either test profile: it goes through the pivot (en).
    text, info = ui.predict("Archivo no encontrado", "es", "de", api_name="/translate")
    assert text == live_server.expected("Archivo no encontrado", "es", "de")
    assert "es → en → de (pivot)" in info


def test_gradio_errors_are_readable(ui: Client, live_server: LiveServer) -> None:
    with pytest.raises(Exception) as empty:
        ui.predict("   ", "en", "es", api_name="/translate")
    assert "Type or paste some text" in str(empty.value)
    reachable = {i.code: set(i.targets) for i in live_server.service.languages()}
    unreachable = next(c for c in ("ko", "ja", "ar", "th") if c not in reachable["en"])
    with pytest.raises(Exception) as refused:
        ui.predict("Hello", "en", unreachable, api_name="/translate")
    assert "Traceback" not in str(refused.value)
    assert unreachable in str(refused.value) or "reach" in str(refused.value).lower()


def test_gradio_document_endpoint(ui: Client, live_server: LiveServer, tmp_path: Path) -> None:
    source = tmp_path / "report.docx"
    source.write_bytes(make_docx())
    out_path, note = ui.predict(handle_file(str(source)), "en", "es", api_name="/translate_document")
    assert Path(out_path).name == "report.es.docx"
    assert "English → Spanish" in note
    expected, _ = translate_upload(live_server.service, source.read_bytes(), "report.docx", "en", "es",
                                   live_server.cfg.limits)
    assert docx_structure(Path(out_path).read_bytes()) == docx_structure(expected.data)


def test_gradio_document_progress_counts_segments(ui: Client, live_server: LiveServer, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The service reports progress per segment; the UI's progress bar shows it (held between two segments)."""
    halfway, release = threading.Event(), threading.Event()
    real = live_server.service.translate_segments

    def stepwise(segments: list[str], src: str, tgt: str, progress: Any = None, **kwargs: Any) -> list[str]:
        progress(1, len(segments))
        halfway.set()
        assert release.wait(60), "test never released the held job"
        return real(segments, src, tgt, progress=progress, **kwargs)

    monkeypatch.setattr(live_server.service, "translate_segments", stepwise)
    source = tmp_path / "three.txt"
    source.write_text("Open the file.\n\nSave the document.\n\nClose the window.\n", encoding="utf-8")
    job = ui.submit(handle_file(str(source)), "en", "es", api_name="/translate_document")
    try:
        assert halfway.wait(60)
        seen = None
        for _ in range(600):  # progress messages reach the client asynchronously; poll, don't time
            update = job.status()
            if update.progress_data and update.progress_data[0].index == 1:
                seen = update.progress_data[0]
                break
            threading.Event().wait(0.1)
        assert seen is not None, "no per-segment progress reached the client"
        assert (seen.index, seen.length, seen.unit) == (1, 3, "segments")
    finally:
        release.set()
    out_path, _ = job.result(timeout=120)
    assert Path(out_path).name == "three.es.txt"


@pytest.mark.parametrize("name, data, message", [
    ("virus.exe", b"MZ\x90\x00", "415 Unsupported Media Type"),  # refused by the upload route, before it is stored
    ("broken.docx", b"not a zip at all", "not a Word document"),
    ("empty.txt", b"", "empty"),
])
def test_gradio_document_errors_are_readable(ui: Client, tmp_path: Path, name: str, data: bytes,
                                             message: str) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(Exception) as refused:
        ui.predict(handle_file(str(path)), "en", "es", api_name="/translate_document")
    assert message in str(refused.value) and "Traceback" not in str(refused.value)


def test_gradio_status_endpoint_shows_resident_adapters(ui: Client, live_server: LiveServer) -> None:
    ui.predict(TEXT, "en", "es", api_name="/translate")
    overview, adapters, counters, latency, hit_rate = ui.predict(api_name="/status")
    assert "Backbone:" in overview and "cpu" in overview
    rows = {row[0]: row[1] for row in adapters["data"]}
    assert rows["en2es"] == "pinned"
    assert adapters["headers"] == ["adapter", "state", "leases", "version"]
    assert {row[0]: row[3] for row in adapters["data"]}["en2es"] == "v1"  # the serving version, as shipped
    assert "Hits" in counters and "LRU" in counters
    # The plots come as updates: data, the fixed window (x_lim, epoch seconds) and a caption saying what they show.
    assert latency["value"]["data"] and latency["value"]["datatypes"]["time"] == "temporal"
    start, end = latency["x_lim"]
    assert end - start == 300 and latency["value"]["data"][-1][0] / 1000 <= end
    assert " in the last 5 minutes; slowest " in latency["caption"]
    slowest = max(point[1] for point in latency["value"]["data"])
    # A round end above it: the next of 1, 2, 2.5, 5 × 10^k above 1.05 × slowest, at most 2.1 × slowest.
    assert latency["y_lim"][0] == 0 and slowest < latency["y_lim"][1] <= 2.1 * slowest + 1
    assert hit_rate["caption"].startswith("Now ") and "already loaded" in hit_rate["caption"]


def test_rest_job_does_not_block_ui(live_server: LiveServer, ui: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """A REST translate held open inside the service; the UI keeps answering meanwhile."""
    entered, release = threading.Event(), threading.Event()
    real = live_server.service.translate_batch
    held_text = "Close the window before you open the file."

    def maybe_held(texts: list[str], src: str, tgt: str, **kw: Any) -> list[Any]:
        if texts == [held_text]:
            entered.set()
            assert release.wait(60), "test never released the held request"
        return real(texts, src, tgt, **kw)

    monkeypatch.setattr(live_server.service, "translate_batch", maybe_held)
    result: dict[str, Any] = {}

    def call_rest() -> None:
        with httpx.Client(base_url=live_server.url, timeout=120) as c:
            result["response"] = c.post("/translate", json={"q": held_text, "source": "en", "target": "es"})

    thread = threading.Thread(target=call_rest)
    thread.start()
    try:
        assert entered.wait(60)
        text, _ = ui.predict(TEXT, "en", "es", api_name="/translate")
        assert text == real([TEXT], "en", "es")[0].text
        assert "response" not in result  # the REST call is still held
    finally:
        release.set()
        thread.join(120)
    assert result["response"].json()["translatedText"] == real([held_text], "en", "es")[0].text


def test_saturated_rest_pool_leaves_the_ui_its_own_threads(live_server: LiveServer, ui: Client,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Every REST worker thread held inside the service at once; the UI still translates (its own pool). One
    caller holds at most `shares.requests` threads, so the pool is filled from as many addresses as that takes."""
    from hunyuan_mt.web.api import REST_THREADS

    per_caller = live_server.cfg.shares.requests

    held_text = "Close the window before you open the file."
    inside = threading.Semaphore(0)
    release = threading.Event()
    real = live_server.service.translate_batch

    def maybe_held(texts: list[str], src: str, tgt: str, **kw: Any) -> list[Any]:
        if texts == [held_text]:
            inside.release()
            assert release.wait(120), "test never released the held requests"
        return real(texts, src, tgt, **kw)

    monkeypatch.setattr(live_server.service, "translate_batch", maybe_held)
    statuses: list[int] = []

    def call_rest(address: str) -> None:
        transport = httpx.HTTPTransport(local_address=address)
        with httpx.Client(base_url=live_server.url, timeout=180, transport=transport) as c:
            statuses.append(c.post("/translate", json={"q": held_text, "source": "en", "target": "es"}).status_code)

    threads = [threading.Thread(target=call_rest, args=(f"127.0.0.{10 + n // per_caller}",))
               for n in range(REST_THREADS)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(REST_THREADS):
            assert inside.acquire(timeout=60), "not every REST call reached the service (shared thread pool?)"
        text, _ = ui.predict(TEXT, "en", "es", api_name="/translate")
        assert text == real([TEXT], "en", "es")[0].text
        assert statuses == []
    finally:
        release.set()
        for thread in threads:
            thread.join(180)
    assert statuses == [200] * REST_THREADS


def test_gradio_admin_needs_the_key(ui: Client) -> None:
    with pytest.raises(Exception) as refused:
        ui.predict("wrong", "en2es", api_name="/admin_pin")
    assert "Invalid admin key" in str(refused.value)
    assert "Rescanned" in ui.predict(ADMIN_KEY, "", api_name="/admin_rescan")
    with pytest.raises(Exception) as traversal:
        ui.predict(ADMIN_KEY, "../../etc/passwd", api_name="/admin_pin")
    assert "Malformed pair name" in str(traversal.value)


# ---------------------------------------------------------------------------------------------------- OpenAI


@pytest.fixture(scope="module")
def oai(live_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", max_retries=0)


def test_openai_model_names_target_or_pair(oai: openai.OpenAI, live_server: LiveServer) -> None:
    french = oai.chat.completions.create(model="en2fr", messages=[{"role": "user", "content": "Unknown error"}])
    assert french.choices[0].message.content == live_server.expected("Unknown error", "en", "fr")
    pair = oai.chat.completions.create(model="en2es", messages=[{"role": "user", "content": TEXT}])
    assert pair.choices[0].message.content == live_server.reference(TEXT, "en", "es")
    dashed = oai.chat.completions.create(model="en-es", messages=[{"role": "user", "content": TEXT}])
    assert dashed.choices[0].message.content == pair.choices[0].message.content
    detected = live_server.service.detect(TEXT)[0].code
    target_only = oai.chat.completions.create(model="es", messages=[
        {"role": "system", "content": "You are a translator."},
        {"role": "user", "content": "ignored earlier turn"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": TEXT}])
    assert target_only.choices[0].message.content == live_server.reference(TEXT, detected, "es")


def test_openai_hunyuan_prompt_format(oai: openai.OpenAI, live_server: LiveServer) -> None:
    prompt = prompts.build("hunyuan-mt", TEXT, "en", "es")
    reply = oai.chat.completions.create(model="hunyuan-mt", messages=[{"role": "user", "content": prompt}])
    detected = live_server.service.detect(TEXT)[0].code
    assert reply.choices[0].message.content == live_server.reference(TEXT, detected, "es")
    # The pair in the model id fixes the source; the prompt's text is what gets translated.
    reply = oai.chat.completions.create(model="en2es", messages=[{"role": "user", "content": prompt}])
    assert reply.choices[0].message.content == live_server.reference(TEXT, "en", "es")


def test_openai_streaming(oai: openai.OpenAI, live_server: LiveServer) -> None:
    stream = oai.chat.completions.create(model="en2es", messages=[{"role": "user", "content": TEXT}], stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    assert text == live_server.reference(TEXT, "en", "es")


def test_openai_models_and_errors(oai: openai.OpenAI) -> None:
    ids = {model.id for model in oai.models.list()}
    assert {"es", "en2es", "es2en"} <= ids
    with pytest.raises(openai.BadRequestError) as unknown:
        oai.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "Hello"}])
    assert "Unknown model 'gpt-4'" in str(unknown.value)
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model="es", messages=[{"role": "system", "content": "no user turn"}])


def test_openai_n_choices_are_the_alternatives(oai: openai.OpenAI, live_server: LiveServer) -> None:
    reply = oai.chat.completions.create(model="en2es", n=3, messages=[{"role": "user", "content": TEXT}])
    want = live_server.service.translate_batch([TEXT], "en", "es", alternatives=2)[0]
    assert [c.message.content for c in reply.choices] == [want.text, *want.alternatives][:3]
    assert [c.index for c in reply.choices] == list(range(len(reply.choices))) and len(reply.choices) >= 2
    top = live_server.cfg.limits.max_alternatives + 1
    with pytest.raises(openai.BadRequestError, match=f"n must be a whole number from 1 to {top}"):
        oai.chat.completions.create(model="en2es", n=top + 1, messages=[{"role": "user", "content": TEXT}])
    with pytest.raises(openai.BadRequestError, match="n > 1 cannot be streamed"):
        oai.chat.completions.create(model="en2es", n=2, stream=True, messages=[{"role": "user", "content": TEXT}])
