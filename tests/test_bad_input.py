"""Bad input end to end: through the real HTTP server on 127.0.0.1 and the UI handlers.

Every refusal is a clear 4xx with `{"error": message}` (no traceback, no path), and afterwards the server is
healthy: `/health` is ok and the next good request gets its exact reference. Inputs that are odd but valid
(control characters, lone surrogates, RTL, emoji, case variants of codes, 10k lines) are served, and equal the
reference of the cleaned text. The UI handlers raise `gr.Error` with the same readable messages. Upload temp files
never outlive the request.

The server is the session-wide one of tests/web_server.py (demo model when built, else the tiny Marian model).
"""

from __future__ import annotations

import io
import os
import random
import tempfile
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr
import httpx
import pytest

from hunyuan_mt.config import LimitsConfig
from hunyuan_mt.documents import SUPPORTED_EXTENSIONS
from hunyuan_mt.web.doctranslate import translate_upload
from test_documents import make_docx, make_pdf, tiny_png
from web_server import ADMIN_KEY, LiveServer

GOOD = "Open the file."
SRT_OK = "1\n00:00:01,000 --> 00:00:02,000\nHello there.\n\n"


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def good_reference(live_server: LiveServer) -> str:
    return live_server.reference(GOOD, "en", "es")


@pytest.fixture(scope="module")
def limits(live_server: LiveServer) -> LimitsConfig:
    return live_server.cfg.limits


@pytest.fixture(scope="module")
def ui(live_server: LiveServer) -> Any:
    """The UI's handler object (web/ui.py TranslatorUI) of the running server."""
    return live_server.app.state.blocks.hmt_ui


def refused(response: httpx.Response, status: int, message: str) -> str:
    """A clear 4xx: exactly `{"error": ...}` starting with `message`, JSON, no traceback."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    # An unreachable pair also lists what is reachable; where LibreTranslate has its own sentence for the error,
    # that is the `error` and ours the `detail`.
    assert set(body) - {"reachable", "detail"} == {"error"}, body
    said = body.get("detail", body["error"])
    assert said.startswith(message), said
    assert "Traceback" not in response.text and 'File "' not in response.text
    return said


def healthy(client: httpx.Client, good_reference: str) -> None:
    """After any refusal: /health ok and the next good request served with its reference."""
    assert client.get("/health").json()["status"] == "ok"
    response = client.post("/translate", json={"q": GOOD, "source": "en", "target": "es"})
    assert response.status_code == 200 and response.json()["translatedText"] == good_reference
    # suggestions and the model's confidence may come beside it
    assert set(response.json()) <= {"translatedText", "memoryMatches", "confidence"}


def ui_error(call: Callable[[], Any]) -> str:
    with pytest.raises(gr.Error) as err:
        call()
    message = err.value.message
    assert "Traceback" not in message and 'File "' not in message
    return message


# ------------------------------------------------------------------------------------------------ text: refused

L = LimitsConfig()  # ids only; the messages below are built from the server's own limits


def _text_cases(limits: LimitsConfig) -> dict[str, tuple[dict[str, Any], int, str]]:
    over = limits.max_chars + 1
    return {
        "empty-text": ({"q": ""}, 400, "Invalid request: missing q parameter"),
        "whitespace-only": ({"q": " \n\t  "}, 400, "Text is empty (only whitespace or control characters)."),
        "control-chars-only": ({"q": "\x00\x07\x1b\x7f"}, 400, "Text is empty."),
        "over-char-limit": ({"q": "a" * over}, 400, f"Invalid request: request ({over} characters) exceeds text "
                                                    f"limit ({limits.max_chars} characters)"),
        "10k-lines-over-char-limit": ({"q": "\n".join([GOOD] * 10_000)}, 400,
                                      f"Invalid request: request ({len(GOOD) * 10_000 + 9_999} characters) exceeds "
                                      f"text limit ({limits.max_chars} characters)"),
        "batch-too-long": ({"q": [GOOD] * (limits.max_batch_items + 1)}, 400,
                           f"Invalid request: request ({limits.max_batch_items + 1} texts) exceeds text limit "
                           f"({limits.max_batch_items} texts)"),
        "batch-over-char-limit": ({"q": ["a" * (limits.max_chars // 2 + 1)] * 2}, 400,
                                  f"Invalid request: request ({2 * (limits.max_chars // 2 + 1)} characters)"),
        "empty-item-in-batch": ({"q": [GOOD, "  "]}, 400, "Text is empty (only whitespace"),
        "non-string-in-batch": ({"q": [GOOD, 5]}, 400, "Invalid request: q must be a string or a list of strings"),
        "q-is-an-object": ({"q": {"text": GOOD}}, 400, "Invalid request: q must be a string or a list of strings"),
        "unknown-code": ({"target": "xx"}, 400, "Unsupported language code 'xx'. Codes this server translates: "),
        "unknown-mixed-case-code": ({"target": "Zh-Latn"}, 400, "Unsupported language code 'Zh-Latn'."),
        "malformed-code": ({"target": "e$"}, 400, "Malformed language code 'e$': expected something like 'en'"),
        "overlong-code": ({"target": "x" * 500}, 400, "Malformed language code 'xxxxxxxxxxxxxxxx…'"),
        "non-string-code": ({"target": 5}, 400, "Invalid request: target must be a string"),
        "missing-target": ({"target": None}, 400, "Invalid request: missing target parameter"),
        "bad-format": ({"format": "pdf"}, 400, "Invalid request: format must be 'text' or 'html', got 'pdf'"),
        # Pair names from callers: codes are parsed as strings only (invariant 7; more in test_security.py).
        "traversal-in-target": ({"target": "../es"}, 400, "Malformed language code '../es'"),
        "url-encoded-traversal-in-target": ({"target": "%2e%2e%2fes"}, 400, "Malformed language code '%2e%2e%2fes'"),
        "absolute-path-as-source": ({"source": "/etc/passwd"}, 400, "Malformed language code '/etc/passwd'"),
        "nul-in-code": ({"source": "en\x00../"}, 400, "Malformed language code"),
    }


TEXT_CASES = list(_text_cases(L))


@pytest.mark.parametrize("case", TEXT_CASES)
def test_bad_text_is_a_clear_4xx_and_the_server_stays_healthy(case: str, client: httpx.Client, limits: LimitsConfig,
                                                              good_reference: str) -> None:
    fields, status, message = _text_cases(limits)[case]
    body = {"q": GOOD, "source": "en", "target": "es", **fields}
    body = {k: v for k, v in body.items() if v is not None}
    said = refused(client.post("/translate", json=body), status, message)
    assert len(said) < 600  # long or hostile input is never echoed back in full
    healthy(client, good_reference)


def test_openai_route_refuses_path_like_model_names(client: httpx.Client, good_reference: str) -> None:
    for model in ("../en2es", "/etc/passwd", "%2e%2e%2fen2es", "en2es/../../x"):
        response = client.post("/v1/chat/completions", json={"model": model, "messages": [
            {"role": "user", "content": GOOD}]})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["message"].startswith("Unknown model ")
    healthy(client, good_reference)


# ------------------------------------------------------------------------------------------------ text: served


@pytest.mark.parametrize("sent, cleaned", [
    pytest.param("Open\x00 the\x07 file.", GOOD, id="control-chars-and-nul-stripped"),
    pytest.param("Open the file.\x1b[31m", "Open the file.[31m", id="ansi-escape-stripped"),
    pytest.param("Open the file שלום مرحبا 你好.", "Open the file שלום مرحبا 你好.", id="rtl-and-mixed-scripts"),
    pytest.param("\u202eOpen the file.\u202c", "\u202eOpen the file.\u202c", id="bidi-override-kept"),
    pytest.param("Open the file 😀👍🏽.", "Open the file 😀👍🏽.", id="emoji"),
])
def test_odd_but_valid_text_equals_the_reference_of_the_cleaned_text(sent: str, cleaned: str, client: httpx.Client,
                                                                      live_server: LiveServer,
                                                                      good_reference: str) -> None:
    response = client.post("/translate", json={"q": sent, "source": "en", "target": "es"})
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"] == live_server.reference(cleaned, "en", "es")
    healthy(client, good_reference)


def test_lone_surrogate_as_a_raw_json_escape(client: httpx.Client, live_server: LiveServer,
                                             good_reference: str) -> None:
    raw = b'{"q": "Open the \\udc80file.", "source": "en", "target": "es"}'
    response = client.post("/translate", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"] == live_server.reference("Open the \ufffdfile.", "en", "es")
    healthy(client, good_reference)


def test_paragraphs_of_numbers_come_back_verbatim(client: httpx.Client, live_server: LiveServer) -> None:
    """Masked spans of a paragraph with nothing to translate are put back as they were, in order."""
    text = "Open the file.\n\n10 - 20\n\n3.5 / 7"
    response = client.post("/translate", json={"q": text, "source": "en", "target": "es"})
    first = live_server.reference("Open the file.", "en", "es")
    assert response.json()["translatedText"] == f"{first}\n\n10 - 20\n\n3.5 / 7"


def test_passthrough_and_emoji_only(client: httpx.Client) -> None:
    same = client.post("/translate", json={"q": "Open\x00 the file. 😀", "source": "en", "target": "EN"})
    assert same.json() == {"translatedText": "Open the file. 😀"}  # src == tgt: returned (cleaned), not translated
    emoji = client.post("/translate", json={"q": "😀👍🏽🎉 42", "source": "en", "target": "es"})
    assert emoji.json() == {"translatedText": "😀👍🏽🎉 42"}  # nothing with letters: nothing to translate


@pytest.mark.parametrize("code", ["zh-hant", "ZH-HANT", "zh_Hant"])
def test_case_variants_of_codes_are_accepted_and_canonical(code: str, client: httpx.Client,
                                                           live_server: LiveServer) -> None:
    response = client.post("/translate", json={"q": GOOD, "source": "en", "target": code})
    if response.status_code == 200:  # the demo profile may reach zh-Hant
        assert response.json()["translatedText"] == live_server.reference(GOOD, "en", "zh-Hant")
    else:  # the code was understood: the refusal names the canonical code, not the spelling sent
        refused(response, 400, "No route from en to zh-Hant: ")


def test_ten_thousand_lines_within_a_raised_limit_keep_their_layout(client: httpx.Client, live_server: LiveServer,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    good_reference: str) -> None:
    """A server configured for long texts: 10k lines (numbers, blanks, 20 sentences) come back line for line."""
    monkeypatch.setattr(live_server.cfg.limits, "max_chars", 100_000)
    monkeypatch.setattr(live_server.app.state.api.policy, "max_chars", 100_000)
    lines = [GOOD if i % 500 == 0 else ("" if i % 7 == 0 else str(i)) for i in range(10_000)]
    text = "\n".join(lines)
    response = client.post("/translate", json={"q": text, "source": "en", "target": "es"})
    assert response.status_code == 200, response.text
    out = response.json()["translatedText"]
    assert out == live_server.reference(text, "en", "es")
    out_lines = out.split("\n")
    assert len(out_lines) == 10_000
    assert all(o == i for o, i in zip(out_lines, lines) if i != GOOD)  # numbers and blank lines untouched
    healthy(client, good_reference)


# ------------------------------------------------------------------------------------------------ form and JSON


def _json_post(client: httpx.Client, content: bytes, ctype: str | None = "application/json") -> httpx.Response:
    headers = {"content-type": ctype} if ctype else {}
    return client.post("/translate", content=content, headers=headers)


def test_wrong_content_types(client: httpx.Client, good_reference: str) -> None:
    both = "application/json, application/x-www-form-urlencoded, multipart/form-data."
    refused(client.post("/translate", content=b"q=hi", headers={"content-type": "text/plain"}), 415,
            f"Unsupported Content-Type 'text/plain': send one of {both}")
    refused(client.post("/translate", content=b"<q>hi</q>", headers={"content-type": "application/xml"}), 415,
            "Unsupported Content-Type 'application/xml'")
    refused(_json_post(client, b"q=hi&target=es", ctype=None), 415, "Missing Content-Type: send application/json")
    refused(client.post("/translate_file", json={"q": "hi", "target": "es"}), 415,
            "Unsupported Content-Type 'application/json': send one of multipart/form-data.")
    openai = client.post("/v1/chat/completions", data={"model": "es"})
    assert openai.status_code == 415 and openai.json()["error"]["message"].startswith(
        "Unsupported Content-Type 'application/x-www-form-urlencoded'")  # OpenAI's error shape under /v1
    # curl -d '{...}' sends no Content-Type at all: a JSON object is still understood.
    headerless = _json_post(client, b'{"q": "Open the file.", "source": "en", "target": "es"}', ctype=None)
    assert headerless.json()["translatedText"] == good_reference
    healthy(client, good_reference)


def test_malformed_empty_and_nested_json(client: httpx.Client, good_reference: str) -> None:
    refused(_json_post(client, b'{"q": "hi", '), 400, "Invalid JSON body: ")
    refused(_json_post(client, b'["hi"]'), 400, 'Invalid JSON body: expected an object such as {"q": ..., ')
    refused(_json_post(client, b""), 400, "Invalid request: empty JSON body.")
    refused(_json_post(client, b'{"q": "Open \xff\xfe the file", "target": "es"}'), 400, "Invalid JSON body: ")
    refused(_json_post(client, b"[" * 100_000 + b"]" * 100_000), 400, "Invalid JSON body: nested too deeply.")
    healthy(client, good_reference)


def test_missing_fields(client: httpx.Client, good_reference: str) -> None:
    refused(client.post("/translate", json={"source": "en", "target": "es"}), 400,
            "Invalid request: missing q parameter")
    refused(client.post("/translate", data={"q": GOOD, "source": "en"}), 400,
            "Invalid request: missing target parameter")
    refused(client.post("/detect", json={}), 400, "Invalid request: missing q parameter")
    refused(client.post("/translate_file", files={"other": ("a.txt", b"hi")}, data={"target": "es"}), 400,
            "Invalid request: missing file parameter")
    refused(client.post("/translate_file", data={"file": "not a file", "target": "es"},
                        files={"x": ("x.txt", b"x")}), 400, "Invalid request: missing file parameter")
    refused(client.post("/translate_file", files={"file": ("a.txt", b"Open the file.")}), 400,
            "Invalid request: missing target parameter")
    healthy(client, good_reference)


def test_huge_json_declared_or_streamed(client: httpx.Client, good_reference: str) -> None:
    huge = b'{"q": "' + b"a" * (8 * 1024 * 1024) + b'", "source": "en", "target": "es"}'
    refused(_json_post(client, huge), 413, f"Request body too large: {len(huge)} bytes, at most ")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the cap is enforced while the body streams in
        for i in range(0, len(huge), 256 * 1024):
            yield huge[i:i + 256 * 1024]

    streamed = client.post("/translate", content=chunks(), headers={"content-type": "application/json"})
    refused(streamed, 413, "Request body too large: more than ")
    healthy(client, good_reference)


# ------------------------------------------------------------------------------------------------ uploads


def _zip_bomb(unpacked: int) -> bytes:
    """A real .docx plus one member of `unpacked` zero bytes (a few hundred KiB packed)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(make_docx()), "r") as src, \
            zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as dst:
        for item in src.infolist():
            dst.writestr(item, src.read(item.filename))
        with dst.open("word/media/bomb.bin", "w", force_zip64=True) as member:
            block = bytes(1 << 20)
            for _ in range(unpacked >> 20):
                member.write(block)
    return buf.getvalue()


def _undetectable() -> bytes:
    return bytes(b | 0x80 for b in random.Random(7).randbytes(600))


def _upload_cases(limits: LimitsConfig) -> dict[str, tuple[str, Callable[[], bytes], int, str]]:
    supported = ", ".join(SUPPORTED_EXTENSIONS)
    bomb = limits.max_unzipped_bytes + (1 << 20)
    return {
        "unsupported-extension": ("table.csv", lambda: b"a,b\n1,2\n", 415,
                                  f"table.csv: unsupported file type '.csv'; supported: {supported}"),
        "no-extension": ("README", lambda: b"Open the file.", 415, "README: unsupported file type (no extension)"),
        "executable": ("virus.exe", lambda: b"MZ\x90\x00" + bytes(64), 415, "virus.exe: unsupported file type '.exe'"),
        "pdf-named-docx": ("report.docx", lambda: make_pdf([["Hello."]]), 415,
                           "report.docx: the file's content is a PDF document, not a Word document as its .docx "
                           "extension says"),
        "png-named-txt": ("notes.txt", tiny_png, 415,
                          "notes.txt: the file's content is a PNG image, not a plain-text file"),
        "text-named-pdf": ("paper.pdf", lambda: b"just some text pretending", 415,
                           "paper.pdf: the file's content is text, not a PDF"),
        "corrupt-docx": ("broken.docx", lambda: make_docx()[:3000], 415, "broken.docx: the .docx is damaged"),
        "zip-bomb-docx": ("bomb.docx", lambda: _zip_bomb(bomb), 413, "bomb.docx: unpacks to "),
        "docx-with-only-images": ("pictures.docx", lambda: make_docx(image_only=True), 400,
                                  "pictures.docx: the document holds only images, no text to translate (text inside "
                                  "images needs OCR first)"),
        "encrypted-pdf": ("secret.pdf", lambda: make_pdf([["Top secret."]], user_password="pw"), 415,
                          "secret.pdf: the PDF is password-protected; remove the password"),
        "pdf-without-text-layer": ("scan.pdf", lambda: make_pdf([[], []]), 415,
                                   "scan.pdf: the PDF has no text layer (it is probably a scanned image); run OCR"),
        "srt-broken-timings": ("movie.srt", lambda: (SRT_OK + "2\n00:00:09,000 --> 00:00:07,000\nBack.\n").encode(),
                               400, "movie.srt: subtitle block 2 (index 2) ends at 00:00:07,000, before it starts "
                                    "at 00:00:09,000"),
        "srt-garbled-timing": ("movie.srt", lambda: (SRT_OK + "2\n00:00:05,000 -> 00:00:0x,000\nX\n").encode(), 400,
                               "movie.srt: subtitle block 2 is not valid SRT"),
        "empty-file": ("empty.txt", lambda: b"", 400, "empty.txt: the file is empty"),
        "empty-docx-name": ("empty.docx", lambda: b"", 400, "empty.docx: the file is empty"),
        "nothing-to-translate": ("numbers.txt", lambda: b"1 2 3\n\n4.5\n", 400,
                                 "numbers.txt: no text to translate was found"),
        "non-utf8-undetectable": ("mystery.txt", _undetectable, 400,
                                  "mystery.txt: the text is not UTF-8 and its encoding could not be detected; save "
                                  "it as UTF-8 and upload it again"),
        "non-utf8-with-utf8-bom": ("bad.txt", lambda: b"\xef\xbb\xbfabc \xff\xfe\xfa broken", 400,
                                   "bad.txt: starts with a UTF-8-SIG byte-order mark but is not valid"),
        "over-size-limit": ("big.txt", lambda: b"a" * (limits.max_file_bytes + 1), 413,
                            f"File too large: more than {limits.max_file_bytes} bytes"),
    }


UPLOAD_CASES = list(_upload_cases(L))


@pytest.fixture()
def spool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Upload spool files go to a private temp dir; yields the files created. Afterwards: none open, none left."""
    folder = tmp_path / "spool"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    created: list[Any] = []
    real = tempfile.TemporaryFile

    def recorded(*args: Any, **kwargs: Any) -> Any:
        handle = real(*args, **kwargs)
        created.append(handle)
        return handle

    monkeypatch.setattr(tempfile, "TemporaryFile", recorded)
    yield created
    assert all(handle.closed for handle in created), "an upload's spool file was left open"
    open_in_spool = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                     if _points_into(f"/proc/self/fd/{fd}", str(folder))]
    assert open_in_spool == [] and list(folder.iterdir()) == []


def _points_into(link: str, folder: str) -> bool:
    try:
        return os.readlink(link).startswith(folder)
    except OSError:
        return False


@pytest.mark.parametrize("case", UPLOAD_CASES)
def test_bad_upload_is_a_clear_4xx_in_rest_and_ui_and_leaves_no_temp_file(
        case: str, client: httpx.Client, limits: LimitsConfig, ui: Any, tmp_path: Path, spool: list[Any],
        good_reference: str) -> None:
    name, make, status, message = _upload_cases(limits)[case]
    data = make()
    said = refused(client.post("/translate_file", files={"file": (name, data)},
                               data={"source": "en", "target": "es"}), status, message)
    if len(data) > 1 << 20:
        assert spool, "a large upload should have been spooled to disk (the cleanup check would be vacuous)"
    healthy(client, good_reference)
    # The UI's document handler says the same (it checks the size itself, before reading the file).
    path = tmp_path / "ui" / name
    path.parent.mkdir()
    path.write_bytes(data)
    before = set(ui.outputs.iterdir())
    shown = ui_error(lambda: ui.translate_document(str(path), "en", "es", progress=_no_progress))
    if case == "over-size-limit":
        assert shown == f"File too large: {len(data)} bytes, the limit is {limits.max_file_bytes}."
    else:
        assert shown == said
    assert set(ui.outputs.iterdir()) == before  # a failed document leaves nothing in the UI's output folder


def _no_progress(*args: Any, **kwargs: Any) -> None:
    return None


def test_non_utf8_text_that_can_be_detected_is_translated(client: httpx.Client, live_server: LiveServer,
                                                          spool: list[Any]) -> None:
    data = "Open the file.\n\nSave the café document and close the window.\n".encode("cp1252")
    response = client.post("/translate_file", files={"file": ("legacy.txt", data)}, data={"source": "en",
                                                                                          "target": "es"})
    assert response.status_code == 200, response.text
    body = response.json()
    expected, _ = translate_upload(live_server.service, data, "legacy.txt", "en", "es", live_server.cfg.limits)
    assert client.get(body["translatedFileUrl"]).content == expected.data
    assert body.get("note") == expected.note and expected.note


def test_upload_filename_never_becomes_a_path(client: httpx.Client, spool: list[Any]) -> None:
    response = client.post("/translate_file", files={"file": ("../../etc/passwd.txt", b"Open the file.")},
                           data={"source": "en", "target": "es"})
    assert response.status_code == 200, response.text
    url = response.json()["translatedFileUrl"]
    assert url.endswith("/passwd.es.txt") and "/etc/" not in url and ".." not in url


def test_upload_streamed_past_the_cap_is_refused_and_its_spool_closed(client: httpx.Client, limits: LimitsConfig,
                                                                      spool: list[Any], good_reference: str) -> None:
    """A multipart body with no Content-Length, larger than the route's cap: cut off while it streams in."""
    request = client.build_request("POST", "/translate_file",
                                   files={"file": ("big.txt", b"a" * (limits.max_file_bytes + 200_000))},
                                   data={"target": "es"})
    body = request.read()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 512 * 1024):
            yield body[i:i + 512 * 1024]

    response = client.post("/translate_file", content=chunks(),
                           headers={"content-type": request.headers["content-type"]})
    refused(response, 413, "Request body too large: more than ")
    assert spool, "the streamed upload should have been spooled to disk before the cap hit"
    healthy(client, good_reference)


# ------------------------------------------------------------------------------------------------ UI handlers


def test_ui_text_handler_messages(ui: Any, limits: LimitsConfig, live_server: LiveServer,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert ui_error(lambda: ui.translate_text("", "en", "es")) == "Type or paste some text to translate."
    assert ui_error(lambda: ui.translate_text(" \n ", "en", "es")) == "Type or paste some text to translate."
    assert ui_error(lambda: ui.translate_text("\x00\x07", "en", "es")) == "Text is empty."
    over = limits.max_chars + 1
    assert ui_error(lambda: ui.translate_text("a" * over, "en", "es")) == (
        f"Text is {over} characters, over the limit of {limits.max_chars} (limits.max_chars).")
    assert ui_error(lambda: ui.translate_text(GOOD, "en", "xx")).startswith("Unsupported language code 'xx'.")
    assert ui_error(lambda: ui.translate_text(GOOD, "../en", "es")).startswith("Malformed language code '../en'")
    text, info, _ = ui.translate_text("Open\x00 the file.", "en", "en")
    assert text == GOOD and "identity" in info
    text, _, _ = ui.translate_text("Open the \ud800file.", "en", "es")
    assert text == live_server.reference("Open the \ufffdfile.", "en", "es")
    # Swap from Auto-detect before anything was detected: one sentence in the note, every box left as it is.
    *unchanged, note = ui.swap("auto", "es", GOOD, "", None)
    assert note == "Auto-detect has no language to swap to yet: choose the source language, or translate once."
    assert all(u == {"__type__": "update"} for u in unchanged), unchanged
    assert ui_error(lambda: ui.translate_document(None, "en", "es", progress=_no_progress)) == (
        "Drop a document first (.txt .md .srt .docx .pptx .xlsx .odt .ods .odp .epub .pdf .html .po .pot .json .yaml "
        ".xlf).")

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret detail at /srv/private/path.py")

    monkeypatch.setattr(live_server.service, "translate_batch", boom)
    assert ui_error(lambda: ui.translate_text(GOOD, "en", "es")) == "Internal error; the server log has the details."


def test_ui_admin_handler_messages(ui: Any) -> None:
    assert ui_error(lambda: ui.admin("pin", "", "en2es")) == "Missing admin key: send it in the X-Admin-Key header."
    assert ui_error(lambda: ui.admin("pin", "wrong", "en2es")) == "Invalid admin key."
    for name, says in (("../etc2en", "Malformed language code '../etc'"),
                       ("/abs/en2es", "Malformed language code '/abs/en'"),
                       ("..%2Fen2es", "Malformed pair name '..%2Fen2es': expected <src>2<tgt>")):
        assert ui_error(lambda: ui.admin("unload", ADMIN_KEY, name)).startswith(says)
    assert ui_error(lambda: ui.admin("pin", ADMIN_KEY, "")) == (
        "Malformed pair name '': expected <src>2<tgt>, e.g. 'en2es'.")


def test_ui_output_folder_is_swept(ui: Any, tmp_path: Path) -> None:
    """A translated document stays for download, then is swept once older than the TTL."""
    from hunyuan_mt.web import ui as ui_module

    source = tmp_path / "notes.txt"
    source.write_text("Open the file.\n", encoding="utf-8")
    out, _ = ui.translate_document(str(source), "en", "es", progress=_no_progress)
    folder = Path(out).parent
    assert folder.parent == ui.outputs and Path(out).exists()
    old = os.stat(folder).st_mtime - ui_module._OUTPUT_TTL_S - 1
    os.utime(folder, (old, old))
    second, _ = ui.translate_document(str(source), "en", "es", progress=_no_progress)
    assert not folder.exists() and Path(second).exists()
