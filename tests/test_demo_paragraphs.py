"""The demo's paragraph data: Mallard pages aligned by position, paragraph segments, whole held-out pages, and the
repeated-phrase count of the evaluation."""

from __future__ import annotations

from pathlib import Path

import pytest

from hunyuan_mt.demo import corpus as corpus_mod
from hunyuan_mt.demo import sources
from hunyuan_mt.demo.corpus import build_corpus, load_corpus, paragraph_segments, write_corpus
from hunyuan_mt.demo.evaluate import new_repeats, repeats_phrase
from hunyuan_mt.demo.mallard import aligned_paragraphs, page_blocks

PAGE = """<page xmlns="http://projectmallard.org/1.0/" xmlns:ui="http://projectmallard.org/ui/1.0/" id="{id}">
  <info>
    <link type="guide" xref="files"/>
    <credit type="author"><name>Someone</name></credit>
    <desc>{desc}</desc>
    {translator}
  </info>
<title>{title}</title>
<p>{p1}</p>
<steps>
<item><p>{p2}</p></item>
<item><p>{p3}</p></item>
</steps>
<code>ls -l ~/Documents</code>
<p>{p4}</p>
</page>
"""
EN = dict(id="files-copy", desc="Copy or move items to a new folder.", title="Copy or move files", translator="",
          p1="A file can be copied by dragging it\n with the mouse, or by using <gui>Copy</gui>.",
          p2="Press <keyseq><key>Ctrl</key><key>C</key></keyseq> to copy.",
          p3="Open <guiseq><gui>Settings</gui><gui>Privacy</gui></guiseq>.",
          p4="See <link xref='files-move'/> for more.")
ES = dict(id="files-copy", desc="Copiar o mover elementos a una carpeta nueva.", title="Copiar o mover archivos",
          translator='<mal:credit xmlns:mal="http://projectmallard.org/1.0/" type="translator">'
                     '<mal:name>T</mal:name></mal:credit>',
          p1="Se puede copiar un archivo arrastrándolo con el ratón, o usando <gui>Copiar</gui>.",
          p2="Pulse <keyseq><key>Ctrl</key><key>C</key></keyseq> para copiar.",
          p3="Abra <guiseq><gui>Configuración</gui><gui>Privacidad</gui></guiseq>.",
          p4="Consulte <link xref='files-move'/> para más.")


def _write(path: Path, fields: dict[str, str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PAGE.format(**fields), encoding="utf-8")
    return path


def test_mallard_blocks_in_order_with_inline_markup_flattened(tmp_path: Path) -> None:
    blocks = page_blocks(_write(tmp_path / "C.page", EN))
    # The info's desc, the title, then every p; credits, links and code blocks are not prose. A paragraph with a
    # link whose text the renderer fills in keeps its place as None.
    assert blocks == ["Copy or move items to a new folder.", "Copy or move files",
                      "A file can be copied by dragging it with the mouse, or by using Copy.",
                      "Press Ctrl+C to copy.", "Open Settings ▸ Privacy.", None]


def test_mallard_pages_align_by_position_and_skip_a_page_that_differs(tmp_path: Path) -> None:
    english, spanish = _write(tmp_path / "C.page", EN), _write(tmp_path / "es.page", ES)
    pairs = aligned_paragraphs(english, spanish)
    assert [i for i, _, _ in pairs] == [0, 1, 2, 3, 4]
    assert pairs[3][1:] == ("Press Ctrl+C to copy.", "Pulse Ctrl+C para copiar.")
    # A translation with a block more (out of date) is not guessed at, and neither is a broken file.
    extra = _write(tmp_path / "old.page", {**ES, "p4": "Más.</p><p>Otro párrafo."})
    assert aligned_paragraphs(english, extra) == []
    broken = tmp_path / "broken.page"
    broken.write_text("<page><p>unclosed</page>", encoding="utf-8")
    assert aligned_paragraphs(english, broken) == []


def _help_tree(root: Path, pages: dict[str, tuple[dict, dict]]) -> Path:
    for name, (en, es) in pages.items():
        _write(root / "usr/share/help/C/gnome-help" / f"{name}.page", en)
        _write(root / "usr/share/help/es/gnome-help" / f"{name}.page", es)
    return root


def test_gnome_help_entries_are_keyed_by_page_and_position(tmp_path: Path) -> None:
    root = _help_tree(tmp_path, {"files-copy": (EN, ES)})
    entries = list(sources.gnome_help(root, ["es", "de"]))      # no German pages: nothing for de
    assert [e.key for e in entries] == [f"gnomehelp:gnome-help/files-copy#{i}" for i in range(5)]
    assert {e.origin for e in entries} == {"gnomehelp:gnome-help"} and {e.lang for e in entries} == {"es"}


def test_paragraph_segments_whole_paragraphs_sentences_and_runs_of_two() -> None:
    en = "Open the file manager. Select the file. Press Delete to move it to the trash."
    es = "Abra el gestor de archivos. Seleccione el archivo. Pulse Suprimir para moverlo a la papelera."
    segments = paragraph_segments(en, es, "es")
    assert segments[0] == (en, es)
    assert ("Select the file.", "Seleccione el archivo.") in segments
    assert ("Open the file manager. Select the file.", "Abra el gestor de archivos. Seleccione el archivo.") \
        in segments
    assert len(segments) == 1 + 3 + 2
    # LibreOffice's help gives its sentences and short paragraphs elsewhere: only the runs of two here.
    assert (en, es) not in paragraph_segments(en, es, "es", short=False)
    assert len(paragraph_segments(en, es, "es", short=False)) == 2
    # Chinese sentences are joined without a space; sides that split differently give the whole paragraph only.
    zh = paragraph_segments("Open the file. Select it. Press Delete.", "打开文件。选择它。按删除键。", "zh")
    assert ("Open the file. Select it.", "打开文件。选择它。") in zh
    assert paragraph_segments(en, "Abra el gestor y seleccione el archivo; pulse Suprimir.", "es") == [
        (en, "Abra el gestor y seleccione el archivo; pulse Suprimir.")]
    # Longer than PARAGRAPH_MAX_CHARS: only the pieces that fit.
    long_en, long_es = " ".join([en] * 6), " ".join([es] * 6)
    assert all(len(s) <= corpus_mod.PARAGRAPH_MAX_CHARS for s, _ in paragraph_segments(long_en, long_es, "es"))


def test_paragraph_test_holds_out_whole_pages(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(corpus_mod, "PARA_HELD_OUT_PERCENT", 50)
    pages = {}
    # Words, not numbers: numbers are masked for training.
    words = [("red", "rojo"), ("green", "verde"), ("blue", "azul"), ("black", "negro"), ("white", "blanco"),
             ("grey", "gris"), ("pink", "rosa"), ("brown", "marrón"), ("old", "viejo"), ("new", "nuevo"),
             ("big", "grande"), ("small", "pequeño")]
    for n, (word, palabra) in enumerate(words):
        en = {**EN, "p1": f"A {word} file can be copied by dragging it with the mouse to another folder."}
        es = {**ES, "p1": f"Un archivo {palabra} se puede copiar arrastrándolo con el ratón a otra carpeta."}
        pages[f"page-{n}"] = (en, es)
    root = _help_tree(tmp_path / "docs", pages)
    corpus = build_corpus(list(sources.gnome_help(root, ["es"])), test_size=2, frequent_size=2, seed=1)
    held_pages = {f"page-{n}" for n in range(12)
                  if corpus_mod.is_held_out_page(f"gnomehelp:gnome-help/page-{n}", 50)}
    assert 0 < len(held_pages) < 12
    tested = corpus.para_test["en2es"]
    assert {en for en, _ in tested} == {pages[p][0]["p1"] for p in held_pages}   # long enough, translated
    assert corpus.para_test["es2en"] == [(t, e) for e, t in tested]
    trained = {text for rows in corpus.train.values() for s, t, origin in rows for text in (s, t)}
    assert all(en not in trained and es not in trained for en, es in tested)
    # Every other page trains, whole paragraphs included, under its own origin.
    kept = next(p for p in pages if p not in held_pages)
    assert (pages[kept][0]["p1"], pages[kept][1]["p1"], "gnomehelp") in corpus.train["en2es"]
    assert corpus.stats["en2es"]["para_test"] == len(tested) and corpus.stats["en2es"]["gnomehelp"] > 0
    write_corpus(corpus, tmp_path / "out")
    assert load_corpus(tmp_path / "out").para_test == corpus.para_test


@pytest.mark.parametrize(("text", "lang", "loops"), [
    ("Cuando se escribe una orden de shell, la orden de shell, la orden de shell, la orden", "es", True),
    ("Go to Settings, Settings, Settings.", "en", True),
    ("one two three four one two three four one two three four", "en", True),
    ("the file file", "en", False),                                   # twice is language, not a loop
    ("a b c d e a b c d e a b c d e", "en", False),                  # five words: longer than a phrase
    ("文件文件文件", "zh", True),
    ("我们 好的", "zh", False),
    ("「Settter」在 Windows 网络中", "zh", False),                     # a misspelt word, not "t" three times
    ("使用 logins 有有有用的", "zh", True),
])
def test_repeats_phrase(text: str, lang: str, loops: bool) -> None:
    assert repeats_phrase(text, lang) is loops


def test_new_repeats_count_only_what_the_source_lacks() -> None:
    items = [("Very, very, very good", "Muy, muy, muy bien"), ("Open the file", "Abra el archivo")]
    assert new_repeats(items, ["Muy, muy, muy bien", "Abra el archivo archivo archivo"], "en2es") == [1]
