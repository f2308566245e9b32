"""The page tells the truth, in Chromium: an error takes the previous result and its route line away,
swap from Auto-detect says one sentence, an over-long text is refused rather than cut, a rate limit reads as a
sentence, a file name shows as itself, and the language lists offer only what the model reaches."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

from hunyuan_mt.text.languages import LANGUAGES
from page_steps import choose, options, upload_document
from web_server import WEB_BACKEND, LiveServer, serve, with_server

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
ITALIAN = "Il file è stato salvato nella cartella dei documenti."


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
        yield browser
        browser.close()


def open_page(browser: Any, url: str) -> Any:
    page = browser.new_context(viewport={"width": 1300, "height": 1000}).new_page()
    page.set_default_timeout(120_000)
    page.goto(url + "/ui/")
    page.wait_for_selector("#hmt-source textarea")
    return page


def toast_text(page: Any) -> str:
    """The message of the newest toast (its title "Error" and close button come before it)."""
    toast = page.locator(".toast-body, [data-testid='toast-body']").last
    toast.wait_for()
    return toast.inner_text().strip().splitlines()[-1]


def translate(page: Any, text: str) -> None:
    page.locator("#hmt-source textarea").fill(text)
    page.locator("#hmt-translate").click()


def test_an_error_clears_the_previous_result_and_route(browser: Any, live_server: LiveServer) -> None:
    from playwright.sync_api import expect

    page = open_page(browser, live_server.url)
    choose(page, "hmt-tgt", "Español — Spanish (es)")
    translate(page, "Unknown error")
    page.locator("#hmt-info").get_by_text("Route:").wait_for()
    assert page.locator("#hmt-result textarea").input_value()
    translate(page, ITALIAN)  # detected as Italian, which the model cannot translate from
    message = toast_text(page)
    assert "No route from it to es" in message and "this model translates from" in message, message
    expect(page.locator("#hmt-result textarea")).to_have_value("")
    # Gradio marks the failed event's outputs "Error"; the route of the previous translation is gone.
    expect(page.locator("#hmt-info")).not_to_contain_text("Route:")
    page.screenshot(path=str(ARTIFACTS / "ui-error-cleared.png"), full_page=True)
    page.context.close()


def test_swap_from_auto_detect_says_one_sentence_and_keeps_the_text(browser: Any, live_server: LiveServer) -> None:
    page = open_page(browser, live_server.url)
    page.locator("#hmt-source textarea").fill("Unknown error")
    page.locator("#hmt-swap").click()
    page.locator("#hmt-pair-note").get_by_text("Auto-detect has no language to swap to yet").wait_for()
    assert page.locator("#hmt-source textarea").input_value() == "Unknown error"
    assert page.locator(".toast-body, [data-testid='toast-body']").count() == 0
    assert page.locator("#hmt-source .error, #hmt-result .error, #hmt-src .error, #hmt-tgt .error").count() == 0
    page.screenshot(path=str(ARTIFACTS / "ui-swap-auto.png"), full_page=True)
    page.context.close()


def test_an_over_long_text_is_refused_not_cut(browser: Any, live_server: LiveServer) -> None:
    limit = live_server.cfg.limits.max_chars
    page = open_page(browser, live_server.url)
    long_text = ("Open the file. " * (limit // 15 + 2))[: limit + 1]
    translate(page, long_text)
    message = toast_text(page)
    assert message.strip().startswith(f"Text is {limit + 1} characters, over the limit of {limit}"), message
    assert len(page.locator("#hmt-source textarea").input_value()) == limit + 1  # nothing was cut
    assert page.locator("#hmt-result textarea").input_value() == ""
    page.context.close()


def test_a_rate_limit_reads_as_a_sentence(browser: Any, web_service: Any, web_cfg: Any) -> None:
    from playwright.sync_api import expect

    with serve(web_service, with_server(web_cfg, rate_limit_per_min=1)) as server:
        page = open_page(browser, server.url)
        choose(page, "hmt-src", "English (en)")
        choose(page, "hmt-tgt", "Español — Spanish (es)")
        translate(page, "Unknown error")
        page.locator("#hmt-info").get_by_text("Route:").wait_for()
        translate(page, "Open the file.")
        message = toast_text(page)
        assert message.strip().startswith("Too many requests: 1 per minute allowed; retry in"), message
        assert "{" not in message
        expect(page.locator("#hmt-result textarea")).to_have_value("")
        page.screenshot(path=str(ARTIFACTS / "ui-rate-limit.png"), full_page=True)
        page.context.close()


def test_a_file_name_shows_as_itself(browser: Any, live_server: LiveServer, tmp_path: Path) -> None:
    source = tmp_path / "my_final_report_.txt"
    source.write_text("Unknown error\n", encoding="utf-8")
    page = open_page(browser, live_server.url)
    upload_document(page, source)
    page.locator("#hmt-doc-note").get_by_text("my_final_report_.es.txt").wait_for()
    assert page.locator("#hmt-doc-note em").count() == 0
    page.context.close()


def test_the_lists_offer_only_languages_the_model_reaches(browser: Any, live_server: LiveServer) -> None:
    infos = live_server.service.languages()
    sources = {i.code for i in infos if i.targets}
    targets = {t for i in infos for t in i.targets}
    page = open_page(browser, live_server.url)
    offered = [o.get_attribute("aria-label") for o in options(page, "hmt-src").all()]
    codes = {re.search(r"\(([\w-]+)\)$", label).group(1) for label in offered if label != "Auto-detect"}
    assert codes == sources and offered[0] == "Auto-detect"
    page.keyboard.press("Escape")
    offered = [o.get_attribute("aria-label") for o in options(page, "hmt-tgt").all()]
    assert {re.search(r"\(([\w-]+)\)", label).group(1) for label in offered} == targets
    note = page.locator("#hmt-model-note")
    if WEB_BACKEND == "demo":
        assert len(codes) == 5 and "ja" not in codes
        # The page says what the demo covers before anyone pastes a paragraph into it.
        text = note.inner_text()
        assert "5 languages" in text and "paragraphs" in text
        assert all(LANGUAGES[c].english in text for c in codes)
    else:
        assert note.count() == 0 or not note.is_visible()  # a model without the demo's build record: no note
    page.context.close()
