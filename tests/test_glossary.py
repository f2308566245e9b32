"""Glossaries: terms parsed, found (whole words, longest first, any case) and enforced as the target term through
the service, REST (requests), the page (gradio_client), documents and the CLI."""

from __future__ import annotations

import re

import dataclasses
import os
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from bench.markup import tag_sequence
from hunyuan_mt import cli
from hunyuan_mt.runtime.backbone import Backbone
from hunyuan_mt.config import Config, GlossaryConfig
from hunyuan_mt.errors import InvalidInput
from hunyuan_mt.text.glossary import GlossaryStore, parse_terms
from hunyuan_mt.text.masking import protect, restore
from web_server import ADMIN_KEY, LiveServer, serve

UI_TERMS = "# stored list\nSave\tGuardar\nSave as\tGuardar como\nfile\tarchivo\n"


def _enforce(text: str, glossary: Any) -> str:
    """What the service does with a text whose model echoes the masked text: the terms restored as targets."""
    masked = glossary.apply(protect(text))
    return restore(masked.text, masked)


# ---------------------------------------------------------------------------------------------------- parsing


def test_inline_forms_parse_to_the_same_terms() -> None:
    forms = [{"Save": "Guardar", "file": "archivo"}, [["Save", "Guardar"], ["file", "archivo"]],
             "Save = Guardar\n\n# a comment\nfile\tarchivo", "Save → Guardar\nfile -> archivo"]
    assert len({parse_terms(f, 10).terms for f in forms}) == 1


@pytest.mark.parametrize("value, message", [
    ("Save Guardar", "line 1 ('Save Guardar') is not 'source = target'"),
    ("# only a comment", "it has no terms"),
    ({"Save": ""}, "every term needs a non-empty source and target"),
    ({"a": "b", "c": "d", "e": "f"}, "3 terms, over the limit of 2"),
    ({"x" * 201: "y"}, "longer than 200 characters"),
    (42, "give terms"),
])
def test_bad_glossaries_say_what_is_wrong(value: Any, message: str) -> None:
    with pytest.raises(InvalidInput, match="Invalid glossary") as caught:
        parse_terms(value, 2)
    assert message in caught.value.message


# ---------------------------------------------------------------------------------------------------- matching


def test_terms_match_whole_words_longest_first_in_the_texts_case() -> None:
    glossary = parse_terms(UI_TERMS, 10)
    assert _enforce("Save as PDF, then Save.", glossary) == "Guardar como PDF, then Guardar."
    assert _enforce("Saved files are unsaved.", glossary) == "Saved files are unsaved."
    assert _enforce("SAVE THE FILE", glossary) == "GUARDAR THE ARCHIVO"
    assert _enforce("Could not save the file.", glossary) == "Could not guardar the archivo."  # a label, lower-cased
    assert _enforce("File not found", glossary) == "Archivo not found"  # a sentence start, capitalised
    german = parse_terms("file = Datei", 10)
    assert _enforce("Open the file", german) == "Open the Datei"  # the target's own capital stays


def test_terms_leave_protected_spans_alone_and_match_inside_cjk() -> None:
    glossary = parse_terms({"file": "archivo", "文件": "archivo"}, 10)
    assert _enforce("Open `file` or https://x.org/file and the file", glossary) == \
        "Open `file` or https://x.org/file and the archivo"
    assert _enforce("打开文件失败", glossary) == "打开archivo失败"


# ---------------------------------------------------------------------------------------------------- stored


def test_stored_glossaries_by_id_and_pair(tmp_path: Path) -> None:
    (tmp_path / "ui.en2es.tsv").write_text(UI_TERMS, encoding="utf-8")
    (tmp_path / "ui.en2de.tsv").write_text("file\tDatei\n", encoding="utf-8")
    from hunyuan_mt.store import Store

    rows = Store.open("", tmp_path / "data").glossaries
    store = GlossaryStore(tmp_path, 100, rows)
    assert store.available() == {"ui": ["en2de", "en2es"]}
    assert len(store.get("ui", "en", "es")) == 3 and len(store.get("ui", "auto", "de")) == 1
    with pytest.raises(InvalidInput, match=r"Unknown glossary 'nope'; stored glossaries: ui\."):
        store.get("nope", "en", "es")
    with pytest.raises(InvalidInput, match=r"has no en→fr list \(it has: en2de, en2es\)"):
        store.get("ui", "en", "fr")
    with pytest.raises(InvalidInput, match="Invalid glossary id"):
        store.get("../etc", "en", "es")
    path = tmp_path / "ui.en2de.tsv"
    path.write_text("file\tDatei\nCancel\tAbbrechen\n", encoding="utf-8")
    os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 5))
    assert len(store.get("ui", "en", "de")) == 2  # an edited file counts at once
    # Another process (a replica) on the same store sees the lists, those stored over the API too.
    store.put("support", "en2es", "ticket = incidencia", who="key:abc")
    beside = GlossaryStore(tmp_path / "elsewhere", 100, Store.open("", tmp_path / "data").glossaries)
    assert beside.available() == {"support": ["en2es"], "ui": ["en2de", "en2es"]}
    assert beside.get("support", "en", "es").terms == (("ticket", "incidencia"),)
    assert len(beside.get("ui", "en", "de")) == 2
    assert store.resolve("Save = Guardar", "en", "es").terms == (("Save", "Guardar"),)
    assert store.resolve("", "en", "es") is None


# ---------------------------------------------------------------------------------------------------- every door


@pytest.fixture()
def glossary_server(web_service: Any, web_cfg: Config, tmp_path: Path) -> Iterator[LiveServer]:
    (tmp_path / "ui-terms.en2es.tsv").write_text(UI_TERMS, encoding="utf-8")
    cfg = dataclasses.replace(web_cfg, glossary=GlossaryConfig(dir=str(tmp_path)))
    with serve(web_service, cfg) as server:
        yield server


def _post(server: LiveServer, **body: Any) -> requests.Response:
    return requests.post(server.url + "/translate", json={"source": "en", "target": "es", **body}, timeout=60)


def test_rest_enforces_inline_and_stored_glossaries(glossary_server: LiveServer) -> None:
    plain = _post(glossary_server, q="Open the file.").json()["translatedText"]
    assert "expediente" not in plain  # so the term below is the glossary's doing
    inline = _post(glossary_server, q="Open the file.", glossary={"file": "expediente"}).json()["translatedText"]
    assert "expediente" in inline
    form = requests.post(glossary_server.url + "/translate", timeout=60, data={
        "q": "Open the file.", "source": "en", "target": "es", "glossary": "file = legajo"}).json()
    assert "legajo" in form["translatedText"]
    stored = _post(glossary_server, q=["Save as PDF", "Save the file"], glossary="ui-terms").json()
    assert "Guardar como" in stored["translatedText"][0] and "Guardar" in stored["translatedText"][1]
    pivot = requests.post(glossary_server.url + "/translate", json={
        "q": "Abrir el archivo.", "source": "es", "target": "de", "glossary": {"archivo": "Akte"}}, timeout=60)
    assert "Akte" in pivot.json()["translatedText"]  # through es → en → de: the sentinel rides both hops
    unknown = _post(glossary_server, q="Open the file.", glossary="nope")
    assert unknown.status_code == 400 and unknown.json() == {
        "error": "Unknown glossary 'nope'; stored glossaries: ui-terms."}
    bad = _post(glossary_server, q="Open the file.", glossary=[["file"]])
    assert bad.status_code == 400 and bad.json()["error"].startswith("Invalid glossary: a list must hold")
    assert requests.get(glossary_server.url + "/glossaries", timeout=60).json() == {"ui-terms": ["en2es"]}


def test_documents_and_html_get_the_glossary(glossary_server: LiveServer, tmp_path: Path) -> None:
    doc = tmp_path / "notes.txt"
    doc.write_text("Open the file.\n\nClose the file.\n", encoding="utf-8")
    with doc.open("rb") as handle:
        done = requests.post(glossary_server.url + "/translate_file", files={"file": handle}, timeout=120,
                             data={"source": "en", "target": "es", "glossary": "file = expediente"}).json()
    text = requests.get(done["translatedFileUrl"], timeout=60).text
    assert text.count("expediente") == 2, text
    html = _post(glossary_server, q="<p>Open the <b>file</b>.</p>", format="html", glossary={"file": "legajo"})
    out = html.json()["translatedText"]
    assert tag_sequence(out) == ["<p>", "<b>", "</b>", "</p>"]
    assert re.search(r"<b>[^<]*legajo[^<]*</b>", out), out  # the term stays inside its own element


def test_the_page_takes_a_glossary(glossary_server: LiveServer, tmp_path: Path) -> None:
    page = Client(glossary_server.url + "/ui/", verbose=False)
    text, info = page.predict("Open the file.", "en", "es", "file = expediente", api_name="/translate")
    assert "expediente" in text and "**Glossary:** 1 term applied, of 1" in info
    _, info = page.predict("Close the window.", "en", "es", "file = expediente\nsave = guardar",
                           api_name="/translate")
    assert "**Glossary:** 0 terms applied, of 2" in info  # what this text used, not the list's size
    text, _ = page.predict("Save the file.", "en", "es", "ui-terms", api_name="/translate")
    assert "Guardar" in text and "archivo" in text
    with pytest.raises(AppError, match="line 1 .* is not 'source = target'"):
        page.predict("Open the file.", "en", "es", "file expediente", api_name="/translate")
    doc = tmp_path / "a.txt"
    doc.write_text("Open the file.\n", encoding="utf-8")
    out_path, _ = page.predict(handle_file(str(doc)), "en", "es", "file = expediente",
                               api_name="/translate_document")
    assert "expediente" in Path(out_path).read_text(encoding="utf-8")


def test_cli_glossary_from_a_file_or_an_id(tmp_path: Path, capsys, web_cfg: Config, monkeypatch) -> None:
    import hunyuan_mt.service.translation as service_mod

    terms = tmp_path / "terms.txt"
    terms.write_text("file = expediente\n", encoding="utf-8")
    (tmp_path / "ui-terms.en2es.tsv").write_text(UI_TERMS, encoding="utf-8")
    monkeypatch.setattr(service_mod, "_service", None)
    # Its own backbone: a second service on the shared one would take over the slot layers of the web tests' cache.
    monkeypatch.setattr(service_mod, "load_backbone", Backbone.load_uncached)
    base = ["translate", "--set", f"model.path={web_cfg.model.path}", "--set",
            f"cache.adapters_dir={web_cfg.cache.adapters_dir}", "--set", "model.warmup=false",
            "--set", "memory.enabled=false", "--set", f"glossary.dir={tmp_path}", "--src", "en", "--tgt", "es"]
    try:
        assert cli.main(base + ["--glossary", str(terms), "Open the file."]) == 0
        assert "expediente" in capsys.readouterr().out
        assert cli.main(base + ["--glossary", "ui-terms", "Save the file."]) == 0
        assert "Guardar" in capsys.readouterr().out
        assert cli.main(base + ["--glossary", "nope", "Open the file."]) == 2
        assert "error: Unknown glossary 'nope'" in capsys.readouterr().err
    finally:
        if service_mod._service is not None:
            service_mod._service.close()


def test_a_glossary_stored_over_the_admin_api_is_used_at_once(glossary_server: LiveServer) -> None:
    url = glossary_server.url
    body = {"id": "support", "pair": "en2es", "terms": "file = legajo"}
    assert requests.post(url + "/admin/glossary", data=body, timeout=60).status_code == 403
    stored = requests.post(url + "/admin/glossary", data=body, headers={"X-Admin-Key": ADMIN_KEY}, timeout=60)
    assert stored.json() == {"ok": True, "action": "glossary", "id": "support", "pair": "en2es", "terms": 1}
    assert "legajo" in _post(glossary_server, q="Open the file.", glossary="support").json()["translatedText"]
    assert requests.get(url + "/glossaries", timeout=60).json() == {"support": ["en2es"], "ui-terms": ["en2es"]}
    bad = requests.post(url + "/admin/glossary", data={**body, "id": "../x"}, headers={"X-Admin-Key": ADMIN_KEY},
                        timeout=60)
    assert bad.status_code == 400 and "Invalid glossary id" in bad.json()["error"]
