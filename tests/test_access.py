"""One access policy for every door: REST (requests), the OpenAI endpoint (openai), the page's own API
(gradio_client), its uploads, and both kinds of download, with API keys on and off.

Each test says who gets in, who is refused and with what: 403 and its message, 429 and its Retry-After, 404 for
someone else's file. A second client address is real: Linux routes all of 127.0.0.0/8 to the loopback, so a client
bound to 127.0.0.2 reaches the server on 127.0.0.1 and the server sees 127.0.0.2.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest
import requests
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

import app as entry
from hunyuan_mt.config import Config
from hunyuan_mt.errors import InvalidInput, RateLimited
from hunyuan_mt.web.auth import SlidingWindow
from web_server import ADMIN_KEY, LiveServer, serve, with_server

TEXT = "Open the file."
OTHER_ADDRESS = "127.0.0.2"
BODY = {"q": TEXT, "source": "en", "target": "es"}


def _from(address: str, **kw: Any) -> httpx.Client:
    """An HTTP client whose connections leave from `address`."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=60, **kw)


def _page(server: LiveServer, **kw: Any) -> Client:
    return Client(server.url + "/ui/", verbose=False, **kw)


def _retry_after(response: requests.Response | httpx.Response) -> int:
    value = int(response.headers["Retry-After"])
    assert 1 <= value <= 60, value
    return value


def _chat(server: LiveServer, key: str = "unused") -> openai.OpenAI:
    # max_retries=0: the client would otherwise wait out the Retry-After and try again by itself.
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


def _chat_once(client: openai.OpenAI) -> str:
    reply = client.chat.completions.create(model="en2es", messages=[{"role": "user", "content": TEXT}])
    return reply.choices[0].message.content or ""


@pytest.fixture()
def doc(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("Open the file.\n\nSave the file.\n", encoding="utf-8")  # 30 characters in 2 segments
    return path


# ---------------------------------------------------------------------------------------------- keys off


def test_without_keys_the_page_and_the_api_share_one_budget_per_address(web_service: Any, web_cfg: Config) -> None:
    with serve(web_service, with_server(web_cfg, rate_limit_per_min=3)) as server:
        assert requests.post(server.url + "/translate", json=BODY, timeout=60).status_code == 200
        assert _chat_once(_chat(server)) == server.reference(TEXT, "en", "es")
        page = _page(server)
        text, _ = page.predict(TEXT, "en", "es", api_name="/translate")
        assert text == server.reference(TEXT, "en", "es")
        # The fourth call from 127.0.0.1 is refused whichever door it knocks on.
        with pytest.raises(AppError, match=r"Too many requests: 3 per minute allowed; retry in \d+ s\."):
            page.predict(TEXT, "en", "es", api_name="/translate")
        limited = requests.post(server.url + "/translate", json=BODY, timeout=60)
        assert limited.status_code == 429 and _retry_after(limited)
        assert limited.json()["error"].startswith("Too many requests: 3 per minute allowed")
        with pytest.raises(openai.RateLimitError) as refused:
            _chat_once(_chat(server))
        assert _retry_after(refused.value.response)
        # Another address has its own budget; the unmetered routes stay open.
        with _from(OTHER_ADDRESS, base_url=server.url) as other:
            assert other.post("/translate", json=BODY).status_code == 200
        assert requests.get(server.url + "/health", timeout=60).status_code == 200
        assert requests.get(server.url + "/languages", timeout=60).status_code == 200


@pytest.mark.parametrize("trusted", [[], ["127.0.0.1"]], ids=["no-proxy", "behind-a-local-proxy"])
def test_x_forwarded_for_counts_only_from_a_trusted_proxy(web_service: Any, web_cfg: Config,
                                                          trusted: list[str]) -> None:
    with serve(web_service, with_server(web_cfg, rate_limit_per_min=1, trusted_proxies=trusted)) as server:
        codes = [requests.post(server.url + "/translate", json=BODY, headers={"X-Forwarded-For": address},
                               timeout=60).status_code for address in ("10.0.0.1", "10.0.0.2")]
        # Untrusted, the header cannot buy a caller a fresh budget; from a trusted proxy it names the client.
        assert codes == ([200, 200] if trusted else [200, 429])


def test_page_uploads_are_calls_under_the_same_limit(web_service: Any, web_cfg: Config, doc: Path) -> None:
    with serve(web_service, with_server(web_cfg, rate_limit_per_min=2)) as server:
        upload = server.url + "/ui/gradio_api/upload"
        for _ in range(2):
            with doc.open("rb") as handle:
                assert requests.post(upload, files={"files": handle}, timeout=60).status_code == 200
        with doc.open("rb") as handle:
            refused = requests.post(upload, files={"files": handle}, timeout=60)
        assert refused.status_code == 429 and _retry_after(refused)
        # A sentence, not JSON: the page shows an upload's refusal as "HTTP 429: <body>".
        assert refused.text.startswith("Too many requests: 2 per minute allowed")
        assert refused.headers["content-type"].startswith("text/plain")


# ---------------------------------------------------------------------------------------------- keys on


@pytest.fixture()
def keyed(web_service: Any, web_cfg: Config) -> Iterator[LiveServer]:
    with serve(web_service, with_server(web_cfg, api_keys=["k1", "k2"], rate_limit_per_min=2)) as server:
        yield server


def test_with_keys_rest_and_openai_need_a_key(keyed: LiveServer) -> None:
    missing = requests.post(keyed.url + "/translate", json=BODY, timeout=60)
    assert missing.status_code == 403 and missing.json()["error"].startswith("Missing API key")
    wrong = requests.post(keyed.url + "/translate", json={**BODY, "api_key": "nope"}, timeout=60)
    assert wrong.status_code == 403 and wrong.json() == {"error": "Invalid API key."}
    with pytest.raises(openai.PermissionDeniedError, match="Invalid API key"):
        _chat_once(_chat(keyed, "nope"))
    assert _chat_once(_chat(keyed, "k1")) == keyed.reference(TEXT, "en", "es")
    assert requests.post(keyed.url + "/translate", json={**BODY, "api_key": "k1"}, timeout=60).status_code == 200
    limited = requests.post(keyed.url + "/translate", json={**BODY, "api_key": "k1"}, timeout=60)
    assert limited.status_code == 429 and _retry_after(limited)


def test_with_keys_an_open_page_is_metered_per_address(keyed: LiveServer) -> None:
    page = _page(keyed)
    for _ in range(2):
        text, _ = page.predict(TEXT, "en", "es", api_name="/translate")
        assert text == keyed.reference(TEXT, "en", "es")
    with pytest.raises(AppError, match=r"Too many requests: 2 per minute allowed; retry in \d+ s\."):
        page.predict(TEXT, "en", "es", api_name="/translate")
    # A key's budget is its own: the page's calls from this address did not spend it.
    ok = requests.post(keyed.url + "/translate", json={**BODY, "api_key": "k2"}, timeout=60)
    assert ok.status_code == 200


def test_the_start_says_when_keys_are_on_but_the_page_is_open(web_cfg: Config) -> None:
    line = entry.access_line(with_server(web_cfg, api_keys=["k1"], rate_limit_per_min=30, chars_per_min=5000))
    assert line == ("access: API keys are required, but the web page is open without a login: its calls are counted "
                    "per address under the same limits (30 requests/min and 5000 characters/min); --auth USER:PASS "
                    "closes it. Status: public.")
    assert "open without a login" not in entry.access_line(with_server(web_cfg, api_keys=["k1"], auth="a:b"))
    no_limit = entry.access_line(with_server(web_cfg, api_keys=["k1"]))
    assert "(no rate or character limit)" in no_limit
    assert entry.access_line(with_server(web_cfg, status_key="s")).endswith("status private (status key).")


def test_with_auth_the_page_needs_the_login_and_is_still_metered(web_service: Any, web_cfg: Config) -> None:
    cfg = with_server(web_cfg, api_keys=["k1"], auth="ann:s3cret", rate_limit_per_min=2)
    with serve(web_service, cfg) as server:
        with pytest.raises(Exception, match="(?i)login|auth|401|403"):
            _page(server).predict(TEXT, "en", "es", api_name="/translate")
        # Without the login, Gradio's own upload route refuses; the attempt is counted like any upload (the
        # address is metered before Gradio looks at the login).
        upload = requests.post(server.url + "/ui/gradio_api/upload", files={"files": ("a.txt", b"hi")}, timeout=60)
        assert upload.status_code in (401, 403)
        page = _page(server, auth=("ann", "s3cret"))
        assert page.predict(TEXT, "en", "es", api_name="/translate")[0] == server.reference(TEXT, "en", "es")
        with pytest.raises(AppError, match="Too many requests: 2 per minute allowed"):
            page.predict(TEXT, "en", "es", api_name="/translate")


# ---------------------------------------------------------------------------------------------- characters


def test_documents_and_texts_spend_one_character_budget(web_service: Any, web_cfg: Config, doc: Path) -> None:
    with serve(web_service, with_server(web_cfg, chars_per_min=80)) as server:
        for _ in range(2):  # 2 × 30 characters: 60 of 80
            with doc.open("rb") as handle:
                done = requests.post(server.url + "/translate_file", files={"file": handle},
                                     data={"source": "en", "target": "es"}, timeout=120)
            assert done.status_code == 200, done.text
        # The page's document counts against the same address's budget: 30 more do not fit.
        with pytest.raises(AppError, match=r"Too many characters: 80 per minute allowed; retry in \d+ s\."):
            _page(server).predict(handle_file(str(doc)), "en", "es", api_name="/translate_document")
        with doc.open("rb") as handle:
            refused = requests.post(server.url + "/translate_file", files={"file": handle},
                                    data={"source": "en", "target": "es"}, timeout=120)
        assert refused.status_code == 429 and _retry_after(refused)
        assert refused.json() == {"error": f"Too many characters: 80 per minute allowed; retry in "
                                           f"{refused.headers['Retry-After']} s."}
        short = requests.post(server.url + "/translate", json={**BODY, "q": "Save."}, timeout=60)
        assert short.status_code == 200  # 5 characters still fit: 65 of 80
        with _from(OTHER_ADDRESS, base_url=server.url) as other:
            assert other.post("/translate", json={**BODY, "q": "x" * 81}).json() == {
                "error": "Invalid request: 81 characters at once exceeds the limit of 80 characters per minute"}


def test_sliding_windows_say_when_enough_has_left() -> None:
    now = [1000.0]
    window = SlidingWindow(100, "characters", clock=lambda: now[0])
    window.hit("a", 60)
    now[0] += 20
    window.hit("a", 30)
    now[0] += 10
    with pytest.raises(RateLimited) as first:
        window.hit("a", 20)  # fits once the 60 from t=0 have left: 30 s from now
    assert first.value.retry_after_s == 30
    with pytest.raises(RateLimited) as both:
        window.hit("a", 80)  # needs both earlier entries gone: the second leaves 50 s from now
    assert both.value.retry_after_s == 50
    window.hit("b", 100)  # another caller
    with pytest.raises(InvalidInput):
        window.hit("c", 101)
    now[0] += 30
    window.hit("a", 20)


# ---------------------------------------------------------------------------------------------- downloads


def test_rest_downloads_belong_to_the_uploader_when_keys_are_on(keyed: LiveServer, doc: Path) -> None:
    with doc.open("rb") as handle:
        done = requests.post(keyed.url + "/translate_file", files={"file": handle},
                             data={"source": "en", "target": "es", "api_key": "k1"}, timeout=120)
    url = done.json()["translatedFileUrl"]
    with _from(OTHER_ADDRESS) as other:
        assert other.get(url).status_code == 404
        assert other.get(url, headers={"Authorization": "Bearer k2"}).status_code == 404
        assert other.get(url, params={"api_key": "k2"}).status_code == 404
        fetched = other.get(url, headers={"Authorization": "Bearer k1"})
        assert fetched.status_code == 200 and fetched.text.startswith(keyed.reference("Open the file.", "en", "es"))
    # From the uploader's address without the key: LibreTranslate clients download the link bare. Another key, or a
    # wrong one, from that same address gets nothing.
    assert requests.get(url, timeout=60).status_code == 200
    assert requests.get(url, headers={"Authorization": "Bearer k2"}, timeout=60).status_code == 404
    assert requests.get(url, params={"api_key": "not-a-key"}, timeout=60).status_code == 404


def test_without_keys_a_download_link_is_enough(live_server: LiveServer, doc: Path) -> None:
    with doc.open("rb") as handle:
        url = requests.post(live_server.url + "/translate_file", files={"file": handle},
                            data={"source": "en", "target": "es"}, timeout=120).json()["translatedFileUrl"]
    with _from(OTHER_ADDRESS) as other:
        assert other.get(url).status_code == 200


@pytest.mark.parametrize("keys", [True, False], ids=["keys-on", "keys-off"])
def test_page_downloads_belong_to_the_uploaders_address_when_keys_are_on(
        web_service: Any, web_cfg: Config, doc: Path, keys: bool) -> None:
    with serve(web_service, with_server(web_cfg, api_keys=["k1"] if keys else [])) as server:
        result, note = _page(server, download_files=False).predict(handle_file(str(doc)), "en", "es",
                                                                   api_name="/translate_document")
        assert "notes.es.txt" in note
        url = result["url"]
        assert url.startswith(server.url + "/ui/gradio_api/file=")
        assert requests.get(url, timeout=60).status_code == 200
        with _from(OTHER_ADDRESS) as other:
            assert other.get(url).status_code == (404 if keys else 200)


def test_every_spelling_of_a_page_file_and_the_uploaded_original_belong_to_the_uploader(
        web_service: Any, web_cfg: Config, doc: Path) -> None:
    """With keys on, another address got a page file through Gradio's older alias (`/gradio_api/file/<path>`), as
    `file=/proc/self/root<path>` or `file=/tmp/../tmp/…`, and the uploaded original through its path.
    Every spelling is now the uploader's alone."""
    with serve(web_service, with_server(web_cfg, api_keys=["k1"])) as server:
        page = _page(server, download_files=False)
        result, _ = page.predict(handle_file(str(doc)), "en", "es", api_name="/translate_document")
        served = result["path"]
        base = server.url + "/ui/gradio_api/"
        spellings = [f"file={served}", f"file//{served.lstrip('/')}", f"file=/proc/self/root{served}",
                     f"file={Path(served).parent}/../{Path(served).parent.name}/{Path(served).name}"]
        uploaded = requests.post(base + "upload", files={"files": ("mine.txt", b"Open the secret file.\n")},
                                 timeout=60).json()
        assert isinstance(uploaded, list) and len(uploaded) == 1
        spellings += [f"file={uploaded[0]}", f"file//{uploaded[0].lstrip('/')}"]
        for spelling in spellings:
            assert requests.get(base + spelling, timeout=60).status_code == 200, spelling  # the uploader's own
            with _from(OTHER_ADDRESS) as other:
                assert other.get(base + spelling).status_code == 404, spelling


# ---------------------------------------------------------------------------------------------- status


def test_a_status_key_hides_metrics_adapters_and_the_status_tab(web_service: Any, web_cfg: Config) -> None:
    with serve(web_service, with_server(web_cfg, status_key="sk")) as server:
        for path in ("/metrics", "/adapters"):
            refused = requests.get(server.url + path, timeout=60)
            assert refused.status_code == 403
            assert refused.json() == {"error": "The status is private on this server: send the status key "
                                               "('Authorization: Bearer KEY')."}
            wrong = requests.get(server.url + path, headers={"Authorization": "Bearer nope"}, timeout=60)
            assert wrong.status_code == 403 and wrong.json() == {"error": "Invalid status key."}
            assert requests.get(server.url + path, headers={"Authorization": "Bearer sk"}, timeout=60).ok
            assert requests.get(server.url + path, headers={"X-Admin-Key": ADMIN_KEY}, timeout=60).ok
        assert requests.get(server.url + "/health", timeout=60).status_code == 200  # load balancers need it
        page = _page(server)
        overview, adapters, counters, _, _ = page.predict(api_name="/status")
        assert overview.startswith("🔒 The status is private on this server") and not adapters["data"]
        assert counters == "" and "en2es" not in str(adapters)
        overview, adapters, _, _, _ = page.predict("sk", api_name="/status")
        assert "Backbone:" in overview and any(row[0] == "en2es" for row in adapters["data"])


def test_status_is_public_by_default(live_server: LiveServer) -> None:
    assert requests.get(live_server.url + "/metrics", timeout=60).status_code == 200
    assert "en2es" in requests.get(live_server.url + "/adapters", timeout=60).text
    overview = _page(live_server).predict(api_name="/status")[0]
    assert "Backbone:" in overview and not re.search("private", overview)
