"""Fair shares under abuse: one caller floods a door it may use, and another key's one-sentence /translate and a
page user on another address are answered as if it did not, while the abuser gets 429/413/408 with a Retry-After
that is the real wait. Each test is a flood at a scaled-down size (bench/fair_shares.py replays the full sizes
against `python app.py`), and asserts the other callers' latency: the key's median of 10 ≤ 1 s and worst ≤ 2 s,
the page user ≤ 5 s.

A second client address is real: Linux routes all of 127.0.0.0/8 to the loopback, so a client bound to 127.0.0.2
reaches the server on 127.0.0.1 and the server sees 127.0.0.2.
"""

from __future__ import annotations

import dataclasses
import io
import json
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hunyuan_mt.scheduler.callers import Caller
from hunyuan_mt.config import Config, LimitsConfig, ServerConfig
from hunyuan_mt.documents import RenderedDocument
from hunyuan_mt.errors import RateLimited
from hunyuan_mt.scheduler.shares import Share, TimeBudget
from hunyuan_mt.web.auth import AccessPolicy
from bench.flood import Flood
from web_server import LiveServer, serve, with_server

KEYS = ["kA", "kB", "kC", "kD", "kE"]
SENTENCE = {"q": "Open the file.", "source": "en", "target": "es"}
ABUSER, PAGE_USER = "127.0.0.2", "127.0.0.3"
#: The "done when" of the flood tests: the other key's median of 10 and worst, and a page user's answer (seconds).
KEY_MEDIAN_S, KEY_WORST_S, PAGE_USER_S = 1.0, 2.0, 5.0
#: ~5,000 characters of distinct sentences: a page translation that keeps the engine busy for about a second.
LONG_TEXT = " ".join(f"Sentence number {i} asks you to open the file and save it." for i in range(80))[:4990]


def _from(address: str, **kw: Any) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=60, **kw)


def _config(cfg: Config, **sections: dict[str, Any]) -> Config:
    """`cfg` with keys on and other settings in the named sections (server, shares, jobs, limits)."""
    changed = {name: dataclasses.replace(getattr(cfg, name), **values) for name, values in sections.items()}
    changed["server"] = dataclasses.replace(changed.get("server", cfg.server), api_keys=KEYS)
    return dataclasses.replace(cfg, **changed)


def warm(server: LiveServer) -> None:
    """What a server's start does (model.warmup, off in the tests): the first translations, before the flood, so
    that the first measured call does not pay for them."""
    key_latencies(server, count=2)
    page_translation(server.url, PAGE_USER)
    server.service.translate_batch([LONG_TEXT[:1000]], "en", "es")


def key_latencies(server: LiveServer, key: str = "kB", count: int = 10) -> list[float]:
    """`count` one-sentence /translate calls of `key`, one after another: each one's seconds."""
    seconds = []
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {key}"}) as client:
        for _ in range(count):
            started = time.monotonic()
            reply = client.post("/translate", json=SENTENCE)
            seconds.append(time.monotonic() - started)
            assert reply.status_code == 200, reply.text
    return seconds


def assert_key_unaffected(seconds: list[float]) -> None:
    assert statistics.median(seconds) <= KEY_MEDIAN_S and max(seconds) <= KEY_WORST_S, \
        [round(s, 3) for s in seconds]


def page_call(base: str, address: str, text: str, client: httpx.Client | None = None) -> httpx.Response:
    """Join the page's queue for a translation through Gradio's call API (what curl and bench/flood.py use)."""
    body = {"data": [text, "en", "es", "", ""]}
    if client is not None:
        return client.post("/ui/gradio_api/call/translate", json=body)
    with _from(address, base_url=base) as own:
        return own.post("/ui/gradio_api/call/translate", json=body)


def page_translation(base: str, address: str, text: str = "Open the file.") -> tuple[float, str]:
    """A page user's translation from `address`, joined and read to its end: (seconds, the translation)."""
    started = time.monotonic()
    with _from(address, base_url=base) as client:
        joined = page_call(base, address, text, client)
        assert joined.status_code == 200, joined.text
        event = joined.json()["event_id"]
        outcome, data = "", ""
        with client.stream("GET", f"/ui/gradio_api/call/translate/{event}") as stream:
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    outcome = line[len("event: "):]
                elif line.startswith("data: ") and outcome in ("complete", "error"):
                    data = line[len("data: "):]
                    break
    assert outcome == "complete", (outcome, data)
    return time.monotonic() - started, json.loads(data)[0]


def assert_truthful_wait(response: httpx.Response, at_most: float) -> int:
    wait = int(response.headers["Retry-After"])
    assert 1 <= wait <= at_most, (wait, response.text)
    return wait


def truthful_wait(refusal: dict[str, Any], at_most: float) -> int:
    """A refusal a flood recorded (bench/flood.py): its Retry-After, within bounds."""
    wait = int(refusal["retry_after"])
    assert 1 <= wait <= at_most, refusal
    return wait


# ---------------------------------------------------------------------------------------------- 1. the page's queue


def test_a_keyless_page_flood_gets_its_share_and_others_are_answered_at_once(web_service: Any,
                                                                            web_cfg: Config) -> None:
    """From one address with no key, page translations of ~5,000 characters through the call API, eight at a
    time for as long as the others are measured: the address has `shares.page_calls` (4) events in Gradio's queue
    at most, the rest are refused with 429 and the likely wait, and its rows take turns with the others' in the
    engine. Before, 1,000 of them were all accepted and another key's sentence took 34 s."""
    with serve(web_service, _config(web_cfg)) as server:
        warm(server)
        share = server.app.state.blocks.hmt_ui.cfg.shares.page_calls
        with Flood(url=server.url, path="/ui/gradio_api/call/translate", address=ABUSER, workers=8,
                   json={"data": [LONG_TEXT, "en", "es", "", ""]}) as flood:
            time.sleep(3.0)  # the abuser's share is full and its translations are running
            seconds = key_latencies(server)
            page_seconds, text = page_translation(server.url, PAGE_USER)
        assert_key_unaffected(seconds)
        assert page_seconds <= PAGE_USER_S and text == server.reference("Open the file.", "en", "es")
        assert flood.codes.count(429) > flood.codes.count(200) >= share, flood.codes[:40]
        assert set(flood.codes) <= {200, 429}
        refused = flood.refusals[-1]
        assert "Too many page requests from your address: 4 waiting or running" in refused["body"]
        # The wait is the real one: once it has passed, the address's next join is taken.
        time.sleep(truthful_wait(refused, 30) + 0.5)
        assert page_call(server.url, ABUSER, "Open the file.").status_code == 200


def test_one_keys_slow_calls_hold_its_share_of_the_rest_threads_not_all(web_service: Any, web_cfg: Config,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """REST calls run on 64 threads that every caller shares. kA's calls, held inside the service, take its
    `shares.requests` (8) and, while the pool is otherwise idle, borrow up to half of it (32 in all): its further
    calls get 429 at once with the wait, and kB is answered meanwhile from the half never lent."""
    held_text = "Hold the first key's call inside the service."
    inside, release = threading.Semaphore(0), threading.Event()
    real = web_service.translate_batch

    def maybe_held(texts: list[str], *args: Any, **kw: Any) -> Any:
        if texts == [held_text]:
            inside.release()
            assert release.wait(60)
        return real(texts, *args, **kw)

    monkeypatch.setattr(web_service, "translate_batch", maybe_held)
    with serve(web_service, _config(web_cfg)) as server:
        warm(server)
        codes: list[httpx.Response] = []

        def call() -> None:
            codes.append(httpx.post(server.url + "/translate", json={**SENTENCE, "q": held_text}, timeout=60,
                                    headers={"Authorization": "Bearer kA"}))

        threads = [threading.Thread(target=call, daemon=True) for _ in range(40)]
        for thread in threads:
            thread.start()
        try:
            for _ in range(32):
                assert inside.acquire(timeout=30)
            deadline = time.monotonic() + 10
            while len(codes) < 8 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert [r.status_code for r in codes] == [429] * 8
            assert "Too many requests at work: 8 at once allowed per caller" in codes[0].json()["error"]
            assert_truthful_wait(codes[0], 60)
            assert server.app.state.api.policy.requests.held("key:kA") == 32
            assert_key_unaffected(key_latencies(server))
        finally:
            release.set()
            for thread in threads:
                thread.join(60)
        assert sorted(r.status_code for r in codes) == [200] * 32 + [429] * 8


# ---------------------------------------------------------------------------------------------- 2. corrections


def test_with_keys_on_the_open_page_writes_no_corrections(web_service: Any, web_cfg: Config) -> None:
    """A keyless visitor's "Save correction" changed what kB's /translate answered for that text. With keys on and
    no page login it is refused (the button is not shown), and kB still gets the model's translation."""
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    with serve(web_service, _config(web_cfg)) as server:
        text = "Save the report before you close it."
        before = key_latencies_text(server, text)
        page = Client(server.url + "/ui/", verbose=False)
        with pytest.raises(AppError, match="takes corrections from the page only from signed-in users"):
            page.predict(text, "en", "es", "Texto falso.", "en", "", api_name="/save_correction")
        assert key_latencies_text(server, text) == before != "Texto falso."
        assert_key_unaffected(key_latencies(server))


def key_latencies_text(server: LiveServer, text: str) -> str:
    reply = httpx.post(server.url + "/translate", json={**SENTENCE, "q": text}, timeout=60,
                       headers={"Authorization": "Bearer kB"})
    assert reply.status_code == 200, reply.text
    return reply.json()["translatedText"]


@pytest.mark.parametrize("keys, auth, option, saves", [
    ([], None, False, True),             # keys off: the page is a caller like any other
    (["k"], None, False, False),         # keys on, page open: no
    (["k"], "ann:pw", False, True),      # keys on, page behind the login: the user signed in
    (["k"], None, True, True),           # keys on, page open, server.page_corrections: the operator said so
])
def test_who_may_save_corrections_from_the_page(keys: list[str], auth: str | None, option: bool,
                                                saves: bool) -> None:
    policy = AccessPolicy(ServerConfig(api_keys=keys, auth=auth, page_corrections=option), LimitsConfig())
    assert policy.page_corrections is saves


# ---------------------------------------------------------------------------------------------- 3. long polls


@pytest.fixture()
def held_job() -> Iterator[tuple[threading.Event, Callable[..., Any]]]:
    """A job's work that stays queued-then-translating until the event is set."""
    release = threading.Event()

    def work(progress: Callable[[int, int], None], ticket: Any) -> tuple[RenderedDocument, str]:
        assert release.wait(60)
        progress(1, 1)
        return RenderedDocument(b"hecho", "a.es.txt", "text/plain", ""), "en"

    yield release, work
    release.set()


def test_long_polls_are_the_callers_share_hold_no_thread_and_end_with_the_job(web_service: Any, web_cfg: Config,
                                                                              held_job: Any) -> None:
    """80 polls `GET /v1/documents/<id>?wait=30` from kA held 80 REST threads and took kB's sentence from 0.1 to
    25 s. A poll is now awaited on the job's event (no thread), checked against the job's key (kB gets 404), and
    kA has `shares.long_polls` (4) open at most: the rest get 429 with the seconds until its soonest poll ends.
    When the job changes, the open polls answer at once."""
    release, work = held_job
    with serve(web_service, _config(web_cfg)) as server:
        warm(server)
        api = server.app.state.api
        owner = Caller("key:kA", "127.0.0.1")
        job = api.jobs.submit(work, "a.txt", "en", "es", total=1, owner=owner, caller=owner)
        url = f"{server.url}/v1/documents/{job.id}"
        assert httpx.get(url, params={"wait": 1}, headers={"Authorization": "Bearer kB"}).status_code == 404
        answers: list[tuple[int, float, httpx.Response]] = []

        def poll() -> None:
            started = time.monotonic()
            reply = httpx.get(url, params={"wait": 20}, headers={"Authorization": "Bearer kA"}, timeout=60)
            answers.append((reply.status_code, time.monotonic() - started, reply))

        polls = [threading.Thread(target=poll, daemon=True) for _ in range(20)]
        for thread in polls:
            thread.start()
        deadline = time.monotonic() + 10
        while sum(1 for code, _, _ in answers if code == 429) < 16 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert api.policy.long_polls.held("key:kA") == 4
        limiter = api._limiter
        assert limiter is None or limiter.borrowed_tokens == 0  # the open polls hold no REST thread
        assert_key_unaffected(key_latencies(server))
        refused = [r for code, _, r in answers if code == 429]
        assert len(refused) == 16 and "Too many long polls open: 4 at once allowed" in refused[0].json()["error"]
        assert_truthful_wait(refused[0], 20)
        release.set()  # the job ends: the four open polls answer now, not after their 20 s
        for thread in polls:
            thread.join(30)
        held = [(seconds, r.json()["state"]) for code, seconds, r in answers if code == 200]
        assert len(held) == 4 and all(seconds < 15 and state in ("translating", "done") for seconds, state in held)
        assert api.policy.long_polls.held("key:kA") == 0


# ---------------------------------------------------------------------------------------------- 4. slow clients


def _trickle(address: str, port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), source_address=(address, 0), timeout=5)
    sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\n")
    return sock


def _answer(sock: socket.socket, wait_s: float) -> bytes:
    sock.settimeout(wait_s)
    try:
        return sock.recv(4096)
    except (socket.timeout, ConnectionError):
        return b""


def test_slow_header_clients_are_capped_per_address_and_timed_out(web_service: Any, web_cfg: Config) -> None:
    """3,000 connections trickling header bytes were all open after 90 s, and at ~20,000 the process ran out of
    file descriptors. Here one address opens 60 such connections: 20 (`server.connections_per_address`) are
    kept, the rest are answered 429 with a Retry-After at once and closed; the kept ones get 408 once
    `server.header_timeout_s` has passed. kB, from another address, is not slowed meanwhile."""
    cfg = _config(web_cfg, server={"connections_per_address": 20, "header_timeout_s": 2.0})
    with serve(web_service, cfg) as server:
        warm(server)
        guard = server.app.state.connections
        port = int(server.url.rsplit(":", 1)[1])
        socks = [_trickle(ABUSER, port) for _ in range(60)]
        try:
            time.sleep(0.3)
            answers = [_answer(s, 0.05) for s in socks]
            refused = [a for a in answers if a.startswith(b"HTTP/1.1 429")]
            assert len(refused) == 40 and guard.open_from(ABUSER) == 20, (len(refused), guard.open_from(ABUSER))
            assert b"retry-after: 2" in refused[0] and b"Too many connections from your address" in refused[0]
            kept = [s for s, a in zip(socks, answers) if not a]
            for s in kept:
                s.sendall(b"X-Slow: 1\r\n")  # a byte now and then does not buy more time
            assert_key_unaffected(key_latencies(server))
            timed_out = [_answer(s, 5.0) for s in kept]
            assert all(a.startswith(b"HTTP/1.1 408") for a in timed_out), timed_out[:2]
            deadline = time.monotonic() + 5
            while guard.open_from(ABUSER) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert guard.open_from(ABUSER) == 0 and guard.timed_out >= 20
        finally:
            for s in socks:
                s.close()


def test_connections_over_the_total_are_refused_with_503(web_service: Any, web_cfg: Config) -> None:
    cfg = _config(web_cfg, server={"max_connections": 30, "connections_per_address": 100})
    with serve(web_service, cfg) as server:
        port = int(server.url.rsplit(":", 1)[1])
        socks = [_trickle(f"127.0.0.{10 + n % 20}", port) for n in range(40)]
        try:
            time.sleep(0.3)
            answers = [_answer(s, 0.05) for s in socks]
            assert sum(1 for a in answers if a.startswith(b"HTTP/1.1 503")) == 10
            assert server.app.state.connections.open == 30
        finally:
            for s in socks:
                s.close()


# ---------------------------------------------------------------------------------------------- 5. parse floods


#: Legitimate flat markup, repeated to megabytes: HTMLParser needs seconds for it, a read that runs to a short
#: deadline (no <html> around it: the reader takes a fragment).
FLAT_HTML_PARAGRAPH = "<p>Open the <b>settings</b> page and change your password, then save the file.</p>\n"


def test_reads_that_run_to_the_deadline_are_charged_and_others_still_read(web_service: Any,
                                                                          web_cfg: Config) -> None:
    """Two loops posting a file that runs to the parse deadline took both document readers: kC's small .txt
    waited 57 s for a 503. kA now reads one file at a time (`shares.parses`; the second loop gets 429 at once),
    each refused read is charged its whole time, and past `shares.parse_s_per_min` kA gets 429 until the window
    frees; kC's file is read at once and kB's sentences are not slowed."""
    cfg = _config(web_cfg, limits={"parse_timeout_s": 1.0}, shares={"parse_s_per_min": 1.5})
    with serve(web_service, cfg) as server:
        warm(server)
        with Flood(url=server.url, path="/v1/documents", address="127.0.0.1", workers=2, pace_s=0.5, seconds=40,
                   data={"source": "en", "target": "es"}, headers={"Authorization": "Bearer kA"},
                   files={"file": ["flat.html", FLAT_HTML_PARAGRAPH, "text/html"]},
                   repeat=4 * 2**20 // len(FLAT_HTML_PARAGRAPH)) as flood:
            time.sleep(3.0)
            started = time.monotonic()
            small = httpx.post(server.url + "/v1/documents", data={"source": "en", "target": "es"},
                               files={"file": ("notes.txt", b"Open the file.\n", "text/plain")},
                               headers={"Authorization": "Bearer kC"}, timeout=60)
            small_s = time.monotonic() - started
            seconds = key_latencies(server)
            time.sleep(8.0)  # long enough for kA to spend its budget on refused reads
        assert small.status_code == 202 and small_s <= 5.0, (small.status_code, small_s, small.text)
        assert_key_unaffected(seconds)
        assert 413 in flood.codes and 429 in flood.codes and 202 not in flood.codes, flood.codes
        budget = [r for r in flood.refusals if "Too much document reading" in r["body"]]
        assert budget, [r["body"][:80] for r in flood.refusals[:5]]
        truthful_wait(budget[-1], 60)
        spent = server.app.state.api.parsers.reading_time.spent("key:kA")
        assert spent >= 1.5  # the refused reads were charged


# ---------------------------------------------------------------------------------------------- 6. job slots


def test_finished_jobs_leave_the_queue_to_other_keys(web_service: Any, web_cfg: Config) -> None:
    """Keys A, C, D and E each sent 16 tiny jobs; once done they still held the 64 server-wide slots, and kB's
    submit got 503 for the next hour. Finished jobs no longer count: with 8 slots and 2 per key, four keys' 8
    finished jobs leave room for kB, whose sentences were not slowed by the flood."""
    cfg = _config(web_cfg, jobs={"max_jobs": 8, "per_caller": 2})
    files = {"file": ("notes.txt", b"Open the file.\nSave it.\n", "text/plain")}
    with serve(web_service, cfg) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        warm(server)
        ids = []
        for key in ("kA", "kC", "kD", "kE"):
            for _ in range(2):
                reply = client.post("/v1/documents", data={"source": "en", "target": "es"}, files=files,
                                    headers={"Authorization": f"Bearer {key}"})
                assert reply.status_code in (202, 429), reply.text
                if reply.status_code == 202:
                    ids.append((key, reply.json()["id"]))
        for key, job_id in ids:
            state = {"state": "queued"}
            while state["state"] not in ("done", "error", "cancelled"):
                state = client.get(f"/v1/documents/{job_id}", params={"wait": 10},
                                   headers={"Authorization": f"Bearer {key}"}).json()
            assert state["state"] == "done"
        mine = client.post("/v1/documents", data={"source": "en", "target": "es"}, files=files,
                           headers={"Authorization": "Bearer kB"})
        assert mine.status_code == 202, mine.text
        assert all(client.get(f"/v1/documents/{job_id}/result",
                              headers={"Authorization": f"Bearer {key}"}).status_code == 200 for key, job_id in ids)
        assert_key_unaffected(key_latencies(server))


# ---------------------------------------------------------------------------------------------- 7. page uploads


def test_page_uploads_are_the_pages_file_types_within_a_budget_and_swept(web_service: Any, web_cfg: Config,
                                                                          tmp_path: Path) -> None:
    """100 keyless uploads of ~10 MiB took the temp folder from 10 MB to 1 GB in 12 s, an .exe among them. An
    upload must be a file the page reads (415 before Gradio writes it), an address keeps `shares.upload_bytes` at
    most (429 until its oldest is deleted: the wait given is enough), and uploads are deleted
    `shares.upload_ttl_s` after they came. Another address uploads meanwhile; kB is not slowed."""
    cfg = _config(web_cfg, shares={"upload_bytes": 1_000_000, "upload_ttl_s": 3.0})
    chunk = ("Open the file and save it.\n" * 11_000).encode()  # ~300 KB
    with serve(web_service, cfg) as server, _from(ABUSER, base_url=server.url) as abuser:
        warm(server)
        upload = "/ui/gradio_api/upload"
        exe = abuser.post(upload, files={"files": ("setup.exe", b"MZ" + b"\0" * 1000, "application/octet-stream")})
        assert exe.status_code == 415 and exe.text.startswith("setup.exe: the page takes"), exe.text
        codes, stored = [], []
        for n in range(5):
            reply = abuser.post(upload, files={"files": (f"part{n}.txt", chunk, "text/plain")})
            codes.append(reply.status_code)
            if reply.status_code == 200:
                stored += reply.json()
        assert codes == [200, 200, 200, 429, 429], codes
        refused = reply
        assert "Too many uploads kept for your address" in refused.text
        assert all(Path(p).is_file() for p in stored)
        assert not any("setup.exe" in str(p) for p in Path(stored[0]).parent.parent.rglob("*"))
        with _from(PAGE_USER, base_url=server.url) as other:
            assert other.post(upload, files={"files": ("mine.txt", b"Open the file.\n", "text/plain")}
                              ).status_code == 200
        assert_key_unaffected(key_latencies(server))
        time.sleep(assert_truthful_wait(refused, 3) + 0.2)
        again = abuser.post(upload, files={"files": ("later.txt", chunk, "text/plain")})
        assert again.status_code == 200, again.text
        assert not any(Path(p).exists() for p in stored)  # swept once their time was up


# ---------------------------------------------------------------------------------------------- 8. small ones


def test_a_json_number_the_decoder_refuses_is_a_400_and_the_connection_stays(live_server: LiveServer) -> None:
    """A 5,000-digit number passes the JSON grammar and then int() refuses it: that was a 500 and a dropped
    keep-alive connection, on /translate and /v1/chat/completions."""
    port = int(live_server.url.rsplit(":", 1)[1])
    for path in ("/translate", "/v1/chat/completions"):
        body = b'{"q": "Open the file.", "source": "en", "target": "es", "alternatives": ' + b"9" * 5000 + b"}"
        good = json.dumps({"q": "Open the file.", "source": "en", "target": "es", "model": "en2es",
                           "messages": [{"role": "user", "content": "Open the file."}]}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            reader = sock.makefile("rb")
            for payload, expected in ((body, b"400"), (good, b"200")):
                sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
                status = reader.readline()
                headers = {}
                while (line := reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    headers[name.lower()] = value.strip()
                answer = reader.read(int(headers["content-length"]))
                assert status.split()[1] == expected, (path, status, answer[:200])
                if expected == b"400":
                    assert b"Invalid JSON body" in answer and headers.get("connection") != "close"


def _encrypted(filter_entry: bytes) -> bytes:
    from sample_docs import make_pdf

    plain = make_pdf(["Open the file."])
    return plain.replace(b"/Root 1 0 R >>", b"/Root 1 0 R /Encrypt " + filter_entry +
                         b" /ID [<00112233445566778899aabbccddeeff> <00112233445566778899aabbccddeeff>] >>")


@pytest.mark.parametrize("entry", [b"<< /Filter /FooBar /V 1 >>",
                                   b"<< /Filter /Standard /V 9 /R 9 /O (x) /U (y) /P -4 >>"],
                         ids=["unknown-handler", "unknown-version"])
def test_any_encryption_pypdf_cannot_open_is_a_415(live_server: LiveServer, entry: bytes) -> None:
    reply = httpx.post(live_server.url + "/translate_file", data={"source": "en", "target": "es"},
                       files={"file": ("locked.pdf", _encrypted(entry), "application/pdf")}, timeout=60)
    assert reply.status_code == 415, reply.text
    assert reply.json()["error"] == ("locked.pdf: the PDF is encrypted in a way this server cannot open; save it "
                                     "without protection and upload it again")


def test_a_pdfs_translation_is_written_from_its_layout_in_linear_time() -> None:
    """A 5,000-page PDF was read and translated, then its writing ran out of time (it read the PDF again, and
    python-docx looked for each page break past every paragraph written: 200 s here). The layout comes back with
    the segments and the .docx is written from it: 5,000 pages of three paragraphs in seconds."""
    import docx

    from hunyuan_mt.documents.pdf import write_pdf_translation

    pages: list[list[int | str]] = [[3 * i, 3 * i + 1, 3 * i + 2] for i in range(5000)]
    started = time.monotonic()
    rendered = write_pdf_translation("big.pdf", pages, [f"Párrafo {i}." for i in range(15_000)], "es")
    assert time.monotonic() - started < 15.0  # limits.parse_timeout_s; ~3 s on 2 Zen 3 cores
    written = docx.Document(io.BytesIO(rendered.data))
    assert len(written.paragraphs) == 15_000 and written.paragraphs[-1].text == "Párrafo 14999."
    assert rendered.filename == "big.es.docx"


def test_a_parsed_pdf_is_written_without_reading_it_again() -> None:
    from sample_docs import make_pdf

    from hunyuan_mt.documents import parsers as parsing

    pool = parsing.DocumentParsers(LimitsConfig(parse_workers=1))
    try:
        document = pool.read(make_pdf(["Open the file.", "", "Close the window."]), "two.pdf")
        reads = []
        original = pool.call

        def counting(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
            reads.append(fn.__name__)
            return original(fn, *args, **kw)

        pool.call = counting  # type: ignore[method-assign]
        out = document.render([s.upper() for s in document.segments], "es")
        assert reads == ["render_layout"] and out.filename == "two.es.docx"
    finally:
        pool.close()


def test_one_bad_upload_writes_a_bounded_number_of_log_lines(capfd: pytest.CaptureFixture[str]) -> None:
    """One 900 KB PDF of deeply nested dictionaries wrote 33,180 log lines (pypdf warns per bad object). A call in
    a document helper writes at most `parsers.MAX_LOG_RECORDS` lines, then one saying how many more there were."""
    from hunyuan_mt.documents import parsers as parsing

    from sample_docs import log_warnings

    pool = parsing.DocumentParsers(LimitsConfig(parse_workers=1))
    try:
        assert pool.call(log_warnings, 5000, "noisy.pdf", what="noisy.pdf", doing="reading it") == 5000
    finally:
        pool.close()
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "bad object" in line]
    assert len(lines) == parsing.MAX_LOG_RECORDS
    assert "noisy.pdf: 4980 more log lines while reading it were left out" in err


# ---------------------------------------------------------------------------------------------- the shares


def test_a_share_refuses_past_its_size_with_the_nearest_end_and_frees_on_release() -> None:
    now = [100.0]
    share = Share(2, "long polls open", clock=lambda: now[0])
    first = share.acquire("k", ends_at=130.0)
    share.acquire("k", ends_at=110.5)
    with pytest.raises(RateLimited) as refused:
        share.acquire("k")
    assert refused.value.retry_after_s == 11 and "2 at once allowed per caller" in refused.value.message
    share.acquire("other")  # another owner is not touched
    share.release("k", first)
    share.acquire("k")


def test_a_share_over_a_pool_lends_an_idle_pools_first_half_and_never_the_rest() -> None:
    """One application sending more requests at once than its share gets them while the pool is idle (16 clients
    from one address got 429 for half of them on an idle server); borrowed holds stop at half the pool, so the
    other half is always there for the other callers' own shares, and a caller over its share borrows nothing
    then."""
    share = Share(2, "requests at work", pool=8)
    held = [share.acquire("a") for _ in range(4)]  # 2 of its own, 2 borrowed: half the pool
    with pytest.raises(RateLimited) as refused:
        share.acquire("a")
    assert "2 at once allowed per caller (more only while the server is idle)" in refused.value.message
    share.acquire("b")
    share.acquire("b")  # b's own share, whatever a borrowed
    with pytest.raises(RateLimited):
        share.acquire("b")  # past its share while the pool is half used: nothing lent
    share.release("a", held[0])
    share.release("a", held[1])
    with pytest.raises(RateLimited):
        share.acquire("b")  # 4 of 8 in use: still no loan past half the pool
    assert share.held("a") == 2 and share.held("b") == 2


def test_a_time_budget_charges_refusals_and_says_when_it_frees() -> None:
    now = [0.0]
    budget = TimeBudget(10.0, "document reading", clock=lambda: now[0])
    budget.charge("k", 6.0)
    now[0] = 20.0
    budget.charge("k", 6.0)  # a refused read: charged all the same
    with pytest.raises(RateLimited) as refused:
        budget.check("k")
    assert refused.value.retry_after_s == 40  # the first charge leaves the window at 60 s
    budget.check("other")
    now[0] = 60.5
    budget.check("k")


def test_a_caller_back_before_its_wait_is_answered_after_the_rest_of_it() -> None:
    from hunyuan_mt.scheduler.shares import RefusalPace

    now = [0.0]
    pace = RefusalPace(max_s=2.0, clock=lambda: now[0])
    assert pace.delay("k", 30) == 0.0  # the first refusal: at once
    now[0] = 0.5
    assert pace.delay("k", 30) == 2.0  # back early: held (at most max_s)
    assert pace.delay("other", 30) == 0.0
    now[0] = 3.0
    assert pace.delay("k", 1) == 2.0  # its wait (from 0.5 + 2 + 30) is not over: held again
    now[0] = 100.0
    assert pace.delay("k", 30) == 0.0  # came back after its wait: at once
    refusal = RateLimited("Too many things; retry in 30 s.", 30)
    assert (refusal.later(2.0).retry_after_s, refusal.later(2.0).message) == (28, "Too many things; retry in 28 s.")
