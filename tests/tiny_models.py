"""Tiny local models and LoRA adapters for tests (no download, a few seconds to build).

Shared by every test module: import the builders or use the session fixtures in `conftest.py`.

- `build_tokenizer(dir, chat_template=...)`: a small BPE tokenizer (tokenizer.json) with `__xx__` language tokens
  for every code of the language table, so the encoder-decoder path can force a target-language token.
- `build_marian(dir)`: a randomly initialised MarianMTModel (encoder-decoder) saved as safetensors.
- `build_hunyuan(dir)`: a randomly initialised HunYuanDenseV1ForCausalLM (decoder-only), tokenizer with a chat
  template, saved as safetensors.
- `make_adapter(model_dir, out_dir, seed=...)`: a PEFT LoRA folder with random, distinct, large-scale weights (the
  outputs differ from the base and from each other), written straight from shapes (no PeftModel needed).
- `make_incompatible_adapter`, `corrupt_adapter`: the faults the registry and cache must contain.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from hunyuan_mt.text.languages import LANGUAGES

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: Default pairs created by `make_adapters`: enough for eviction pressure with 3 slots plus pins.
DEFAULT_PAIRS = ("en2es", "es2en", "en2de", "de2en", "en2fr", "fr2en", "en2zh", "zh2en")

_CORPUS = [
    "Hello world, how are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "Translate the following segment into Spanish, without additional explanation.",
    "Hola mundo, ¿cómo estás hoy? El rápido zorro marrón salta sobre el perro perezoso.",
    "Hallo Welt, wie geht es dir heute? Der schnelle braune Fuchs springt über den faulen Hund.",
    "Bonjour le monde, comment allez-vous aujourd'hui ? Le renard brun rapide saute par-dessus le chien.",
    "把下面的文本翻译成中文，不要额外解释。你好世界，今天你好吗？",
    "Open the file, save the document and close the window.",
    "Abrir el archivo, guardar el documento y cerrar la ventana.",
    "Datei öffnen, Dokument speichern und Fenster schließen.",
    "Ouvrir le fichier, enregistrer le document et fermer la fenêtre.",
    "1234567890 numbers, dates and names: Maria, Berlin, 2024-05-01.",
] * 20

SPECIAL = ["<pad>", "</s>", "<unk>", "<s>"]

#: A minimal chat template so the decoder-only path exercises `apply_chat_template`.
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)


def lang_token(code: str) -> str:
    return f"__{code}__"


def build_tokenizer(out_dir: Path, vocab_size: int = 400, chat_template: str | None = None):
    """Train a small BPE tokenizer on `_CORPUS` and save it as a fast tokenizer (tokenizer.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    specials = SPECIAL + [lang_token(c) for c in LANGUAGES]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", bos_token="<s>",
        additional_special_tokens=[lang_token(c) for c in LANGUAGES],
    )
    if chat_template:
        fast.chat_template = chat_template
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


def build_marian(out_dir: Path, seed: int = 0) -> Path:
    """A tiny MarianMTModel (d_model 32, 2+2 layers) with a BPE tokenizer, saved as safetensors."""
    from transformers import MarianConfig, MarianMTModel

    tok = build_tokenizer(out_dir)
    torch.manual_seed(seed)
    cfg = MarianConfig(
        vocab_size=len(tok), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, decoder_start_token_id=tok.pad_token_id,
        forced_eos_token_id=None, bos_token_id=tok.bos_token_id, share_encoder_decoder_embeddings=True,
    )
    model = MarianMTModel(cfg).eval()
    _sharpen(model)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def build_hunyuan(out_dir: Path, seed: int = 0) -> Path:
    """A tiny HunYuanDenseV1ForCausalLM (hidden 32, 2 layers) with a chat-template tokenizer, as safetensors."""
    from transformers import HunYuanDenseV1Config, HunYuanDenseV1ForCausalLM

    tok = build_tokenizer(out_dir, chat_template=CHAT_TEMPLATE)
    torch.manual_seed(seed)
    cfg = HunYuanDenseV1Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=512, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, eod_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
    )
    model = HunYuanDenseV1ForCausalLM(cfg).eval()
    _sharpen(model)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def _sharpen(model: torch.nn.Module) -> None:
    """Scale weights up so greedy decoding of a random model does not collapse to one repeated token."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name and "shared" not in name:
                p.mul_(4.0)


def linear_shapes(model_dir: Path) -> dict[str, tuple[int, int]]:
    """Module path → (out_features, in_features) of every nn.Linear in the saved model."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    cls = AutoModelForSeq2SeqLM if cfg.is_encoder_decoder else AutoModelForCausalLM
    with torch.device("meta"):
        model = cls.from_config(cfg)
    return {n: tuple(m.weight.shape) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def make_adapter(
    model_dir: Path,
    out_dir: Path,
    seed: int,
    r: int = 4,
    alpha: int = 16,
    target_modules: tuple[str, ...] = ("q_proj", "v_proj"),
    scale: float = 1.5,
    shape_override: dict[str, tuple[int, int]] | None = None,
    base_model: str | None = None,
    rank_pattern: dict[str, int] | None = None,
    alpha_pattern: dict[str, int] | None = None,
    use_rslora: bool = False,
) -> Path:
    """Write a PEFT LoRA folder (adapter_config.json + adapter_model.safetensors + metadata.json).

    Weights are random with a large scale so each adapter's output differs from the base and from the others.
    `rank_pattern` / `alpha_pattern` follow PEFT's rule (a regex matching a dotted suffix of the module path).
    """
    import re

    from safetensors.torch import save_file

    shapes = shape_override or linear_shapes(model_dir)
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, (out_f, in_f) in shapes.items():
        if name.rsplit(".", 1)[-1] not in target_modules:
            continue
        rank = next((v for k, v in (rank_pattern or {}).items() if re.match(rf"(.*\.)?({k})$", name)), r)
        tensors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(rank, in_f, generator=gen) * scale
        tensors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(out_f, rank, generator=gen) * scale
    if not tensors:
        raise ValueError(f"no module of {model_dir} matches {target_modules}")
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"))
    cfg_json = json.loads((Path(model_dir) / "config.json").read_text())
    task = "SEQ_2_SEQ_LM" if cfg_json.get("is_encoder_decoder") else "CAUSAL_LM"
    config = {
        "peft_type": "LORA", "task_type": task, "r": r, "lora_alpha": alpha, "lora_dropout": 0.0,
        "target_modules": sorted(target_modules), "bias": "none", "fan_in_fan_out": False,
        "base_model_name_or_path": base_model or str(model_dir), "inference_mode": True,
        "init_lora_weights": True, "use_rslora": use_rslora, "use_dora": False, "modules_to_save": None,
        "rank_pattern": rank_pattern or {}, "alpha_pattern": alpha_pattern or {},
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "metadata.json").write_text(json.dumps({"pair": out_dir.name, "seed": seed, "synthetic": True}))
    return out_dir


def make_adapters(model_dir: Path, root: Path, pairs: tuple[str, ...] = DEFAULT_PAIRS, **kw) -> list[Path]:
    """One adapter per pair under `root`, seeds 1..N so each is distinct and reproducible."""
    return [make_adapter(model_dir, root / pair, seed=i + 1, **kw) for i, pair in enumerate(pairs)]


def make_incompatible_adapter(model_dir: Path, out_dir: Path) -> Path:
    """An adapter trained for another base model: its q_proj/v_proj input width does not match."""
    shapes = {n: (o, i * 2) for n, (o, i) in linear_shapes(model_dir).items()}
    return make_adapter(model_dir, out_dir, seed=99, shape_override=shapes, base_model="some/other-model")


def corrupt_adapter(adapter_dir: Path, mode: str = "truncate") -> None:
    """Damage an adapter in place: "truncate" cuts the safetensors file, "garbage" overwrites its header,
    "delete" removes the weights file."""
    weights = adapter_dir / "adapter_model.safetensors"
    if mode == "truncate":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    elif mode == "garbage":
        data = bytearray(weights.read_bytes())
        data[8:40] = b"\xff" * 32
        weights.write_bytes(bytes(data))
    elif mode == "delete":
        weights.unlink()
    else:
        raise ValueError(mode)


#: Limits settings that turn the degenerate-output guards off (limits.loop_repeats, limits.max_output_ratio): the
#: tiny random models repeat themselves, and the engine's mechanics tests need rows that run to their token limit.
UNGUARDED = {"loop_repeats": 0, "max_output_ratio": 0}
