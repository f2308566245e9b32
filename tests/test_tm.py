"""Translation memory: exact matches (case, whitespace and placeholders normalised) answered before the model,
imports from TSV and TMX through the service, REST (requests), the page (gradio_client) and the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
from gradio_client import Client, handle_file

from hunyuan_mt import cli
from hunyuan_mt.errors import InvalidInput
from hunyuan_mt.text.masking import protect
from hunyuan_mt.store.tm import read_rows
from seams import memory_in
from web_server import ADMIN_KEY, LiveServer

TSV = "Delete %s?\t¿Eliminar %s?\nThe disk is full.\tEl disco está lleno.\nBroken\t\n# a comment\n"
TMX = b"""<?xml version="1.0" encoding="UTF-8"?>
<tmx version="1.4"><header srclang="en"/><body>
<tu><tuv xml:lang="en-US"><seg>Print the page.</seg></tuv><tuv xml:lang="es-ES"><seg>Imprima la p\xc3\xa1gina.</seg></tuv></tu>
<tu><tuv xml:lang="en"><seg>Only English.</seg></tuv></tu>
</body></tmx>"""


def _memory(tmp_path: Path) -> Any:
    memory = memory_in(tmp_path / "tm")
    memory.add("en2es", read_rows(TSV.encode(), "a.tsv", "en", "es"))
    return memory


def test_lookup_normalises_case_whitespace_and_placeholders(tmp_path: Path) -> None:
    memory = _memory(tmp_path)
    hit = memory.lookup("en", "es", protect("Delete {name}?"))
    assert hit == "¿Eliminar ⟦0⟧?"  # numbered like the query: restore puts {name} back
    assert memory.lookup("en", "es", protect("the  DISK is full.")) == "El disco está lleno."
    assert memory.lookup("en", "es", protect("The disk is full")) is None  # the full stop counts
    assert memory.lookup("en", "de", protect("The disk is full.")) is None
    assert memory.hits == 2


def test_imports_skip_what_cannot_match_and_persist(tmp_path: Path) -> None:
    memory = memory_in(tmp_path / "tm")
    result = memory.add("en2es", read_rows(TSV.encode(), "a.tsv", "en", "es") + [("Open %s", "Abrir")])
    assert (result.added, result.replaced, result.skipped, result.entries) == (2, 0, 2, 2)  # an empty side;
    # placeholders that differ
    again = memory_in(tmp_path / "tm")  # a new process reads the user's entries from the store
    assert again.lookup("en", "es", protect("The disk is full.")) == "El disco está lleno."
    assert read_rows(TMX, "m.tmx", "en", "es") == [("Print the page.", "Imprima la página.")]
    with pytest.raises(InvalidInput, match="a.tsv: not UTF-8 text"):
        read_rows("Save\tGuardar\n".encode("utf-16"), "a.tsv", "en", "es")
    with pytest.raises(InvalidInput, match="line 1 has no tab"):
        read_rows(b"no tab here\n", "a.tsv", "en", "es")
    with pytest.raises(InvalidInput, match="DOCTYPE"):
        read_rows(b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "b">]><tmx/>', "m.tmx", "en", "es")
    with pytest.raises(InvalidInput, match="Malformed pair name '../x'"):
        memory.add("../x", [("a", "b")])
    with pytest.raises(InvalidInput, match="^No entry to import for en2es: the file has no rows$"):
        memory.add("en2es", read_rows(b"# only a comment\n\n", "a.tsv", "en", "es"))
    with pytest.raises(InvalidInput, match="none of its 1 rows has the same placeholders"):
        memory.add("en2es", [("Open %s", "Abrir")])


def test_a_reimport_replaces_entries_instead_of_duplicating_them(tmp_path: Path) -> None:
    memory = memory_in(tmp_path / "tm")
    first = memory.add("en2es", [("The disk is full.", "El disco está lleno."), ("Save", "Guardar")])
    again = memory.add("en2es", [("The disk is full.", "El disco está completo."), ("Save", "Guardar")])
    assert (first.added, first.replaced) == (2, 0) and (again.added, again.replaced, again.entries) == (0, 2, 2)
    assert memory.export_rows("en2es") == [("The disk is full.", "El disco está completo."), ("Save", "Guardar")]
    assert memory_in(tmp_path / "tm").lookup("en", "es", protect("The disk is full.")) == \
        "El disco está completo."


def test_the_shipped_demo_memory_answers_frequent_ui_strings(tmp_path: Path) -> None:
    from hunyuan_mt.config import PROJECT_ROOT

    memory = memory_in(tmp_path, PROJECT_ROOT / "models" / "demo" / "memory")
    assert memory.lookup("en", "de", protect("File not found")) == "Datei nicht gefunden"
    assert memory.lookup("en", "es", protect("unknown error")) is not None


def test_memories_on_the_same_shipped_file_read_it_once_and_keep_their_users_rows_apart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hunyuan_mt.store import tm

    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "en2es.tsv").write_text("Save\tGuardar\nThe disk is full.\tEl disco está lleno.\n", encoding="utf-8")
    reads: list[Path] = []
    real = tm.tsv_rows
    monkeypatch.setattr(tm, "tsv_rows", lambda path: (reads.append(path), real(path))[1])
    one, two = memory_in(tmp_path / "one", shipped), memory_in(tmp_path / "two", shipped)
    assert one.lookup("en", "es", protect("Save")) == two.lookup("en", "es", protect("Save")) == "Guardar"
    assert reads == [shipped / "en2es.tsv"]  # read once, for both
    # A user's row in one memory (its own store) is its own: the other, and the file's entries, are unchanged.
    one.add("en2es", [("Save", "Salvar"), ("Print", "Imprimir")])
    assert one.lookup("en", "es", protect("Save")) == "Salvar" and one.lookup("en", "es", protect("Print"))
    assert two.lookup("en", "es", protect("Save")) == "Guardar" and two.lookup("en", "es", protect("Print")) is None
    three = memory_in(tmp_path / "three", shipped)
    assert three.lookup("en", "es", protect("Save")) == "Guardar" and reads == [shipped / "en2es.tsv"]
    # A file rewritten is read again.
    (shipped / "en2es.tsv").write_text("Save\tGuardar archivo\n", encoding="utf-8")
    assert memory_in(tmp_path / "four", shipped).lookup("en", "es", protect("Save")) == "Guardar archivo"
    assert len(reads) == 2


def test_a_large_memory_file_is_read_once_per_machine_and_its_cache_gives_the_same_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A memory file of CACHED_ROWS rows or more is kept read, with its fuzzy index, in the cache folder: a later
    process reads that, not the file, and finds the same entries (case-folded ones included), the same index and
    the same answers. A damaged cache file is read from the memory file again; a rewritten file gets a new one."""
    import logging

    from hunyuan_mt.store import tm

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(tm, "CACHED_ROWS", 3)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    # "Save" and "save" fold to one key, the later row winning there: kept as read, not derived again.
    rows = "Save\tGuardar\nThe disk is full.\tEl disco está lleno.\nsave\tguardar ya\nSave\tGuardar todo\n" \
           "Open the file in the editor.\tAbre el archivo en el editor.\n"
    path = shipped / "en2es.tsv"
    path.write_text(rows, encoding="utf-8")
    reads: list[Path] = []
    real = tm.tsv_rows
    monkeypatch.setattr(tm, "tsv_rows", lambda p: (reads.append(p), real(p))[1])
    first = tm._read_shipped(path, path.stat())
    cached = list((tmp_path / "cache" / "hunyuan-mt" / "memory").glob("en2es-*.marshal.z"))
    assert reads == [path] and len(cached) == 1 and first.indexed
    again = tm._read_shipped(path, path.stat())
    assert reads == [path]  # from the cache this time
    for field in ("exact", "folded", "_keys", "_folded_keys", "_words"):
        assert getattr(again, field) == getattr(first, field), field
    assert list(again.exact) == list(first.exact) and again.folded["save"] == "Guardar todo"
    assert again.get("SAVE") == first.get("SAVE") and again.shared
    assert again.nearest("Open the file in the editor", 0.75) == first.nearest("Open the file in the editor", 0.75)
    memory = memory_in(tmp_path / "one", shipped)
    assert memory.lookup("en", "es", protect("The disk is full.")) == "El disco está lleno." and reads == [path]
    # A damaged cache file: one warning, the memory file read again, and the cache written anew.
    cached[0].write_bytes(b"not a cache")
    with caplog.at_level(logging.WARNING, logger="hunyuan_mt.store.tm"):
        damaged = tm._read_shipped(path, path.stat())
    assert damaged.exact == first.exact and len(reads) == 2
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [f"translation memory: cache {cached[0]} unreadable"]
    assert tm._read_shipped(path, path.stat()).exact == first.exact and len(reads) == 2
    # A rewritten file is a new key: read, and cached beside the old one.
    path.write_text(rows + "Print\tImprimir\n", encoding="utf-8")
    assert tm._read_shipped(path, path.stat()).get("Print") == "Imprimir" and len(reads) == 3
    assert len(list(cached[0].parent.glob("en2es-*.marshal.z"))) == 2


@pytest.fixture()
def memory_server(live_server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    """The live server with a memory of its own (no shipped entries), swapped in for this test."""
    monkeypatch.setattr(live_server.service, "tm", memory_in(tmp_path / "tm"))
    yield live_server


def test_service_answers_known_segments_from_memory_and_the_rest_from_the_model(memory_server: LiveServer) -> None:
    service = memory_server.service
    service.tm.add("en2es", read_rows(TSV.encode(), "a.tsv", "en", "es"))
    model_only = service.translate("Open the file.", "en", "es").text
    result = service.translate("The disk is full. Open the file.", "en", "es")
    assert result.text == f"El disco está lleno. {model_only}"
    assert (result.memory_segments, result.segments) == (1, 2)
    with_braces = service.translate("Delete {0}?", "en", "es")
    assert with_braces.text == "¿Eliminar {0}?" and with_braces.memory_segments == 1
    # Alternatives still come from the model; the memory's answer stays the main translation.
    alt = service.translate_batch(["The disk is full."], "en", "es", alternatives=2)[0]
    assert alt.text == "El disco está lleno." and alt.text not in alt.alternatives


def test_rest_import_needs_the_admin_key_and_then_answers(memory_server: LiveServer) -> None:
    url = memory_server.url
    files = {"file": ("m.tmx", TMX)}
    refused = requests.post(url + "/admin/memory", files=files, data={"pair": "en2es"}, timeout=60)
    assert refused.status_code == 403 and refused.json()["error"].startswith("Missing admin key")
    done = requests.post(url + "/admin/memory", files=files, data={"pair": "en2es"}, timeout=60,
                         headers={"X-Admin-Key": ADMIN_KEY})
    assert done.json() == {"ok": True, "action": "memory", "pair": "en2es", "added": 1, "replaced": 0, "skipped": 0,
                           "entries": 1}
    answer = requests.post(url + "/translate", json={"q": "Print the page.", "source": "en", "target": "es"},
                           timeout=60).json()
    assert answer == {"translatedText": "Imprima la página.", "memorySegments": 1, "confidence": 1.0}
    bad = requests.post(url + "/admin/memory", data={"pair": "en2es"}, headers={"X-Admin-Key": ADMIN_KEY},
                        timeout=60)
    assert bad.status_code == 400 and "multipart 'file'" in bad.json()["error"]
    empty = requests.post(url + "/admin/memory", files={"file": ("m.tsv", b"")}, data={"pair": "en2es"},
                          headers={"X-Admin-Key": ADMIN_KEY}, timeout=60)
    assert empty.status_code == 400 and empty.json()["error"] == "No entry to import for en2es: the file has no rows"
    # A pair no request could reach (no adapter, no pivot route) is refused, not stored.
    unreachable = requests.post(url + "/admin/memory", files=files, data={"pair": "en2ko"},
                                headers={"X-Admin-Key": ADMIN_KEY}, timeout=60)
    assert unreachable.status_code == 400 and unreachable.json()["detail"].startswith("No route from en to ko")


def test_the_page_says_which_segments_came_from_memory(memory_server: LiveServer, tmp_path: Path) -> None:
    page = Client(memory_server.url + "/ui/", verbose=False)
    source = tmp_path / "m.tsv"
    source.write_text(TSV, encoding="utf-8")

    note = page.predict(ADMIN_KEY, "en2es", handle_file(str(source)), api_name="/admin_memory")
    assert note == "Memory en2es: 2 entries added, 0 replaced, 1 skipped; 2 in the memory now."
    text, info = page.predict("The disk is full.", "en", "es", api_name="/translate")
    assert text == "El disco está lleno." and "**From memory:** 1 of 1 segment" in info


def test_cli_imports_without_loading_a_model(tmp_path: Path, capsys: Any) -> None:
    source = tmp_path / "m.tsv"
    source.write_text(TSV, encoding="utf-8")
    code = cli.main(["tm", "import", str(source), "--pair", "en2es", "--set", f"store.dir={tmp_path / 'data'}",
                     "--set", "tm.shipped="])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("en2es: 2 entries added, 0 replaced, 1 skipped")
    assert memory_in(tmp_path / "data").export_rows("en2es") == [
        ("Delete %s?", "¿Eliminar %s?"), ("The disk is full.", "El disco está lleno.")]


def test_the_demo_memory_keeps_each_sources_most_common_ui_translation(tmp_path: Path) -> None:
    import gzip

    from hunyuan_mt.demo.corpus import Corpus
    from hunyuan_mt.demo.memory import write_memory

    corpus = Corpus(preferred={"en2es": [("Open", "Abrir", "gettext"), ("Open", "Abre", "gettext"),
                                         ("bank", "banco", "freedict"), ("Spain", "España", "babel")]})
    assert write_memory(corpus, tmp_path) == {"en2es": 2}
    lines = gzip.decompress((tmp_path / "en2es.tsv.gz").read_bytes()).decode("utf-8").splitlines()
    assert lines == ["Open\tAbrir", "Spain\tEspaña"]  # dictionary glosses stay out: one sense of several


def test_a_near_entry_is_suggested_with_its_score_and_the_querys_own_spans(tmp_path: Path) -> None:
    memory = memory_in(tmp_path / "tm")
    memory.add("en2es", [("Delete {0} files from the disk?", "¿Eliminar {0} archivos del disco?"),
                         ("Open the settings", "Abrir la configuración")])
    near = memory.suggest("en", "es", protect("Delete {0} files from this disk?"), 0.75)
    assert near is not None and near.source == "Delete ⟦0⟧ files from the disk?" and 0.75 <= near.score < 1
    assert near.target == "¿Eliminar ⟦0⟧ archivos del disco?"
    assert memory.suggest("en", "es", protect("Something else entirely"), 0.75) is None
    assert memory.suggest("en", "es", protect("Delete {0} files from this disk?"), 0) is None  # 0: off
    assert memory.lookup("en", "es", protect("Delete {0} files from this disk?")) is None  # never an answer


def test_rest_answers_memory_matches_as_suggestions(memory_server: LiveServer) -> None:
    service = memory_server.service
    service.tm.add("en2es", [("The disk is full.", "El disco está lleno."), ("Delete %s files?", "¿Eliminar %s archivos?")])
    body = requests.post(memory_server.url + "/translate", json={"q": "Delete 12 old files?", "source": "en",
                                                                 "target": "es"}, timeout=60).json()
    match = body["memoryMatches"][0]
    assert match["segment"] == 0 and match["source"] == "Delete 12 files?" and match["target"] == "¿Eliminar 12 archivos?"
    assert 0.75 <= match["score"] < 1 and body["translatedText"] != match["target"]
    exact = requests.post(memory_server.url + "/translate", json={"q": "The disk is full.", "source": "en",
                                                                  "target": "es"}, timeout=60).json()
    assert exact == {"translatedText": "El disco está lleno.", "memorySegments": 1, "confidence": 1.0}  # no suggestion beside a hit


#: The near-exact set: (memory source, memory target, query, what the answer must be). Each query differs
#: from its entry only in case, closing punctuation, whitespace, numbers or placeholders.
NEAR_EXACT = [
    ("Open the file.", "Abra el archivo.", "Open the file", "Abra el archivo"),
    ("Open the file.", "Abra el archivo.", "open the file.", "Abra el archivo."),
    ("Open the file.", "Abra el archivo.", "OPEN THE FILE!", "¡Abra el archivo!"),  # Spanish opens it too
    ("Welcome", "Bienvenido", "Welcome!", "¡Bienvenido!"),
    ("Save changes", "Guardar cambios", "Save changes?", "¿Guardar cambios?"),
    ("Save changes", "Guardar cambios", "Save changes.", "Guardar cambios."),
    ("Save changes", "Guardar cambios", "Save changes:", "Guardar cambios:"),
    ("Where is the file?", "¿Dónde está el archivo?", "Where is the file", "Dónde está el archivo"),
    ("Where is the file?", "¿Dónde está el archivo?", "where is the  file?", "¿Dónde está el archivo?"),
    ("Delete 3 files", "Eliminar 3 archivos", "Delete 12 files.", "Eliminar 12 archivos."),
    ("Delete 3 files.", "Eliminar 3 archivos.", "Delete 250 files", "Eliminar 250 archivos"),
    ("Delete %s?", "¿Eliminar %s?", "Delete {name}", "Eliminar {name}"),
    ("Copied %d items.", "Se copiaron %d elementos.", "copied %d items", "Se copiaron %d elementos"),
    ("The disk is full.", "El disco está lleno.", "The disk is full...", "El disco está lleno..."),
]


def test_every_near_exact_entry_is_applied_and_flagged(memory_server: LiveServer) -> None:
    service = memory_server.service
    service.tm.add("en2es", sorted({(s, t) for s, t, _, _ in NEAR_EXACT}))
    applied = 0
    for source, _, query, expected in NEAR_EXACT:
        result = service.translate(query, "en", "es")
        assert (result.text, result.memory_segments, result.memory_near_segments) == (expected, 1, 1), (query, result)
        applied += 1
    assert applied == len(NEAR_EXACT)  # 100 %, each flagged
    assert service.status()["tm"]["near_hits"] == len(NEAR_EXACT)
    # An exact hit is not flagged; a query that differs in a word is no near-exact hit (a suggestion at most).
    exact = service.translate("Open the file.", "en", "es")
    assert (exact.memory_segments, exact.memory_near_segments) == (1, 0)
    other = service.translate("Open the folder.", "en", "es")
    assert other.memory_near_segments == 0 and other.memory_segments == 0


def test_rest_and_the_page_flag_a_near_exact_answer(memory_server: LiveServer) -> None:
    from hunyuan_mt.web.ui import _info_line

    service = memory_server.service
    service.tm.add("en2es", [("The disk is full.", "El disco está lleno.")])
    body = requests.post(memory_server.url + "/translate", json={"q": "the disk is full", "source": "en",
                                                                 "target": "es"}, timeout=60).json()
    assert body == {"translatedText": "El disco está lleno", "memorySegments": 1, "memoryNearSegments": 1, "confidence": 1.0}
    line = _info_line(service.translate("The disk is full!", "en", "es"), None, 0.01)
    assert "From memory:** 1 of 1 segment (1 near-exact: case or closing punctuation differed)" in line


XLIFF_UNITS = b"""<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2"><file source-language="en" datatype="plaintext"
original="ui"><body>
<trans-unit id="a"><source>The disk is full.</source></trans-unit>
<trans-unit id="b"><source>the disk is full</source></trans-unit>
<trans-unit id="c"><source>Open the settings to change the folder.</source></trans-unit>
</body></file></xliff>"""
XLIFF_UNITS_2 = b"""<?xml version="1.0" encoding="UTF-8"?>
<xliff version="2.0" xmlns="urn:oasis:names:tc:xliff:document:2.0" srcLang="en"><file id="ui">
<unit id="a"><segment><source>The disk is full.</source></segment></unit>
<unit id="b"><segment><source>the disk is full</source></segment></unit>
<unit id="c"><segment><source>Open the settings to change the folder.</source></segment></unit>
</file></xliff>"""

PO_ENTRIES = b'''msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\\n"

msgid "The disk is full."
msgstr ""

msgid "Delete 12 files."
msgstr ""

msgid "Open the settings to change the folder."
msgstr ""
'''


def test_documents_say_which_segments_came_from_memory_exact_or_near_and_which_from_the_model(
        memory_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    import polib
    from lxml import etree

    from hunyuan_mt.web.doctranslate import translate_upload

    service = memory_server.service
    # Every machine translation marked for review, however sure the model was (test_confidence.py varies this).
    monkeypatch.setattr(service.cfg, "quality", dataclasses.replace(service.cfg.quality, review_below=1.0))
    service.tm.add("en2es", [("The disk is full.", "El disco está lleno."), ("Delete 3 files.", "Eliminar 3 archivos.")])
    rendered, _ = translate_upload(service, XLIFF_UNITS, "ui.xlf", "en", "es", memory_server.cfg.limits)
    ns = {"x": "urn:oasis:names:tc:xliff:document:1.2"}
    targets = {unit.get("id"): unit.find("x:target", ns)
               for unit in etree.fromstring(rendered.data).iterfind(".//x:trans-unit", ns)}
    states = {key: (t.get("state"), t.get("state-qualifier")) for key, t in targets.items()}
    assert states == {"a": ("translated", "leveraged-tm"), "b": ("needs-review-translation", "leveraged-tm"),
                      "c": ("needs-review-translation", "mt-suggestion")}
    assert targets["a"].text == "El disco está lleno." and targets["b"].text == "El disco está lleno"
    # XLIFF 2.x: the same decisions in its states, the origin in the segment's subState.
    rendered, _ = translate_upload(service, XLIFF_UNITS_2, "ui.xliff", "en", "es", memory_server.cfg.limits)
    ns2 = "{urn:oasis:names:tc:xliff:document:2.0}"
    states = {unit.get("id"): (unit.find(f"{ns2}segment").get("state"), unit.find(f"{ns2}segment").get("subState"))
              for unit in etree.fromstring(rendered.data).iter(f"{ns2}unit")}
    assert states == {"a": ("translated", "hunyuan-mt:leveraged-tm"), "b": ("initial", "hunyuan-mt:leveraged-tm-near"),
                      "c": ("initial", "hunyuan-mt:mt-suggestion")}

    rendered, _ = translate_upload(service, PO_ENTRIES, "ui.po", "en", "es", memory_server.cfg.limits)
    entries = {e.msgid: e for e in polib.pofile(rendered.data.decode())}
    exact, near, model = (entries[k] for k in ("The disk is full.", "Delete 12 files.",
                                              "Open the settings to change the folder."))
    assert (exact.msgstr, exact.tcomment, exact.flags) == ("El disco está lleno.", "translation memory: exact match", [])
    assert near.msgstr == "Eliminar 12 archivos." and near.tcomment.startswith("translation memory: near-exact")
    assert near.flags == ["fuzzy"] and model.flags == ["fuzzy"] and not model.tcomment


def test_a_pairs_memory_exports_as_tmx_that_imports_back(memory_server: LiveServer, tmp_path: Path) -> None:
    service = memory_server.service
    rows = [("The disk is full.", "El disco está lleno."), ("Delete %s?", "¿Eliminar %s?"),
            ("Save & close <now>", "Guardar y cerrar <now>")]
    service.tm.add("en2es", rows)
    # REST, with the admin key only.
    url = memory_server.url + "/admin/memory"
    assert requests.get(url, params={"pair": "en2es"}, timeout=60).status_code == 403
    response = requests.get(url, params={"pair": "en2es"}, headers={"X-Admin-Key": ADMIN_KEY}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-tmx+xml")
    assert 'filename="en2es.tmx"' in response.headers["content-disposition"]
    # The same rows back through the import's own reader (as written: placeholders and markup characters kept).
    assert sorted(read_rows(response.content, "en2es.tmx", "en", "es")) == sorted(rows)
    fresh = memory_in(tmp_path / "again")
    fresh.add("en2es", read_rows(response.content, "en2es.tmx", "en", "es"))
    assert fresh.lookup("en", "es", protect("Delete {0}?")) == "¿Eliminar ⟦0⟧?"


def test_spanish_opening_marks_follow_the_querys_closing_one() -> None:
    from hunyuan_mt.store.tm import with_closing_of

    assert with_closing_of("¡Bienvenido!", "Welcome?", "es") == "¿Bienvenido?"
    assert with_closing_of("¡Bienvenido!", "Welcome.", "es") == "Bienvenido."
    assert with_closing_of("Si quiere, ¿guardar?", "If you want, save?", "es") == "Si quiere, ¿guardar?"
    assert with_closing_of("Bienvenue", "Welcome!", "fr") == "Bienvenue!"  # only where the language opens them
    assert with_closing_of("欢迎", "Welcome!", "zh") == "欢迎！"


def test_a_tmx_export_says_who_made_each_entry_and_when(tmp_path: Path) -> None:
    import re
    import time
    import xml.etree.ElementTree as ElementTree

    from hunyuan_mt.store import Correction, Provenance
    from hunyuan_mt.store.tm import SHIPPED_CREATOR, tmx_bytes

    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "en2es.tsv").write_text("Open\tAbrir\n", encoding="utf-8")
    memory = memory_in(tmp_path / "data", shipped)
    before = time.time()
    memory.add("en2es", [("Save", "Guardar")], Provenance("import", "cli"))
    memory.correct(Correction("en2es", "Close", "Cerrar"), Provenance("correction", "key:0123456789ab"))
    root = ElementTree.fromstring(tmx_bytes(memory.export_entries("en2es"), "en", "es", now=0.0))
    date = re.compile(r"^\d{8}T\d{6}Z$")
    header = root.find("header")
    assert header is not None and header.get("creationdate") == "19700101T000000Z"
    assert header.get("creationid") == "hunyuan-mt"
    units = {tu.findtext("tuv/seg"): tu for tu in root.iter("tu")}
    assert {k: tu.get("creationid") for k, tu in units.items()} == {
        "Open": SHIPPED_CREATOR, "Save": "cli", "Close": "key:0123456789ab"}
    assert all(date.match(tu.get("creationdate") or "") for tu in units.values())
    made = time.strptime(units["Save"].get("creationdate") or "", "%Y%m%dT%H%M%SZ")
    assert abs(time.mktime(made) - time.mktime(time.gmtime(before))) < 60
    # What the import reads back is unchanged.
    assert sorted(read_rows(tmx_bytes(memory.export_entries("en2es"), "en", "es"), "m.tmx", "en", "es")) == [
        ("Close", "Cerrar"), ("Open", "Abrir"), ("Save", "Guardar")]


def test_the_cli_exports_the_shipped_and_the_users_entries(tmp_path: Path, capsys: Any) -> None:
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "en2es.tsv").write_text("Open\tAbrir\nDelete ⟦0⟧?\t¿Eliminar ⟦0⟧?\nSave\tGuardar\n", encoding="utf-8")
    user = tmp_path / "data"
    memory_in(user).add("en2es", [("Save", "Guardar ahora")])
    out = tmp_path / "out.tmx"
    assert cli.main(["tm", "export", str(out), "--pair", "en2es", "--set", f"store.dir={user}",
                     "--set", f"tm.shipped={shipped}"]) == 0
    assert "en2es: 2 entries written to" in capsys.readouterr().out
    # The masked shipped entry is left out (its placeholder is lost); the user's entry wins over the shipped one.
    assert sorted(read_rows(out.read_bytes(), "out.tmx", "en", "es")) == [("Open", "Abrir"), ("Save", "Guardar ahora")]


def test_an_html_fragment_the_memory_answers_keeps_the_translators_formatted_words(memory_server: LiveServer) -> None:
    """/translate with format=html: a segment the memory answered is the translator's, formatted words included.
    The pass that translates again a formatted word the model left in the source language leaves it alone, as it
    does in documents."""
    from hunyuan_mt.documents import read_document

    html = "<p>Click <b>Save</b> to keep your changes.</p>"
    (segment,) = read_document(html.encode(), "q.html", memory_server.cfg.limits).segments
    translation = segment.replace("Click", "Pulse").replace("to keep your changes", "para guardar los cambios")
    assert "Save" in translation and translation != segment
    memory_server.service.tm.add("en2es", [(segment, translation)])
    answer = requests.post(memory_server.url + "/translate", timeout=60,
                           json={"q": html, "source": "en", "target": "es", "format": "html"}).json()
    assert answer["translatedText"] == "<p>Pulse <b>Save</b> para guardar los cambios.</p>"
