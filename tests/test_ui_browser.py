"""The web page in headless Chromium (Debian's chromium driven by Playwright): text, document and status tabs.

Screenshots go to test-artifacts/ (git-ignored; CI keeps them as artifacts). Where a test needs the page mid-way (a
text still growing, a document job running) it holds the engine with its `before_generate` seam, at forwards it
names, and reads the page while it is held: what it sees does not depend on timing.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from hunyuan_mt.web.doctranslate import translate_upload
from page_steps import choose, upload_document
from sample_docs import docx_structure, make_docx
from web_server import LiveServer

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
TEXT = "Open the file and save the document."


@pytest.fixture(scope="module")
def page(live_server: LiveServer) -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed: sudo apt-get install -y chromium "
                    "(./start.sh test installs it when it can)")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
        context = browser.new_context(viewport={"width": 1300, "height": 1000}, accept_downloads=True)
        page = context.new_page()
        page.set_default_timeout(120_000)
        page.goto(live_server.url + "/ui/")
        page.wait_for_selector("#hmt-source textarea")
        yield page
        browser.close()


def test_text_tab_translates_with_ctrl_enter(page, live_server: LiveServer) -> None:
    choose(page, "hmt-src", "English (en)")
    choose(page, "hmt-tgt", "Deutsch — German (de)")
    source = page.locator("#hmt-source textarea")
    source.fill("File not found")
    source.press("Control+Enter")
    expected = live_server.expected("File not found", "en", "de")  # "Datei nicht gefunden" on the demo model
    page.wait_for_function(
        "expected => document.querySelector('#hmt-result textarea').value === expected", arg=expected)
    info = page.locator("#hmt-info")
    info.get_by_text("en → de (direct)").wait_for()
    assert "ms" in info.inner_text()
    assert page.locator("#hmt-result button[aria-label*='opy'], #hmt-result button[title*='opy']").count() >= 1
    page.screenshot(path=str(ARTIFACTS / "ui-text.png"), full_page=True)


def test_a_finished_translation_is_announced_in_words(page, live_server: LiveServer) -> None:
    """Gradio's status tracker tells screen readers (an aria-live region) when an event is done, with the key
    `common.complete` that its locales lack: a reader heard "common.complete". The page gives the word."""
    page.evaluate("""() => { window.__said = []; new MutationObserver(changes => { for (const c of changes) {
        const region = c.target.closest ? c.target.closest('[aria-live]') : c.target.parentElement?.closest('[aria-live]');
        if (region && region.textContent.trim()) window.__said.push(region.textContent.trim()); } })
        .observe(document.body, {subtree: true, childList: true, characterData: true}); }""")
    choose(page, "hmt-src", "English (en)")
    choose(page, "hmt-tgt", "Español — Spanish (es)")
    page.locator("#hmt-source textarea").fill("Close the window.")
    page.locator("#hmt-translate").click()
    expected = live_server.reference("Close the window.", "en", "es")
    page.wait_for_function("t => document.querySelector('#hmt-result textarea').value === t", arg=expected)
    page.wait_for_function("() => window.__said.includes('Done')")
    assert not [said for said in page.evaluate("window.__said") if "common." in said]


def test_swap_after_auto_detect(page, live_server: LiveServer) -> None:
    from playwright.sync_api import expect

    choose(page, "hmt-src", "Auto-detect")
    choose(page, "hmt-tgt", "Español — Spanish (es)")
    page.locator("#hmt-source textarea").fill("Unknown error")
    page.locator("#hmt-translate").click()
    detected = live_server.service.detect("Unknown error")[0].code
    translation = live_server.reference("Unknown error", detected, "es")
    page.wait_for_function("t => document.querySelector('#hmt-result textarea').value === t", arg=translation)
    page.locator("#hmt-info").get_by_text("Detected:").wait_for()
    page.locator("#hmt-swap").click()
    # The detected language becomes the target, Spanish the source, and the translation the new input.
    page.wait_for_function("t => document.querySelector('#hmt-source textarea').value === t", arg=translation)
    # The three outputs of the swap land in the page one after another: wait for each, do not read them once.
    expect(page.locator("#hmt-src input")).to_have_value("Español — Spanish (es)")
    expect(page.locator("#hmt-tgt input")).to_have_value(re.compile(rf".*\({re.escape(detected)}\)$"))
    expect(page.locator("#hmt-result textarea")).to_have_value("")


def test_text_tab_notes_a_pair_that_returns_the_text_unchanged(page, live_server: LiveServer) -> None:
    # Unreachable languages are not offered at all (tests/test_ui_states.py); the note still explains a pair
    # that does nothing.
    choose(page, "hmt-src", "English (en)")
    choose(page, "hmt-tgt", "English (en)")
    page.locator("#hmt-pair-note").get_by_text("Source and target are the same").wait_for()
    choose(page, "hmt-tgt", "Deutsch — German (de)")


def test_document_tab_upload_and_download_docx(page, live_server: LiveServer, tmp_path: Path) -> None:
    source = tmp_path / "report.docx"
    source.write_bytes(make_docx())
    upload_document(page, source)
    link = page.locator('#hmt-doc-out a[download="report.es.docx"]')
    link.wait_for()
    page.locator("#hmt-doc-note").get_by_text("English → Spanish").wait_for()
    page.screenshot(path=str(ARTIFACTS / "ui-document.png"), full_page=True)
    with page.expect_download() as download_info:
        link.click()
    saved = tmp_path / "downloaded.docx"
    download_info.value.save_as(saved)
    expected, _ = translate_upload(live_server.service, source.read_bytes(), "report.docx", "en", "es",
                                   live_server.cfg.limits)
    assert docx_structure(saved.read_bytes()) == docx_structure(expected.data)


def test_status_tab_shows_the_adapter_just_used(page, live_server: LiveServer) -> None:
    # en2fr is not pinned in the test profiles: translating puts it in a slot, and the status table shows it.
    page.get_by_role("tab", name="Text").click()
    choose(page, "hmt-src", "English (en)")
    choose(page, "hmt-tgt", "Français — French (fr)")
    page.locator("#hmt-source textarea").fill(TEXT)
    page.locator("#hmt-translate").click()
    page.locator("#hmt-info").get_by_text("en → fr (direct)").wait_for()
    page.get_by_role("tab", name="Status").click()
    table = page.locator("#hmt-adapters")
    row = table.locator("[role=row]").filter(has_text="en2fr")
    row.wait_for()  # the status timer refreshes the table every 2 s
    # In a slot, or already back in the RAM tier when another test's request (this worker's live server is
    # shared) took the one slot the two pinned pairs leave free: either way the table shows the adapter just used.
    assert re.search(r"slot|RAM tier", row.inner_text()), row.inner_text()
    assert "pinned" in table.locator("[role=row]").filter(has_text="en2es").inner_text()
    page.locator("#hmt-overview").get_by_text("Backbone:").wait_for()
    page.locator("#hmt-counters").get_by_text("Hits").wait_for()
    # The plots: a clock-time axis over a fixed 5-minute window, round latency ticks in ms, a caption.
    latency = page.locator("#hmt-latency")
    latency.get_by_text(re.compile(r"requests? in the last 5 minutes; slowest [\d,]+ ms\.")).wait_for()
    # The caption comes before Vega has drawn the chart (slower with the hundreds of points an earlier test left).
    latency.locator("svg .mark-symbol path").first.wait_for()
    latency.get_by_text("time (last 5 minutes)").wait_for()
    labels = [t.strip() for t in latency.inner_text().splitlines() if t.strip()]
    assert "time (last 5 minutes)" in labels and "ms" in labels, labels
    ticks = [t for t in labels if re.fullmatch(r"[\d:,.]+", t)]
    assert any(re.fullmatch(r"\d\d:\d\d", t) for t in ticks), ticks  # clock times, not "-127.000000"
    assert all(re.fullmatch(r"\d{2}:\d{2}|:\d{2}|[\d,]+", t) for t in ticks), ticks  # no decimals anywhere
    hit_rate = page.locator("#hmt-hitrate")
    hit_rate.get_by_text(re.compile(r"Now \d+% of adapter uses")).wait_for()
    hit_rate.locator("svg .mark-line path").first.wait_for()
    hit_rate.get_by_text("100%", exact=True).wait_for()  # the y axis in percent, from 0% to 100%
    assert "0%" in hit_rate.inner_text().splitlines()
    page.screenshot(path=str(ARTIFACTS / "ui-status.png"), full_page=True)


def test_openapi_page_renders_offline(page, live_server: LiveServer) -> None:
    """/docs loads Swagger UI from the server itself (no CDN), so it works on machines without internet."""
    docs = page.context.new_page()
    docs.goto(live_server.url + "/docs")
    docs.locator(".opblock-summary-path", has_text="/translate_file").wait_for()
    assert docs.locator(".opblock-summary-path", has_text="/v1/chat/completions").count() == 1
    docs.screenshot(path=str(ARTIFACTS / "api-docs.png"), full_page=False)
    docs.close()


@pytest.mark.parametrize("width", [390, 1300])
def test_page_loads_without_console_errors_and_stacks_on_a_phone(page, live_server: LiveServer, width: int) -> None:
    """Below 700 px the source and translation boxes stack (a phone held upright is 390 px wide); wider, they sit
    side by side. Loading the page logs no error in the console (the root's /favicon.ico was a 404)."""
    context = page.context.browser.new_context(viewport={"width": width, "height": 900})
    try:
        phone = context.new_page()
        problems: list[str] = []
        phone.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type == "error" else None)
        phone.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)
        phone.goto(live_server.url + "/ui/")
        phone.wait_for_selector("#hmt-source textarea")
        # Chromium fetches the root's favicon outside the page's own requests (no response event to wait for) and
        # Gradio's queue connection never lets the network go idle: allow the late requests two seconds.
        phone.wait_for_timeout(2000)
        source = phone.locator("#hmt-source").bounding_box()
        result = phone.locator("#hmt-result").bounding_box()
        # The reader's own fonts: the theme's Montserrat (fetched from Google, absent offline) drew a capital E
        # as "Ɛ" in the text boxes.
        font = phone.evaluate("getComputedStyle(document.querySelector('#hmt-source textarea')).fontFamily")
        assert "Montserrat" not in font and font.startswith("ui-sans-serif"), font
        if width < 700:
            assert result["y"] >= source["y"] + source["height"] - 1, (source, result)
            assert abs(result["x"] - source["x"]) < 1 and source["width"] > width * 0.75, (source, result)
            phone.screenshot(path=str(ARTIFACTS / "ui-phone.png"), full_page=True)
            # The Document tab's target shows its whole name ("Español — Spanish (es)" was cut to "Español — Spa").
            phone.get_by_role("tab", name="Document").click()
            target = phone.locator("#hmt-doc-tgt input")
            target.wait_for()
            assert target.evaluate("e => e.scrollWidth <= e.clientWidth"), target.evaluate(
                "e => [e.value, e.scrollWidth, e.clientWidth]")
            phone.screenshot(path=str(ARTIFACTS / "ui-phone-document.png"), full_page=True)
        else:
            assert abs(result["y"] - source["y"]) < 1 and result["x"] > source["x"] + source["width"] - 1
        assert problems == []
        assert httpx.get(live_server.url + "/favicon.ico", follow_redirects=True).status_code == 200
    finally:
        context.close()


# ------------------------------------------------------------------------------------- growing texts, document jobs

LONG = ("The file manager shows the files in your home folder. You can open, copy and move them, and the trash keeps "
        "what you delete until you empty it. Settings are saved when you close the window, and the next time you "
        "open it the same folder is shown.")


class Gate:
    """Holds the engine at the `at`-th forwards (1: the prefill) whose rows include `marker`, one after the other:
    `reached(k)` once the k-th hold is in place, `release()` lets the held forward run. Records the rows of every
    forward after the last release, to check that cancelled rows never ran again."""

    def __init__(self, engine: Any, marker: str, at: list[int]) -> None:
        self.engine, self.marker, self.at = engine, marker, at
        self._reached = [threading.Event() for _ in at]
        self._go = [threading.Event() for _ in at]
        self.forwards = 0
        self.after: list[list[Any]] = []
        engine.before_generate = self._seam

    def _seam(self, rows: list[Any]) -> None:
        if self._go[-1].is_set():
            self.after.append(list(rows))
            return
        if not any(self.marker in r.text for r in rows):
            return
        self.forwards += 1
        if self.forwards in self.at:
            k = self.at.index(self.forwards)
            self._reached[k].set()
            assert self._go[k].wait(60), "the test never released the engine"

    def reached(self, k: int = 0) -> None:
        assert self._reached[k].wait(60), f"the engine never got to forward {self.at[k]} of {self.marker!r}"

    def release(self, k: int = 0) -> None:
        self._go[k].set()

    def close(self) -> None:
        for go in self._go:
            go.set()
        self.engine.before_generate = None


def eventually(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def result_text(page) -> str:
    return page.locator("#hmt-result textarea").input_value()


def test_a_long_text_grows_in_its_box_and_a_reload_stops_it(page, live_server: LiveServer) -> None:
    """Two different partial texts before the final one, each extending the last; then a text left growing by a
    reload: its rows leave the engine (the page's unload cancels them, though the handler is blocked on the held
    engine), and the page counts it as cancelled."""
    engine = live_server.service.engine
    ui = live_server.app.state.blocks.hmt_ui
    page.get_by_role("tab", name="Text").click()
    choose(page, "hmt-src", "English (en)")
    choose(page, "hmt-tgt", "Español — Spanish (es)")
    text = "Walrus " + LONG
    gate = Gate(engine, "Walrus", at=[5, 9])
    try:
        page.locator("#hmt-source textarea").fill(text)
        page.locator("#hmt-translate").click()
        gate.reached(0)
        page.wait_for_function("() => document.querySelector('#hmt-result textarea').value.length > 0")
        first = result_text(page)
        page.screenshot(path=str(ARTIFACTS / "ui-text-growing.png"), full_page=True)
        gate.release(0)
        gate.reached(1)
        page.wait_for_function("n => document.querySelector('#hmt-result textarea').value.length > n",
                               arg=len(first))
        second = result_text(page)
        assert "Route:" not in page.locator("#hmt-info").inner_text()  # still growing
        gate.release(1)
    finally:
        gate.close()
    page.locator("#hmt-info").get_by_text("en → es (direct)").wait_for()
    final = result_text(page)
    assert final == live_server.reference(text, "en", "es")
    assert first != second != final and second.startswith(first) and final.startswith(second), (first, second)

    cancelled = engine.stats.cancelled_running
    left = live_server.app.state.metrics.cancelled_requests.labels("ui")._value.get()
    gate = Gate(engine, "Narwhal", at=[3])
    try:
        page.locator("#hmt-source textarea").fill("Narwhal " + LONG)
        page.locator("#hmt-translate").click()
        gate.reached(0)
        assert ui.visits.watched() == 1
        page.reload()
        page.wait_for_selector("#hmt-source textarea")
        eventually(lambda: ui.visits.watched() == 0, "the reload never reached the page's unload")
        gate.release(0)
        eventually(lambda: engine.stats.cancelled_running > cancelled, "the text's rows were not cancelled")
    finally:
        gate.close()
    assert not any("Narwhal" in r.text for rows in gate.after for r in rows)  # not one forward more
    eventually(lambda: live_server.app.state.metrics.cancelled_requests.labels("ui")._value.get() == left + 1,
               "the page did not count the text it left as cancelled")
    assert sum(r.leases for r in live_server.service.cache.stats().resident) == 0


def _jobs_named(live_server: LiveServer, name: str) -> list[Any]:
    return [v for v in live_server.app.state.api.jobs.list() if v.filename == name]


def test_a_document_job_survives_a_reload(page, live_server: LiveServer, tmp_path: Path) -> None:
    """The page submits a job (the same queue as REST's /v1/documents) and shows its progress; reloaded while the
    engine is held mid-job, it brings the Document tab forward and follows the same job, then gives its file."""
    source = tmp_path / "reload-me.txt"
    source.write_text("\n\n".join(f"Quokka {n} opens the file and saves the document." for n in range(6)) + "\n",
                      encoding="utf-8")
    segments = re.compile(r"\b\d/6 segments")
    gate = Gate(live_server.service.engine, "Quokka", at=[3])
    try:
        upload_document(page, source)
        gate.reached(0)
        page.locator("#hmt-doc-out").get_by_text(segments).wait_for()
        page.locator("#hmt-doc-note").get_by_text("it runs on the server").wait_for()
        [job] = _jobs_named(live_server, "reload-me.txt")
        assert job.state == "translating"
        page.screenshot(path=str(ARTIFACTS / "ui-document-job.png"), full_page=True)
        page.reload()
        # Loaded: the Text tab's box is in the page. Not "visible": the page may bring the Document tab forward
        # (and hide it) before the wait first looks, which made this wait time out once in 1,300 tests.
        page.wait_for_selector("#hmt-source textarea", state="attached")
        page.locator("[role=tab][aria-selected=true]", has_text="Document").wait_for()
        page.locator("#hmt-doc-note").get_by_text("before the page was loaded").wait_for()
        page.locator("#hmt-doc-out").get_by_text(segments).wait_for()
        assert page.locator("#hmt-doc-cancel").is_visible()
        assert [v.id for v in _jobs_named(live_server, "reload-me.txt")] == [job.id]  # followed, not sent again
        page.screenshot(path=str(ARTIFACTS / "ui-document-job-reloaded.png"), full_page=True)
        gate.release(0)
    finally:
        gate.close()
    link = page.locator('#hmt-doc-out a[download="reload-me.es.txt"]')
    link.wait_for()
    page.locator("#hmt-doc-note").get_by_text("English → Spanish").wait_for()
    assert not page.locator("#hmt-doc-cancel").is_visible()
    with page.expect_download() as download_info:
        link.click()
    saved = tmp_path / "downloaded.txt"
    download_info.value.save_as(saved)
    assert saved.read_bytes() == live_server.app.state.api.jobs.result(job.id).data
    assert live_server.app.state.api.jobs.view(job.id).state == "done"


def test_cancel_stops_a_document_job(page, live_server: LiveServer, tmp_path: Path) -> None:
    """Cancel (as DELETE /v1/documents/ID): the job ends cancelled, its rows leave the engine before the next
    forward, and the page says so and gives its buttons back."""
    from playwright.sync_api import expect

    engine = live_server.service.engine
    source = tmp_path / "cancel-me.txt"
    source.write_text("\n\n".join(f"Kiwi {n} closes the window and opens the folder." for n in range(6)) + "\n",
                      encoding="utf-8")
    cancelled = engine.stats.cancelled
    gate = Gate(engine, "Kiwi", at=[3])
    try:
        upload_document(page, source)
        gate.reached(0)
        [job] = _jobs_named(live_server, "cancel-me.txt")
        page.locator("#hmt-doc-cancel").click()
        expect(page.locator("#hmt-doc-cancel")).to_be_hidden()  # the job's ticket is cancelled by then
        gate.release(0)
    finally:
        gate.close()
    page.locator("#hmt-doc-note").get_by_text("Cancelled: cancel-me.txt was not translated").wait_for()
    assert live_server.app.state.api.jobs.view(job.id).state == "cancelled"
    assert engine.stats.cancelled > cancelled
    assert not any("Kiwi" in r.text for rows in gate.after for r in rows)
    expect(page.locator("#hmt-doc-cancel")).to_be_hidden()
    expect(page.locator("#hmt-doc-translate")).to_be_enabled()
    assert page.locator('#hmt-doc-out a[download]').count() == 0
    page.screenshot(path=str(ARTIFACTS / "ui-document-cancelled.png"), full_page=True)
