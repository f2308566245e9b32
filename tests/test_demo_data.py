"""The demo build's data extraction on a small sample: .mo catalogues and a CEDICT snippet made here."""

from __future__ import annotations

import gzip
from pathlib import Path

import polib
import pytest

from hunyuan_mt.demo import sources
from hunyuan_mt.demo.corpus import build_corpus, clean, load_corpus, mask_pair, write_corpus

CATALOGUE = {
    # English: (es, de, fr, zh)
    "_Save As": ("Guardar _como", "Speichern _unter", "Enregistrer _sous", "另存为(_A)"),
    "Delete file": ("Eliminar archivo", "Datei löschen", "Supprimer le fichier", "删除文件"),
    "Settings": ("Configuración", "Einstellungen", "Paramètres", "设置"),
    "Open": ("Abrir", "Öffnen", "Ouvrir", "打开"),
    "Close window": ("Cerrar ventana", "Fenster schließen", "Fermer la fenêtre", "关闭窗口"),
    "Could not open %s": ("No se pudo abrir %s", "%s konnte nicht geöffnet werden", "Impossible d'ouvrir %s",
                          "无法打开 %s"),
    "Copy %s to %d": ("Copiar %d a %s", "%s nach %d kopieren", "Copier %s vers %d", "复制 %s 到 %d"),
    "Broken %s": ("Roto", "Kaputt", "Cassé", "损坏"),   # translators dropped the placeholder: skipped
    "gtk-ok": ("gtk-ok-es", "gtk-ok-de", "gtk-ok-fr", "gtk-ok-zh"),  # a program key, not text: skipped
    "Line one\nline two": ("a\nb", "a\nb", "a\nb", "a\nb"),            # multi-line help text: skipped
}
LANG_FOLDERS = {"es": "es", "de": "de", "fr": "fr", "zh": "zh_CN"}
CEDICT = (
    "# CC-CEDICT snippet\n"
    "文件 文件 [wen2 jian4] /document/file/CL:份[fen4]/\n"
    "設置 设置 [she4 zhi4] /to set up/to install/\n"
    "張 张 [Zhang1] /surname Zhang/\n"
    "卡拉OK 卡拉OK [ka3 la1 O K] /karaoke/\n"
)


@pytest.fixture()
def locale_root(tmp_path: Path) -> Path:
    for index, (lang, folder) in enumerate(LANG_FOLDERS.items()):
        catalogue = polib.MOFile()
        for msgid, translations in CATALOGUE.items():
            catalogue.append(polib.MOEntry(msgid=msgid, msgstr=translations[index]))
        catalogue.append(polib.MOEntry(msgid="%d file", msgid_plural="%d files",
                                       msgstr_plural={0: {"es": "%d archivo", "de": "%d Datei", "fr": "%d fichier",
                                                          "zh": "%d 个文件"}[lang], 1: "x"}))
        messages = tmp_path / folder / "LC_MESSAGES"
        messages.mkdir(parents=True)
        catalogue.save(str(messages / "demoapp.mo"))
    return tmp_path


def test_read_mo_yields_singular_of_plural_entries(locale_root: Path) -> None:
    entries = list(sources.read_mo(locale_root / "de" / "LC_MESSAGES" / "demoapp.mo", "de"))
    by_en = {e.en: e.text for e in entries}
    assert by_en["Delete file"] == "Datei löschen"
    assert by_en["%d file"] == "%d Datei"
    assert {e.origin for e in entries} == {"gettext:demoapp"}


def test_cedict_snippet(tmp_path: Path) -> None:
    path = tmp_path / "cedict.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(CEDICT)
    pairs = [(e.en, e.text) for e in sources.read_cedict(path)]
    # Classifier notes, surnames and headwords with Latin letters are skipped.
    assert pairs == [("document", "文件"), ("file", "文件"), ("to set up", "设置"), ("to install", "设置")]


def test_clean_strips_accelerators_and_rejects_multiline() -> None:
    assert clean("_Save As") == "Save As"
    assert clean("Guardar _como") == "Guardar como"
    assert clean("另存为(_A)") == "另存为"
    assert clean("file_name and other_name") == "file_name and other_name"
    assert clean("Tom &amp; Jerry") == "Tom &amp; Jerry"
    assert clean("Line one\nline two") is None
    assert clean("  spaced   out ") == "spaced out"


def test_mask_pair_numbers_target_spans_like_the_source() -> None:
    assert mask_pair("Copy %s to %d", "%d bekommt %s") == ("Copy ⟦0⟧ to ⟦1⟧", "⟦1⟧ bekommt ⟦0⟧")
    assert mask_pair("Broken %s", "Kaputt") is None


def test_build_corpus_holds_out_and_filters(locale_root: Path, tmp_path: Path) -> None:
    entries = list(sources.gettext_catalogues(locale_root, {k: (v,) for k, v in LANG_FOLDERS.items()}))
    corpus = build_corpus(entries, test_size=2, frequent_size=2, seed=1)
    held_out = {en for en, _ in corpus.test["en2de"]}
    assert len(held_out) == 2
    for direction, rows in corpus.train.items():
        sources_seen = {s for s, _, _ in rows} | {t for _, t, _ in rows}
        assert not held_out & sources_seen, direction
        for lang_ref in (ref for _, ref in corpus.test[direction]):
            assert lang_ref not in sources_seen
    en_sources = {s for s, _, _ in corpus.train["en2es"]} | held_out | {en for en, _ in corpus.frequent["en2es"]}
    assert "Broken ⟦0⟧" not in en_sources and "gtk-ok" not in en_sources
    assert not any("\n" in s for s in en_sources)
    assert ("Copy ⟦0⟧ to ⟦1⟧", "Copiar ⟦1⟧ a ⟦0⟧", "gettext") in corpus.train["en2es"]
    # es→de (the pivot test) pairs the Spanish and German translations of the same held-out strings.
    es_by_en = dict(corpus.test["en2es"])
    de_by_en = dict(corpus.test["en2de"])
    assert sorted(corpus.test["es2de"]) == sorted((es_by_en[en], de_by_en[en]) for en in held_out)
    assert "es2de" not in corpus.train

    write_corpus(corpus, tmp_path / "out")
    again = load_corpus(tmp_path / "out")
    assert again.train == corpus.train and again.test == corpus.test and again.frequent == corpus.frequent


def test_build_demo_command_is_registered() -> None:
    from hunyuan_mt.cli import build_parser
    from hunyuan_mt.demo import build

    args = build_parser("build-demo").parse_args(["build-demo", "--device", "cpu", "--minutes", "2", "--reuse-data"])
    assert args.handler is build.run and args.minutes == 2.0 and args.reuse_data


def test_whole_build_pipeline_on_the_sample(locale_root: Path, tmp_path: Path) -> None:
    """Tokenizer → joint training → checkpoint → export → evaluation → metadata, with a toy model size."""
    import json

    import torch
    from peft import PeftModel
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hunyuan_mt.demo.build import ship, train
    from hunyuan_mt.demo.corpus import ADAPTER_DIRECTIONS

    torch.set_num_threads(1)
    entries = list(sources.gettext_catalogues(locale_root, {k: (v,) for k, v in LANG_FOLDERS.items()}))
    corpus = build_corpus(entries, test_size=2, frequent_size=2, seed=1)
    toy = {"d_model": 32, "layers": 1, "heads": 2, "ffn": 64, "vocab": 120, "lora_rank": 2, "max_tokens": 256}
    info = train(corpus, "cpu", "cpu", minutes=1.0, checkpoint=tmp_path / "ckpt", max_steps=3, overrides=toy)
    assert info["train"]["steps"] == 3
    report = ship(tmp_path / "ckpt", corpus, tmp_path / "out")
    assert set(report["chrf"]) == set(ADAPTER_DIRECTIONS) | {"es2de"}
    assert report["chrf"]["es2de"]["pivot"] is not None and report["chrf"]["en2de"]["right"] is not None

    model_dir, adapters = tmp_path / "out" / "models" / "demo", tmp_path / "out" / "adapters"
    backbone = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    assert tokenizer.convert_tokens_to_ids("⟦0⟧") != tokenizer.unk_token_id
    model = PeftModel.from_pretrained(backbone, str(adapters / "en2es"), adapter_name="en2es")
    model.load_adapter(str(adapters / "zh2en"), adapter_name="zh2en")
    assert sorted(p.name for p in adapters.iterdir()) == sorted(ADAPTER_DIRECTIONS)
    metadata = json.loads((adapters / "en2es" / "metadata.json").read_text(encoding="utf-8"))
    assert metadata["pair"] == "en2es" and metadata["test_size"] == 2
    assert metadata["data_sources"][0]["id"] == "gettext" and "licence" in metadata["data_sources"][0]
    assert not (adapters / "en2es" / "README.md").exists()
