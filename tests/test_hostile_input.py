"""Hostile input: what a reader refuses at its caps, at once, and what it parses in time linear in its
input. Each test states the cap it checks and the message a client gets."""

from __future__ import annotations

import httpx
import pytest

from hunyuan_mt.config import LimitsConfig
from hunyuan_mt.documents.htmlpage import MAX_DEPTH, read_html
from hunyuan_mt.errors import InputTooLarge
from web_server import LiveServer

LIMITS = LimitsConfig()
#: Each attack of bench/hostile.py is answered in seconds at its size and at 10× (bench/hostile.py: 0.1 to
#: 1.1 s through the server); a reader gone quadratic again took 8 s to minutes. The bound stops such a case and
#: fails it, instead of letting it run into the suite's global timeout.
ATTACK_BOUND = pytest.mark.timeout(20)


def _nested(depth: int, inner: str = "Open the file.") -> bytes:
    return (f"<html><body>{'<div>' * depth}<p>{inner}</p>{'</div>' * depth}</body></html>").encode()


@ATTACK_BOUND
def test_html_nested_past_the_depth_cap_is_refused_where_a_deep_but_sane_page_is_read() -> None:
    """20,000 nested elements took 8 s to read, each tag rescanning the open ones; past MAX_DEPTH the reader now
    stops at the first tag too deep, saying where and what the cap is, at bench/hostile.py's size and at 10×. A page just
    under the cap is read whole."""
    document = read_html(_nested(MAX_DEPTH - 10), "deep.html", LIMITS)
    assert document.segments == ["Open the file."]
    for depth in (20_000, 200_000):
        with pytest.raises(InputTooLarge, match=rf"^deep.html: elements nested more than {MAX_DEPTH} deep "
                                                rf"\(line 1\); the limit is {MAX_DEPTH}$"):
            read_html(_nested(depth), "deep.html", LIMITS)


def test_end_tags_close_what_they_match_and_stray_ones_change_nothing() -> None:
    """The open elements are counted, not searched: an end tag closes its element and the ones opened inside it,
    an end tag with nothing open to close is ignored (50,000 of them read in one pass), and content kept
    untranslated stays kept until its own element ends."""
    page = ("<p>Save <b>the <i>file</b> now.</p>" + "</span>" * 50_000 +
            "<p>Keep <code>x = 1</code> as is.</p><pre>kept <em>too</em></pre><p>Close it.</p>")
    document = read_html(page.encode(), "sloppy.html", LIMITS)
    plain = [" ".join(s.replace("⟦", " ⟦").split()) for s in document.segments]
    assert len(plain) == 3 and plain[0].startswith("Save") and plain[0].endswith("now.")
    assert "x = 1" not in plain[1] and plain[1].startswith("Keep") and plain[2] == "Close it."
    assert not any("kept" in s for s in plain)


def test_a_deep_html_upload_gets_413_with_the_reason(live_server: LiveServer) -> None:
    files = {"file": ("deep.html", _nested(30_000), "text/html")}
    reply = httpx.post(f"{live_server.url}/translate_file", data={"source": "en", "target": "es"}, files=files,
                       timeout=30)
    assert reply.status_code == 413
    assert reply.json()["error"] == f"deep.html: elements nested more than {MAX_DEPTH} deep (line 1); the limit " \
                                    f"is {MAX_DEPTH}"


def _one_at_a_time(result: str, span: str, masked_source: str, index: int) -> str:
    """The placement rule as it was written before (one search of the whole text per dropped span, quadratic):
    the oracle the linear `masking.restore` is compared with."""
    import re

    from hunyuan_mt.text import masking

    tail = masked_source.split(masking.sentinel(index), 1)[1] if masking.sentinel(index) in masked_source else ""
    trail_match = re.search(r"[.!?。！？:：…]+\s*$", result)
    if tail.strip() and all(not ch.isalnum() for ch in tail) and trail_match:
        cut = trail_match.start()
        return f"{result[:cut].rstrip()} {span}{result[cut:]}"
    if not result:
        return span
    if result[-1].isspace():
        return result + span
    return f"{result} {span}"


@ATTACK_BOUND
def test_dropped_codes_are_put_back_in_linear_time_where_they_were_before() -> None:
    """20,000 inline codes the model dropped took minutes to put back (each placed by searching the whole text).
    `restore` now places them in one pass, each where the rule always put it, checked against that rule applied
    one span at a time on sources and translations of every shape (codes inside, at the end, before the final
    punctuation; translations with and without it, with trailing spaces, empty)."""
    import random

    from hunyuan_mt.text import masking

    rng = random.Random(7)
    words = ["Open", "the", "file", "now", "数据", "ok"]
    ends = ["", ".", "!", " .", "。", "?!", "…", ". ", ":"]
    for case in range(400):
        n = rng.randint(1, 6)
        spans = [rng.choice(['<ph id="{}"/>', "{{{}}}", "%s", "<b>", "</b>", "https://x.io/{}"]).format(i)
                 for i in range(n)]
        pieces = []
        for i in range(n):
            pieces += [rng.choice(words)] * rng.randint(0, 2) + [masking.sentinel(i)]
        source = " ".join(pieces) + rng.choice(ends) if rng.random() < 0.7 else rng.choice(words) + " " + \
            " ".join(pieces) + rng.choice(ends)
        kept = rng.sample(range(n), rng.randint(0, n))
        translated = " ".join([rng.choice(words) for _ in range(rng.randint(0, 3))] +
                              [masking.sentinel(i) for i in sorted(kept)]) + rng.choice(ends)
        protected = masking.Protected(source, spans)
        expected, seen = masking._put_back(translated, spans)
        if len(masking._FOUND.findall(translated)) > len(seen):
            expected = masking._collapse_spaces(expected)
        for i in range(n):
            if i not in seen:
                expected = _one_at_a_time(expected, spans[i], source, i)
        assert masking.restore(translated, protected) == expected, (case, source, translated)
    spans = [f'<ph id="{i}"/>' for i in range(20_000)]
    source = "".join(f"w{i} {masking.sentinel(i)} " for i in range(20_000)) + "end."
    out = masking.restore("Nothing kept.", masking.Protected(source, spans))
    assert out.startswith('Nothing kept. <ph id="0"/> <ph id="1"/>') and out.endswith('<ph id="19999"/>')
    assert all(out.count(f'"{i}"') == 1 for i in (0, 1, 9_999, 19_999))


@ATTACK_BOUND
def test_an_element_with_too_many_attributes_is_refused_before_anything_copies_them() -> None:
    """40,000 attributes on one XLIFF element blocked every other client for 18-24 s while lxml copied them; an
    element past MAX_ATTRIBUTES is refused at once, with its line."""
    from hunyuan_mt.documents import read_document
    from hunyuan_mt.documents.base import MAX_ATTRIBUTES

    def xliff(count: int) -> bytes:
        attrs = " ".join(f'a{i}="v"' for i in range(count))
        return (f'<?xml version="1.0"?>\n<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">'
                f'<file source-language="en" target-language="de" datatype="plaintext" original="f"><body>\n'
                f'<trans-unit id="1"><source>Open <g id="1" {attrs}>the</g> file.</source></trans-unit>'
                f'</body></file></xliff>').encode()

    assert len(read_document(xliff(MAX_ATTRIBUTES - 1), "ok.xlf", LIMITS).segments) == 1
    with pytest.raises(InputTooLarge, match=rf"^bad.xlf: an element carries 40001 attributes \(line 3\); the limit "
                                            rf"is {MAX_ATTRIBUTES}$"):
        read_document(xliff(40_000), "bad.xlf", LIMITS)
    with pytest.raises(InputTooLarge, match=r"^bad.xlf: an element carries 400001 attributes"):
        read_document(xliff(400_000), "bad.xlf", LIMITS)  # 10× bench/hostile.py's 430 KB


@ATTACK_BOUND
def test_a_yaml_alias_bomb_is_read_and_written_once_per_object() -> None:
    """Each list aliasing the one before ten times: 411 bytes, 10^8 paths to the two strings. The walker visits each
    object once (it took 83 s at 364 bytes walking paths), and the translation keeps the anchors and aliases."""
    from hunyuan_mt.documents import read_document

    lines = ['a: &a ["Open the file", "Save it"]']
    for previous, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 10) + "]")
    document = read_document(("\n".join(lines) + "\n").encode(), "bomb.yaml", LIMITS)
    assert document.segments == ["Open the file", "Save it"]
    out = document.render(["Datei öffnen", "Speichern"]).data.decode()
    assert out.splitlines()[0] == 'a: &a ["Datei öffnen", "Speichern"]'    # quoting kept
    assert out.count("*a") == 10 and out.count("*h") == 10


@pytest.mark.parametrize("name, data", [
    ("deep.json", b"[" * 3000 + b'"Open the file"' + b"]" * 3000),
    ("deep.json", b"[" * 500 + b'"Open the file"' + b"]" * 500),
    ("deep.yaml", b"a: " + b"[" * 3000 + b"x" + b"]" * 3000 + b"\n"),
    ("deep.yaml", b"a: {b: " + b"[" * 1100 + b"'x]]'" + b"]" * 1100 + b"}\n"),
    ("deep.yaml", b"a:\n  - " + b"[" * 300 + b"1" + b"]" * 300 + b"\n"),          # inside a block list
])
def test_structured_files_nested_too_deep_get_413_not_a_crash(name: str, data: bytes) -> None:
    """A JSON or YAML file nested deeper than the parser's stack was a 500, and ruamel took 4.2 s on a 2 KB flow
    collection 1,100 deep before giving up; past MAX_NESTING it is refused, a YAML one before ruamel parses it."""
    from hunyuan_mt.documents import read_document
    from hunyuan_mt.documents.structured import MAX_NESTING

    with pytest.raises(InputTooLarge, match=rf"^{name}: containers nested more than {MAX_NESTING} deep; the limit "
                                            rf"is {MAX_NESTING}$"):
        read_document(data, name, LIMITS)


def test_a_job_uploaded_with_a_key_is_that_keys_alone_whatever_the_address(web_service, web_cfg) -> None:
    """With keys on, the job routes fell back to the uploader's address: from the same address, no key or another
    key listed k1's jobs and filenames, downloaded its result and cancelled it. A keyed job now answers only its key
    (404 to anyone else, exactly as a job that does not exist)."""
    from web_server import serve, with_server

    cfg = with_server(web_cfg, api_keys=["k1", "k2"], rate_limit_per_min=100)
    with serve(web_service, cfg) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        files = {"file": ("secret-plans.txt", b"Open the file.\n", "text/plain")}
        job = client.post("/v1/documents", data={"source": "en", "target": "es", "api_key": "k1"}, files=files)
        assert job.status_code == 202, job.text
        job_id = job.json()["id"]
        mine = {"Authorization": "Bearer k1"}
        state = client.get(f"/v1/documents/{job_id}", params={"wait": 30}, headers=mine).json()
        while state["state"] not in ("done", "error", "cancelled"):
            state = client.get(f"/v1/documents/{job_id}", params={"wait": 30}, headers=mine).json()
        assert state["state"] == "done"
        for others in ({}, {"Authorization": "Bearer k2"}, {"Authorization": "Bearer nope"}):
            listed = client.get("/v1/documents", headers=others)
            assert "secret-plans" not in listed.text
            for method, path in (("GET", f"/v1/documents/{job_id}"), ("GET", f"/v1/documents/{job_id}/result"),
                                 ("DELETE", f"/v1/documents/{job_id}")):
                assert client.request(method, path, headers=others).status_code == 404, (others, method, path)
        assert [j["id"] for j in client.get("/v1/documents", headers=mine).json()["jobs"]] == [job_id]
        assert client.get(f"/v1/documents/{job_id}/result", headers=mine).status_code == 200


def test_the_pages_routes_cap_their_bodies_as_the_api_does(live_server: LiveServer) -> None:
    """The page's routes take no key; a 200 MB JSON body to its queue was read whole. Now a body over the API's
    JSON cap is refused with 413 before anything reads it, an upload over the file cap too, and the page still
    translates and takes a document of normal size (tests/test_ui_browser.py, tests/test_clients.py)."""
    from hunyuan_mt.web.api import body_caps

    json_cap, file_cap = body_caps(live_server.cfg.limits)
    big = b'{"data": ["' + b"x" * (json_cap + 10) + b'"], "fn_index": 0, "session_hash": "abc"}'
    reply = httpx.post(f"{live_server.url}/ui/gradio_api/queue/join", content=big,
                       headers={"content-type": "application/json"}, timeout=30)
    assert reply.status_code == 413 and "Request body too large" in reply.text
    upload = httpx.post(f"{live_server.url}/ui/gradio_api/upload",
                        files={"files": ("big.txt", b"x" * (file_cap + 10), "text/plain")}, timeout=60)
    assert upload.status_code == 413


def test_a_chat_text_part_that_is_not_a_string_is_the_clients_mistake(live_server: LiveServer) -> None:
    """A content part whose `text` is a number was a 500; the OpenAI client now hears a 400 saying what is wrong."""
    import openai

    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="a text part's 'text' must be a string"):
        client.chat.completions.create(model="en2es", messages=[
            {"role": "user", "content": [{"type": "text", "text": 5}]}])  # type: ignore[list-item]


# ---------------------------------------------------------------------------------------------------- packages


def _with_member(data: bytes, name: str, content: bytes, mode: int | None = None) -> bytes:
    """`data` (a zip package) with one more member, `mode` its Unix type and permissions when given."""
    import io
    import zipfile

    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info, zin.read(info))
        extra = zipfile.ZipInfo(name)
        if mode is not None:
            extra.create_system = 3
            extra.external_attr = mode << 16
        zout.writestr(extra, content)
    return out.getvalue()


EPUB = __import__("pathlib").Path(__file__).parent / "data" / "office" / "gdk-pixbuf.epub"


@pytest.mark.parametrize("name", ["../evil.txt", "OEBPS/../../evil.txt", "/etc/evil", "..\\evil.txt", "C:/evil"])
def test_a_package_member_named_outside_the_package_is_refused(name: str) -> None:
    from hunyuan_mt.documents import read_document
    from hunyuan_mt.errors import UnsupportedDocument

    bad = _with_member(EPUB.read_bytes(), name, b"x")
    with pytest.raises(UnsupportedDocument, match="points outside the package; such a package is refused"):
        read_document(bad, "book.epub", LIMITS)


def test_a_symlink_member_comes_back_a_plain_file() -> None:
    import io
    import stat
    import zipfile

    from hunyuan_mt.documents import read_document

    linked = _with_member(EPUB.read_bytes(), "OEBPS/link", b"/etc/passwd", stat.S_IFLNK | 0o777)
    document = read_document(linked, "book.epub", LIMITS)
    out = document.render(document.segments, "es").data
    with zipfile.ZipFile(io.BytesIO(out)) as zf:
        modes = {info.filename: info.external_attr >> 16 for info in zf.infolist()}
        assert zf.read("OEBPS/link") == b"/etc/passwd"  # the bytes stay; only the link flag goes
    assert not stat.S_ISLNK(modes["OEBPS/link"]) and stat.S_ISREG(modes["OEBPS/link"])
    assert not any(stat.S_ISLNK(mode) for mode in modes.values())


def test_a_body_that_trickles_in_is_cut_off_with_408(live_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slowloris client: headers promise 1,000 bytes, then one byte every 0.2 s. It gets 408 once it falls
    behind the minimum rate (shortened here to 1 s of grace and 50 bytes a second), and the server answers others
    meanwhile."""
    import socket
    import time
    from urllib.parse import urlsplit

    import hunyuan_mt.web.requests as requests_mod

    monkeypatch.setattr(requests_mod, "BODY_GRACE_S", 1.0)
    monkeypatch.setattr(requests_mod, "BODY_MIN_RATE", 50)
    url = urlsplit(live_server.url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{")
        started = time.monotonic()
        sock.setblocking(False)
        answer = b""
        while time.monotonic() - started < 20 and b"\r\n\r\n" not in answer:
            try:
                sock.send(b" ")
            except OSError:
                pass
            time.sleep(0.2)
            try:
                answer += sock.recv(65536)
            except BlockingIOError:
                pass
        elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"Request body too slow" in answer and elapsed < 10, (elapsed, answer[-300:])
    # A client at a normal pace is not touched.
    assert httpx.post(live_server.url + "/detect", json={"q": "Bonjour tout le monde"}, timeout=60).status_code == 200


def test_one_keys_flood_gets_its_own_429_and_never_evicts_anothers_link_or_job(web_service, web_cfg) -> None:
    """k2 floods /translate_file and /v1/documents: it gets 429 with Retry-After once it holds its share (2 here;
    16 links and 8 unfinished jobs by default), while k1's download link, taken first, stays downloadable and k1 can still submit a job. Before,
    64 small uploads from k2 pushed k1's link out, and k2's jobs up to the shared 64 gave everyone 503."""
    from seams import hold
    from web_server import serve, with_server

    cfg = with_server(web_cfg, api_keys=["k1", "k2"], rate_limit_per_min=1000)
    with serve(web_service, cfg) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        api = server.app.state.api
        api.downloads.per_caller = 2
        api.jobs.cfg = __import__("dataclasses").replace(api.jobs.cfg, per_caller=2)
        files = {"file": ("notes.txt", b"Open the file.\n", "text/plain")}
        k1, k2 = {"Authorization": "Bearer k1"}, {"Authorization": "Bearer k2"}
        link = client.post("/translate_file", data={"source": "en", "target": "es"}, files=files, headers=k1)
        assert link.status_code == 200, link.text
        codes = [client.post("/translate_file", data={"source": "en", "target": "es"}, files=files,
                             headers=k2).status_code for _ in range(6)]
        assert codes == [200, 200, 429, 429, 429, 429], codes
        refused = client.post("/translate_file", data={"source": "en", "target": "es"}, files=files, headers=k2)
        assert "translated files waiting to be downloaded" in refused.json()["error"]
        assert 1 <= int(refused.headers["Retry-After"]) <= 900
        assert client.get(link.json()["translatedFileUrl"], headers=k1).status_code == 200  # k1's link kept
        # k2's jobs are held in the engine, so they stay unfinished (finished jobs take no share).
        held = {"file": ("held.txt", b"Hold the second key's job here.\n", "text/plain")}
        reached, go, _ = hold(server.service.engine, "Hold the second key")
        try:
            jobs = [client.post("/v1/documents", data={"source": "en", "target": "es"}, files=held, headers=k2)
                    for _ in range(4)]
            assert [j.status_code for j in jobs] == [202, 202, 429, 429]
            assert "document jobs queued or translating, the most one caller may" in jobs[-1].json()["error"]
            assert int(jobs[-1].headers["Retry-After"]) >= 1
            mine = client.post("/v1/documents", data={"source": "en", "target": "es"}, files=files, headers=k1)
            assert mine.status_code == 202, mine.text
        finally:
            go.set()
            server.service.engine.before_generate = None


@pytest.mark.parametrize("route", ["/translate", "/translate_file"])
def test_a_letter_under_thousands_of_accents_is_refused_and_real_marks_are_not(live_server: LiveServer,
                                                                              route: str) -> None:
    """"a" followed by 4,999 combining accents came back 4,001 characters long (the model made one "á" of the
    first 1,000). More than 30 marks in a row (Unicode's stream-safe limit) is a 400 now, text or document."""
    zalgo = "a" + "\u0301" * 4999
    with httpx.Client(base_url=live_server.url, timeout=60) as client:
        if route == "/translate":
            refused = client.post(route, json={"q": zalgo, "source": "en", "target": "es"})
        else:
            refused = client.post(route, data={"source": "en", "target": "es"},
                                  files={"file": ("z.txt", f"Open the file.\n{zalgo}\n".encode(), "text/plain")})
        assert refused.status_code == 400, refused.text
        body = refused.json()
        assert "4999 combining marks in a row at character" in body["error"] + body.get("detail", "")
        # Marks as languages use them: Vietnamese stacks two, Arabic and Devanagari one or two per letter.
        fine = "Việt Nam đẹp. " + "كَتَبَ الوَلَدُ" + " नमस्ते "
        assert client.post("/translate", json={"q": fine, "source": "en", "target": "es"}).status_code == 200
