"""File names, extensions and other file-like tokens are protected spans: a model turned `settings.json` into
`设置.json` and `report.txt` into `报告.txt`. They come back unchanged in every direction, Chinese included."""

from __future__ import annotations

from typing import Any

import pytest

from hunyuan_mt.text.masking import protect

#: (text, the file-like tokens it holds)
FILES = [
    ("Error: the file (report.txt) was not found!", ["report.txt"]),
    ("Open settings.json and edit it.", ["settings.json"]),
    ("Save the document as .docx or *.pdf.", [".docx", "*.pdf"]),
    ("The archive backup-2024.tar.gz is ready.", ["backup-2024.tar.gz"]),
    ("See docs/intro.md for details.", ["docs/intro.md"]),
    ("Rename README.md to NOTES.MD first.", ["README.md", "NOTES.MD"]),
    ("Could not read config.yaml: permission denied.", ["config.yaml"]),
    ("The image logo.png is too large.", ["logo.png"]),
    ("Run setup.exe as administrator.", ["setup.exe"]),
    ("Delete the file data_old.csv?", ["data_old.csv"]),
    ("Your changes to index.html were saved.", ["index.html"]),
    ("Upload invoice_march.xlsx and contract.pdf.", ["invoice_march.xlsx", "contract.pdf"]),
    ("The log is written to server.log every hour.", ["server.log"]),
    ("Edit the .bashrc file in your home folder.", [".bashrc"]),
    ("Import messages.po into the project.", ["messages.po"]),
    ("The script main.py failed to start.", ["main.py"]),
    ("Open photo.JPG in the viewer.", ["photo.JPG"]),
    ("Copy notes.txt and todo.txt to the server.", ["notes.txt", "todo.txt"]),
    ("Attach the file Übersicht.docx to the e-mail.", ["Übersicht.docx"]),
    ("The database app.sqlite is locked.", ["app.sqlite"]),
]


@pytest.mark.parametrize("text, names", FILES, ids=[t[:28] for t, _ in FILES])
def test_every_file_like_token_is_one_protected_span(text: str, names: list[str]) -> None:
    assert protect(text).spans == names


@pytest.mark.parametrize("text, names", [
    ("打开settings.json文件", ["settings.json"]),   # Chinese around the name is not part of it
    ("报告.txt 已保存", [".txt"]),                   # a name in Chinese: its extension at least
    ("Ошибка в файле отчет.txt", ["отчет.txt"]),
])
def test_a_file_name_beside_other_scripts(text: str, names: list[str]) -> None:
    assert protect(text).spans == names


@pytest.mark.parametrize("text", ["e.g. this one", "z.B. das hier", "Mr.Smith said so", "i.e. that one",
                                  "U.S.A. and etc.", "The end.Next one"])
def test_abbreviations_and_sentences_stay_text(text: str) -> None:
    assert protect(text).spans == []


def test_no_file_name_changes_from_english_to_chinese(web_service: Any) -> None:
    if "zh" not in web_service.router.reachable_targets("en"):
        pytest.skip("no route to Chinese")
    results = web_service.translate_batch([text for text, _ in FILES], "en", "zh")
    changed = [(name, result.text) for (text, names), result in zip(FILES, results) for name in names
               if result.text.count(name) != text.count(name)]
    assert changed == []


@pytest.mark.parametrize("target", ["es", "de", "fr"])
def test_no_file_name_changes_into_other_languages(web_service: Any, target: str) -> None:
    results = web_service.translate_batch([text for text, _ in FILES[:8]], "en", target)
    changed = [(name, result.text) for (text, names), result in zip(FILES[:8], results) for name in names
               if result.text.count(name) != text.count(name)]
    assert changed == []
