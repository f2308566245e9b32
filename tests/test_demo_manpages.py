"""The demo's manual-page data: English pages and their po4a translations rendered by groff and aligned by
section and line, with the translators' closing section ignored and out-of-step sections skipped."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from demo_corpus import assert_trains_only

from hunyuan_mt.demo import manpages, sources

pytestmark = pytest.mark.skipif(not manpages.available(), reason="groff is not installed (Debian: groff-base)")

EN = r""".TH COPYIT 1 "2024" "tools 1.0" "User Commands"
.SH NAME
copyit \- copy a file to another folder
.SH DESCRIPTION
Copy the \fIsource\fR file to the \fBtarget\fR folder, keeping its modification time and its permissions.
.PP
The folder is created when it does not exist yet.
.TP
\fB\-f\fR, \fB\-\-force\fR
overwrite a file that already exists in the target folder
.TP
\fB\-v\fR
print the name of every file that is copied
.SH EXAMPLES
Copy a report into the archive folder and print its name.
.SH "SEE ALSO"
cp(1)
"""
ES = r""".TH COPYIT 1 "2024" "tools 1.0" "Órdenes de usuario"
.SH NOMBRE
copyit \- copia un archivo a otra carpeta
.SH DESCRIPCIÓN
Copia el archivo \fIsource\fR a la carpeta \fBtarget\fR, manteniendo su fecha de modificación y sus permisos.
.PP
La carpeta se crea cuando todavía no existe.
.TP
\fB\-f\fR, \fB\-\-force\fR
sobrescribe un archivo que ya existe en la carpeta de destino
.TP
\fB\-v\fR
muestra el nombre de cada archivo que se copia
.SH EJEMPLOS
Copia un informe a la carpeta de archivo e imprime su nombre.
Una línea que el inglés no tiene.
.br
Y otra más.
.SH "VÉASE TAMBIÉN"
cp(1)
.SH TRADUCCIÓN
La traducción al español de esta página fue creada por alguien.
"""


def _tree(root: Path, pages: dict[str, tuple[str, str]], locale: str = "es") -> Path:
    man = root / "usr" / "share" / "man"
    for name, (en, other) in pages.items():
        for folder, text in ((man / "man1", en), (man / locale / "man1", other)):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{name}.1.gz").write_bytes(gzip.compress(text.encode("utf-8")))
    return root


def test_pages_align_by_section_and_line(tmp_path: Path) -> None:
    man = _tree(tmp_path, {"copyit": (EN, ES)}) / "usr" / "share" / "man"
    english, translated = manpages.render(man / "man1" / "copyit.1.gz", man), \
        manpages.render(man / "es" / "man1" / "copyit.1.gz", man)
    assert [heading for heading, _ in english] == ["NAME", "DESCRIPTION", "EXAMPLES", "SEE ALSO"]
    assert english[1][1][0] == ("Copy the source file to the target folder, keeping its modification time and its "
                                "permissions.")
    pairs = [(en, es) for _, en, es in manpages.aligned_lines(english, translated)]
    assert ("The folder is created when it does not exist yet.", "La carpeta se crea cuando todavía no existe.") \
        in pairs
    # A short option's tag shares its line with the text: the tag is kept apart from both sides.
    assert ("print the name of every file that is copied", "muestra el nombre de cada archivo que se copia") in pairs
    assert ("-f, --force", "-f, --force") in pairs
    # EXAMPLES has an extra line in the translation: the section is skipped; the translators' section is ignored.
    assert not any(en.startswith("Copy a report") for en, _ in pairs)
    assert not any("traducción" in es for _, es in pairs)
    assert pairs[-1] == ("cp(1)", "cp(1)")


def test_a_section_out_of_step_or_a_page_of_another_shape_is_skipped() -> None:
    english = [("DESCRIPTION", ["Copy files.", "-a, --all copy everything"]), ("SEE ALSO", ["cp(1)"])]
    drifted = [("DESCRIPCIÓN", ["Copia archivos.", "-r, --recursive copia todo"]), ("VÉASE", ["cp(1)"])]
    assert list(manpages.aligned_lines(english, drifted)) == [(2, "cp(1)", "cp(1)")]
    assert list(manpages.aligned_lines(english, drifted[:1])) == []     # a section fewer: the page is skipped


def test_man_page_entries_train_and_never_reach_the_paragraph_test(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"copyit": (EN, ES)})
    entries = list(sources.man_pages(root, ["es", "de"]))                     # no German pages: nothing for de
    assert_trains_only(entries, "manpages:man1", "manpages:man1/copyit.1#0",
                       ("The folder is created when it does not exist yet.",
                        "La carpeta se crea cuando todavía no existe."), "manpages")
    assert list(sources.man_pages(tmp_path / "nothing")) == []
