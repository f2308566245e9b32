"""What a visitor does on the page, as Playwright steps shared by the browser tests (Chromium, tests/test_ui_*.py)."""

from __future__ import annotations

import sys
import threading
import traceback
from pathlib import Path
from typing import Any


def options(page: Any, elem_id: str) -> Any:
    """Open a Gradio dropdown; its own option list (found through aria-controls, as several may be open)."""
    box = page.locator(f"#{elem_id} input")
    box.click()
    return page.locator(f"#{box.get_attribute('aria-controls')}").get_by_role("option")


def choose(page: Any, elem_id: str, label: str) -> None:
    options(page, elem_id).and_(page.locator(f'[aria-label="{label}"]')).click()


def upload_document(page: Any, path: Path, source: str = "English (en)",
                    target: str = "Español — Spanish (es)") -> None:
    """On the Document tab: pick the languages, drop `path` in, wait until the page shows it, press Translate."""
    page.get_by_role("tab", name="Document").click()
    choose(page, "hmt-doc-src", source)
    choose(page, "hmt-doc-tgt", target)
    # The browser tests share one page: a file an earlier test dropped in is still there, and the box takes no new
    # one (its file input is gone) until it is cleared, as a visitor would.
    clear = page.locator('#hmt-doc-in button[aria-label="Clear"]')
    if clear.count():
        clear.click()
    try:
        page.locator("#hmt-doc-in input[type=file]").set_input_files(str(path))
        # The uploaded file's row, labelled with its name: the row shows the name as stem and extension in two
        # elements ("reload-me" ".txt"), so a text match finds only the upload's progress line, which a quick
        # upload takes away before the match is tried (the 120 s timeouts of 2026-12-05).
        page.locator(f'#hmt-doc-in td.filename[aria-label="{path.name}"]').wait_for()
    except Exception:
        report_stuck_page(page, f"upload-{path.stem}")
        raise
    page.locator("#hmt-doc-translate").click()


def report_stuck_page(page: Any, name: str) -> None:
    """What the page and this process were doing when a step timed out: a screenshot in test-artifacts/ and every
    thread's stack on stderr (the live server runs in the test process, so its threads are among them). They showed
    what the document-upload timeouts of 2026-12-05 were: the file was in, the step was waiting for the wrong
    element."""
    artifacts = Path(__file__).resolve().parent.parent / "test-artifacts"
    try:
        artifacts.mkdir(exist_ok=True)
        page.screenshot(path=str(artifacts / f"stuck-{name}.png"), full_page=True)
    except Exception as exc:  # noqa: BLE001 - a page too stuck to take a picture of is itself the finding
        print(f"no screenshot of the stuck page: {exc}", file=sys.stderr)
    names = {t.ident: t.name for t in threading.enumerate()}
    print(f"--- every thread's stack when '{name}' timed out ---", file=sys.stderr)
    for ident, frame in sys._current_frames().items():
        print(f"thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}", file=sys.stderr)
