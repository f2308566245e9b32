"""The demo build's data extraction on a small sample: .mo catalogues and a CEDICT snippet made here."""

from __future__ import annotations

import gzip
from pathlib import Path

import polib
import pytest

from hunyuan_mt.demo import corpus as corpus_mod
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

    # The backbone is stored in fp16 and loads in fp32 by default (its config says so).
    from safetensors import safe_open
    with safe_open(str(model_dir / "model.safetensors"), "pt") as weights:
        assert {weights.get_tensor(k).dtype for k in weights.keys()} == {torch.float16}
    assert next(backbone.parameters()).dtype == torch.float32
    assert info["train"]["steps_per_direction"]["copy"] == 0       # step 9 is the first copy step

    # A shipped build continues training from where it stopped: the checkpoint rebuilt from models/demo and
    # adapters/ gives the served outputs, and a resumed run counts its copy steps.
    from hunyuan_mt.demo.build import evaluate_build, shipped_checkpoint
    from hunyuan_mt.demo.checkpoint import load_multi_lora
    from hunyuan_mt.demo.evaluate import translate

    resumed, _, meta = load_multi_lora(shipped_checkpoint(tmp_path / "out", tmp_path / "shipped"))
    assert meta["size"]["d_model"] == 32 and meta["build"]["train"]["steps"] == 3
    served = PeftModel.from_pretrained(AutoModelForSeq2SeqLM.from_pretrained(str(model_dir)), str(adapters / "en2es"),
                                       adapter_name="en2es").eval()
    texts = ["Delete file", "Open"]
    assert translate(resumed.eval(), tokenizer, texts, "en2es") == translate(served, tokenizer, texts, "en2es")
    info = train(corpus, "cpu", "cpu", minutes=1.0, checkpoint=tmp_path / "ckpt2", max_steps=6,
                 resume=tmp_path / "shipped", copy_every=3)
    assert info["train"]["steps_per_direction"]["copy"] == 2 and info["resumed_from"]["train"]["steps"] == 3
    report = evaluate_build(tmp_path / "out", corpus, tmp_path / "report.json")
    assert json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))["chrf"] == report["chrf"]


HELP_EN = """<html><body><h1 id="hd_id3150">Page Style</h1>
<p id="par_id3151" class="paragraph">Choose <a href="x.html">Format - Page Style</a> to open the dialog.</p>
<p id="par_id3152">Sets the margins. Then choose a paper size for the document.</p>
<p id="par_id3153">This paragraph was not translated.</p>
<p id="par_id3154">One sentence here. Another one there.</p>
<script>var par_id = 1;</script><p class="no-id">Ignored.</p></body></html>"""
HELP_ES = """<html><body><h1 id="hd_id3150">Estilo de página</h1>
<p id="par_id3151" class="paragraph">Elija <a href="x.html">Formato ▸ Estilo de página</a> para abrir el diálogo.</p>
<p id="par_id3152">Define los márgenes. Luego elija un tamaño de papel para el documento.</p>
<p id="par_id3153">This paragraph was not translated.</p>
<p id="par_id3154">Una sola frase, sin punto que la corte en dos</p></body></html>"""


def _help_tree(root: Path, pages: dict[str, tuple[str, str]]) -> Path:
    for relative, (english, spanish) in pages.items():
        for folder, html in (("en-US", english), ("es", spanish)):
            page = sources.help_root(root) / folder / "text" / relative
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(html, encoding="utf-8")
    return root


def test_help_pages_align_by_paragraph_id(tmp_path: Path) -> None:
    root = _help_tree(tmp_path, {"shared/01/page.html": (HELP_EN, HELP_ES)})
    entries = {e.key.split("#")[1]: e for e in sources.libreoffice_help(root, ["es", "de"])}
    assert entries["hd_id3150"].text == "Estilo de página"
    # Inline links are flattened into the paragraph's text.
    assert entries["par_id3151"].en == "Choose Format - Page Style to open the dialog."
    assert entries["par_id3151"].key == "lohelp:text/shared/01/page.html#par_id3151"
    assert entries["par_id3151"].origin == "lohelp:text/shared/01"
    assert set(entries) == {"hd_id3150", "par_id3151", "par_id3152", "par_id3153", "par_id3154"}


def test_help_sentences_pair_only_what_splits_alike() -> None:
    from hunyuan_mt.demo.corpus import help_sentences

    short = "Sets the margins. Then choose a paper size."
    assert help_sentences(short, "Define los márgenes. Luego elija un tamaño.", "es") == [
        (short, "Define los márgenes. Luego elija un tamaño.")]
    long_en = "Sets the page margins for every page of the document in use. " * 3 + "Then choose a paper size."
    long_es = "Define los márgenes de todas las páginas del documento en uso. " * 3 + "Luego elija un tamaño."
    pairs = help_sentences(long_en, long_es, "es")
    assert len(pairs) == 4 and pairs[3] == ("Then choose a paper size.", "Luego elija un tamaño.")
    # Three English sentences against two Spanish ones: no guess at the alignment.
    assert help_sentences(long_en, "Define los márgenes de todas las páginas del documento en uso, dos veces. "
                                   "Luego elija un tamaño de papel para el documento en uso ahora.", "es") == []


def test_libreoffice_catalogues_keep_contexts_and_drop_tilde_accelerators(tmp_path: Path) -> None:
    catalogue = polib.MOFile()
    catalogue.append(polib.MOEntry(msgctxt="dlg|save", msgid="~Save As", msgstr="Guardar ~como"))
    catalogue.append(polib.MOEntry(msgctxt="menu|save", msgid="~Save As", msgstr="Guardar c~omo"))
    messages = tmp_path / "usr/lib/libreoffice/program/resource/es/LC_MESSAGES"
    messages.mkdir(parents=True)
    catalogue.save(str(messages / "sw.mo"))
    entries = list(sources.libreoffice_catalogues(tmp_path))
    assert [(e.key, e.origin) for e in entries] == [("dlg|save\x04~Save As", "libreoffice:sw"),
                                                    ("menu|save\x04~Save As", "libreoffice:sw")]
    assert clean(entries[0].en) == "Save As" and clean(entries[1].text) == "Guardar como"
    assert clean("~/Documents and ~/Music") == "~/Documents and ~/Music"


def test_new_sources_do_not_move_the_held_out_split(locale_root: Path, tmp_path: Path, monkeypatch) -> None:
    """Builds stay comparable: adding LibreOffice, application catalogues and help leaves the UI test and the
    frequent phrases as they were, and nothing held out (UI string or help sentence) is trained on by any source."""
    system = list(sources.gettext_catalogues(locale_root, {k: (v,) for k, v in LANG_FOLDERS.items()}))
    before = build_corpus(system, test_size=2, frequent_size=2, seed=1)
    held_en = {en for en, _ in before.test["en2de"]}
    held_es = dict(before.test["en2es"])
    monkeypatch.setattr(corpus_mod, "HELP_HELD_OUT_PERCENT", 50)
    pages = {f"shared/{n:02d}/p{n}.html": (HELP_EN.replace("paper size", f"paper size {n}"),
                                           HELP_ES.replace("tamaño de papel", f"tamaño de papel {n}"))
             for n in range(20)}
    root = _help_tree(tmp_path / "lo", pages)
    extra = [sources.Entry(key="k", en=en, lang="es", text=held_es[en] + " bis", origin="libreoffice:sw")
             for en in held_en]
    extra += [sources.Entry(key="k2", en="Page margins", lang="es", text="Márgenes de página", origin="apps:kate")]
    after = build_corpus(system + extra + list(sources.libreoffice_help(root)), test_size=2, frequent_size=2, seed=1)
    assert after.test == before.test and after.frequent == before.frequent
    assert ("Page margins", "Márgenes de página", "apps") in after.train["en2es"]
    assert after.help_test["en2es"] and all(len(en.split()) >= 4 for en, _ in after.help_test["en2es"])
    assert after.help_test["es2en"] == [(t, e) for e, t in after.help_test["en2es"]]
    trained = {text for rows in after.train.values() for s, t, _ in rows for text in (s, t)}
    for en, es in after.help_test["en2es"]:
        assert en not in trained and es not in trained
    assert not held_en & trained
    assert after.stats["en2es"]["help_test"] == len(after.help_test["en2es"]) and after.stats["en2es"]["lohelp"] > 0
    write_corpus(after, tmp_path / "out")
    assert load_corpus(tmp_path / "out").help_test == after.help_test


def test_copy_examples_repeat_each_source_once() -> None:
    from hunyuan_mt.demo.trainer import copy_examples

    data = {"en2es": [([5, 6, 1], [7, 1]), ([8, 1], [9, 1])], "es2en": [([7, 1], [5, 6, 1])]}
    assert copy_examples(data, per_direction=10) == [([5, 6, 1], [5, 6, 1]), ([7, 1], [7, 1]), ([8, 1], [8, 1])]


def test_unpack_group_reports_a_package_it_cannot_fetch(tmp_path: Path, monkeypatch, capsys) -> None:
    from hunyuan_mt.demo import packages

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text("#!/bin/sh\necho 'E: Unable to locate package' >&2\nexit 100\n")
    (bin_dir / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    target = packages.unpack_group("apps", tmp_path / "data")
    assert target == tmp_path / "data" / "apps" and not (target / ".unpacked").exists()
    assert "apps: packages not available" in capsys.readouterr().out


def test_a_kept_split_stays_the_test_and_out_of_training(locale_root: Path) -> None:
    """--keep-split: a continued build is scored on its parent's held-out strings, and trains on none of them,
    even when today's extraction would draw another split."""
    entries = list(sources.gettext_catalogues(locale_root, {k: (v,) for k, v in LANG_FOLDERS.items()}))
    fresh = build_corpus(entries, test_size=2, frequent_size=2, seed=1)
    parent = build_corpus(entries, test_size=2, frequent_size=2, seed=5)
    assert parent.test != fresh.test            # another seed, another split: the case --keep-split is for
    kept = build_corpus(entries, test_size=2, frequent_size=2, seed=1, keep=parent)
    assert kept.test == parent.test and kept.frequent == parent.frequent and kept.help_test == parent.help_test
    trained = {text for rows in kept.train.values() for s, t, _ in rows for text in (s, t)}
    for direction, rows in parent.test.items():
        for src, ref in rows:
            assert src not in trained and ref not in trained, (direction, src)
    assert kept.stats["en2es"]["test"] == len(parent.test["en2es"])


def test_weighted_directions_get_their_turns_per_round() -> None:
    """`--weight zh2en=3`: a direction that lags gets three turns in every round of the others' one."""
    import argparse

    import torch
    from transformers import MarianMTModel

    from hunyuan_mt.demo.build import _weight
    from hunyuan_mt.demo.trainer import ModelSize, build_config, multi_lora_model, train_joint

    torch.manual_seed(0)
    size = ModelSize(d_model=16, layers=1, heads=2, ffn=32, vocab=40, lora_rank=2, max_tokens=64)
    model = multi_lora_model(MarianMTModel(build_config(size, 40, 0, 1)), ["en2es", "zh2en"], size.lora_rank)
    data = {d: [([5 + i % 7, 1], [9 + i % 5, 1]) for i in range(30)] for d in ("en2es", "zh2en")}
    log = train_joint(model, data, size, minutes=5.0, pad_id=0, device=torch.device("cpu"), max_steps=8,
                      warmup=1, weights={"zh2en": 3})
    assert log.steps_per_direction == {"en2es": 2, "zh2en": 6}      # two rounds of four turns
    with pytest.raises(ValueError, match="without training data"):
        train_joint(model, data, size, minutes=5.0, pad_id=0, device=torch.device("cpu"), max_steps=1,
                    weights={"de2en": 2})
    assert _weight("zh2en=2") == ("zh2en", 2)
    for bad in ("zh2en", "xx2yy=2", "zh2en=0", "zh2en=two"):
        with pytest.raises(argparse.ArgumentTypeError, match="DIRECTION=N"):
            _weight(bad)


def test_adapters_only_moves_that_adapter_and_nothing_else() -> None:
    """`build-demo --adapters-only zh2en`: the backbone and every other adapter keep their exact weights."""
    import torch
    from transformers import MarianMTModel

    from hunyuan_mt.demo.trainer import ModelSize, build_config, freeze_all_but, multi_lora_model, train_joint

    torch.manual_seed(0)
    size = ModelSize(d_model=16, layers=1, heads=2, ffn=32, vocab=40, lora_rank=2, max_tokens=64)
    model = multi_lora_model(MarianMTModel(build_config(size, 40, 0, 1)), ["en2es", "zh2en"], size.lora_rank)
    for name, param in model.named_parameters():       # PEFT starts B at zero; give every adapter a real term
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert freeze_all_but(model, ["zh2en"]) == sum(p.numel() for n, p in model.named_parameters()
                                                  if "lora_" in n and ".zh2en." in n)
    data = {"zh2en": [([5 + i % 7, 1], [9 + i % 5, 1]) for i in range(30)]}
    log = train_joint(model, data, size, minutes=5.0, pad_id=0, device=torch.device("cpu"), max_steps=3, warmup=1)
    assert log.steps_per_direction == {"zh2en": 3}
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all("lora_" in n and ".zh2en." in n for n in moved), sorted(moved)[:3]
    with pytest.raises(ValueError, match=r"no adapter named \['de2en'\]"):
        freeze_all_but(model, ["de2en"])


def test_adapters_only_refuses_a_build_from_nothing(capsys) -> None:
    from hunyuan_mt.cli import build_parser

    args = build_parser("build-demo").parse_args(["build-demo", "--device", "cpu", "--reuse-data",
                                                  "--adapters-only", "zh2en", "--data", "/nonexistent"])
    assert args.adapters_only == ["zh2en"]
    assert args.handler(args) == 2
    assert "--adapters-only continues a build: add --continue-shipped" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser("build-demo").parse_args(["build-demo", "--adapters-only", "xx2yy"])


def test_an_adapter_left_alone_keeps_the_stage_that_trained_it() -> None:
    """metadata.json's built_with: a stage that trained only zh2en did not build en2es."""
    from hunyuan_mt.demo.build import _trained_by

    joint = {"device": "cpu", "minutes": 55.0, "resumed_from": {"device": "cuda", "minutes": 6.0}}
    alone = {"device": "cpu", "minutes": 75.0, "adapters_only": ["zh2en"], "resumed_from": joint}
    assert _trained_by(alone, "zh2en") is alone
    assert _trained_by(alone, "en2es") is joint
    assert _trained_by(joint, "en2es") is joint
    again = {"minutes": 10.0, "adapters_only": ["de2en"], "resumed_from": alone}
    assert _trained_by(again, "en2es") is joint and _trained_by(again, "zh2en") is alone


def test_fresh_set_leaves_out_every_string_an_extraction_holds(locale_root: Path) -> None:
    """bench.fresh_ui compares builds trained on different extractions: a string seen on either side (the English,
    or any language's translation) must not be scored."""
    from bench.fresh_ui import fresh_set

    everything = fresh_set(locale_root, seen=set(), size=100)
    english = [en for en, _ in everything["en2es"]]
    assert "Delete file" in english and "Settings" in english and "Open" in english
    counts: dict[str, int] = {}
    test = fresh_set(locale_root, seen={"Settings", "Fenster schließen"}, size=100, counts=counts)
    kept = [en for en, _ in test["en2es"]]
    assert "Settings" not in kept            # seen as English
    assert "Close window" not in kept        # its German translation was seen
    assert "Delete file" in kept
    # Every direction holds the same strings, sources and references on their own sides; es→de pairs the two.
    assert ("Datei löschen", "Delete file") in test["de2en"]
    assert ("Eliminar archivo", "Datei löschen") in test["es2de"]
    assert {len(rows) for rows in test.values()} == {len(kept)}
    assert counts == {"translated": len(english), "fresh": len(english) - 2}
    assert len(fresh_set(locale_root, seen=set(), size=2)["zh2en"]) == 2


def test_paired_interval_is_zero_for_one_build_and_signed_for_a_better_one() -> None:
    from bench.fresh_ui import _stats, paired_interval

    refs = ["the file was saved", "open the window", "close all tabs", "delete the folder"]
    metric, good = _stats(refs, refs)
    _, poor = _stats(["a file saved", "open window", "close", "delete"], refs)
    assert paired_interval(good, good, metric, rounds=50) == (0.0, 0.0)
    low, high = paired_interval(good, poor, metric, rounds=50)
    assert low <= high < 0
