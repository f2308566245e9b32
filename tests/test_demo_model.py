"""The shipped demo model: sizes, standard formats, every adapter validates and translates, the adapter matters,
and do-not-translate spans survive translation with every backbone (demo and the tiny test models)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hunyuan_mt.adapters.registry import AdapterRegistry
from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.runtime.backbone import PromptRow
from hunyuan_mt.lora import BASE_SLOT
from hunyuan_mt.config import PROJECT_ROOT, GenerationConfig, load_config
from hunyuan_mt.text.masking import protect, restore

DEMO = PROJECT_ROOT / "models" / "demo"
ADAPTERS = PROJECT_ROOT / "adapters"
SHIPPED = ("en2es", "en2de", "en2fr", "en2zh", "es2en", "de2en", "fr2en", "zh2en")

# Frequent UI strings and the shipped build's exact output for each: all in the catalogues the demo learned from,
# which is what a first-time user types. (Single menu words such as "Save" or "Cancel" are often copied untranslated
# by this small build; README.md shows those failures too.)
EXPECTED: dict[str, list[tuple[str, str]]] = {
    "en2es": [("Unknown error", "Error desconocido"), ("Could not open file", "No se pudo abrir el archivo"),
              ("File not found", "No se encontró el archivo"), ("Open", "Abrir"), ("Save", "Guardar")],
    "en2de": [("too many arguments", "zu viele Argumente"), ("File not found", "Datei nicht gefunden"),
              ("command not found", "Befehl nicht gefunden"), ("Password", "Passwort"), ("Warning", "Warnung")],
    "en2fr": [("Unknown error", "Erreur inconnue"), ("Error", "Erreur"),
              ("File not found", "Fichier non trouvé"), ("directory", "répertoire"), ("internal error", "erreur interne")],
    "en2zh": [("Settings", "设置"), ("Could not open file", "无法打开文件"), ("Unknown error", "未知错误"),
              ("Password", "密码"), ("Print", "打印")],
    "es2en": [("orden no encontrada", "command not found"), ("Archivo no encontrado", "File not found"),
              ("Tamaño", "Size"), ("directorio", "directory")],
    "de2en": [("Unbekannter Fehler", "Unknown error"), ("Datei nicht gefunden", "File not found"),
              ("Passwort", "password")],
    "fr2en": [("Fichier introuvable", "File not found"), ("Taille", "Size"), ("Mot de passe", "Password")],
    "zh2en": [("未知错误", "Unknown error"), ("密码", "Password"), ("权限不够", "permission denied"),
              ("文件未找到", "File not found")],
}

SPAN_TEXTS = [
    "Could not open %s: %(reason)s",
    "Saved {count} files to <b>{path}</b>.",
    "Visit https://example.org/help or mail support@example.org",
    "Run `make test` 3 times",
]


@pytest.fixture(scope="module")
def demo_backbone():
    from hunyuan_mt.runtime.backbone import Backbone
    from hunyuan_mt.config import ModelConfig

    torch.set_num_threads(1)
    return Backbone.load_uncached(ModelConfig(path=str(DEMO), device="cpu", warmup=False))


@pytest.fixture(scope="module")
def demo_cache(demo_backbone):
    from hunyuan_mt.adapters.cache import AdapterCache
    from hunyuan_mt.config import CacheConfig

    registry = AdapterRegistry(ADAPTERS, demo_backbone.spec)
    registry.scan()
    cache = AdapterCache(demo_backbone, registry, CacheConfig(adapters_dir=str(ADAPTERS), slots=3, pinned=[]))
    cache.start()
    return cache


def run(backbone, cache, texts: list[str], pair: str | None) -> list[str]:
    src, tgt = (pair or "en2es").split("2")
    key = Pair.parse(pair) if pair else None
    with cache.lease([key] * len(texts)) as lease:
        return backbone.generate([PromptRow(t, src, tgt) for t in texts], lease.slots, GenerationConfig(),
                                 max_new_tokens=48)


def test_formats_and_sizes() -> None:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(str(DEMO), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(DEMO), local_files_only=True)
    assert model.config.model_type == "marian"
    assert (DEMO / "model.safetensors").stat().st_size <= 60 * 1024 * 1024
    # The sentinels of the masking module are whole tokens.
    assert tokenizer.tokenize("Open ⟦0⟧ and ⟦1⟧") == ["▁Open", "▁", "⟦0⟧", "▁and", "▁", "⟦1⟧"]
    assert tokenizer.decode(tokenizer("Abrir ⟦0⟧: ⟦1⟧")["input_ids"], skip_special_tokens=True) == "Abrir ⟦0⟧: ⟦1⟧"
    for name in SHIPPED:
        folder = ADAPTERS / name
        assert (folder / "adapter_model.safetensors").stat().st_size <= 3 * 1024 * 1024, name
        metadata = json.loads((folder / "metadata.json").read_text(encoding="utf-8"))
        assert metadata["pair"] == name and metadata["test_size"] >= 300
        assert {s["id"] for s in metadata["data_sources"]} >= {"gettext"}
    # es→de is reachable only through the pivot.
    assert not (ADAPTERS / "es2de").exists()


def test_default_config_serves_the_demo() -> None:
    cfg = load_config(None)
    assert cfg.model.resolved_path == DEMO
    assert cfg.routing.pivot == "en"
    assert cfg.cache.slots == 3 and len(cfg.cache.pinned) == 2
    assert len(SHIPPED) > cfg.cache.slots + len(cfg.cache.pinned)
    assert all((ADAPTERS / p).is_dir() for p in cfg.cache.pinned)


def test_every_shipped_adapter_validates(demo_backbone) -> None:
    registry = AdapterRegistry(ADAPTERS, demo_backbone.spec)
    registry.scan()
    assert {p.key for p in registry.usable_pairs()} >= set(SHIPPED)


@pytest.mark.parametrize("pair", SHIPPED)
def test_adapter_translates_frequent_phrases(demo_backbone, demo_cache, pair: str) -> None:
    sources = [s for s, _ in EXPECTED[pair]]
    outputs = run(demo_backbone, demo_cache, sources, pair)
    assert outputs == [expected for _, expected in EXPECTED[pair]]


def test_adapter_output_differs_from_no_adapter(demo_backbone, demo_cache) -> None:
    texts = ["Unknown error", "Could not open file", "Password", "The file could not be saved."]
    bare = run(demo_backbone, demo_cache, texts, None)
    for pair in ("en2es", "en2de", "en2zh"):
        assert run(demo_backbone, demo_cache, texts, pair) != bare


def _assert_spans_survive(texts: list[str], outputs: list[str]) -> None:
    for text, output in zip(texts, outputs):
        protected = protect(text)
        assert protected.spans, text
        restored = restore(output, protected)
        for span in protected.spans:
            assert restored.count(span) == text.count(span), (text, output, restored)


def test_spans_survive_with_the_demo_backbone(demo_backbone, demo_cache) -> None:
    masked = [protect(t).text for t in SPAN_TEXTS]
    for pair in ("en2es", "en2zh", None):
        _assert_spans_survive(SPAN_TEXTS, run(demo_backbone, demo_cache, masked, pair))


@pytest.mark.parametrize("which", ["marian", "hunyuan"])
def test_spans_survive_with_tiny_backbones(which: str, request, fresh_backbone) -> None:
    model_dir: Path = request.getfixturevalue(f"{which}_dir")
    backbone = fresh_backbone(model_dir, device="cpu")
    masked = [protect(t).text for t in SPAN_TEXTS]
    outputs = backbone.generate([PromptRow(m, "en", "es") for m in masked], [BASE_SLOT] * len(masked),
                                GenerationConfig(), max_new_tokens=16)
    _assert_spans_survive(SPAN_TEXTS, outputs)
