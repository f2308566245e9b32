"""Backbone: loaded once per process, clear load errors, per-row adapters that match single-row runs."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
import torch

from hunyuan_mt.runtime import backbone as backbone_mod
from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.runtime.backbone import Backbone, PromptRow, load_backbone
from hunyuan_mt.config import GenerationConfig, ModelConfig
from hunyuan_mt.errors import ConfigError, ModelUnavailable
from hunyuan_mt.lora import BASE_SLOT

GREEDY = GenerationConfig()
ROWS = [
    PromptRow("Hello world, how are you today?", "en", "es"),
    PromptRow("Open the file, save the document and close the window.", "en", "de"),
    PromptRow("Hola mundo", "es", "en"),
    PromptRow("The quick brown fox.", "en", "fr"),
    PromptRow("你好世界，今天你好吗？", "zh", "en"),
    PromptRow("Datei öffnen", "de", "en"),
]
PAIRS = [Pair("en", "es"), Pair("en", "de"), Pair("es", "en"), None, Pair("zh", "en"), Pair("de", "en")]


def test_backbone_loads_once_for_many_callers(tmp_path: Path, marian_dir: Path) -> None:
    """Services, UIs and CLI calls in many threads, with equivalent configs, share one load (invariant 1)."""
    model_dir = tmp_path / "private-model"  # a folder no other test loads, so the count delta is exact
    shutil.copytree(marian_dir, model_dir)
    before = backbone_mod.LOAD_COUNT
    barrier = threading.Barrier(8)
    got: list[Backbone] = []

    def caller() -> None:
        barrier.wait()
        got.append(load_backbone(ModelConfig(path=str(model_dir))))

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    again = load_backbone(ModelConfig(path=str(model_dir / ".." / "private-model")))  # same folder, spelled differently
    assert backbone_mod.LOAD_COUNT - before == 1
    assert len(got) == 8 and all(b is got[0] for b in got) and again is got[0]
    assert got[0].warmup_ms is not None  # the warm-up generation ran at load
    # The markup form (and the prompt style) shape every row's input: another one is another backbone.
    spaced = load_backbone(ModelConfig(path=str(model_dir), markup="spaced", warmup=False))
    assert spaced is not got[0] and (spaced.markup_form, got[0].markup_form) == ("spaced", "sentinels")
    # So do the int8 kernel (the layers loaded) and the key/value dtype (every batch's cache).
    fbgemm = load_backbone(ModelConfig(path=str(model_dir), quantization="int8", int8_kernel="fbgemm", warmup=False))
    int_mm = load_backbone(ModelConfig(path=str(model_dir), quantization="int8", int8_kernel="int_mm", warmup=False))
    assert fbgemm is not int_mm and (fbgemm.int8_kernel, int_mm.int8_kernel) == ("fbgemm", "int_mm")
    wide = load_backbone(ModelConfig(path=str(model_dir), quantization="int8", int8_kernel="fbgemm",
                                     kv_cache="float32", warmup=False))
    assert wide is not fbgemm and wide.kv_cache_dtype() is None


def test_architecture_dtype_and_info(fresh_backbone, marian_dir: Path, hunyuan_dir: Path) -> None:
    marian, hunyuan = fresh_backbone(marian_dir), fresh_backbone(hunyuan_dir)
    assert (marian.arch, hunyuan.arch) == ("encoder-decoder", "decoder-only")
    if torch.cuda.is_available():
        assert marian.device == "cuda:0" and marian.dtype == torch.bfloat16  # auto on CUDA
    else:
        assert marian.device == "cpu" and marian.dtype == torch.float32  # auto on CPU
    assert (marian.tokenizer.padding_side, hunyuan.tokenizer.padding_side) == ("right", "left")
    info = hunyuan.info()
    assert info["arch"] == "decoder-only" and info["params"] > 0 and info["dtype"] == str(hunyuan.dtype)[6:]
    assert "model.layers.0.self_attn.q_proj" in hunyuan.spec.shapes


def test_arch_override_is_respected(fresh_backbone, hunyuan_dir: Path) -> None:
    assert fresh_backbone(hunyuan_dir, arch="decoder-only").arch == "decoder-only"


def test_missing_model_folder_says_nothing_is_downloaded(tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailable, match="Nothing is downloaded"):
        Backbone.load_uncached(ModelConfig(path=str(tmp_path / "absent")))
    with pytest.raises(ModelUnavailable, match="Nothing is downloaded"):
        Backbone.load_uncached(ModelConfig(path="no-such-org/no-such-model-xyz"))


def test_pickle_only_model_is_refused(tmp_path: Path, marian_dir: Path) -> None:
    model_dir = tmp_path / "pickled"
    shutil.copytree(marian_dir, model_dir)
    (model_dir / "model.safetensors").unlink()
    (model_dir / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(ModelUnavailable, match="allow_pickle"):
        Backbone.load_uncached(ModelConfig(path=str(model_dir)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA messages")
def test_gpu_only_settings_fail_clearly_without_cuda(marian_dir: Path) -> None:
    with pytest.raises(ModelUnavailable, match="requires a CUDA GPU"):
        Backbone.load_uncached(ModelConfig(path=str(marian_dir), require_cuda=True))
    with pytest.raises(ModelUnavailable, match="no CUDA"):
        Backbone.load_uncached(ModelConfig(path=str(marian_dir), device="cuda:0"))
    with pytest.raises(ConfigError, match="model.quantization: 4bit needs a CUDA GPU"):
        Backbone.load_uncached(ModelConfig(path=str(marian_dir), quantization="4bit"))


def test_decoder_only_prompt_uses_chat_template_and_hunyuan_format(fresh_backbone, hunyuan_dir: Path) -> None:
    bb = fresh_backbone(hunyuan_dir)
    en_es = bb.prompt_text(PromptRow("Hello", "en", "es"))
    zh_en = bb.prompt_text(PromptRow("你好", "zh", "en"))
    # Hunyuan-MT-7B's card passes add_generation_prompt=False: the prompt ends with the user's turn.
    assert en_es == ("<s>user: Translate the following segment into Spanish, without additional explanation."
                     "\n\nHello</s>")
    assert zh_en == "<s>user: 把下面的文本翻译成英语，不要额外解释。\n\n你好</s>"
    # Hy-MT2's passes True: the template's generation prompt follows.
    assert fresh_backbone(hunyuan_dir, prompt="hy-mt2").prompt_text(PromptRow("你好", "zh", "en")) == (
        "<s>user: 将以下文本翻译为英语，注意只需要输出翻译后的结果，不要额外解释：\n\n你好</s><s>assistant:")


def test_encoder_decoder_input_is_source_text_with_target_token(fresh_backbone, marian_dir: Path) -> None:
    bb = fresh_backbone(marian_dir)
    assert bb.prompt_text(PromptRow("Hello", "en", "es")) == "Hello"
    assert bb.target_token_id("es") == bb.tokenizer.convert_tokens_to_ids("__es__")
    assert bb.target_token_id("de") != bb.target_token_id("es")


def test_bare_backbone_generates_without_slot_layers(fresh_backbone, marian_dir: Path) -> None:
    bb = fresh_backbone(marian_dir)
    assert bb.lora is None
    out = bb.generate(ROWS[:2], [BASE_SLOT, BASE_SLOT], GREEDY, max_new_tokens=8)
    assert len(out) == 2 and all(isinstance(o, str) for o in out)
    with pytest.raises(ValueError, match="slot 1 does not exist: this backbone has 0 adapter slots"):
        bb.generate(ROWS[:1], [1], GREEDY, max_new_tokens=8)


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder-only"])
def test_mixed_adapter_rows_equal_rows_run_alone(arch, request, fresh_backbone, make_cache) -> None:
    """Invariant 5: a row's greedy output does not depend on the rows (and adapters) that share its batch."""
    model_dir = request.getfixturevalue("marian_dir" if arch == "encoder-decoder" else "hunyuan_dir")
    adapters = request.getfixturevalue("marian_adapters" if arch == "encoder-decoder" else "hunyuan_adapters")
    bb = fresh_backbone(model_dir)
    cache = make_cache(bb, adapters, slots=4, pinned=["en2es"])
    with cache.lease(PAIRS) as lease:
        mixed = bb.generate(ROWS, lease.slots, GREEDY, max_new_tokens=12)
    alone = []
    for row, pair in zip(ROWS, PAIRS):
        with cache.lease([pair]) as lease:
            alone.append(bb.generate([row], lease.slots, GREEDY, max_new_tokens=12)[0])
    assert mixed == alone
    # The adapters really act: the same text under each adapter and under the base gives distinct outputs.
    text = ROWS[0]
    outs = []
    for pair in (None, Pair("en", "es"), Pair("en", "de"), Pair("en", "fr")):
        with cache.lease([pair]) as lease:
            outs.append(bb.generate([text], lease.slots, GREEDY, max_new_tokens=12)[0])
    assert len(set(outs)) == 4, outs


def test_rows_with_one_adapter_and_many_lengths_equal_alone(fresh_backbone, make_cache, hunyuan_dir: Path,
                                                            hunyuan_adapters: Path) -> None:
    """Left padding: very different prompt lengths in one batch still match the single-row runs."""
    bb = fresh_backbone(hunyuan_dir)
    cache = make_cache(bb, hunyuan_adapters, slots=3)
    rows = [PromptRow("Hi", "en", "es"), PromptRow(" ".join(["Open the file and save it."] * 6), "en", "es")]
    with cache.lease([Pair("en", "es")] * 2) as lease:
        mixed = bb.generate(rows, lease.slots, GREEDY, max_new_tokens=10)
        alone = [bb.generate([r], lease.slots[:1], GREEDY, max_new_tokens=10)[0] for r in rows]
    assert mixed == alone


def test_prompt_lengths_count_model_tokens(fresh_backbone, hunyuan_dir: Path) -> None:
    bb = fresh_backbone(hunyuan_dir)
    short, long = bb.prompt_lengths([PromptRow("Hi", "en", "es"), PromptRow("Hi " * 30, "en", "es")])
    assert 0 < short < long


def test_rows_with_and_without_target_token_equal_alone(fresh_backbone, make_cache, marian_dir, marian_adapters,
                                                         monkeypatch) -> None:
    """A vocabulary lacking one target's token: those rows run apart, each still equal to its run alone."""
    bb = fresh_backbone(marian_dir)
    real = bb.target_token_id
    monkeypatch.setattr(bb, "target_token_id", lambda tgt: None if tgt == "fr" else real(tgt))
    cache = make_cache(bb, marian_adapters, slots=3)
    rows = [ROWS[0], ROWS[3], ROWS[1]]
    pairs = [Pair("en", "es"), None, Pair("en", "de")]
    with cache.lease(pairs) as lease:
        mixed = bb.generate(rows, lease.slots, GREEDY, max_new_tokens=10)
        alone = [bb.generate([r], [n], GREEDY, max_new_tokens=10)[0] for r, n in zip(rows, lease.slots)]
    assert mixed == alone


def test_missing_demo_model_points_to_build_demo(tmp_path, monkeypatch) -> None:
    # The demo ships in this repo, so point its configured path at an empty place instead of skipping.
    monkeypatch.setattr(ModelConfig, "resolved_path", property(lambda self: tmp_path / "no-demo-here"))
    monkeypatch.chdir(tmp_path)  # transformers would otherwise find ./models/demo relative to the working directory
    with pytest.raises(ModelUnavailable, match=r"python -m hunyuan_mt build-demo"):
        Backbone.load_uncached(ModelConfig(path="models/demo"))


def test_beam_search_with_mixed_adapters_equals_rows_alone(fresh_backbone, make_cache, hunyuan_dir,
                                                           hunyuan_adapters) -> None:
    bb = fresh_backbone(hunyuan_dir)
    cache = make_cache(bb, hunyuan_adapters, slots=3)
    beams = GenerationConfig(num_beams=3)
    rows, pairs = ROWS[:3], PAIRS[:3]
    with cache.lease(pairs) as lease:
        mixed = bb.generate(rows, lease.slots, beams, max_new_tokens=8)
        alone = [bb.generate([r], [n], beams, max_new_tokens=8)[0] for r, n in zip(rows, lease.slots)]
    assert mixed == alone


def test_over_long_row_is_refused_and_generation_stays_in_the_position_table(fresh_backbone, marian_dir) -> None:
    from hunyuan_mt.errors import InputTooLarge

    bb = fresh_backbone(marian_dir)
    assert bb.max_input_tokens == 128  # the tiny Marian's max_position_embeddings
    long_row = PromptRow("Hello world " * 200, "en", "es")
    with pytest.raises(InputTooLarge, match=r"^A segment of \d+ tokens is longer than this model's limit of 128"):
        bb.generate([long_row], [BASE_SLOT], GREEDY, max_new_tokens=8)
    # asking for more new tokens than positions exist does not crash: it is clamped
    assert isinstance(bb.generate([ROWS[0]], [BASE_SLOT], GREEDY, max_new_tokens=500)[0], str)


def test_many_services_share_one_backbone_load(tmp_path: Path, marian_dir: Path, marian_adapters: Path) -> None:
    """Service objects built by a UI, an API and a CLI call in one process load the backbone once."""
    from hunyuan_mt.config import load_config
    from hunyuan_mt.service.translation import TranslationService

    model_dir = tmp_path / "service-model"
    shutil.copytree(marian_dir, model_dir)
    cfg = load_config(overrides={"model.path": str(model_dir), "cache.adapters_dir": str(marian_adapters),
                                 "cache.pinned": [], "memory.enabled": False, "model.compile": "off"}, env={})
    before = backbone_mod.LOAD_COUNT
    services = [TranslationService(cfg) for _ in range(3)]
    try:
        assert backbone_mod.LOAD_COUNT - before == 1
        assert services[0].backbone is services[1].backbone is services[2].backbone
        assert services[2].translate("Hello world", "en", "es").text  # the newest one serves
    finally:
        for service in services:
            service.close()


@pytest.mark.parametrize(("requested", "device", "dtype", "flash", "supports", "expected"), [
    ("auto", "cuda:0", torch.bfloat16, True, True, "flash_attention_2"),
    ("auto", "cuda:0", torch.float16, True, True, "flash_attention_2"),
    ("auto", "cuda:0", torch.float32, True, True, "sdpa"),  # flash kernels take fp16/bf16 only
    ("auto", "cuda:0", torch.bfloat16, False, True, "sdpa"),  # flash_attn not installed
    ("auto", "cuda:0", torch.bfloat16, True, False, "sdpa"),  # the model class does not support it
    ("auto", "cpu", torch.bfloat16, True, True, None),  # CPU: transformers decides
    ("auto", "cpu", torch.float32, False, True, None),
    ("eager", "cuda:0", torch.bfloat16, True, True, "eager"),  # an explicit choice is kept
    ("flash_attention_2", "cuda:0", torch.float32, False, True, "flash_attention_2"),
])
def test_attention_implementation_choice(requested: str, device: str, dtype: torch.dtype, flash: bool,
                                         supports: bool, expected: str | None) -> None:
    from hunyuan_mt.runtime.backbone import choose_attn_implementation

    assert choose_attn_implementation(requested, device, dtype, flash_available=flash,
                                      model_supports_flash=supports) == expected


def test_loaded_backbone_reports_its_attention(fresh_backbone, marian_dir: Path) -> None:
    from transformers import AutoModelForSeq2SeqLM, MarianConfig, T5Config

    bb = fresh_backbone(marian_dir, attn_implementation="eager")
    assert bb.info()["attn_implementation"] == "eager"
    # Support is read from the concrete class the auto class would build: Marian has FlashAttention-2, T5 not.
    assert backbone_mod._supports_flash(AutoModelForSeq2SeqLM, MarianConfig()) is True
    assert backbone_mod._supports_flash(AutoModelForSeq2SeqLM, T5Config()) is False
