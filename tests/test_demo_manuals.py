"""The demo's HTML-manual data: DocBook pages and their translations aligned block by block, pages of another
shape skipped, untranslated and half-translated blocks dropped, and the pairs kept out of the paragraph test."""

from __future__ import annotations

from pathlib import Path

from demo_corpus import assert_trains_only

from hunyuan_mt.demo import manuals, sources

EN = """<html><head><title>Chapter 2. Package management</title></head><body>
<div class="navheader"><table><tr><td>Prev</td><td>Next</td></tr></table></div>
<h2>2.1. Package management basics</h2>
<p>The <span class="package">apt</span> tool installs packages together with everything they depend on.</p>
<ul><li><p>Run the upgrade before you install anything new on the system.</p></li><li>a short item</li></ul>
<pre class="screen">$ apt-get install foo
$ apt-get remove foo</pre>
<table><tr><td>Figure 8.41. Example for layer mode “HSV Value” in the image window</td></tr></table>
<p>This paragraph is not translated yet.</p>
</body></html>"""

ES = """<html><head><title>Capítulo 2. Gestión de paquetes</title></head><body>
<div class="navheader"><table><tr><td>Anterior</td><td>Siguiente</td></tr></table></div>
<h2>2.1. Fundamentos de la gestión de paquetes</h2>
<p>La herramienta <span class="package">apt</span> instala los paquetes junto con todo aquello de lo que dependen.</p>
<ul><li><p>Actualice el sistema antes de instalar algo nuevo.</p></li><li>un elemento corto</li></ul>
<pre class="screen">$ apt-get install foo
$ apt-get remove foo</pre>
<table><tr><td>Figura 8.41. Example for layer mode “HSV Value” in the image window</td></tr></table>
<p>This paragraph is not translated yet.</p>
</body></html>"""


def _tree(root: Path, pages: dict[str, tuple[str, str]], locale: str = "es") -> Path:
    folder = root / "usr" / "share" / "debian-reference"
    folder.mkdir(parents=True, exist_ok=True)
    for name, (en, other) in pages.items():
        (folder / f"{name}.en.html").write_text(en, encoding="utf-8")
        (folder / f"{name}.{locale}.html").write_text(other, encoding="utf-8")
    return root


def test_blocks_align_by_position_and_untranslated_ones_are_dropped(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"ch02": (EN, ES)})
    folder = root / "usr" / "share" / "debian-reference"
    english = manuals.page_blocks(folder / "ch02.en.html")
    # The title, the navigation cells, the heading, the paragraphs; a list item holding a paragraph is not a
    # block of its own, its paragraph is; the screen listing is no block.
    assert english[:4] == ["Chapter 2. Package management", "Prev", "Next", "2.1. Package management basics"]
    assert "Run the upgrade before you install anything new on the system." in english
    assert not any("apt-get" in block for block in english)
    pairs = [(en, es) for _, en, es in manuals.aligned_blocks(english, manuals.page_blocks(folder / "ch02.es.html"))]
    assert ("The apt tool installs packages together with everything they depend on.",
            "La herramienta apt instala los paquetes junto con todo aquello de lo que dependen.") in pairs
    assert ("a short item", "un elemento corto") in pairs and ("Prev", "Anterior") in pairs
    # Left in English, whole or all but its first word: not a translation.
    assert not any(en.startswith("This paragraph") or en.startswith("Figure") for en, _ in pairs)


def test_a_page_of_another_shape_is_skipped() -> None:
    assert list(manuals.aligned_blocks(["Open the file.", "Save it."], ["Abra el archivo."])) == []


def test_copied_english_is_told_from_a_translation_that_keeps_names() -> None:
    assert manuals.mostly_copied("The “Buffers” context menu", "图 15.71. The “Buffers” context menu")
    assert not manuals.mostly_copied("Each package comes with its own configuration script called debconf(7).",
                                     "每个软件包都带有自己的配置脚本，它使用标准用户接口 debconf(7) 来帮助软件包初始化安装过程。")
    # A product name of four words inside a real translation is kept.
    assert not manuals.mostly_copied("The GNU Image Manipulation Program opens every common image format.",
                                     "El GNU Image Manipulation Program abre todos los formatos de imagen habituales.")


def test_manual_entries_train_and_never_reach_the_paragraph_test(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"ch02": (EN, ES)})
    entries = list(sources.manual_pages(root, ["es", "de"]))                 # no German pages: nothing for de
    assert_trains_only(entries, "manuals:debian-reference", "manuals:debian-reference/ch02#0",
                       ("The apt tool installs packages together with everything they depend on.",
                        "La herramienta apt instala los paquetes junto con todo aquello de lo que dependen."), "manuals")
    assert list(sources.manual_pages(tmp_path / "nothing")) == []


def test_gimp_help_pages_are_found_by_name_in_each_locale(tmp_path: Path) -> None:
    help_root = tmp_path / "usr" / "share" / "gimp" / "2.0" / "help"
    for locale, text in (("en", EN), ("zh_CN", ES)):
        (help_root / locale).mkdir(parents=True)
        (help_root / locale / "gimp-tool-crop.html").write_text(text, encoding="utf-8")
    (help_root / "en" / "only-in-english.html").write_text(EN, encoding="utf-8")
    gimp = next(m for m in manuals.MANUALS if m.name == "gimp-help")
    assert [(stem, other.parent.name) for stem, _, other in gimp.pages(tmp_path, "zh")] == \
        [("gimp-tool-crop", "zh_CN")]
    assert list(gimp.pages(tmp_path, "it")) == []


TAGGED_EN = """<html><head><meta charset="utf-8"></head><body>
<p>Click <a class="link" href="ch03.en.html">here</a> to change your <span class="guilabel">Password</span>.</p>
<p>Run <code class="literal">apt-get update</code> first.</p>
<p>Press <span class="guibutton">OK</span> and then <em>wait</em>.</p>
<p>The <span class="guimenu">File</span> menu <b>holds</b> everything.</p>
<div><p>Only <em>one</em> segment.</p></div>
</body></html>"""

TAGGED_ES = """<html><head><meta charset="utf-8"></head><body>
<p>Pulse <a class="link" href="ch03.es.html">aquí</a> para cambiar su <span class="guilabel">Contraseña</span>.</p>
<p>Ejecute <code class="literal">apt-get update</code> primero.</p>
<p>Pulse <span class="guibutton">Aceptar</span> y luego <b>espere</b>.</p>
<p>Todo está en el menú <b>contiene</b> <span class="guimenu">Archivo</span>.</p>
<div><p>Solo <em>un</em> segmento.</p></div>
</body></html>"""


def test_tagged_blocks_keep_the_readers_sentinels_spaced_and_pair_only_the_same_markup(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"ch02": (TAGGED_EN, TAGGED_ES)})
    folder = root / "usr" / "share" / "debian-reference"
    english = manuals.page_tagged_blocks(folder / "ch02.en.html")
    # One entry per block of page_blocks (positions agree with the plain reading).
    assert len(english) == len(manuals.page_blocks(folder / "ch02.en.html"))
    shape, text = english[0]
    assert shape == (("a", "link"), ("span", "guilabel"))
    assert text == "Click ⟦0⟧ here ⟦1⟧ to change your ⟦2⟧ Password ⟦3⟧."
    # Inline code alone is no formatted word: that block is not a tagged one.
    assert english[1] is None
    pairs = [(en, es) for _, en, es in manuals.aligned_tagged_blocks(english,
                                                                     manuals.page_tagged_blocks(folder / "ch02.es.html"))]
    assert pairs == [
        ("Click ⟦0⟧ here ⟦1⟧ to change your ⟦2⟧ Password ⟦3⟧.",
         "Pulse ⟦0⟧ aquí ⟦1⟧ para cambiar su ⟦2⟧ Contraseña ⟦3⟧."),
        ("Only ⟦0⟧ one ⟦1⟧ segment.", "Solo ⟦0⟧ un ⟦1⟧ segmento."),
    ]   # <em> against <b>, and elements in another order: the words between may not correspond


def test_tagged_segments_train_and_their_held_out_pages_stay_out_of_training(tmp_path: Path) -> None:
    from hunyuan_mt.demo import corpus as corpus_module

    pages = {f"ch{n:02d}": (TAGGED_EN.replace("Password", f"Password{n}"), TAGGED_ES.replace("Contraseña", f"Clave{n}"))
             for n in range(60, 80)}   # ch61, ch74 and ch76 are held out
    root = _tree(tmp_path, pages)
    entries = list(sources.tagged_manual_pages(root, ["es"])) + list(sources.manual_pages(root, ["es"]))
    assert {e.origin for e in entries} == {"tagged:debian-reference", "manuals:debian-reference"}
    built = corpus_module.build_corpus(entries, test_size=2, frequent_size=2, seed=1)
    held = {stem for stem in pages if corpus_module._tag_held_out(f"tagged:debian-reference/{stem}")}
    assert held and len(held) < len(pages)
    tested = {en for en, _ in built.tag_test["en2es"]}
    assert {en for en in tested if "Password" in en} == {
        f"Click ⟦0⟧ here ⟦1⟧ to change your ⟦2⟧ Password{stem[2:]} ⟦3⟧." for stem in held}
    assert tested - {en for en in tested if "Password" in en} == {"Only ⟦0⟧ one ⟦1⟧ segment."}
    assert built.tag_test["es2en"] == [(es, en) for en, es in built.tag_test["en2es"]]
    trained = [(s, t, o) for s, t, o in built.train["en2es"]]
    tagged_rows = [row for row in trained if row[2] == "tagged"]
    assert tagged_rows and len(tagged_rows) == corpus_module.TAG_REPEAT * built.stats["en2es"]["tagged"]
    for stem in held:  # neither the tagged block nor the plain one of a held-out page trains
        assert not any(f"Password{stem[2:]}" in s or f"Clave{stem[2:]}" in t for s, t, _ in trained)
    assert not any("Only" in s for s, _, _ in trained)   # on every page, held-out ones too: tested, not trained
