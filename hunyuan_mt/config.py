"""Typed settings: YAML file, then `HMT_*` environment variables, then CLI overrides.

Precedence (later wins): dataclass defaults < `configs/<name>.yaml` < env `HMT_SECTION__KEY=value`
< CLI `--set section.key=value` (and the dedicated flags of `app.py`, which become such overrides).

Every value is checked against the field's type and the section's `__post_init__`; a bad value raises one
`ConfigError` naming the dotted key, e.g. ``cache.slots: expected an integer >= 1, got 0``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from .text import prompts
from .errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = PROJECT_ROOT / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"

_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


def project_path(value: str) -> Path:
    """A configured folder: `~` expanded, relative paths under the project folder."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else PROJECT_ROOT / p


def _check(ok: bool, key: str, expected: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{key}: expected {expected}, got {value!r}")


@dataclass
class ModelConfig:
    #: Folder with config.json, tokenizer and safetensors weights. Relative paths resolve from the project root.
    path: str = "models/demo"
    #: "auto" reads the model's own config (is_encoder_decoder); or force "decoder-only" / "encoder-decoder".
    arch: str = "auto"
    #: "auto" → bfloat16 on CUDA, float32 on CPU.
    dtype: str = "auto"
    #: "auto" → cuda:0 when available, else cpu.
    device: str = "auto"
    #: "none"; "int8": int8 weights with per-row scales on the CPU (activations per token; hunyuan_mt/quant/int8.py,
    #: quant/fbgemm.py; LoRA on top); "int4": 4-bit weights on the CPU, a scale per 128 inputs, through our qgemm
    #: kernel (quant/packed.py: half int8's bytes, so a large model decodes faster; rounded without calibration);
    #: "auto": int8 where this CPU runs an int8 GEMM faster than float32 (timed at load), else none; "8bit" or
    #: "4bit": bitsandbytes on CUDA.
    quantization: str = "none"
    #: Which GEMM multiplies int8 weights: "int_mm" (torch._int_mm; fast with AVX-512, a plain loop on AVX2 alone),
    #: "fbgemm" (built for AVX2; 7-bit weights), "qgemm" (ours, kernels/qgemm.cpp; 7-bit weights; for models too
    #: large for the caches), or "auto": the faster here (int8.kernel_for).
    int8_kernel: str = "auto"
    #: "auto": flash_attention_2 on CUDA when flash_attn works and the dtype is fp16/bf16, else sdpa; on CPU
    #: transformers picks. Or "sdpa", "flash_attention_2", "eager".
    attn_implementation: str = "auto"
    #: accelerate device map for multi-GPU ("auto", "balanced", ...) or None for a single device.
    device_map: str | None = None
    #: Off by default: loading .bin/.pt pickles can execute code.
    allow_pickle: bool = False
    trust_remote_code: bool = False
    #: Refuse to start unless CUDA is present (the GPU profiles set this).
    require_cuda: bool = False
    #: Run a short generation at start so the first user request is not the slow one.
    warmup: bool = True
    #: torch's intra-op threads when the model runs on the CPU. 0: every core when Intel's OpenMP runtime is loaded
    #: (./start.sh preloads it), else one less than the cores, since torch's own libgomp makes a second thread
    #: cost more than it gives in the engine's thread (hunyuan_mt/host/cpu.py, BENCHMARKS.md).
    cpu_threads: int = 0
    #: Compile the decode step and encoder ahead of time (decode/compiled.py, decode/aot.py; CPU, lean steps, int8
    #: or float32 weights). "auto": when the service warms up, in the background (prebuild.py: the eager step serves
    #: from the start and the engine switches once the packages are built, ~150 s the first time on 2 cores; later
    #: starts load them in about a second); true: before the service serves anything, also without warm-up
    #: (benchmarks of the compiled step); false: eager.
    compile: str = "auto"
    #: What a Marian decode step keeps its attention keys and values in on the CPU: "float16" halves what every step
    #: reads (its attention is bound by memory; kernels/), "float32" keeps the model's precision, "auto": float16
    #: where the weights are int8 (already rounded more coarsely than that) and the attention kernel is built, else
    #: the model's dtype.
    kv_cache: str = "auto"
    #: The family whose card a decoder-only model's prompt follows (prompts.RECIPES): "hunyuan-mt" (Hunyuan-MT-7B's
    #: card), "hy-mt1.5" (HY-MT1.5's) or "hy-mt2" (Hy-MT2's): templates, the end of the chat template, end tokens,
    #: sampling values. Encoder-decoder models take no prompt.
    prompt: str = "hunyuan-mt"
    #: Where a decoder-only model's chat template comes from: "folder" (its own, chat_template.jinja or
    #: tokenizer_config.json; a folder without one is refused at start), or "family": the folder's own, else the
    #: family's from prompts.CHAT_FORMATS, logged at start.
    chat_template: str = "folder"
    #: How a document's inline markup reaches the model (inline.py): "sentinels" (as the reader wrote them),
    #: "spaced" (markup sentinels set apart from the words beside them, the source's spacing put back: the demo,
    #: trained so), "tags" (the HY-MT1.5 card's formatted-translation template, `<s1>…</s1>`), or "auto": "tags"
    #: under a family whose own card has that template (hy-mt1.5), else "sentinels".
    markup: str = "auto"

    @property
    def markup_form(self) -> str:
        """`markup` with "auto" resolved (inline.FORMS)."""
        if self.markup != "auto":
            return self.markup
        family = prompts.RECIPES[self.prompt]
        own = family.chinese.formatted is not None and "formatted" not in family.borrowed
        return "tags" if own else "sentinels"

    def __post_init__(self) -> None:
        # YAML reads on/off/true/false as booleans; environment variables and --set give strings.
        if isinstance(self.compile, bool):
            self.compile = "on" if self.compile else "off"
        elif isinstance(self.compile, str):
            self.compile = {"true": "on", "yes": "on", "1": "on", "false": "off", "no": "off",
                            "0": "off"}.get(self.compile.lower(), self.compile.lower())
        _check(self.compile in ("auto", "on", "off"), "model.compile", "one of auto, true, false", self.compile)
        _check(self.arch in ("auto", "decoder-only", "encoder-decoder"), "model.arch",
               "one of auto, decoder-only, encoder-decoder", self.arch)
        _check(self.dtype in ("auto", "float32", "bfloat16", "float16"), "model.dtype",
               "one of auto, float32, bfloat16, float16", self.dtype)
        _check(bool(_DEVICE.match(self.device)), "model.device", "auto, cpu, cuda or cuda:N", self.device)
        _check(self.quantization in ("none", "auto", "int8", "int4", "8bit", "4bit"), "model.quantization",
               "one of none, auto, int8, int4, 8bit, 4bit", self.quantization)
        _check(self.int8_kernel in ("auto", "int_mm", "fbgemm", "qgemm"), "model.int8_kernel",
               "one of auto, int_mm, fbgemm, qgemm", self.int8_kernel)
        _check(self.kv_cache in ("auto", "float32", "float16"), "model.kv_cache", "one of auto, float32, float16",
               self.kv_cache)
        _check(self.prompt in prompts.STYLES, "model.prompt", f"one of {', '.join(prompts.STYLES)}", self.prompt)
        _check(self.chat_template in ("folder", "family"), "model.chat_template", "one of folder, family",
               self.chat_template)
        _check(self.markup in ("auto", "sentinels", "spaced", "tags"), "model.markup",
               "one of auto, sentinels, spaced, tags", self.markup)
        family = prompts.RECIPES[self.prompt]
        _check(self.markup != "tags" or family.chinese.formatted is not None, "model.markup",
               f"auto, sentinels or spaced ({family.card} has no formatted-translation template)", self.markup)
        _check(self.attn_implementation in ("auto", "sdpa", "flash_attention_2", "eager"),
               "model.attn_implementation", "one of auto, sdpa, flash_attention_2, eager", self.attn_implementation)
        _check(isinstance(self.cpu_threads, int) and self.cpu_threads >= 0, "model.cpu_threads", "an integer >= 0",
               self.cpu_threads)

    @property
    def resolved_path(self) -> Path:
        p = Path(self.path).expanduser()
        return p if p.is_absolute() else PROJECT_ROOT / p


@dataclass
class CacheConfig:
    #: Folder of PEFT LoRA adapters, one per direction, named <src>2<tgt>.
    adapters_dir: str = "adapters"
    #: Non-pinned adapters attached at once.
    slots: int = 3
    #: Pairs attached at start, never evicted, not counted in `slots` (e.g. ["en2es", "es2en"]).
    pinned: list[str] = field(default_factory=list)
    #: Evicted adapters kept as host-RAM state dicts, so re-attaching skips the disk.
    ram_tier: int = 8
    #: How long a request waits for a slot when every slot is leased, before `Busy`.
    lease_timeout_s: float = 10.0
    #: How long a failed load is remembered (fails fast) before it is tried again.
    failure_ttl_s: float = 30.0
    #: Memory the slot layers may take for LRU slots beyond `slots` (MB; 0: exactly `slots`). While memory allows,
    #: as many more adapters stay attached as this budget holds (never more than the registered adapters), so rows
    #: of more pairs share a step; under memory pressure (light mode) new pairs go only to the first `slots`.
    slot_budget_mb: float = 0.0
    #: What the slot layers keep adapters in: "auto" (the model's dtype), "float32" or "bfloat16". bfloat16 halves
    #: the slots' memory (an r=16 q/k/v/o adapter of HY-MT1.5-1.8B: 26.8 → 13.4 MB) and rounds each weight to 8
    #: bits of mantissa, as a server that keeps LoRA in a bfloat16 model's dtype does; the LoRA products of the lean
    #: steps still run in float32 (lora/grouped.py).
    slot_dtype: str = "auto"

    def __post_init__(self) -> None:
        _check(isinstance(self.slots, int) and self.slots >= 1, "cache.slots", "an integer >= 1", self.slots)
        _check(self.slot_dtype in ("auto", "float32", "bfloat16"), "cache.slot_dtype",
               "one of auto, float32, bfloat16", self.slot_dtype)
        _check(isinstance(self.ram_tier, int) and self.ram_tier >= 0, "cache.ram_tier", "an integer >= 0",
               self.ram_tier)
        _check(self.lease_timeout_s > 0, "cache.lease_timeout_s", "a number > 0", self.lease_timeout_s)
        _check(self.failure_ttl_s >= 0, "cache.failure_ttl_s", "a number >= 0", self.failure_ttl_s)
        _check(isinstance(self.slot_budget_mb, (int, float)) and self.slot_budget_mb >= 0, "cache.slot_budget_mb",
               "a number >= 0", self.slot_budget_mb)
        _check(len(set(self.pinned)) == len(self.pinned), "cache.pinned", "distinct pairs", self.pinned)

    @property
    def resolved_dir(self) -> Path:
        return project_path(self.adapters_dir)


@dataclass
class RoutingConfig:
    #: Language used for two-hop routes when no direct adapter exists.
    pivot: str = "zh"
    #: Whether the bare backbone may translate a pair that has no adapter and no pivot route.
    allow_base: bool = False
    #: Languages the auto-detector chooses among: "model" (those with adapters) or "all" (the whole table).
    detect_among: str = "model"
    #: Whether this service detects languages itself (source "auto", /detect). serve-ray turns it off on the
    #: replicas of every group but the long tail, which its ingress asks for every detection: each of them is then
    #: spared the detector's helper process (lingua's models: ~420 MB resident, ~5 s of a core to load).
    detect: bool = True

    def __post_init__(self) -> None:
        _check(self.detect_among in ("model", "all"), "routing.detect_among", "model or all", self.detect_among)
        _check(isinstance(self.detect, bool), "routing.detect", "true or false", self.detect)


@dataclass
class LimitsConfig:
    max_chars: int = 5000
    max_batch_items: int = 64
    max_new_tokens: int = 256
    max_file_bytes: int = 10 * 1024 * 1024
    max_doc_chars: int = 200_000
    max_segments: int = 5000
    #: Decompressed-size cap for zip containers (docx), against zip bombs.
    max_unzipped_bytes: int = 100 * 1024 * 1024
    #: Documents are read and written in helper processes (documents/parsers.py), where a parse that runs past
    #: `parse_timeout_s` seconds, or whose client left, is stopped. `parse_workers` is how many may work at once;
    #: 0 reads them in the server's process, with no deadline (debugging only).
    parse_timeout_s: float = 15.0
    parse_workers: int = 2
    #: Most alternative translations one request may ask for (LibreTranslate's `alternatives`); 0 turns them off.
    #: Each costs a beam of the search that finds them.
    max_alternatives: int = 3
    #: A row generates at most this × its input tokens + output_slack_tokens (and never over max_new_tokens):
    #: a model that does not stop cannot run to the limit on a short segment. 0 turns the relative cap off.
    max_output_ratio: float = 3.0
    output_slack_tokens: int = 16
    #: A unit of up to 8 tokens repeated this many times (over 8 tokens at least) at the end of an output stops
    #: the row, and the unit is kept once ("de vez de vez de vez …" → "de vez"); 0 turns the guard off.
    loop_repeats: int = 3
    #: Under that span, a short unit said twice ("ha ha", "Fi-Fi") may not begin a third copy: its first token is
    #: forbidden for the next step and the row goes on (decode/guard.py). Off with the guard too.
    loop_stutter: bool = True

    def __post_init__(self) -> None:
        for name in ("max_chars", "max_batch_items", "max_new_tokens", "max_file_bytes", "max_doc_chars",
                     "max_segments", "max_unzipped_bytes"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 1, f"limits.{name}", "an integer >= 1", value)
        _check(isinstance(self.parse_timeout_s, (int, float)) and self.parse_timeout_s > 0, "limits.parse_timeout_s",
               "a number of seconds > 0", self.parse_timeout_s)
        _check(isinstance(self.parse_workers, int) and self.parse_workers >= 0, "limits.parse_workers",
               "an integer >= 0 (0: read documents in the server's process, with no deadline)", self.parse_workers)
        _check(isinstance(self.max_alternatives, int) and self.max_alternatives >= 0, "limits.max_alternatives",
               "an integer >= 0", self.max_alternatives)
        _check(isinstance(self.max_output_ratio, (int, float)) and self.max_output_ratio >= 0,
               "limits.max_output_ratio", "a number >= 0 (0: off)", self.max_output_ratio)
        _check(isinstance(self.output_slack_tokens, int) and self.output_slack_tokens >= 0,
               "limits.output_slack_tokens", "an integer >= 0", self.output_slack_tokens)
        _check(isinstance(self.loop_repeats, int) and (self.loop_repeats == 0 or self.loop_repeats >= 2),
               "limits.loop_repeats", "0 (off) or an integer >= 2", self.loop_repeats)
        _check(isinstance(self.loop_stutter, bool), "limits.loop_stutter", "true or false", self.loop_stutter)


@dataclass
class GenerationConfig:
    num_beams: int = 1
    #: Greedy keeps outputs reproducible and batch-independent, which the invariants need. With do_sample, every
    #: value below the config leaves unset is the model family's card's (prompts.RECIPES: temperature 0.7, top_p
    #: 0.6, top_k 20, repetition_penalty 1.05 for the Hunyuan families), or transformers' neutral one for a model
    #: without a family (an encoder-decoder). Greedy leaves repetition_penalty at 1.0 unless it is set.
    do_sample: bool = False
    repetition_penalty: float | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None

    def __post_init__(self) -> None:
        _check(isinstance(self.num_beams, int) and self.num_beams >= 1, "generation.num_beams", "an integer >= 1",
               self.num_beams)
        _check(self.repetition_penalty is None or self.repetition_penalty > 0, "generation.repetition_penalty",
               "a number > 0", self.repetition_penalty)
        _check(self.temperature is None or self.temperature > 0, "generation.temperature", "a number > 0",
               self.temperature)
        _check(self.top_p is None or 0 < self.top_p <= 1, "generation.top_p", "a number in (0, 1]", self.top_p)
        _check(self.top_k is None or self.top_k >= 0, "generation.top_k", "an integer >= 0 (0: off)", self.top_k)

    def resolved(self, card: prompts.Sampling | None) -> GenerationConfig:
        """Every value set: the config's own, else (sampling) the card's, else transformers' neutral one."""
        card = card if self.do_sample else None

        def pick(name: str, neutral: float) -> Any:
            own = getattr(self, name)
            return own if own is not None else getattr(card, name) if card is not None else neutral

        return dataclasses.replace(self, repetition_penalty=pick("repetition_penalty", 1.0),
                                   temperature=pick("temperature", 1.0), top_p=pick("top_p", 1.0),
                                   top_k=pick("top_k", 50))


@dataclass
class EngineConfig:
    #: On an idle engine, how long the first forward may wait for rows that callers are still tokenizing (only
    #: while a submit is in progress; a lone request starts at once).
    max_wait_ms: float = 5.0
    max_rows: int = 32
    #: Token budget of one batch (rows × padded input length).
    max_tokens: int = 8192
    #: A row may be passed over this many times (its pair had no free slot) before it blocks new pairs.
    fairness_max_skips: int = 4
    #: Split long inputs into sentences and translate them as separate rows.
    split_sentences: bool = True
    #: While rows decode, waiting rows are prefilled together once they number this share of the live rows...
    join_ratio: float = 0.5
    #: ...or once one of them has waited this many decode steps (0: every waiting row joins at the next step).
    max_join_steps: int = 4
    #: With more rows waiting than the batch has room for (a backlog), they join once this many fit, not one by
    #: one as rows finish: every join is a prefill forward and a cache copy of its own.
    join_min_rows: int = 8
    #: KV cache of the decode loop: "dynamic" (grows and shrinks with the rows), "static" (preallocated for
    #: max_rows rows of max_seq_len tokens; decoder-only models with sdpa/eager attention) or "auto" (static on
    #: CUDA for decoder-only models, dynamic otherwise).
    kv_cache: str = "auto"
    #: Static cache: tokens per row (prompt + new tokens). A longer prompt is refused; new tokens are capped.
    max_seq_len: int = 1024
    #: Static cache on CUDA: capture decode steps as CUDA graphs (per batch-size bucket; eager where capture fails).
    cuda_graphs: bool = True
    #: Document rows yield to interactive ones: they enter after them, and give up their places in a full batch.
    #: Off, they queue like any row (what bench.live_traffic compares against).
    documents_yield: bool = True
    #: While interactive rows run or wait, at most this many document rows share their batch (the others wait, or
    #: go back to the queue): a step's cost grows with its rows.
    background_rows: int = 2
    #: Document rows enter at most this many a prefill, so an interactive row that arrives meanwhile waits for a
    #: small forward, not for the whole batch's refill.
    background_prefill_rows: int = 4
    #: Decoder-only models on the lean step (`decode/llama.py`): padded tokens per prefill forward, for a group of
    #: entering rows or a piece of a longer prompt; the live rows decode a step between two of them, so a long
    #: prompt stalls them a piece at a time. "auto": 128 on a wide model (hidden ≥ 1024), every entering row in
    #: one forward on a smaller one; "off": every prefill in one forward; a number ≥ 16, rounded up to a whole
    #: block of 16.
    prefill_chunk_tokens: str = "auto"

    @property
    def prefill_chunk(self) -> int | None | str:
        """`prefill_chunk_tokens` as the decode loop takes it: "auto", None (off) or whole blocks of tokens."""
        value = self.prefill_chunk_tokens
        return value if value == "auto" else None if value == "off" else -(-int(value) // 16) * 16

    def __post_init__(self) -> None:
        _check(self.max_wait_ms >= 0, "engine.max_wait_ms", "a number >= 0", self.max_wait_ms)
        _check(isinstance(self.max_rows, int) and self.max_rows >= 1, "engine.max_rows", "an integer >= 1",
               self.max_rows)
        _check(isinstance(self.max_tokens, int) and self.max_tokens >= 16, "engine.max_tokens", "an integer >= 16",
               self.max_tokens)
        _check(self.join_ratio >= 0, "engine.join_ratio", "a number >= 0", self.join_ratio)
        _check(self.kv_cache in ("auto", "dynamic", "static"), "engine.kv_cache", "one of auto, dynamic, static",
               self.kv_cache)
        _check(isinstance(self.max_seq_len, int) and self.max_seq_len >= 8, "engine.max_seq_len", "an integer >= 8",
               self.max_seq_len)
        _check(isinstance(self.max_join_steps, int) and self.max_join_steps >= 0, "engine.max_join_steps",
               "an integer >= 0", self.max_join_steps)
        _check(isinstance(self.background_rows, int) and self.background_rows >= 0, "engine.background_rows",
               "an integer >= 0", self.background_rows)
        _check(isinstance(self.background_prefill_rows, int) and self.background_prefill_rows >= 1,
               "engine.background_prefill_rows", "an integer >= 1", self.background_prefill_rows)
        # YAML reads off as false; environment variables and --set give strings.
        chunk = self.prefill_chunk_tokens
        chunk = str(chunk).strip().lower()
        chunk = self.prefill_chunk_tokens = "off" if chunk in ("false", "no") else chunk
        _check(chunk in ("auto", "off") or (chunk.isdigit() and int(chunk) >= 16), "engine.prefill_chunk_tokens",
               "auto, off or an integer >= 16", chunk)


@dataclass
class MemoryConfig:
    enabled: bool = True
    #: Enter light mode above this fraction of memory in use.
    high_watermark: float = 0.88
    #: Return to normal below this fraction.
    low_watermark: float = 0.75
    poll_interval_s: float = 2.0

    def __post_init__(self) -> None:
        _check(0 < self.low_watermark < self.high_watermark <= 1, "memory.low_watermark",
               "0 < low_watermark < high_watermark <= 1", (self.low_watermark, self.high_watermark))


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 7860
    share: bool = False
    #: "user:pass" for the Gradio UI, or None.
    auth: str | None = None
    #: REST API keys; empty means the API is open.
    api_keys: list[str] = field(default_factory=list)
    #: Key for admin routes (rescan, pin, unload). None disables admin routes.
    admin_key: str | None = None
    #: Allowed CORS origins; empty disables CORS.
    cors_origins: list[str] = field(default_factory=list)
    #: Requests per minute per API key (or per client address when keys are off); 0 disables.
    rate_limit_per_min: int = 0
    #: Characters per request and key, in the LibreTranslate style; 0 means limits.max_chars only.
    char_limit: int = 0
    #: Characters per minute per caller (a key, or an address), across texts and documents; 0 disables.
    chars_per_min: int = 0
    #: When set, /metrics, /adapters and the page's Status tab need this key (or the admin key); None: public.
    status_key: str | None = None
    #: Proxies whose X-Forwarded-For names the client (e.g. ["127.0.0.1"] behind nginx on this machine);
    #: empty: the connection's own address counts, whatever the header says.
    trusted_proxies: list[str] = field(default_factory=list)
    #: Corrections from clients: LibreTranslate's /suggest (and /frontend/settings says so) and the page's "Save
    #: correction". Off: /suggest answers 403 as LibreTranslate's does (POST /v1/corrections stays on).
    suggestions: bool = True
    #: Whether the page saves corrections from visitors who are not signed in while API keys are on. Off by
    #: default: a correction changes what every key's /translate answers, and the open page has no key.
    page_corrections: bool = False
    #: Connections open at once from one address (a trusted proxy's are not counted per address) and in all; the
    #: total is kept below the process's open-file limit (app.py raises its soft limit to the hard one). More are
    #: answered 503 and closed at once, before anything is read from them.
    connections_per_address: int = 128
    max_connections: int = 10_000
    #: Seconds a client has to send a request's headers, counted from its connection's start or its previous
    #: answer; then 408 and the connection is closed. (A body has its own pace: web/requests.BODY_MIN_RATE.)
    header_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        _check(isinstance(self.port, int) and 0 <= self.port <= 65535, "server.port", "a port number", self.port)
        for key in ("connections_per_address", "max_connections"):
            value = getattr(self, key)
            _check(isinstance(value, int) and value >= 1, f"server.{key}", "an integer >= 1", value)
        _check(isinstance(self.header_timeout_s, (int, float)) and self.header_timeout_s > 0,
               "server.header_timeout_s", "a number of seconds > 0", self.header_timeout_s)
        _check(self.auth is None or (":" in self.auth and not self.auth.startswith(":")), "server.auth",
               "'user:pass'", "***")
        for key in ("rate_limit_per_min", "char_limit", "chars_per_min"):
            value = getattr(self, key)
            _check(isinstance(value, int) and value >= 0, f"server.{key}", "an integer >= 0 (0: no limit)", value)
        _check(self.status_key is None or bool(self.status_key), "server.status_key", "a non-empty key or null",
               "''")


@dataclass
class SharesConfig:
    """What one caller (an API key; an address where keys are off, and always on the page) may hold at once of
    what every caller shares. Beyond its share a caller gets 429 with the wait; docs/ACCESS.md has the table."""

    #: REST calls at work at once per caller (they run on a pool of 64 threads that every caller shares).
    requests: int = 8
    #: Page events (a translation, a document, its follower, the page's own small calls) queued or running at once
    #: per address.
    page_calls: int = 4
    #: Page events waiting in Gradio's queue, every address together (Gradio's `max_size`; past it, 503).
    page_queue: int = 256
    #: Long polls (GET /v1/documents/<id>?wait=S) open at once per caller.
    long_polls: int = 4
    #: Documents being read at once per caller, and seconds of reading per caller per minute (a read stopped at
    #: limits.parse_timeout_s counts its whole time).
    parses: int = 1
    parse_s_per_min: float = 40.0
    #: Page uploads kept on disk per address and in all; each is deleted `upload_ttl_s` after it came (sooner when
    #: the total is over), and an address over its bytes gets 429 until its oldest is gone.
    upload_bytes: int = 64 * 1024 * 1024
    upload_total_bytes: int = 1024 * 1024 * 1024
    upload_ttl_s: float = 900.0

    def __post_init__(self) -> None:
        for key in ("requests", "page_calls", "page_queue", "long_polls", "parses", "upload_bytes",
                    "upload_total_bytes"):
            value = getattr(self, key)
            _check(isinstance(value, int) and value >= 1, f"shares.{key}", "an integer >= 1", value)
        for key in ("parse_s_per_min", "upload_ttl_s"):
            value = getattr(self, key)
            _check(isinstance(value, (int, float)) and value > 0, f"shares.{key}", "a number > 0", value)


@dataclass
class GlossaryConfig:
    #: Stored glossaries: `<dir>/<id>.<src>2<tgt>.tsv` (relative paths are under the project folder).
    dir: str = "glossaries"
    #: Most terms one glossary may hold (inline or stored).
    max_terms: int = 1000
    #: How a term goes in: "visible" (the model sees the target term in the source and makes the words around
    #: it agree; a text whose output lacks a term is translated again with "sentinel"), or "sentinel" (always a
    #: placeholder the target term replaces). On held-out phrases: chrF 1.011× / 1.005× of no glossary (en→es /
    #: en→de) visible, 0.951× / 0.964× sentinel (bench.glossary_quality). "prompt": the terms a segment holds go
    #: into a decoder-only model's prompt as the HY-MT1.5 card's terminology template, the source left as it is
    #: (direct routes; a pivot route or an encoder-decoder model takes "visible"); a text whose output lacks a term
    #: is translated again with "sentinel", as for "visible".
    mode: str = "visible"

    def __post_init__(self) -> None:
        _check(isinstance(self.max_terms, int) and self.max_terms >= 1, "glossary.max_terms", "an integer >= 1",
               self.max_terms)
        _check(self.mode in ("visible", "sentinel", "prompt"), "glossary.mode", "one of visible, sentinel, prompt",
               self.mode)

    @property
    def resolved_dir(self) -> Path:
        return project_path(self.dir)


@dataclass
class TmConfig:
    #: Segments found in the translation memory are answered from it, before the model.
    enabled: bool = True
    #: Where earlier versions kept the user's memory (`<src>2<tgt>.tsv`): its files are imported into the store
    #: once (again when one changes); the store's entries win over the shipped memory.
    dir: str = "tm"
    #: The shipped memory (the demo's, built from its training pairs); "" for none.
    shipped: str = "models/demo/memory"
    #: A segment the memory does not know exactly gets its nearest entry at this similarity or above (0..1,
    #: rapidfuzz's ratio of the masked texts) as a suggestion, `memoryMatches`; 0 turns suggestions off.
    fuzzy_threshold: float = 0.75

    def __post_init__(self) -> None:
        _check(isinstance(self.fuzzy_threshold, (int, float)) and not isinstance(self.fuzzy_threshold, bool)
               and 0 <= self.fuzzy_threshold <= 1, "tm.fuzzy_threshold", "a number from 0 to 1",
               self.fuzzy_threshold)

    @property
    def resolved_dir(self) -> Path:
        return project_path(self.dir)

    @property
    def resolved_shipped(self) -> Path | None:
        return project_path(self.shipped) if self.shipped else None


@dataclass
class QualityConfig:
    #: A document segment the model translated with a confidence below this (0..1: the geometric mean of its
    #: tokens' probabilities, its least sure sentence's) is marked for review where the format has a place:
    #: XLIFF 1.2 `state="needs-review-translation"`, PO's `fuzzy` flag. At or above it: XLIFF `translated`
    #: (`mt-suggestion`), and no fuzzy flag. 1.0 marks every machine translation for review. A segment given back
    #: as its source is marked whatever this says (review.py). The demo profile sets its calibrated 0.68
    #: (configs/default.yaml, `python -m bench.review_threshold`); this default is uncalibrated.
    review_below: float = 0.5
    #: Word has no review state: a .docx segment marked for review gets a Word comment saying so ("machine
    #: translation to check: low confidence …") when this is on. Off by default: comments change the delivered file.
    docx_comments: bool = False

    def __post_init__(self) -> None:
        _check(isinstance(self.review_below, (int, float)) and not isinstance(self.review_below, bool)
               and 0 <= self.review_below <= 1, "quality.review_below", "a number from 0 to 1", self.review_below)
        _check(isinstance(self.docx_comments, bool), "quality.docx_comments", "true or false", self.docx_comments)


@dataclass
class StoreConfig:
    #: The database for what the server learns (memory, corrections, jobs): "" for SQLite at
    #: `<dir>/hunyuan.db`, or a SQLAlchemy URL, `postgresql+psycopg://user:password@host/db`, which replicas share.
    url: str = ""
    #: The data folder: the SQLite database and document jobs' files. "": $HMT_DATA, else `data/`.
    dir: str = ""

    def __post_init__(self) -> None:
        _check(isinstance(self.url, str), "store.url", "a database URL or \"\"", self.url)
        _check(isinstance(self.dir, str), "store.dir", "a folder or \"\"", self.dir)


@dataclass
class JobsConfig:
    #: Documents translated at once (the others wait, queued); they share the engine with live traffic either way.
    workers: int = 2
    #: Jobs (and their translated files) are kept this long after they end, then forgotten.
    ttl_s: float = 3600.0
    #: Jobs queued or translating at once; more are refused as busy (503). Finished jobs do not count: their
    #: results stay downloadable until they expire, within `max_kept_bytes`.
    max_jobs: int = 64
    #: Jobs one caller (an API key, or an address) may have queued or translating at once; more get 429 with
    #: Retry-After, so one caller's flood never locks the others out of the shared `max_jobs`.
    per_caller: int = 8
    #: Bytes of finished jobs' results kept in all; past it, the oldest result of the caller who keeps the most
    #: expires first.
    max_kept_bytes: int = 1024 * 1024 * 1024

    def __post_init__(self) -> None:
        _check(isinstance(self.workers, int) and self.workers >= 1, "jobs.workers", "an integer >= 1", self.workers)
        _check(self.ttl_s > 0, "jobs.ttl_s", "a number > 0", self.ttl_s)
        _check(isinstance(self.max_jobs, int) and self.max_jobs >= 1, "jobs.max_jobs", "an integer >= 1",
               self.max_jobs)
        _check(isinstance(self.per_caller, int) and self.per_caller >= 1, "jobs.per_caller", "an integer >= 1",
               self.per_caller)
        _check(isinstance(self.max_kept_bytes, int) and self.max_kept_bytes >= 1, "jobs.max_kept_bytes",
               "an integer >= 1", self.max_kept_bytes)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    glossary: GlossaryConfig = field(default_factory=GlossaryConfig)
    tm: TmConfig = field(default_factory=TmConfig)
    jobs: JobsConfig = field(default_factory=JobsConfig)
    shares: SharesConfig = field(default_factory=SharesConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)
    #: Free-form profile name, shown in the status tab.
    name: str = "custom"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------------------------
# Loading


def config_from_dict(data: Mapping[str, Any]) -> Config:
    """A configuration from `Config.to_dict()`'s output (what a helper process is handed), validated again."""
    return _build(Config, data, "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML/env value to the annotated type, or raise ConfigError naming `key`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        if isinstance(value, str) and value.lower() in ("none", "null", "") and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        try:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
    if tp is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return str(value)
    return value


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{prefix}{unknown[0]}: unknown key (known: {', '.join(sorted(names))})")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        tp = hints[name]
        key = f"{prefix}{name}"
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{key}: expected a mapping, got {value!r}")
            kwargs[name] = _build(tp, value, f"{key}.")
        else:
            kwargs[name] = _coerce(value, tp, key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except TypeError as exc:  # pragma: no cover - defensive, unknown keys are caught above
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {exc}") from None


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        raise ConfigError(f"{dotted!r}: empty key")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def resolve_config_path(name_or_path: str | os.PathLike[str] | None) -> Path:
    """`None` → default.yaml; a bare name (`hunyuan-mt-7b`) → configs/<name>.yaml; else a path."""
    if name_or_path is None:
        return DEFAULT_CONFIG
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    return CONFIG_DIR / f"{name_or_path}.yaml"


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Load and validate the configuration. `overrides` maps dotted keys (``cache.slots``) to values."""
    cfg_path = resolve_config_path(path)
    if not cfg_path.exists():
        raise ConfigError(f"config: file {cfg_path} not found (profiles: "
                          f"{', '.join(sorted(p.stem for p in CONFIG_DIR.glob('*.yaml')))})")
    try:
        data = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config: {cfg_path.name} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {cfg_path.name} must hold a mapping at the top level")
    env = os.environ if env is None else env
    env_tree: dict[str, Any] = {}
    for var, value in env.items():
        if var.startswith("HMT_") and "__" in var:
            dotted = ".".join(part.lower() for part in var[4:].split("__"))
            _set_dotted(env_tree, dotted, value)
    # The shorthand HMT_CONFIG selects the file itself, it is not a key.
    data = _deep_merge(data, env_tree)
    override_tree: dict[str, Any] = {}
    for dotted, value in (overrides or {}).items():
        _set_dotted(override_tree, dotted, value)
    data = _deep_merge(data, override_tree)
    return _build(Config, data, "")


def parse_set_args(items: list[str] | None) -> dict[str, str]:
    """`["cache.slots=4", "routing.pivot=en"]` → {"cache.slots": "4", ...}; YAML-typed values are coerced later."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. cache.slots=4")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    return out


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """`--config` and `--set` on a command's parser (the CLI's own commands and its plugins')."""
    parser.add_argument("--config", default=os.environ.get("HMT_CONFIG"),
                        help="profile name in configs/ (e.g. hunyuan-mt-7b) or a YAML path; default: default.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a setting, e.g. --set cache.slots=4 (repeatable)")
    # Also accepted after the command; SUPPRESS keeps the top-level value when it is not given here.
    parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log progress and the route to stderr")


def config_from(args: argparse.Namespace) -> Config:
    """The config a one-shot command runs with: its --config and --set, not warmed up."""
    overrides = parse_set_args(args.set)
    # A one-shot command gains nothing from warming up (a throw-away generation, the detector's models).
    overrides.setdefault("model.warmup", False)
    return load_config(args.config, overrides)
