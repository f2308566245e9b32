"""The service's translate_stream: a text as it grows, in reading order, each text extending the last, ending in
the same result translate_batch gives; memory segments at once; closing the stream cancels its rows.

The engine is held with its `before_generate` seam (called with the rows of every forward, on the engine
thread), so what the stream has shown at a given step is deterministic.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from hunyuan_mt.service.translation import TranslationResult
from seams import eventually, hold, leases
from web_server import WEB_BACKEND, LiveServer

TEXT = ("The file manager shows the files in your home folder. You can open, copy and move them, and the trash "
        "keeps what you delete until you empty it.")


def collect(service: Any, text: str, src: str, tgt: str) -> tuple[list[str], TranslationResult]:
    items = list(service.translate_stream(text, src, tgt))
    assert isinstance(items[-1], TranslationResult)
    assert all(isinstance(i, str) for i in items[:-1])
    return items[:-1], items[-1]


@pytest.mark.parametrize("src,tgt", [("en", "es"), ("es", "de")])  # direct, and a pivot's last hop
def test_each_text_extends_the_last_and_ends_as_translate_batch(live_server: LiveServer, src: str, tgt: str) -> None:
    text = TEXT if src == "en" else "El archivo no se pudo abrir. La impresora no tiene papel y la ventana se cerró."
    snapshots, result = collect(live_server.service, text, src, tgt)
    assert result.text == live_server.reference(text, src, tgt)
    assert len(snapshots) >= 3
    assert all(b.startswith(a) and b != a for a, b in zip(snapshots, snapshots[1:]))
    assert result.text.startswith(snapshots[-1])


@pytest.mark.skipif(WEB_BACKEND != "demo", reason="needs the shipped translation memory")
def test_memory_segments_show_before_any_row_decodes(live_server: LiveServer) -> None:
    engine = live_server.service.engine
    held, go = threading.Event(), threading.Event()

    def seam(rows: list[Any]) -> None:
        if any("zebra" in r.text for r in rows) and not held.is_set():
            held.set()
            assert go.wait(30)

    engine.before_generate = seam
    stream = live_server.service.translate_stream("Unknown error\n\nThe zebra walks slowly to the river.", "en", "es")
    try:
        first = next(stream)
        assert held.is_set() or held.wait(30)
        assert first.startswith("Error desconocido")  # from the memory, while the model's row is still held
    finally:
        go.set()
        engine.before_generate = None
    rest = list(stream)
    assert rest[-1].text.startswith("Error desconocido\n\n") and rest[-1].memory_segments == 1


def test_closing_the_stream_cancels_its_rows(live_server: LiveServer) -> None:
    engine = live_server.service.engine
    held, go, after = hold(engine, "Walrus", nth=4)
    before = engine.stats.cancelled_running
    stream = live_server.service.translate_stream("Walrus " + TEXT, "en", "es")
    try:
        next(stream)
        assert held.wait(30)
        stream.close()  # the consumer goes away mid-decode
    finally:
        go.set()
    eventually(lambda: engine.stats.cancelled_running > before, "the rows cancelled")
    engine.before_generate = None
    assert not any("Walrus" in r.text for rows in after for r in rows)
    assert leases(live_server.service) == 0
