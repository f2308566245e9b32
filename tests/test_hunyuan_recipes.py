"""Each Hunyuan family's card, followed through the real files' shape (hunyuan_mt/text/prompts.py, RECIPES).

The stand-in models keep the published config.json's vocabulary, tied embeddings, norm, RoPE and query/key-norm
settings (docs/HUNYUAN_CPU.md, "The shapes we use") with 2 layers of width 32, and a byte-level tokenizer with the
families' special tokens at their ids:

- the 1.8B models (HY-MT1.5-1.8B, Hy-MT2-1.8B): `<｜hy_Assistant｜>` 120007 and the end token
  `<｜hy_place▁holder▁no▁2｜>` 120020 (HY-MT1.5-1.8B's tokenizer_config.json and config.json as the review of the
  prompts read them; the end token also as Hy-MT2-1.8B's published checks name it), the start token 120000 and
  padding 120002 (transformers' HYV4Config defaults, the same tokenizer family). `<｜hy_User｜>` sits at 120006
  here, beside the assistant's marker: its id was not read from the file.
- the 7B models (Hunyuan-MT-7B, HY-MT1.5-7B, Hy-MT2-7B): vocabulary 128,167, `<|startoftext|>` 127958 (llama.cpp's
  converter sets it as the 7B dense models' start token) and `<|eos|>` 127960 (the HY-MT1.5 card's vLLM example
  ends generation on it); `<|extra_0|>`, `<|extra_4|>` and the padding are placed beside them here.

Each folder's chat template is written here from Tencent's description of the official files (Hy-MT2 repository,
train/llama_factory_support/hy_dense_template.py), independently of prompts.CHAT_FORMATS, which a folder without a
template is checked against.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from hunyuan_mt.text import prompts
from hunyuan_mt.runtime.backbone import Backbone, PromptRow
from hunyuan_mt.config import GenerationConfig, ModelConfig, load_config
from hunyuan_mt.errors import ConfigError, ModelUnavailable
from tiny_models import _CORPUS

BOS, PAD, USER, ASSISTANT, HY_EOS, NO_3 = (
    "<｜hy_begin▁of▁sentence｜>", "<｜hy_pad｜>", "<｜hy_User｜>", "<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁2｜>",
    "<｜hy_place▁holder▁no▁3｜>")
SMALL_IDS = {BOS: 120000, PAD: 120002, USER: 120006, ASSISTANT: 120007, HY_EOS: 120020, NO_3: 120021}
START, EXTRA_0, EXTRA_4, EOS_7B, PAD_7B = "<|startoftext|>", "<|extra_0|>", "<|extra_4|>", "<|eos|>", "<|pad|>"
LARGE_IDS = {START: 127958, EOS_7B: 127960, PAD_7B: 127961, EXTRA_0: 127962, EXTRA_4: 127966}

#: HY-MT1.5-1.8B's config.json (and Hy-MT2-1.8B's: the same architecture), then Hunyuan-MT-7B's, as published.
SMALL_CONFIG = dict(vocab_size=120818, tie_word_embeddings=True, rms_norm_eps=1e-5, use_qk_norm=True,
                    max_position_embeddings=262144, bos_token_id=120000, eos_token_id=120020, pad_token_id=120002,
                    rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0})
LARGE_CONFIG = dict(SMALL_CONFIG, vocab_size=128167, bos_token_id=127958, eos_token_id=127960, pad_token_id=127961)
#: What shrinks: 2 layers of width 32, grouped-query attention kept (4 query heads to 1 key/value head).
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
            head_dim=8)

#: The chat formats, from Tencent's description: the 1.8B's user turn after its marker and a generation prompt of the
#: assistant's marker; the 7B's user turn closed by <|extra_0|>, after which the model answers.
SMALL_TEMPLATE = (BOS + "{% for m in messages %}{% if m['role'] == 'user' %}" + USER + "{{ m['content'] }}"
                  "{% elif m['role'] == 'assistant' %}" + ASSISTANT + "{{ m['content'] }}" + HY_EOS +
                  "{% endif %}{% endfor %}{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}")
LARGE_TEMPLATE = (START + "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}" + EXTRA_0 +
                  "{% elif m['role'] == 'assistant' %}{{ m['content'] }}" + EOS_7B + "{% endif %}{% endfor %}")


def _tokenizer(folder: Path, ids: dict[str, int], bos: str, eos: str, pad: str, template: str | None,
               plain: tuple[str, ...] = ()) -> None:
    """A byte-level BPE tokenizer (as the Hunyuan tokenizers are) with `ids`' tokens at those ids, special except
    `plain`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_CORPUS, trainer=trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    data = json.loads(tok.to_str())
    data["model"]["vocab"].update(ids)
    tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ids if t not in plain])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad)
    if template is not None:
        fast.chat_template = template
    fast.save_pretrained(folder)


def _model(folder: Path, config: dict) -> None:
    from transformers import HunYuanDenseV1Config, HunYuanDenseV1ForCausalLM

    torch.manual_seed(0)
    HunYuanDenseV1ForCausalLM(HunYuanDenseV1Config(**{**config, **TINY})).eval().save_pretrained(
        folder, safe_serialization=True)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hy-1.8b")
    _model(folder, SMALL_CONFIG)
    _tokenizer(folder, SMALL_IDS, BOS, HY_EOS, PAD, SMALL_TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def large_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hy-7b")
    _model(folder, LARGE_CONFIG)
    _tokenizer(folder, LARGE_IDS, START, EOS_7B, PAD_7B, LARGE_TEMPLATE)
    return folder


def _without_template(folder: Path, dest: Path) -> Path:
    shutil.copytree(folder, dest)
    (dest / "chat_template.jinja").unlink()
    config = json.loads((dest / "tokenizer_config.json").read_text())
    assert "chat_template" not in config  # the 1.8B keeps it only in chat_template.jinja
    return dest


def _load(profile: str, folder: Path, **overrides: object) -> Backbone:
    cfg = load_config(profile, {"model.path": str(folder), "model.quantization": "none", "model.warmup": False,
                                "model.device": "cpu", **{f"model.{k}": v for k, v in overrides.items()}})
    return Backbone.load_uncached(cfg.model)


def _card_ids(backbone: Backbone, content: str, add_generation_prompt: bool) -> list[int]:
    """What the card's own code feeds the model (the cards' "Use with transformers" / "transformers" sections)."""
    messages = [{"role": "user", "content": content}]
    return backbone.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                                  return_tensors="pt")["input_ids"][0].tolist()


# The cards' templates, written here from the cards themselves (not from prompts.py).
HY_MT15_ZH = "将以下文本翻译为{lang}，注意只需要输出翻译后的结果，不要额外解释：\n\n{text}"
HY_MT15_XX = "Translate the following segment into {lang}, without additional explanation.\n\n{text}"
HY_MT15_TERMS = "参考下面的翻译：\n{terms}\n\n将以下文本翻译为{lang}，注意只需要输出翻译后的结果，不要额外解释：\n{text}"
HY_MT15_CONTEXT = "{context}\n参考上面的信息，把下面的文本翻译成{lang}，注意不需要翻译上文，也不要额外解释：\n{text}"
HY_MT15_FORMATTED = ("将以下<source></source>之间的文本翻译为中文，注意只需要输出翻译后的结果，不要额外解释，"
                     "原文中的<sn></sn>标签表示标签内文本包含格式信息，需要在译文中相应的位置尽量保留该标签。"
                     "输出格式为：<target>str</target>\n\n<source>{text}</source>")
HUNYUAN_MT_ZH = "把下面的文本翻译成{lang}，不要额外解释。\n\n{text}"
HY_MT2_ZH = "将以下文本翻译为{lang}，注意只需要输出翻译后的结果，不要额外解释：\n\n{text}"
HY_MT2_EN = ("Translate the following text into {lang}. Note that you should only output the translated result "
             "without any additional explanation:\n\n{text}")
HY_MT2_TERMS_ZH = "参考下面的翻译：\n{terms}\n将以下文本翻译为{lang}，注意只需要输出翻译后的结果，不要额外解释：\n\n{text}"
HY_MT2_TERMS_EN = ("Reference the following translations:\n{terms}\n\nTranslate the following text into {lang}. "
                   "Note that you must ONLY output the translated result without any additional explanation:\n\n{text}")
HY_MT2_BACKGROUND_ZH = "【背景信息】\n{context}\n\n请结合背景信息将以下文本翻译为{lang}。\n\n【待翻译文本】\n{text}"
HY_MT2_BACKGROUND_EN = ("[Background Information]\n{context}\n\nPlease translate the following text into {lang}, "
                        "taking the provided background information into consideration.\n\n[Source Text]\n{text}")

PILOT = "The Educational and Inspirational Poetics of Pilots"
TV = "For commercial television programs, that start is the unusual entity known as the pilot."
TAGGED = "<s1>Click </s1><s2>here</s2><s3>.</s3>"
#: (row, the card's user turn) per family: every template the family has, each instruction language.
CASES: dict[str, list[tuple[PromptRow, str]]] = {
    "hy-mt1.5": [
        (PromptRow("It's on the house.", "en", "zh"), HY_MT15_ZH.format(lang="中文", text="It's on the house.")),
        (PromptRow("Hola", "es", "de"), HY_MT15_XX.format(lang="German", text="Hola")),
        # The technical report's Table 3 examples.
        (PromptRow("孕育出一颗混元珠", "zh", "en", terms=(("混元珠", "Chaos Pearl"),)),
         HY_MT15_TERMS.format(terms="混元珠 翻译成 Chaos Pearl", lang="英语", text="孕育出一颗混元珠")),
        (PromptRow(PILOT, "en", "zh", context=TV), HY_MT15_CONTEXT.format(context=TV, lang="中文", text=PILOT)),
        (PromptRow("Click ⟦0⟧here⟦1⟧.", "en", "zh", markup=(0, 1)), HY_MT15_FORMATTED.format(text=TAGGED)),
    ],
    "hunyuan-mt": [
        (PromptRow("It's on the house.", "en", "zh"), HUNYUAN_MT_ZH.format(lang="中文", text="It's on the house.")),
        (PromptRow("Hola", "es", "de"), HY_MT15_XX.format(lang="German", text="Hola")),
        # Not in its card: the HY-MT1.5 card's (prompts.RECIPES["hunyuan-mt"].borrowed).
        (PromptRow("Open", "en", "de", terms=(("Open", "Öffnen"),)),
         HY_MT15_TERMS.format(terms="Open 翻译成 Öffnen", lang="德语", text="Open")),
        (PromptRow(PILOT, "en", "zh", context=TV), HY_MT15_CONTEXT.format(context=TV, lang="中文", text=PILOT)),
    ],
    "hy-mt2": [
        (PromptRow("今天天气真好。", "zh", "en"), HY_MT2_ZH.format(lang="英语", text="今天天气真好。")),
        (PromptRow("Hola", "es", "de"), HY_MT2_EN.format(lang="German", text="Hola")),
        (PromptRow("孕育出一颗混元珠", "zh", "en", terms=(("混元珠", "Chaos Pearl"), ("孕育", "give birth to"))),
         HY_MT2_TERMS_ZH.format(terms="混元珠 翻译成 Chaos Pearl\n孕育 翻译成 give birth to", lang="英语",
                                text="孕育出一颗混元珠")),
        (PromptRow("Open the file", "en", "de", terms=(("file", "Datei"),)),
         HY_MT2_TERMS_EN.format(terms="file translates to Datei", lang="German", text="Open the file")),
        (PromptRow(PILOT, "en", "zh", context=TV), HY_MT2_BACKGROUND_ZH.format(context=TV, lang="中文", text=PILOT)),
        (PromptRow(PILOT, "en", "es", context=TV),
         HY_MT2_BACKGROUND_EN.format(context=TV, lang="Spanish", text=PILOT)),
    ],
}


@pytest.mark.parametrize(("profile", "size"), [("hunyuan-mt-7b", "large"), ("hy-mt1.5-1.8b", "small"),
                                               ("hy-mt2-1.8b", "small"), ("hy-mt2-7b", "large")])
def test_each_profile_feeds_the_model_what_its_cards_code_does(profile: str, size: str, request) -> None:
    """Every template of the profile's family, rendered through the backbone, is token for token what the card's
    own code gives for the card's text on the same tokenizer and chat template, the prompt's end included."""
    backbone = _load(profile, request.getfixturevalue(f"{size}_dir"))
    family = backbone.recipe
    assert family is not None and family.name == load_config(profile).model.prompt
    for row, card_text in CASES[family.name]:
        ours = list(backbone.encode(row).input_ids)
        assert ours == _card_ids(backbone, card_text, family.add_generation_prompt), (profile, row)
    if size == "small":
        # The 1.8B's template ends with the assistant's marker exactly where the card's code asks for it.
        ends = backbone.encode(CASES[family.name][0][0]).input_ids[-1] == SMALL_IDS[ASSISTANT]
        assert ends is family.add_generation_prompt is (family.name == "hy-mt2")


def test_the_formatted_template_names_the_target_as_the_cards_chinese_example_does() -> None:
    """The card writes 中文: its one worked example translates into Chinese. Other targets get their Chinese name
    there, in the same Chinese instruction."""
    zh = prompts.build("hy-mt1.5", TAGGED, "en", "zh", formatted=True)
    assert zh == HY_MT15_FORMATTED.format(text=TAGGED)
    de = prompts.build("hy-mt1.5", TAGGED, "en", "de", formatted=True)
    en = prompts.build("hy-mt1.5", TAGGED, "zh", "en", formatted=True)
    assert de == zh.replace("翻译为中文", "翻译为德语") and "中文" not in de
    assert en == zh.replace("翻译为中文", "翻译为英语")
    with pytest.raises(ConfigError, match="model.markup: expected auto, sentinels or spaced"):
        ModelConfig(prompt="hy-mt2", markup="tags")
    assert ModelConfig(prompt="hy-mt2").markup_form == "sentinels"
    assert ModelConfig(prompt="hunyuan-mt").markup_form == "sentinels"  # its card has no formatted template
    assert ModelConfig(prompt="hy-mt1.5").markup_form == "tags"


def test_hy_mt2_prompts_read_back(small_dir: Path) -> None:
    for src, tgt in (("en", "de"), ("zh", "en")):
        assert prompts.parse(prompts.build("hy-mt2", "Some text\nwith lines", src, tgt)) == (tgt, "Some text\nwith lines")
    # The card's own transformers example writes 翻译成 and half-width punctuation.
    assert prompts.parse("将以下文本翻译成英语,注意只需要输出翻译后的结果,不要额外解释:\n\n今天天气真好。") == ("en", "今天天气真好。")


def test_a_folder_without_its_chat_template_is_refused_in_one_line(small_dir: Path, tmp_path: Path) -> None:
    bare = _without_template(small_dir, tmp_path / "HY-MT1.5-1.8B")
    with pytest.raises(ModelUnavailable) as refused:
        _load("hy-mt1.5-1.8b", bare)
    message = str(refused.value)
    assert "\n" not in message
    assert "no chat template: chat_template.jinja is missing" in message and "model.chat_template: family" in message


def test_the_familys_chat_template_is_used_and_logged_when_the_profile_asks(small_dir: Path, large_dir: Path,
                                                                            hunyuan_dir: Path, tmp_path: Path,
                                                                            caplog) -> None:
    """prompts.CHAT_FORMATS gives the same ids as the folders' own templates; a tokenizer without the family's
    role tokens is refused."""
    rows = [row for row, _ in CASES["hy-mt2"]]
    for profile, folder, chat_format in (("hy-mt2-1.8b", small_dir, "hunyuan-1.8b"),
                                         ("hy-mt1.5-1.8b", small_dir, "hunyuan-1.8b"),
                                         ("hunyuan-mt-7b", large_dir, "hunyuan-7b")):
        bare = _without_template(folder, tmp_path / f"{profile}-bare")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hunyuan_mt.runtime.backbone"):
            family = _load(profile, bare, chat_template="family")
        assert f"has no chat template (chat_template.jinja): using the {family.recipe.name} family's {chat_format} " \
               "chat format" in caplog.text
        own = _load(profile, folder)
        assert [family.encode(r).input_ids for r in rows] == [own.encode(r).input_ids for r in rows], profile
    other = _without_template(hunyuan_dir, tmp_path / "other-bare")
    with pytest.raises(ModelUnavailable, match="its tokenizer lacks the role tokens of the hy-mt1.5 family's"):
        _load("hy-mt1.5-1.8b", other, chat_template="family")


def test_do_sample_takes_the_cards_values_unless_the_config_sets_its_own(small_dir: Path, marian_dir: Path) -> None:
    backbone = _load("hy-mt1.5-1.8b", small_dir)
    card = (0.7, 0.6, 20, 1.05)

    def values(gen: GenerationConfig) -> tuple:
        return gen.temperature, gen.top_p, gen.top_k, gen.repetition_penalty

    sampling = load_config("hy-mt1.5-1.8b", {"generation.do_sample": True}).generation
    assert values(backbone.generation(sampling)) == card
    assert values(backbone.picker(sampling).gen) == card
    kwargs = backbone._generation_kwargs(sampling, 8)  # transformers' generate (beam search, light mode)
    assert (kwargs["temperature"], kwargs["top_p"], kwargs["top_k"], kwargs["repetition_penalty"]) == card
    # Without the profile's own repetition penalty the card's applies too; a value the config sets is kept.
    assert values(backbone.generation(GenerationConfig(do_sample=True))) == card
    own = GenerationConfig(do_sample=True, temperature=0.9, top_k=5)
    assert values(backbone.generation(own)) == (0.9, 0.6, 5, 1.05)
    # Greedy: no sampling values, no penalty unless one is set.
    assert backbone.generation(GenerationConfig()).repetition_penalty == 1.0
    # A model without a family (the demo's encoder-decoder) samples with transformers' neutral values.
    marian = Backbone.load_uncached(ModelConfig(path=str(marian_dir), warmup=False))
    assert values(marian.generation(GenerationConfig(do_sample=True))) == (1.0, 1.0, 50, 1.0)


def test_sampling_draws_from_the_cards_top_tokens_only(small_dir: Path) -> None:
    """40 near-equal candidates: top_k 20 and top_p 0.6 leave only the first ones to draw from."""
    from hunyuan_mt.decode.picker import RowTokens

    backbone = _load("hy-mt1.5-1.8b", small_dir)
    picker = backbone.picker(GenerationConfig(do_sample=True))
    picker.generator = torch.Generator().manual_seed(0)
    logits = torch.full((1, picker.vocab_size), -1e4)
    logits[0, 1000:1040] = 10 - 0.01 * torch.arange(40)
    row = RowTokens(seen=[1], generated=0, max_new=8)
    chosen = {picker.pick(logits.clone(), [row])[0] for _ in range(200)}
    assert len(chosen) > 1 and max(chosen) < 1020
    neutral = backbone.picker(GenerationConfig(do_sample=True, top_k=50, top_p=1.0, temperature=1.0))
    neutral.generator = torch.Generator().manual_seed(0)
    assert max(neutral.pick(logits.clone(), [row])[0] for _ in range(200)) >= 1020


def test_an_end_token_that_is_not_special_is_never_printed(small_dir: Path, tmp_path: Path) -> None:
    """A model that declares another end token, and a tokenizer that leaves the family's end token plain text:
    decoding with skip_special_tokens would print it. The family's table makes it end the row, in the decode loop
    and in transformers' generate, and no output holds it."""
    folder = tmp_path / "plain-end"
    shutil.copytree(small_dir, folder)
    end = "<｜hy_end▁of▁sentence｜>"
    _tokenizer(folder, {**SMALL_IDS, end: 120001}, BOS, end, PAD, SMALL_TEMPLATE, plain=(HY_EOS,))
    for name in ("config.json", "generation_config.json"):
        declared = json.loads((folder / name).read_text())
        (folder / name).write_text(json.dumps({**declared, "eos_token_id": 120001}))
    backbone = _load("hy-mt1.5-1.8b", folder)
    token = SMALL_IDS[HY_EOS]
    assert token in backbone.end_ids and 120001 in backbone.end_ids
    hola = backbone.tokenizer("Hola", add_special_tokens=False)["input_ids"]
    assert HY_EOS in backbone.tokenizer.decode(hola + [token], skip_special_tokens=True)
    assert backbone.decode(hola + [token] + hola) == "Hola"
    # The model made to end every row with it (forced as the last token), in both decoding paths.
    backbone.model.generation_config.forced_eos_token_id = token
    rows = [PromptRow("Open the file.", "en", "de"), PromptRow("你好", "zh", "en")]
    loop = backbone.generate(rows, [0, 0], GenerationConfig(), max_new_tokens=3)
    beams = backbone.generate(rows, [0, 0], GenerationConfig(num_beams=2), max_new_tokens=3)
    assert not any("hy_place" in out for out in loop + beams), (loop, beams)


def test_an_int8_model_counts_its_parameters(fresh_backbone, hunyuan_dir: Path) -> None:
    wide = fresh_backbone(hunyuan_dir, quantization="none")
    narrow = fresh_backbone(hunyuan_dir, quantization="int8")
    assert wide.param_count > 0 and narrow.param_count == wide.param_count
    assert narrow.info()["params"] == wide.param_count
    assert sum(p.numel() for p in narrow.model.parameters()) < wide.param_count  # what the log showed as 0.0M


@pytest.mark.parametrize("profile", ["hunyuan-mt-7b", "hy-mt1.5-1.8b", "hy-mt2-1.8b", "hy-mt2-7b"])
def test_each_hunyuan_profile_follows_its_card(profile: str) -> None:
    cfg = load_config(profile)
    family = prompts.recipe(cfg.model.prompt)
    assert cfg.limits.max_new_tokens == family.max_new_tokens
    assert cfg.generation.do_sample is False  # greedy by default (invariant 5); the card's values one switch away
    assert cfg.model.chat_template == "folder"  # a folder without its template is refused, not served bare
    text = (Path(__file__).resolve().parent.parent / "configs" / f"{profile}.yaml").read_text()
    if family.name == "hy-mt2":
        assert "European Union" in text and "outputs to improve" in text
    if family.borrowed:
        assert "documents no terminology, context or formatted template" in text
