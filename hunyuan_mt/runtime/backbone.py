"""The shared backbone: loaded once per process (counted in LOAD_COUNT), warmed up, and run with per-row adapters.

`load_backbone(cfg)` returns the process-wide instance for that resolved configuration; every service object, UI
or CLI call asking again gets the same object. Nothing is ever downloaded: models load with
`local_files_only=True` from a folder (or the local Hugging Face cache for a hub id).

`Backbone.encode` builds the inputs for a row the way the model family expects (Hunyuan prompt + chat template for
decoder-only models, source text + target-language token for encoder-decoder ones). Adapters are served by the
slot layers the adapter cache puts into the model (`lora.SlotLoRA`, `backbone.lora`): a forward pass reads each
row's slot index from `lora.mapping`, so rows of any mix of adapters share it. `new_batch` gives the decode loop's
running batch for this model (`decode/`), and `generate` runs a whole batch through it, or through transformers'
`generate` for beam search and for models the loop does not cover. Either way a row's greedy output equals that
row run alone.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ..host import cpu, footprint, heap
from ..text import inline, prompts
from ..quant import int8, embedding as int8_embedding, packed as int8_packed
from .. import kernels
from ..quant.layer import fuse_siblings
from ..config import GenerationConfig, ModelConfig
from ..decode import CausalBatch, LlamaBatch, MarianBatch, RunningBatch, Sequence, TokenPicker, running_batch_class
from ..decode.lean import LeanBatch
from ..decode.static import StaticCausalBatch
from ..errors import ConfigError, InputTooLarge, ModelUnavailable
from ..text.languages import LANGUAGES
from ..lora import BASE_SLOT
from ..lora.peft_format import BackboneSpec
from ..text.tokens import PromptTokens

log = logging.getLogger(__name__)

DECODER_ONLY = "decoder-only"
ENCODER_DECODER = "encoder-decoder"

#: How many backbones this process has loaded. Tests read it to prove "loaded exactly once" (invariant 1).
LOAD_COUNT = 0
_INSTANCES: dict[tuple[Any, ...], Backbone] = {}
_LOAD_LOCK = threading.Lock()

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# FLORES-200 codes NLLB tokenizers use as language tokens.
_NLLB = {
    "zh": "zho_Hans", "zh-Hant": "zho_Hant", "yue": "yue_Hant", "en": "eng_Latn", "fr": "fra_Latn",
    "pt": "por_Latn", "es": "spa_Latn", "ja": "jpn_Jpan", "tr": "tur_Latn", "ru": "rus_Cyrl", "ar": "arb_Arab",
    "ko": "kor_Hang", "th": "tha_Thai", "it": "ita_Latn", "de": "deu_Latn", "vi": "vie_Latn", "ms": "zsm_Latn",
    "id": "ind_Latn", "tl": "tgl_Latn", "hi": "hin_Deva", "pl": "pol_Latn", "cs": "ces_Latn", "nl": "nld_Latn",
    "km": "khm_Khmr", "my": "mya_Mymr", "fa": "pes_Arab", "gu": "guj_Gujr", "ur": "urd_Arab", "te": "tel_Telu",
    "mr": "mar_Deva", "he": "heb_Hebr", "bn": "ben_Beng", "ta": "tam_Taml", "uk": "ukr_Cyrl", "bo": "bod_Tibt",
    "kk": "kaz_Cyrl", "mn": "khk_Cyrl", "ug": "uig_Arab",
}


#: Tokens a prompt may add around a segment, for `fits`' shortcut: Hunyuan's instruction and chat template for a
#: decoder-only model; a language tag and the end token for an encoder-decoder.
_PROMPT_TOKENS = {DECODER_ONLY: 96, ENCODER_DECODER: 8}


@dataclass(frozen=True)
class PromptRow:
    """One segment to translate: text and canonical language codes, and optional context (text that shapes the
    translation and is not itself translated; decoder-only models read it in their prompt)."""

    text: str
    src: str
    tgt: str
    context: str | None = None
    #: Glossary terms the segment holds, (source, target), for the terminology prompt (glossary.mode: prompt).
    terms: tuple[tuple[str, str], ...] = ()
    #: Which of the text's sentinels are a document's inline markup (inline.py), not protected spans.
    markup: tuple[int, ...] = ()


@dataclass(frozen=True)
class StaticCache:
    """What a preallocated (static) KV cache is sized for: rows, columns per row (prompt + new tokens), and whether
    decode steps may be captured as CUDA graphs (on CUDA only)."""

    rows: int
    max_len: int
    cuda_graphs: bool = True


@dataclass(frozen=True)
class Encoded:
    """A row's model input: the prompt (decoder-only) or source (encoder-decoder) token ids, and for
    encoder-decoder models the decoder tokens before the first generated one."""

    input_ids: tuple[int, ...]
    decoder_prefix: tuple[int, ...] = ()

    @property
    def tokens(self) -> int:
        return len(self.input_ids)


def resolve_device(cfg: ModelConfig) -> str:
    """"auto" → cuda:0 when CUDA is present, else cpu. A CUDA device without CUDA is a ModelUnavailable."""
    has_cuda = torch.cuda.is_available()
    if cfg.require_cuda and not has_cuda:
        raise ModelUnavailable(
            "This profile requires a CUDA GPU (model.require_cuda: true), but torch sees none. "
            "Use a CPU profile (e.g. configs/default.yaml) or install the CUDA build of torch."
        )
    if cfg.device == "auto":
        return "cuda:0" if has_cuda else "cpu"
    if cfg.device.startswith("cuda") and not has_cuda:
        raise ModelUnavailable(f"model.device is {cfg.device!r}, but torch sees no CUDA device.")
    return "cuda:0" if cfg.device == "cuda" else cfg.device


def resolve_dtype(cfg: ModelConfig, device: str) -> torch.dtype:
    if cfg.dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return _DTYPES[cfg.dtype]


def choose_attn_implementation(requested: str, device: str, dtype: torch.dtype, flash_available: bool,
                               model_supports_flash: bool = True) -> str | None:
    """The `attn_implementation` to load with; None lets transformers decide (it picks sdpa where it can).

    "auto" on CUDA: FlashAttention-2 when the flash_attn package works there, the model class supports it and the
    dtype is fp16/bf16 (its kernels take nothing else), otherwise sdpa. On CPU, transformers' own choice.
    """
    if requested != "auto":
        return requested
    if not device.startswith("cuda"):
        return None
    if flash_available and model_supports_flash and dtype in (torch.float16, torch.bfloat16):
        return "flash_attention_2"
    return "sdpa"


def _flash_attn_available() -> bool:
    from transformers.utils import is_flash_attn_2_available

    return bool(is_flash_attn_2_available())


def _supports_flash(model_cls: Any, hf_config: Any) -> bool:
    """Whether the concrete model class for this config declares FlashAttention-2 support (True if unknown)."""
    try:
        concrete = model_cls._model_mapping[type(hf_config)]
    except (AttributeError, KeyError, ValueError):
        return True
    return bool(getattr(concrete, "_supports_flash_attn", True))


def _model_source(cfg: ModelConfig) -> str:
    """The folder to load, or a hub id to look up in the local cache only. ModelUnavailable when neither exists."""
    folder = cfg.resolved_path
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ModelUnavailable(f"Model folder {cfg.path!r} has no config.json; it is not a Hugging Face model.")
        return str(folder)
    if _HUB_ID.match(cfg.path) and not Path(cfg.path).expanduser().is_absolute():
        return cfg.path  # maybe a hub id already in the local Hugging Face cache; _load says so if it is not
    raise ModelUnavailable(_missing_message(cfg))


def _missing_message(cfg: ModelConfig) -> str:
    hint = " Build the embedded demo model with `python -m hunyuan_mt build-demo`." if cfg.path == "models/demo" else ""
    return (f"Model {cfg.path!r} was found neither as a folder nor in the local Hugging Face cache. Nothing is "
            "downloaded by this server: put the model folder there (config.json, tokenizer, *.safetensors) or set "
            f"model.path.{hint}")


def _resolved_key(cfg: ModelConfig) -> tuple[Any, ...]:
    folder = cfg.resolved_path
    where = str(folder.resolve()) if folder.is_dir() else cfg.path
    # The prompt style and the markup form are read by the backbone as it builds a row's input, the int8 kernel
    # decides the layers it loads, the key/value dtype every batch it makes: a configuration that asks for others
    # must not get one built for the first.
    return (where, cfg.arch, cfg.dtype, cfg.device, cfg.quantization, cfg.int8_kernel, cfg.kv_cache,
            cfg.attn_implementation, cfg.device_map, cfg.allow_pickle, cfg.trust_remote_code, cfg.prompt, cfg.markup,
            cfg.chat_template)


def load_backbone(cfg: ModelConfig) -> Backbone:
    """The process-wide backbone for this configuration, loading it on first use (invariant 1)."""
    global LOAD_COUNT
    key = _resolved_key(cfg)
    with _LOAD_LOCK:
        backbone = _INSTANCES.get(key)
        if backbone is None:
            backbone = Backbone._load(cfg)
            _INSTANCES[key] = backbone
            LOAD_COUNT += 1
        return backbone


def kernels_needed_at_load(cfg: ModelConfig) -> bool:
    """Whether loading this model needs our CPU kernels built first: 4-bit weights and a pinned qgemm are packed
    for them at load, and a model too large for the CPU's caches chooses its int8 kernel among them by timing them
    (`int8.kernel_for`). The demo needs them only for speed, so a server can build them in the background."""
    if cfg.quantization == "int4" or cfg.int8_kernel == "qgemm":
        return True
    if cfg.quantization not in ("int8", "auto"):
        return False
    return _larger_than_caches(cfg)


def _larger_than_caches(cfg: ModelConfig) -> bool:
    """Whether the model's int8 weights would exceed `int8.LARGE_MODEL_BYTES` (its decode steps bound by reading
    them), from the checkpoint's size on disk."""
    folder = cfg.resolved_path
    stored = sum(f.stat().st_size for f in folder.glob("*.safetensors")) if folder.is_dir() else 0
    # Half-precision checkpoints hold 2 bytes a weight, float32 ones 4: either way more than the int8 bound.
    return stored > 2 * int8.LARGE_MODEL_BYTES


def loaded_backbones() -> list[Backbone]:
    with _LOAD_LOCK:
        return list(_INSTANCES.values())


#: The `model.quantization` values that quantize the weights on the CPU after loading (not bitsandbytes).
CPU_QUANTIZATION = ("int8", "int4")


def resolve_quantization(cfg: ModelConfig, device: str, dtype: torch.dtype) -> tuple[str, str]:
    """`model.quantization` as it will run, and a note saying why when it was chosen for the user ("auto") or the
    user's choice will run slow. "auto" is int8 only on a CPU whose int8 GEMM beats float32 (`int8.gemm_speed`):
    the default profile's int8 decoded 14× slower than float32 on an AVX2-only CPU (BENCHMARKS.md)."""
    if cfg.quantization not in ("auto", "int8"):
        return cfg.quantization, ""
    unfit = ("int8 runs on the CPU only" if device != "cpu" else
             "int8 takes a float32 model" if dtype != torch.float32 else
             "this torch build has no CPU int8 GEMM (torch._int_mm or fbgemm)" if not int8.available() else None)
    if unfit is not None:
        # int8 asked for is refused, with its reason, by _quantization_config.
        return ("int8", "") if cfg.quantization == "int8" else ("none", f"auto: none ({unfit})")
    if cfg.int8_kernel == "auto" and int8.int8_fbgemm.available() and _larger_than_caches(cfg):
        # The small probe below times GEMMs that fit the caches: what decides the demo, not a model whose steps read
        # gigabytes (int8 reads a quarter of float32's bytes; its kernel is timed on such weights, `int8.kernel_for`).
        # Loading the 1.8B on an AVX2-only Zen 3, the probe once read fbgemm at 40× float32 and advised float32.
        return "int8", ("auto: int8 (a model larger than the CPU's caches: its steps read the weights, and int8 "
                        "reads a quarter of float32's bytes)" if cfg.quantization == "auto" else "")
    speed = int8_speed(cfg)
    if cfg.quantization == "auto":
        return ("int8", f"auto: int8 ({speed.describe()})") if speed.fast else \
            ("none", f"auto: float32 ({speed.describe()})")
    if speed.fast:
        return "int8", ""
    note = (f"int8 as configured, though {speed.describe()}: set model.quantization to auto or none for float32, "
            "which decodes faster here")
    log.warning("model.quantization: %s", note)
    return "int8", note


def int8_speed(cfg: ModelConfig) -> int8.GemmSpeed:
    """The int8 kernels timed against float32 on this CPU (once per process and thread count), with the kernel
    `model.int8_kernel` pins, if it pins one and this torch build has it."""
    speed = int8.gemm_speed(torch.get_num_threads())
    if cfg.int8_kernel == "auto":
        return speed
    have = {"fbgemm": int8.int8_fbgemm.available, "int_mm": int8.int_mm_available, "qgemm": int8_packed.available}
    if not have[cfg.int8_kernel]():
        where = "built here (a C++ compiler and ninja)" if cfg.int8_kernel == "qgemm" else "in this torch build"
        raise ConfigError(f"model.int8_kernel: {cfg.int8_kernel} is not {where}; set it to auto.")
    return replace(speed, pinned=cfg.int8_kernel)


def _quantization_config(cfg: ModelConfig, device: str, dtype: torch.dtype) -> Any:
    """bitsandbytes' config for 8bit/4bit (CUDA), None otherwise; int8 is checked here and applied after loading."""
    if cfg.quantization == "none":
        return None
    if cfg.quantization in CPU_QUANTIZATION:
        name = cfg.quantization
        if device != "cpu":
            raise ConfigError(f"model.quantization: {name} runs on the CPU; this profile runs on {device}. Use "
                              f"{'8bit' if name == 'int8' else '4bit'} (bitsandbytes) on CUDA, or none.")
        if dtype != torch.float32:
            raise ConfigError(f"model.quantization: {name} takes a float32 model (model.dtype: float32 or auto).")
        if name == "int8" and not int8.available():
            raise ConfigError("model.quantization: int8 needs torch._int_mm or fbgemm on the CPU, "
                              "which this torch build lacks; set model.quantization: none.")
        if name == "int4" and not int8_packed.available():
            raise ConfigError("model.quantization: int4 needs our qgemm kernel, which could not be built here (a C++ "
                              "compiler and ninja; the log says why); set model.quantization: int8.")
        return None
    if not device.startswith("cuda"):
        raise ConfigError(
            f"model.quantization: {cfg.quantization} needs a CUDA GPU (bitsandbytes); this machine runs on {device}. "
            "Set model.quantization: none."
        )
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ModelUnavailable(
            f"model.quantization: {cfg.quantization} needs the bitsandbytes package, which is not installed "
            "(pip install bitsandbytes)."
        ) from None
    from transformers import BitsAndBytesConfig

    if cfg.quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_type="nf4")


def _check_footprint(cfg: ModelConfig, folder: Path, hf_config: Any, dtype: torch.dtype) -> torch.dtype:
    """Refuse, with one line, a model the machine's memory cannot hold (footprint.py), and say which dtype to load
    in: a half-precision checkpoint headed for int8 is read in its own precision and quantized layer by layer,
    which halves the peak of loading it in float32 first (Hunyuan-MT-7B: ~15 instead of ~30 GB)."""
    import psutil

    # int4 is estimated as int8 (its 4-bit layers take a little over half): a start may be refused that would fit,
    # never admitted that would not.
    int8_weights = cfg.quantization in CPU_QUANTIZATION
    try:
        decoder_only = not getattr(hf_config, "is_encoder_decoder", False)
        found = footprint.check(folder, int8_weights, bool(getattr(hf_config, "tie_word_embeddings", False)),
                                decoder_only, psutil.virtual_memory().available, cfg.path)
    except MemoryError as exc:
        raise ModelUnavailable(str(exc)) from None
    if found is not None:
        log.info("%s: %s", cfg.path, found.describe())
    stored = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    stored = _DTYPES.get(str(stored).replace("torch.", ""), None) if stored is not None else None
    if int8_weights and dtype == torch.float32 and stored in (torch.bfloat16, torch.float16):
        return stored
    return dtype


def _ensure_chat_template(cfg: ModelConfig, tokenizer: Any) -> None:
    """A decoder-only model's prompt is its chat template's user turn: a folder without a template is refused in one
    line, unless the profile asks for the family's (`model.chat_template: family`), which is then logged. Served
    without one, every request got the bare instruction: no start token, no role markers."""
    if getattr(tokenizer, "chat_template", None):
        return
    family = prompts.recipe(cfg.prompt)
    if cfg.chat_template != "family":
        raise ModelUnavailable(
            f"Model {cfg.path!r} has no chat template: chat_template.jinja is missing from the folder (and "
            "tokenizer_config.json holds none). Copy chat_template.jinja from the model's repository into the folder, "
            f"or set model.chat_template: family to use the {family.name} family's (hunyuan_mt/text/prompts.py).")
    vocab = tokenizer.get_vocab()
    formats = [prompts.CHAT_FORMATS[name] for name in family.chat_formats]
    fits = [f for f in formats if all(marker in vocab for marker in f.markers)]
    if not fits:
        raise ModelUnavailable(
            f"Model {cfg.path!r} has no chat template (chat_template.jinja), and its tokenizer lacks the role tokens "
            f"of the {family.name} family's ({', '.join(f'{f.name}: ' + ' '.join(f.markers) for f in formats)}). "
            "Copy chat_template.jinja from the model's repository into the folder.")
    tokenizer.chat_template = fits[0].template
    log.warning("%s has no chat template (chat_template.jinja): using the %s family's %s chat format from "
                "hunyuan_mt/text/prompts.py (model.chat_template: family)", cfg.path, family.name, fits[0].name)


def _has_safetensors(source: str) -> bool:
    folder = Path(source)
    if not folder.is_dir():
        return True  # a hub id in the local cache: transformers checks use_safetensors itself
    return any(folder.glob("*.safetensors"))


def _inductor_cache() -> str:
    """Where the compiled step's packages are kept (decode/aot.py: beside torch's own cache, `kernels.compile_cache`:
    ~/.cache/hunyuan-mt/torchinductor unless TORCHINDUCTOR_CACHE_DIR names another)."""
    from ..decode.aot import cache_dir

    return str(cache_dir())


class Backbone:
    """The loaded model and tokenizer. The adapter cache wraps the model's target linears in slot layers
    (`lora`); the model object itself is never replaced."""

    def __init__(self, model: Any, tokenizer: Any, arch: str, device: str, dtype: torch.dtype, name: str,
                 cfg: ModelConfig, load_s: float, params: int | None = None) -> None:
        self.model = model
        #: The same model (kept for callers that predate the slot layers).
        self.base_model = model
        #: The slot layers, owned and installed by the adapter cache (None until a cache takes the backbone).
        self.lora: Any = None
        self.tokenizer = tokenizer
        self.arch = arch
        self.device = device
        self.dtype = dtype
        self.name = name
        self.cfg = cfg
        self.load_s = load_s
        #: Why `cfg.quantization` is what runs, when the service chose it ("auto") or warns about it.
        self.quantization_note = ""
        #: Which kernel multiplies the int8 weights ("int_mm" or "fbgemm"; int8.gemm_speed), None without them.
        self.int8_kernel: str | None = None
        self.warmup_ms: float | None = None
        #: `target_token_id` by language: the lookup goes through transformers' tokenizer `__getattr__`, which
        #: walks the class hierarchy for an absent attribute (~7 µs a row: encoding 600 rows took 5.8 ms, 1.5 ms
        #: with this); the tokenizer never changes under a backbone.
        self._target_ids: dict[str, int | None] = {}
        #: The compiled decode step and encoder every new batch uses (`compile_step`), or None: eager.
        self.compiled: Any = None
        self.spec = BackboneSpec.from_model(model)
        #: The model's parameters as loaded (int8/int4 layers keep their weights as buffers: `_load` counts first).
        self.param_count = params if params is not None else sum(p.numel() for p in model.parameters())
        #: The card this backbone's prompts, end tokens and sampling values follow (decoder-only models).
        self.recipe: prompts.Recipe | None = prompts.recipe(cfg.prompt) if arch == DECODER_ONLY else None
        #: Serialises forward passes with each other and with slot writes: the slot mapping is one per model, so
        #: two forwards, or a forward and an attach that grows the layers, must not overlap.
        self.model_lock = threading.RLock()
        #: Prompts to ids and back (thread-safe; see tokens.py). Tokenizing is safe beside a running generate.
        self.tokens = PromptTokens(tokenizer)
        self._target_prefix = self._detect_target_prefix()
        vocab = tokenizer.get_vocab() if self.recipe is not None else {}
        #: The family's end tokens this tokenizer has, beside the model's declared end-of-sequence ids.
        self._family_ends = tuple(vocab[t] for t in (self.recipe.end_tokens if self.recipe else ()) if t in vocab)
        #: Every token that ends a row; none of them is ever part of an output (`decode`), special or not.
        self.end_ids: frozenset[int] = self.picker(GenerationConfig()).eos
        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        #: Longest model input a row may have (tokens), or None when the model sets no limit. The engine checks
        #: rows against it so one over-long row fails alone instead of failing its batch inside `generate`.
        self.max_input_tokens: int | None = (
            None if not isinstance(positions, int) else (positions if arch == ENCODER_DECODER else positions - 1)
        )
        self._max_positions = positions if isinstance(positions, int) else None
        #: The decode loop's running batch for this model, or None with the reason (transformers' generate then).
        self.batch_class, self.batch_note = running_batch_class(model, arch)
        if self.batch_class is not None and issubclass(self.batch_class, LeanBatch):
            # int8 siblings the step multiplies as one (Q/K/V, gate/up) become one layer now, not a second copy
            # beside the model's at the first step (int8_layer.fuse_siblings).
            fuse_siblings(model, self.batch_class.FUSED)
        if self.batch_class is None:
            log.info("iteration-level decoding is not available for %s (%s); whole batches run through "
                     "transformers' generate", name, self.batch_note)

    # ------------------------------------------------------------------ loading

    @classmethod
    def load_uncached(cls, cfg: ModelConfig) -> Backbone:
        """A new, private backbone (not shared, not counted). For tests and baselines; the service uses
        `load_backbone`."""
        return cls._load(cfg)

    @classmethod
    def _load(cls, cfg: ModelConfig) -> Backbone:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

        t0 = time.perf_counter()
        device = resolve_device(cfg)
        dtype = resolve_dtype(cfg, device)
        if device == "cpu":
            threads = cfg.cpu_threads or cpu.default_threads()
            log.info("torch intra-op threads: %d (model.cpu_threads; OpenMP runtime: %s)", threads,
                     "Intel's (preloaded)" if cpu.intel_openmp_loaded() else "torch's libgomp")
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
        quantization, quantization_note = resolve_quantization(cfg, device, dtype)
        if quantization != cfg.quantization:
            log.info("model.quantization: %s", quantization_note)
        # From here on the configuration says what runs (the compiled step, info() and the metrics read it).
        cfg = replace(cfg, quantization=quantization)
        quant = _quantization_config(cfg, device, dtype)
        source = _model_source(cfg)
        common = {"local_files_only": True, "trust_remote_code": cfg.trust_remote_code}
        try:
            hf_config = AutoConfig.from_pretrained(source, **common)
        except OSError:
            raise ModelUnavailable(_missing_message(cfg)) from None
        except ValueError as exc:
            raise ModelUnavailable(f"Model {cfg.path!r} cannot be loaded: {str(exc).splitlines()[0][:200]}") from None
        arch = cfg.arch
        if arch == "auto":
            arch = ENCODER_DECODER if getattr(hf_config, "is_encoder_decoder", False) else DECODER_ONLY
        if not cfg.allow_pickle and not _has_safetensors(source):
            raise ModelUnavailable(
                f"Model {cfg.path!r} has no .safetensors weights; pickle checkpoints are refused unless "
                "model.allow_pickle is true."
            )
        load_dtype = dtype
        if device == "cpu" and Path(source).is_dir():
            load_dtype = _check_footprint(cfg, Path(source), hf_config, dtype)
        kwargs: dict[str, Any] = dict(common, dtype=load_dtype)
        kwargs["use_safetensors"] = None if cfg.allow_pickle else True
        model_cls = AutoModelForSeq2SeqLM if arch == ENCODER_DECODER else AutoModelForCausalLM
        flash = cfg.attn_implementation == "auto" and device.startswith("cuda") and _flash_attn_available()
        attn = choose_attn_implementation(cfg.attn_implementation, device, dtype, flash_available=flash,
                                          model_supports_flash=_supports_flash(model_cls, hf_config))
        if attn is not None:
            kwargs["attn_implementation"] = attn
        if quant is not None:
            kwargs["quantization_config"] = quant
            kwargs["device_map"] = cfg.device_map or {"": device}
        elif cfg.device_map:
            kwargs["device_map"] = cfg.device_map
        try:
            model = model_cls.from_pretrained(source, **kwargs)
            tokenizer = AutoTokenizer.from_pretrained(source, **common)
        except (OSError, ValueError) as exc:
            raise ModelUnavailable(
                f"Model {cfg.path!r} could not be loaded: {str(exc).splitlines()[0][:200]}"
            ) from None
        if arch == DECODER_ONLY:
            _ensure_chat_template(cfg, tokenizer)
        if "device_map" not in kwargs:
            model.to(device)
        model.eval()
        model.requires_grad_(False)
        # Counted before int8/int4 layers replace the linears (their weights are buffers, not parameters).
        params = model.num_parameters()
        kernel = None
        if cfg.quantization in CPU_QUANTIZATION:
            # The kernel configured, or the faster on this CPU (timed once per process); 4-bit weights: qgemm.
            linear_bytes = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
            bits = 4 if cfg.quantization == "int4" else 8
            kernel = "qgemm" if bits == 4 else int8.kernel_for(int8_speed(cfg), linear_bytes)
            int8.quantize_linears(model, kernel, bits)
            if arch == DECODER_ONLY:
                # The token table as int8 too (the tied output projection's own rows where it has them) or read
                # from the checkpoint file: in float32 it was a third of a 1.8B Hunyuan's resident memory
                # (quant/embedding.py).
                int8_embedding.quantize_embeddings(model, Path(source) if Path(source).is_dir() else None)
            if load_dtype != dtype:
                model.to(dtype)  # what stayed float (norms), after the linears left half precision
        tokenizer.padding_side = "left" if arch == DECODER_ONLY else "right"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        name = Path(source).name if Path(source).is_dir() else source
        backbone = cls(model, tokenizer, arch, device, dtype, name, cfg, load_s=0.0, params=params)
        backbone.quantization_note = quantization_note
        backbone.int8_kernel = kernel
        backbone.load_s = time.perf_counter() - t0
        heap.trim()   # the half-precision layers quantized and freed one by one stay resident otherwise (heap.py)
        log.info("backbone %s loaded: %s, %s, %s, attention %s, %.1fM params in %.2f s", name, arch, device,
                 str(dtype).replace("torch.", ""), backbone.info()["attn_implementation"], backbone.param_count / 1e6,
                 backbone.load_s)
        if cfg.warmup:
            backbone.warmup()
        return backbone

    def warmup(self) -> None:
        """One short generation so the first user request does not pay for lazy initialisation."""
        t0 = time.perf_counter()
        self.generate([PromptRow("Hello.", "en", "es")], [BASE_SLOT], GenerationConfig(), max_new_tokens=4)
        self.warmup_ms = (time.perf_counter() - t0) * 1000
        log.info("backbone warm-up generation took %.0f ms", self.warmup_ms)

    # ------------------------------------------------------------------ inputs

    def _detect_target_prefix(self) -> str | None:
        """How this tokenizer marks the target language: ">>{}<<" source prefix (Marian multi-target), or None."""
        vocab = self.tokenizer.get_vocab() if hasattr(self.tokenizer, "get_vocab") else {}
        if any(f">>{c}<<" in vocab for c in LANGUAGES):
            return ">>{}<<"
        return None

    def target_token_id(self, tgt: str) -> int | None:
        """The token that starts a target-language sentence (M2M100 `__es__`, NLLB `spa_Latn`), if the tokenizer
        defines one. It is forced as the first decoder token per row."""
        if self.arch != ENCODER_DECODER:
            return None
        if tgt not in self._target_ids:
            self._target_ids[tgt] = self._find_target_token(tgt)
        return self._target_ids[tgt]

    def _find_target_token(self, tgt: str) -> int | None:
        tok = self.tokenizer
        lang_map = getattr(tok, "lang_code_to_id", None)
        if isinstance(lang_map, dict):
            for code in (tgt, _NLLB.get(tgt, "")):
                if code in lang_map:
                    return int(lang_map[code])
        unk = tok.unk_token_id
        for token in (f"__{tgt}__", _NLLB.get(tgt)):
            if token:
                tid = tok.convert_tokens_to_ids(token)
                if isinstance(tid, int) and tid != unk and tid is not None:
                    return tid
        return None

    @property
    def markup_form(self) -> str:
        """How this backbone is shown a document's inline markup (inline.FORMS): the card's tags need a prompt."""
        form = self.cfg.markup_form
        return "sentinels" if form == "tags" and self.arch != DECODER_ONLY else form

    def read_output(self, output: str, text: str, markup: tuple[int, ...]) -> str:
        """The model's `output` for a row of `text` with the row's `markup` back as the reader's sentinels
        (inline.py)."""
        return inline.from_model(output, text, markup, self.markup_form)

    def prompt_text(self, row: PromptRow) -> str:
        """The exact string fed to the tokenizer for this row."""
        form = self.markup_form
        text = inline.to_model(row.text, row.markup, form)
        if self.arch == DECODER_ONLY:
            prompt = prompts.build(self.cfg.prompt, text, row.src, row.tgt, row.context, row.terms,
                                   formatted=form == "tags" and bool(row.markup))
            if getattr(self.tokenizer, "chat_template", None):
                # Each card's own code decides whether the prompt ends with the assistant's marker.
                assert self.recipe is not None
                return self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}], tokenize=False,
                    add_generation_prompt=self.recipe.add_generation_prompt,
                )
            return prompt
        if self._target_prefix:
            return f"{self._target_prefix.format(row.tgt)} {text}"
        return text

    def _encode(self, row: PromptRow) -> tuple[int, ...]:
        tok = self.tokenizer
        templated = self.arch == DECODER_ONLY and bool(getattr(tok, "chat_template", None))
        source = None
        if self.arch == ENCODER_DECODER and self.tokens.per_source:
            # NLLB/M2M tokenizers prefix the source-language token from `src_lang`; rows differ, so it is set per
            # row (by `tokens`, under its lock).
            source = next((code for code in (_NLLB.get(row.src), row.src)
                           if code and tok.convert_tokens_to_ids(code) != tok.unk_token_id), None)
        return self.tokens.ids(self.prompt_text(row), special=not templated, source=source)

    def encode(self, row: PromptRow) -> Encoded:
        """The row's model input. Thread-safe; callers tokenize in their own thread, off the decode loop."""
        ids = self._encode(row)
        if self.arch != ENCODER_DECODER:
            return Encoded(ids)
        start = self.model.config.decoder_start_token_id
        forced = self.target_token_id(row.tgt)
        return Encoded(ids, (start,) if forced is None else (start, forced))

    def prompt_lengths(self, rows: list[PromptRow]) -> list[int]:
        """Token count of each row's model input (the engine's token budget uses it). Does not wait for a
        running generate."""
        return [len(self._encode(r)) for r in rows]

    def fits(self, text: str, src: str, tgt: str, budget: int | None = None) -> bool:
        """Whether `text` as a segment of src→tgt stays within the model's input limit and `budget` tokens.
        Tokenizes only a text long enough to possibly exceed them (at most 4 tokens a character, byte fallback,
        plus the prompt's own)."""
        limits = [n for n in (self.max_input_tokens, budget) if n is not None]
        limit = min(limits) if limits else None
        if limit is None or len(text) * 4 + _PROMPT_TOKENS.get(self.arch, 96) < limit:
            return True
        return len(self._encode(PromptRow(text, src, tgt))) <= limit

    def check_length(self, encoded: Encoded) -> None:
        """InputTooLarge when the row is longer than the model's input limit (quoting both numbers)."""
        if self.max_input_tokens is not None and encoded.tokens > self.max_input_tokens:
            raise InputTooLarge(f"A segment of {encoded.tokens} tokens is longer than this model's limit of "
                                f"{self.max_input_tokens} tokens; split the text into shorter segments.")

    def max_new_tokens(self, encoded: Encoded, requested: int) -> int:
        """`requested`, capped so the row's positions stay inside the model's position table. Depends on the
        row alone, never on its batch."""
        if self._max_positions is None:
            return max(1, requested)
        used = len(encoded.decoder_prefix) if self.arch == ENCODER_DECODER else encoded.tokens
        return max(1, min(requested, self._max_positions - used))

    def decode(self, token_ids: list[int]) -> str:
        """A row's generated ids as text: up to its first end token, which is never printed (a family's end
        token need not be a special token the tokenizer leaves out)."""
        ids = list(token_ids)
        end = next((i for i, t in enumerate(ids) if t in self.end_ids), len(ids))
        return self.tokens.text(ids[:end])

    # ------------------------------------------------------------------ generation

    def generation(self, gen: GenerationConfig) -> GenerationConfig:
        """`gen` with every value set: the profile's own, else the family card's when sampling (prompts.py)."""
        return gen.resolved(self.recipe.sampling if self.recipe is not None else None)

    def picker(self, gen: GenerationConfig) -> TokenPicker:
        return TokenPicker.for_model(self.model, self.generation(gen), self.tokenizer.eos_token_id,
                                     encoder_decoder=self.arch == ENCODER_DECODER, ends=self._family_ends)

    def new_batch(self, gen: GenerationConfig, static: StaticCache | None = None) -> RunningBatch | None:
        """An empty running batch for the decode loop, or None when this model or `gen` needs transformers'
        `generate` (beam search; see `batch_note`). `static` asks for the preallocated cache (decoder-only; see
        `static_cache_note`). Its forwards must run under `model_lock`."""
        if self.batch_class is None or gen.num_beams > 1:
            return None
        pad = self.tokenizer.pad_token_id
        args = (self.model, None if self.lora is None else self.lora.mapping, self.picker(gen),
                torch.device(self.device), pad if pad is not None else 0)
        if static is not None and self.static_cache_note(static) is None:
            graphs = static.cuda_graphs and self.device.startswith("cuda")
            return StaticCausalBatch(*args, capacity=static.rows, max_len=static.max_len, dtype=self.dtype,
                                     graphs=graphs)
        batch = self.batch_class(*args)
        if isinstance(batch, LeanBatch):
            batch.kv_dtype = self.kv_cache_dtype()
            if self.compiled is not None:
                batch.compiled = self.compiled[0]
                if isinstance(batch, MarianBatch):
                    batch.compiled_encoder = self.compiled[1]
        return batch

    def kv_cache_dtype(self) -> torch.dtype | None:
        """The dtype a lean batch (Marian, Llama-shaped) keeps its attention keys/values in (`model.kv_cache`);
        None: the model's."""
        mode = self.cfg.kv_cache
        lean = self.batch_class is not None and issubclass(self.batch_class, LeanBatch)
        if mode == "float32" or not lean or not self.device.startswith("cpu"):
            return None
        if mode == "auto" and (self.cfg.quantization not in CPU_QUANTIZATION or kernels.decode_attention() is None):
            return None
        return torch.float16

    def compile_note(self) -> str | None:
        """None when `compile_step` applies to this backbone, else why not."""
        if not self.device.startswith("cpu"):
            return f"the compiled step is built and measured for the CPU; this backbone runs on {self.device}"
        if self.batch_class is None or not issubclass(self.batch_class, LeanBatch):
            return f"{self.name} has no lean decode step to compile ({self.batch_note or 'its own forward runs'})"
        if self.cfg.quantization not in ("int8", "none") or (self.cfg.quantization == "none"
                                                              and self.dtype != torch.float32):
            return (f"the compiled step is built for int8 and float32 weights (model.quantization "
                    f"{self.cfg.quantization}, {self.dtype})")
        if self.int8_kernel == "qgemm":
            # At the sizes qgemm is chosen for, its GEMMs are the step and there is nothing for the compiler to fuse
            # (the 1.8B compiled with fbgemm: 156 s to compile, the same speed; BENCHMARKS.md).
            return "the compiled step is not built for the qgemm kernel (the GEMMs are the step at its sizes)"
        return None

    def compile_step(self, build: bool = True) -> bool:
        """Run every later batch's decode step (and a Marian model's encoder) compiled (decode/compiled.py) and warm
        them up now: the first calls compile (the caller waits; logged). False, with the reason logged, where it
        does not apply or the decode step failed to compile (decoding stays eager).

        `build=False` only loads packages already on disk (another process built them: prebuild.py), and a missing
        one leaves decoding eager: a serving process must not compile for minutes in its decode thread."""
        note = self.compile_note()
        if note is not None:
            log.info("model.compile: not applied (%s)", note)
            return False
        from ..decode.compiled import CompiledEncoder, CompiledLlamaStep, CompiledStep

        if self.compiled is None or not build or not all(c.active for c in self.compiled if c is not None):
            # Float32 weights are frozen into the packages, where inductor packs them for oneDNN as the eager step
            # does (decode/dense.py): as inputs, a compiled step would multiply them unpacked, slower than eager.
            # int8 weights stay inputs (their GEMM, torch._int_mm, packs nothing).
            freeze = self.cfg.quantization == "none"
            compiled = ((CompiledStep(freeze, build), CompiledEncoder(freeze, build))
                        if self.batch_class is MarianBatch else (CompiledLlamaStep(freeze, build), None))
        else:
            compiled = self.compiled
        if build:
            log.info("compiling the decode step%s for this CPU (model.compile; the first start takes minutes on 2 "
                     "cores, later starts read the compiled packages in %s)",
                     " and encoder" if compiled[1] is not None else "", _inductor_cache())
        t0 = time.perf_counter()
        with self.model_lock:
            # New batches take the compiled step from here on: set with the model lock held, so that no batch is
            # being made meanwhile; the warm-up below runs before any other forward can.
            self.compiled = compiled
            # One row (run beside a padding row) and then three: the second call must find the same graph.
            self.generate([PromptRow("Hello.", "en", "es")], [BASE_SLOT], GenerationConfig(), max_new_tokens=4)
            self.generate([PromptRow(t, "en", "es") for t in ("Open the file.", "Save.", "Close the window now.")],
                          [BASE_SLOT] * 3, GenerationConfig(), max_new_tokens=6)
        step, encoder = compiled
        if not step.active:
            return False
        log.info("decode step %s and warm in %.1f s%s", "compiled" if build else "loaded",
                 time.perf_counter() - t0,
                 "" if encoder is None or encoder.active else " (the encoder runs eagerly: it failed to compile)")
        return True

    def static_cache_note(self, static: StaticCache) -> str | None:
        """None when the preallocated cache can serve this model, else why not."""
        if self.batch_class not in (CausalBatch, LlamaBatch):
            return f"{self.name} is not a decoder-only model the decode loop drives"
        attn = getattr(self.model.config, "_attn_implementation", None)
        if attn not in (None, "sdpa", "eager"):
            return f"attention {attn} takes no 4D mask (the static cache needs sdpa or eager)"
        return None

    def generate(self, rows: list[PromptRow], slots: list[int], gen: GenerationConfig,
                 max_new_tokens: int, **extra: Any) -> list[str]:
        """Translate `rows` as one batch, row i with the adapter in slot `slots[i]` (0: the bare backbone).

        Runs the decode loop when the model has one and `extra` is empty; else transformers' `generate` with
        `extra` passed on (the engine's light mode passes a quantized KV cache setting). Thread-safe.
        """
        if len(rows) != len(slots):
            raise ValueError(f"{len(rows)} rows but {len(slots)} slots")
        if not rows:
            return []
        capacity = 0 if self.lora is None else self.lora.capacity
        wrong = sorted({s for s in slots if not 0 <= s <= capacity})
        if wrong:
            raise ValueError(f"slot {wrong[0]} does not exist: this backbone has {capacity} adapter slots")
        encoded = [self.encode(r) for r in rows]
        for e in encoded:
            self.check_length(e)
        batch = None if extra else self.new_batch(gen)
        if batch is None:
            return self._hf_generate(encoded, list(slots), gen, max_new_tokens, **extra)
        out: dict[int, list[int]] = {}
        with self.model_lock, torch.inference_mode():
            batch.add([Sequence(i, e.input_ids, slot, self.max_new_tokens(e, max_new_tokens), e.decoder_prefix)
                       for i, (e, slot) in enumerate(zip(encoded, slots))])
            while True:
                for row in batch.pop_finished():
                    out[row.seq.tag] = row.generated
                if not len(batch):
                    break
                batch.step()
        return [self.decode(out[i]) for i in range(len(rows))]

    def nbest(self, rows: list[PromptRow], slots: list[int], gen: GenerationConfig, max_new_tokens: int,
              n: int) -> list[list[str]]:
        """The `n` best translations of each row (beam search with n beams), best first. Runs transformers'
        generate under the model lock: the decode loop waits for it."""
        if n < 1:
            raise ValueError("n must be at least 1")
        encoded = [self.encode(r) for r in rows]
        for e in encoded:
            self.check_length(e)
        beams = GenerationConfig(num_beams=max(n, gen.num_beams),
                                 repetition_penalty=self.generation(gen).repetition_penalty)
        flat = self._hf_generate(encoded, list(slots), beams, max_new_tokens, num_return_sequences=n)
        return [flat[i * n:(i + 1) * n] for i in range(len(rows))]

    def _hf_generate(self, encoded: list[Encoded], slots: list[int], gen: GenerationConfig, max_new_tokens: int,
                     **extra: Any) -> list[str]:
        """One transformers `generate` over the batch, the slot mapping set for its rows (beam search repeats
        each row; the mapping follows). With `num_return_sequences` in `extra`, each row's sequences follow one
        another in the result."""
        per_row = int(extra.get("num_return_sequences", 1))
        prefixes = {e.decoder_prefix for e in encoded}
        if len(prefixes) > 1:
            # Rows with and without a target-language token need different decoder prefixes; run them apart so
            # each row's output stays what it would be alone.
            out: list[str] = [""] * (len(encoded) * per_row)
            for prefix in prefixes:
                group = [i for i, e in enumerate(encoded) if e.decoder_prefix == prefix]
                texts = self._hf_generate([encoded[i] for i in group], [slots[i] for i in group], gen,
                                          max_new_tokens, **extra)
                for j, i in enumerate(group):
                    out[i * per_row:(i + 1) * per_row] = texts[j * per_row:(j + 1) * per_row]
            return out
        tok = self.tokenizer
        with self.tokens.lock:
            batch = tok.pad([{"input_ids": list(e.input_ids)} for e in encoded], padding=True, return_tensors="pt")
        batch = {k: v.to(self.device) for k, v in batch.items()}
        if self._max_positions is not None:
            # Learned/sinusoidal position tables end at max_positions: never generate past them.
            room = self._max_positions - (2 if self.arch == ENCODER_DECODER else batch["input_ids"].shape[1])
            max_new_tokens = max(1, min(max_new_tokens, room))
        kwargs = self._generation_kwargs(gen, max_new_tokens)
        kwargs.update(extra)
        prefix = encoded[0].decoder_prefix
        if self.arch == ENCODER_DECODER:
            if len(prefix) > 1:
                # The target token as the second decoder input (all rows here share the prefix).
                batch["decoder_input_ids"] = torch.tensor([list(prefix)] * len(encoded), device=self.device)
            prefix_len = len(prefix)
        else:
            prefix_len = batch["input_ids"].shape[1]
        mapping = self.lora.mapping if self.lora is not None else None
        with self.model_lock, torch.inference_mode():
            if mapping is not None:
                mapping.set(slots)
            out = self.model.generate(**batch, **kwargs)
        return [self.decode(row) for row in out[:, prefix_len:].tolist()]

    def _generation_kwargs(self, gen: GenerationConfig, max_new_tokens: int) -> dict[str, Any]:
        gen = self.generation(gen)
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "num_beams": gen.num_beams,
            "do_sample": gen.do_sample,
            "repetition_penalty": gen.repetition_penalty,
            "pad_token_id": self.tokenizer.pad_token_id,
        }
        if self.end_ids:
            # The family's end tokens end a row here as in the decode loop (TokenPicker.eos).
            kwargs["eos_token_id"] = sorted(self.end_ids)
        if gen.do_sample:
            kwargs.update(temperature=gen.temperature, top_p=gen.top_p, top_k=gen.top_k)
        else:
            # Explicit, so a checkpoint's sampling defaults (Hunyuan-MT ships some) do not leak into greedy runs.
            kwargs.update(temperature=None, top_p=None, top_k=None)
        return kwargs

    # ------------------------------------------------------------------ info

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "arch": self.arch,
            "device": self.device,
            "dtype": str(self.dtype).replace("torch.", ""),
            "quantization": self.cfg.quantization,
            **({"int8_kernel": self.int8_kernel} if self.int8_kernel else {}),
            **({"kv_cache": str(kv).replace("torch.", "")} if (kv := self.kv_cache_dtype()) is not None else {}),
            **({"quantization_note": self.quantization_note} if self.quantization_note else {}),
            "attn_implementation": getattr(getattr(self.base_model, "config", None), "_attn_implementation", None),
            "params": self.param_count,
            "load_s": round(self.load_s, 3),
            "warmup_ms": None if self.warmup_ms is None else round(self.warmup_ms, 1),
        }
