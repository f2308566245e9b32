"""What a visitor does on the page, as Playwright steps shared by the browser tests (Chromium, tests/test_ui_*.py)."""

from __future__ import annotations

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
    page.locator("#hmt-doc-in input[type=file]").set_input_files(str(path))
    page.locator("#hmt-doc-in").get_by_text(path.name).wait_for()
    page.locator("#hmt-doc-translate").click()
