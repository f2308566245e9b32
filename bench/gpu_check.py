"""GPU check: the Hunyuan-MT-7B path end to end on one GPU, through the server's own engine, with no download.

What it does (a few minutes on one H200; it stops starting sections after `--budget-s`, 420 s by default):
  1. builds a HunYuanDenseV1ForCausalLM with Hunyuan-MT-7B's published shapes and random bf16 weights, plus a
     small tokenizer with a chat template, saved as safetensors into a temporary folder (deleted at the end);
  2. writes 38 PEFT LoRA adapters (r=16 on q/k/v/o, ~26 MiB each), one per direction zh<->X;
  3. loads the backbone the way the server does (`hunyuan_mt.runtime.backbone.Backbone`, bf16, SDPA);
  4. the baseline, PEFT on the plain model: 32 rows over 8 pairs, serial `set_adapter` per pair and one
     `generate(adapter_names=...)` (then PEFT's layers are taken out again);
  5. the server's adapter cache (5 pinned + 3 slots): GPU memory, slot copies (disk, RAM tier, the copy alone);
  6. the server's engine over the static KV cache with CUDA graphs: 32 rows over 8 pairs (tok/s), one row (ms per
     token), a mixed 8-pair decode step against a step of the bare model, a pinned pair's first request against
     its steady state, and whether mixed rows equal the rows alone in bf16;
  7. light mode forced on (fp8 KV cache, a quarter of the rows): GPU memory before/after, latency in it, leaving;
  8. the same rows in fp32 (a second backbone): mixed rows against rows alone, token for token;
  9. a 4-bit (bitsandbytes NF4) backbone with 8 adapters: GPU memory and tok/s, when bitsandbytes is installed.
Results: gpu_check.json and gpu_check.md (a section for BENCHMARKS.md) in $OUT, else bench/results/.

It needs torch, transformers, peft, safetensors, tokenizers, pyyaml and psutil (the GPU machine's python3 has
them) and cachetools (carry its wheel there; docs/GPU.md). Without CUDA it prints why and exits 0; `--tiny` shrinks
every shape so the whole path runs on a CPU in about a minute (how the script itself is tested).

Shapes: the published HunYuanDenseV1 7B configuration (Hunyuan-7B family, which Hunyuan-MT-7B is built on):
hidden 4096, intermediate 14336, 32 layers, 32 attention heads, 8 KV heads, head_dim 128, vocab 128167, tied
embeddings, QK-norm, dynamic NTK RoPE (alpha 1000).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

# Run as `python bench/gpu_check.py`, Python puts bench/ first on sys.path, where a sibling module can shadow the
# standard library (bench/profile.py hides `profile`, which torch._dynamo imports through cProfile): drop it, and
# put the project root there instead, so the server's own modules are what is measured.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

#: Hunyuan-MT-7B's architecture (HunYuanDenseV1); values from the published 7B config.json of the family.
HUNYUAN_MT_7B: dict[str, Any] = {
    "vocab_size": 128167, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True, "use_qk_norm": True,
    "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0},
    "pad_token_id": 127961, "bos_token_id": 127958, "eos_token_id": 127960,
}
#: --tiny: the same architecture shrunk so the whole path runs on a CPU in seconds.
TINY: dict[str, Any] = dict(
    HUNYUAN_MT_7B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)

#: 38 directions: zh <-> 19 languages (Hunyuan-MT's pivot is zh).
_LANGS = ["en", "ja", "ko", "fr", "de", "es", "ru", "ar", "pt", "it", "th", "vi", "id", "ms", "tr", "hi", "pl",
          "nl", "cs"]
PAIRS = [p for lang in _LANGS for p in (f"zh2{lang}", f"{lang}2zh")]
#: The profile's recommended pinned pairs (configs/hunyuan-mt-7b.yaml) and the LRU slots.
PINNED = ["zh2en", "en2zh", "zh2ja", "ja2zh", "zh2ko"]
SLOTS = 3
#: The 8 pairs of the mixed batch: every pinned pair and one per slot.
BATCH_PAIRS = PINNED + [p for p in PAIRS if p not in PINNED][:SLOTS]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
GIB = 1024 ** 3
#: A few sentences the tokenizer is trained on and the rows are cut from.
CORPUS = [
    "The weather is nice today and we are going to the park.",
    "Please translate the following segment into English without additional explanation.",
    "The meeting was moved to Thursday afternoon because of the holiday.",
    "Open the file, save the document and close the window before you leave.",
    "Our company ships orders to more than forty countries every week.",
    "She reads the news every morning while drinking a cup of coffee.",
]
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant:{% endif %}")


@dataclass
class Settings:
    tiny: bool
    device: str
    rank: int = 16
    rows: int = 32
    new_tokens: int = 32
    reps: int = 3
    budget_s: float = 420.0  # stop starting new sections after this (the whole check must stay under 8 min)


class Report:
    """Collects results; every section records either numbers or why it was skipped/failed."""

    def __init__(self, settings: Settings) -> None:
        self.t0 = time.perf_counter()
        self.settings = settings
        self.data: dict[str, Any] = {"sections": {}}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def section(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        if self.elapsed() > self.settings.budget_s:
            self.data["sections"][name] = {"status": "skipped", "reason": f"time budget spent ({self.elapsed():.0f} s)"}
            print(f"[gpu_check] {name}: skipped (time budget)", flush=True)
            return None
        print(f"[gpu_check] {name} ...", flush=True)
        t = time.perf_counter()
        try:
            out = fn()
            out.setdefault("status", "ok")
        except Exception as exc:  # one broken section must not hide the others' numbers
            out = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:300],
                   "traceback": traceback.format_exc(limit=8)}
            print(out["traceback"], file=sys.stderr, flush=True)
        out["section_s"] = round(time.perf_counter() - t, 2)
        self.data["sections"][name] = out
        shown = {k: v for k, v in out.items() if k != "traceback"}
        print(f"[gpu_check] {name}: {json.dumps(shown, default=str)[:700]}", flush=True)
        return out


# ------------------------------------------------------------------------------------------------------------
# Measuring helpers


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def gpu_bytes(device: str) -> int | None:
    import torch

    if not device.startswith("cuda"):
        return None
    _sync(device)
    return int(torch.cuda.memory_allocated())


@contextmanager
def timed(device: str, out: list[float]) -> Iterator[None]:
    _sync(device)
    t = time.perf_counter()
    yield
    _sync(device)
    out.append((time.perf_counter() - t) * 1000.0)


def summary_ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"n": len(values), "p50_ms": round(statistics.median(values), 3), "p95_ms": round(p95, 3),
            "min_ms": round(ordered[0], 3), "max_ms": round(ordered[-1], 3)}


def gib(n: int | None) -> float | None:
    return None if n is None else round(n / GIB, 3)


# ------------------------------------------------------------------------------------------------------------
# Building the model, its tokenizer and the adapters


def model_config(settings: Settings) -> Any:
    from transformers import HunYuanDenseV1Config

    return HunYuanDenseV1Config(**(TINY if settings.tiny else HUNYUAN_MT_7B))


def write_tokenizer(model_dir: Path) -> int:
    """A small BPE tokenizer with a chat template (the random model needs one to be served); its ids stay far
    below the model's vocabulary. Returns its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "</s>", "<unk>", "<s>"],
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 10, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   bos_token="<s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(model_dir)
    return len(fast)


def build_model(settings: Settings, model_dir: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    cfg = model_config(settings)
    t = time.perf_counter()
    with torch.device(settings.device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    _sync(settings.device)
    build_s = time.perf_counter() - t
    n_params = sum(p.numel() for p in model.parameters())
    t = time.perf_counter()
    model.save_pretrained(model_dir)
    save_s = time.perf_counter() - t
    vocab = write_tokenizer(model_dir)
    files = sorted(p.name for p in model_dir.iterdir())
    size = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    del model
    _free(settings.device)
    if not any(f.endswith(".safetensors") for f in files):
        raise RuntimeError(f"save_pretrained wrote no safetensors: {files}")
    return {"params": n_params, "params_b": round(n_params / 1e9, 3), "build_s": round(build_s, 2),
            "save_s": round(save_s, 2), "safetensors_gib": gib(size), "files": len(files), "tokenizer_vocab": vocab}


def make_adapters(settings: Settings, model_dir: Path, root: Path) -> dict[str, Any]:
    """38 PEFT LoRA folders written straight from shapes: small random A and B so outputs stay finite but differ."""
    import torch
    from safetensors.torch import save_file

    cfg = model_config(settings)
    hidden, heads, kv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    shapes = {"q_proj": (heads * hd, hidden), "k_proj": (kv * hd, hidden), "v_proj": (kv * hd, hidden),
              "o_proj": (hidden, heads * hd)}
    r = settings.rank
    gen_device = settings.device if settings.device.startswith("cuda") else "cpu"
    gen = torch.Generator(device=gen_device)
    t = time.perf_counter()
    total = 0
    for seed, pair in enumerate(PAIRS, start=1):
        gen.manual_seed(seed)
        tensors = {}
        for layer in range(cfg.num_hidden_layers):
            for mod, (out_f, in_f) in shapes.items():
                prefix = f"base_model.model.model.layers.{layer}.self_attn.{mod}"
                a = torch.randn(r, in_f, generator=gen, device=gen_device) / in_f ** 0.5
                b = torch.randn(out_f, r, generator=gen, device=gen_device) * (0.02 if not settings.tiny else 2.0)
                tensors[f"{prefix}.lora_A.weight"] = a.to(torch.bfloat16).cpu()
                tensors[f"{prefix}.lora_B.weight"] = b.to(torch.bfloat16).cpu()
        out = root / pair
        out.mkdir(parents=True)
        save_file(tensors, str(out / "adapter_model.safetensors"))
        total += (out / "adapter_model.safetensors").stat().st_size
        (out / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": 2 * r, "lora_dropout": 0.0,
            "target_modules": TARGETS, "bias": "none", "fan_in_fan_out": False,
            "base_model_name_or_path": str(model_dir), "inference_mode": True, "use_rslora": False,
            "use_dora": False, "modules_to_save": None,
        }, indent=1))
        (out / "metadata.json").write_text(json.dumps({"pair": pair, "seed": seed, "synthetic": True}))
    return {"adapters": len(PAIRS), "rank": r, "targets": TARGETS, "mib_each": round(total / len(PAIRS) / 2**20, 2),
            "write_s": round(time.perf_counter() - t, 2)}


# ------------------------------------------------------------------------------------------------------------
# The checks


class Check:
    """Holds the backbone, the cache and the engine between sections."""

    def __init__(self, settings: Settings, work: Path) -> None:
        self.s = settings
        self.model_dir = work / "hunyuan-mt-7b-random"
        self.adapters_dir = work / "adapters"
        self.backbone: Any = None
        self.cache: Any = None
        self.engine: Any = None
        self.mem: dict[str, Any] = {}
        self.bf16_mixed: list[str] | None = None

    # -- helpers ---------------------------------------------------------------------------------------------

    def model_config(self, dtype: str = "bfloat16", quantization: str = "none") -> Any:
        from hunyuan_mt.config import ModelConfig

        return ModelConfig(path=str(self.model_dir), arch="decoder-only", dtype=dtype, device=self.s.device,
                           attn_implementation="sdpa", quantization=quantization, warmup=False)

    def rows(self, n: int | None = None, pairs: list[str] | None = None, max_new: int | None = None) -> list[Any]:
        """`n` engine rows over `pairs`, each a different sentence, each generating exactly `max_new` tokens."""
        from hunyuan_mt.adapters.request import Pair
        from hunyuan_mt.scheduler.engine import Row

        n = self.s.rows if n is None else n
        pairs = pairs or BATCH_PAIRS
        out = []
        for i in range(n):
            pair = Pair.parse(pairs[i % len(pairs)])
            text = " ".join(CORPUS[(i + k) % len(CORPUS)] for k in range(1 + i % 3))
            out.append(Row(text, pair.src, pair.tgt, pair, max_new or self.s.new_tokens))
        return out

    def fix_length(self, backbone: Any) -> None:
        """Every row generates exactly its token limit (the end token is held back): equal work for every path."""
        backbone.model.generation_config.min_new_tokens = self.s.new_tokens

    def make_cache(self, backbone: Any, pinned: list[str] | None = None, slots: int = SLOTS) -> Any:
        from hunyuan_mt.adapters.cache import AdapterCache
        from hunyuan_mt.adapters.registry import AdapterRegistry
        from hunyuan_mt.config import CacheConfig

        registry = AdapterRegistry(self.adapters_dir, backbone.spec)
        registry.scan()
        cache = AdapterCache(backbone, registry, CacheConfig(adapters_dir=str(self.adapters_dir), slots=slots,
                                                             pinned=list(PINNED if pinned is None else pinned),
                                                             ram_tier=16))
        cache.start()
        return cache

    def make_engine(self, backbone: Any, cache: Any) -> Any:
        from hunyuan_mt.config import EngineConfig, GenerationConfig, LimitsConfig
        from hunyuan_mt.scheduler.engine import BatchEngine

        prompt = max(backbone.encode(backbone_row).tokens for backbone_row in
                     (BatchEngine._prompt_row(r) for r in self.rows()))
        return BatchEngine(backbone, cache, EngineConfig(max_wait_ms=2, max_rows=64, max_tokens=64 * 1024,
                                                         kv_cache="static",
                                                         max_seq_len=prompt + self.s.new_tokens + 16),
                           GenerationConfig(), LimitsConfig(max_new_tokens=self.s.new_tokens))

    # -- load ------------------------------------------------------------------------------------------------

    def load(self) -> dict[str, Any]:
        import torch

        from hunyuan_mt.runtime.backbone import Backbone

        dropped = False if self.s.tiny else _drop_page_cache()
        _free(self.s.device)
        if self.s.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        self.backbone = Backbone.load_uncached(self.model_config())
        _sync(self.s.device)
        load_s = time.perf_counter() - t
        self.fix_length(self.backbone)
        self.mem["backbone"] = gpu_bytes(self.s.device)
        out = {"load_s": round(load_s, 2), "page_cache_dropped": dropped, "gpu_gib": gib(self.mem["backbone"]),
               "info": self.backbone.info(), "running_batch": self.backbone.batch_class.__name__}
        if self.s.device.startswith("cuda"):
            out["peak_gib_during_load"] = gib(torch.cuda.max_memory_allocated())
        return out

    # -- the PEFT baseline ---------------------------------------------------------------------------------------

    def peft_baseline(self) -> dict[str, Any]:
        """32 rows over 8 pairs through PEFT on the plain model: serial set_adapter per pair (what a simple
        server does) and one generate with per-row adapter_names. PEFT's layers are removed afterwards."""
        import torch
        from peft import PeftModel

        from hunyuan_mt.scheduler.engine import BatchEngine

        bb = self.backbone
        peft = PeftModel.from_pretrained(bb.model, self.adapters_dir / BATCH_PAIRS[0], adapter_name=BATCH_PAIRS[0])
        for pair in BATCH_PAIRS[1:]:
            peft.load_adapter(self.adapters_dir / pair, adapter_name=pair)
        peft.eval()
        rows = self.rows()
        names = [r.adapter.key for r in rows]
        encoded = [bb.encode(BatchEngine._prompt_row(r)) for r in rows]
        kw = dict(bb._generation_kwargs(bb.picker and _greedy(), self.s.new_tokens), min_new_tokens=self.s.new_tokens)

        def batch(idx: list[int]) -> dict[str, Any]:
            with bb.tokens.lock:
                padded = bb.tokenizer.pad([{"input_ids": list(encoded[i].input_ids)} for i in idx],
                                          return_tensors="pt")
            return {k: v.to(self.s.device) for k, v in padded.items()}

        def mixed() -> None:
            with torch.inference_mode():
                peft.generate(**batch(list(range(len(rows)))), adapter_names=names, **kw)

        def serial() -> None:
            with torch.inference_mode():
                for pair in BATCH_PAIRS:
                    peft.set_adapter(pair)
                    peft.generate(**batch([i for i, n in enumerate(names) if n == pair]), **kw)

        mixed()
        serial()  # warm-up (kernels, allocator)
        t_mixed: list[float] = []
        t_serial: list[float] = []
        for _ in range(max(1, self.s.reps - 1)):
            with timed(self.s.device, t_mixed):
                mixed()
            with timed(self.s.device, t_serial):
                serial()
        bb.model = peft.unload()  # the plain modules back, for the server's own slot layers
        bb.base_model = bb.model
        del peft
        _free(self.s.device)
        tokens = len(rows) * self.s.new_tokens
        m, s = statistics.median(t_mixed), statistics.median(t_serial)
        self.mem["peft"] = {"serial_tok_s": tokens / s * 1000, "mixed_tok_s": tokens / m * 1000}
        return {"rows": len(rows), "pairs": len(BATCH_PAIRS), "new_tokens": self.s.new_tokens,
                "serial_set_adapter_ms": round(s, 1), "serial_tok_s": round(tokens / s * 1000, 1),
                "mixed_adapter_names_ms": round(m, 1), "mixed_tok_s": round(tokens / m * 1000, 1)}

    # -- the server's cache -----------------------------------------------------------------------------------

    def cache_section(self) -> dict[str, Any]:
        t = time.perf_counter()
        self.cache = self.make_cache(self.backbone)
        start_s = time.perf_counter() - t
        self.mem["cache"] = gpu_bytes(self.s.device)
        stats = self.cache.stats()
        return {"start_s": round(start_s, 2), "pinned": self.cache.pinned(), "slots": stats.slots,
                "slot_layers": stats.layers, "gpu_gib": gib(self.mem["cache"]),
                "added_gib": gib(None if self.mem["cache"] is None else self.mem["cache"] - self.mem["backbone"])}

    def attach(self) -> dict[str, Any]:
        """Disk attach, RAM-tier re-attach (both through the cache's lease), and the slot copy alone."""
        from hunyuan_mt.adapters.request import Pair

        cold = [p for p in PAIRS if p not in BATCH_PAIRS]
        disk: list[float] = []
        ram: list[float] = []
        for pair in cold[:5]:
            with timed(self.s.device, disk), self.cache.lease([Pair.parse(pair)]):
                pass
        for filler in cold[5:5 + SLOTS]:  # push them out to the RAM tier
            with self.cache.lease([Pair.parse(filler)]):
                pass
        for pair in cold[:5]:
            with timed(self.s.device, ram), self.cache.lease([Pair.parse(pair)]):
                pass
        lora = self.cache.lora
        weights = next(iter(self.cache._ram.values()), None)
        copy: list[float] = []
        if weights is not None and weights.prepared is not None:
            with self.backbone.model_lock:
                for _ in range(10):
                    with timed(self.s.device, copy):
                        lora.load(1, weights.prepared)
                lora.clear(1)
            mib = weights.prepared.nbytes / 2 ** 20
        else:
            mib = None
        # Put the batch's slot pairs back for the next sections.
        for pair in BATCH_PAIRS[len(PINNED):]:
            with self.cache.lease([Pair.parse(pair)]):
                pass
        return {"disk_attach": summary_ms(disk), "ram_tier_attach": summary_ms(ram), "slot_copy": summary_ms(copy),
                "adapter_mib": None if mib is None else round(mib, 2)}

    # -- the server's engine ------------------------------------------------------------------------------------

    def engine_section(self) -> dict[str, Any]:
        t = time.perf_counter()
        self.engine = self.make_engine(self.backbone, self.cache)
        start_s = time.perf_counter() - t
        engine = self.engine
        # A pinned pair's first request, right after start (graphs were captured at start), then steady state.
        probe = self.rows(1, pairs=[PINNED[0]])
        first: list[float] = []
        steady: list[float] = []
        with timed(self.s.device, first):
            engine.run(probe)
        for _ in range(9):
            with timed(self.s.device, steady):
                engine.run(probe)
        rows = self.rows()
        engine.run(rows)  # warm-up of the 32-row path
        t_mixed: list[float] = []
        for _ in range(self.s.reps):
            with timed(self.s.device, t_mixed):
                mixed = engine.run(rows)
        self.bf16_mixed = mixed
        one: list[float] = []
        for _ in range(self.s.reps):
            with timed(self.s.device, one):
                engine.run(rows[:1])
        alone = [engine.run([r])[0] for r in rows]
        tokens = len(rows) * self.s.new_tokens
        m = statistics.median(t_mixed)
        status = engine.status()
        peft = self.mem.get("peft") or {}
        tok_s = tokens / m * 1000
        return {"start_s": round(start_s, 2), "cuda_graphs": status.get("cuda_graphs"),
                "kv_cache_gib": gib(status.get("kv_cache_bytes")), "rows": len(rows), "pairs": len(BATCH_PAIRS),
                "new_tokens": self.s.new_tokens, "mixed_ms": round(m, 1), "mixed_tok_s": round(tok_s, 1),
                "vs_peft_serial": round(tok_s / peft["serial_tok_s"], 2) if peft else None,
                "vs_peft_mixed": round(tok_s / peft["mixed_tok_s"], 2) if peft else None,
                "one_row_ms_per_token": round(statistics.median(one) / self.s.new_tokens, 3),
                "pinned_first_ms": round(first[0], 1), "pinned_steady_ms": round(statistics.median(steady), 1),
                "pinned_first_over_steady": round(first[0] / statistics.median(steady), 3),
                "bf16_rows_equal_alone": f"{sum(a == b for a, b in zip(mixed, alone))}/{len(rows)}"}

    def step_ratio(self) -> dict[str, Any]:
        """One decode step of 32 rows over 8 adapters against the same rows on the bare model (no LoRA at all),
        both over the static cache, both recorded as CUDA graphs on a GPU."""
        import torch

        from hunyuan_mt.config import GenerationConfig
        from hunyuan_mt.decode import Sequence
        from hunyuan_mt.decode.static import StaticCausalBatch
        from hunyuan_mt.scheduler.engine import BatchEngine

        bb = self.backbone
        rows = self.rows()
        encoded = [bb.encode(BatchEngine._prompt_row(r)) for r in rows]
        lease = self.cache.try_acquire([r.adapter for r in rows])
        if lease is None:
            raise RuntimeError("the batch's adapters could not all be leased")
        width = max(e.tokens for e in encoded) + 64 + 8
        out: dict[str, Any] = {}
        try:
            for kind, mapping, slots in (("bare", None, [0] * len(rows)), ("mixed", bb.lora.mapping, lease.slots)):
                if mapping is None:
                    bb.lora.mapping.clear()  # every slot layer returns its base output: no LoRA op is run
                batch = StaticCausalBatch(bb.model, mapping, bb.picker(GenerationConfig()), torch.device(bb.device),
                                          bb.tokenizer.pad_token_id or 0, capacity=len(rows), max_len=width,
                                          dtype=bb.dtype, graphs=bb.device.startswith("cuda"))
                times: list[float] = []
                with bb.model_lock, torch.inference_mode():
                    batch.add([Sequence(i, e.input_ids, s, 64, ()) for i, (e, s) in
                               enumerate(zip(encoded, slots))])
                    for step in range(24):
                        with timed(self.s.device, times):
                            batch.step()
                out[kind] = summary_ms(times[4:])  # the first steps capture the graph
                out[f"{kind}_graphs"] = None if batch.steps is None else sorted(batch.steps.graphs)
                del batch
                _free(self.s.device)
        finally:
            lease.release()
        out["mixed_over_bare"] = round(out["mixed"]["p50_ms"] / out["bare"]["p50_ms"], 3)
        return out

    # -- light mode ------------------------------------------------------------------------------------------

    def light_mode(self) -> dict[str, Any]:
        """Forced: the engine enters light mode (a quarter of the rows, fp8 KV cache for the rows it keeps) and
        the cache evicts its idle slots, as the memory policy does above its watermark; then it leaves."""
        engine, cache = self.engine, self.cache
        before = gpu_bytes(self.s.device)
        kv_before = engine.status()["kv_cache_bytes"]
        t = time.perf_counter()
        evicted = cache.evict_idle(keep_ram=True)
        effect = engine.set_light_mode(True)
        deadline = time.monotonic() + 60
        while engine.status()["kv_cache_bytes"] == kv_before and time.monotonic() < deadline:
            time.sleep(0.01)  # the loop converts the cache between two steps
        _free(self.s.device)
        enter_ms = (time.perf_counter() - t) * 1000
        after = gpu_bytes(self.s.device)
        kv_after = engine.status()["kv_cache_bytes"]
        rows = self.rows(max(1, self.s.rows // 4), pairs=PINNED)
        lat: list[float] = []
        for _ in range(self.s.reps):
            with timed(self.s.device, lat):
                engine.run(rows)
        t = time.perf_counter()
        engine.set_light_mode(False)
        while engine.status()["kv_cache_bytes"] == kv_after and time.monotonic() < deadline + 60:
            time.sleep(0.01)
        exit_ms = (time.perf_counter() - t) * 1000
        back = gpu_bytes(self.s.device)
        budget = None
        if self.mem.get("backbone") is not None:
            pinned_bytes = sum(w.nbytes for w in (cache._pinned[p].weights for p in cache._pinned))
            budget = int((self.mem["backbone"] + pinned_bytes) * 1.10)
        return {"engine": effect, "evicted": [p.key for p in evicted], "enter_ms": round(enter_ms, 1),
                "gpu_gib_before": gib(before), "gpu_gib_after": gib(after), "gpu_gib_after_leaving": gib(back),
                "kv_cache_gib_before": gib(kv_before), "kv_cache_gib_after": gib(kv_after),
                # In bytes too: a tiny model's cache rounds to 0.001 GiB either side, which hid the change.
                "kv_cache_bytes_before": kv_before, "kv_cache_bytes_after": kv_after,
                "budget_gib": gib(budget), "within_budget": None if budget is None or after is None else after <= budget,
                "light_rows": len(rows), "light_latency": summary_ms(lat), "exit_ms": round(exit_ms, 1)}

    # -- fp32 exactness --------------------------------------------------------------------------------------

    def exactness_fp32(self) -> dict[str, Any]:
        """A second backbone in fp32: the 32 mixed rows against each row alone, token for token."""
        from hunyuan_mt.runtime.backbone import Backbone

        if self.engine is not None:
            self.engine.close()
            self.engine = None
        bb = Backbone.load_uncached(self.model_config(dtype="float32"))
        self.fix_length(bb)
        cache = self.make_cache(bb)
        engine = self.make_engine(bb, cache)
        try:
            rows = self.rows()
            mixed = engine.run(rows)
            alone = [engine.run([r])[0] for r in rows]
        finally:
            engine.close()
            del engine, cache, bb
            _free(self.s.device)
        return {"rows": len(rows), "fp32_rows_equal_alone": f"{sum(a == b for a, b in zip(mixed, alone))}/{len(rows)}",
                "fp32_equal_to_bf16_outputs": None if self.bf16_mixed is None else
                f"{sum(a == b for a, b in zip(mixed, self.bf16_mixed))}/{len(rows)}"}

    # -- 4 bit -----------------------------------------------------------------------------------------------

    def four_bit(self) -> dict[str, Any]:
        try:
            import bitsandbytes  # noqa: F401
        except ImportError as exc:
            return {"status": "skipped", "reason": f"bitsandbytes not importable here ({exc})",
                    "nf4_estimate_gib": nf4_estimate_gib(self.s)}
        if not self.s.device.startswith("cuda"):
            return {"status": "skipped", "reason": "NF4 needs CUDA", "nf4_estimate_gib": nf4_estimate_gib(self.s)}
        from hunyuan_mt.runtime.backbone import Backbone

        # Free the bf16 copy first: both at once would only measure their sum.
        if self.engine is not None:
            self.engine.close()
        self.engine = self.cache = self.backbone = None
        _free(self.s.device)
        base_mem = gpu_bytes(self.s.device) or 0
        t = time.perf_counter()
        bb = Backbone.load_uncached(self.model_config(quantization="4bit"))
        load_s = time.perf_counter() - t
        self.fix_length(bb)
        cache = self.make_cache(bb)
        mem = (gpu_bytes(self.s.device) or 0) - base_mem
        engine = self.make_engine(bb, cache)
        rows = self.rows()
        engine.run(rows)
        times: list[float] = []
        for _ in range(self.s.reps):
            with timed(self.s.device, times):
                engine.run(rows)
        engine.close()
        tokens = len(rows) * self.s.new_tokens
        return {"nf4_with_8_adapters_gib": gib(mem), "load_s": round(load_s, 2),
                "mixed_tok_s": round(tokens / statistics.median(times) * 1000, 1),
                "bf16_backbone_gib": gib(self.mem.get("backbone"))}


def _greedy() -> Any:
    from hunyuan_mt.config import GenerationConfig

    return GenerationConfig()


def nf4_estimate_gib(settings: Settings) -> float:
    """What NF4 would take, computed (not measured): bitsandbytes quantizes the Linear layers of the decoder to
    4 bits plus about 0.127 bit of double-quantized scales per weight; embeddings and norms stay bf16."""
    c = TINY if settings.tiny else HUNYUAN_MT_7B
    h, hd = c["hidden_size"], c["head_dim"]
    per_layer = (h * c["num_attention_heads"] * hd * 2 + h * c["num_key_value_heads"] * hd * 2
                 + 3 * h * c["intermediate_size"])
    linear = per_layer * c["num_hidden_layers"]
    bf16 = c["vocab_size"] * h * (1 if c["tie_word_embeddings"] else 2) + (2 * c["num_hidden_layers"] + 1) * h
    return round((linear * (4 + 0.127) / 8 + bf16 * 2) / GIB, 2)


# ------------------------------------------------------------------------------------------------------------
# Environment helpers


def _drop_page_cache() -> bool:
    """Ask the kernel to drop the page cache so the load reads the disk (root only; harmless when refused)."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def filesystem_of(path: Path) -> str:
    """The filesystem type holding `path` (tmpfs means the "disk" load really reads RAM)."""
    best, kind = "", "unknown"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and str(path.resolve()).startswith(parts[1]) and len(parts[1]) > len(best):
                best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def environment(settings: Settings) -> dict[str, Any]:
    import peft
    import torch
    import transformers

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "transformers": transformers.__version__, "peft": peft.__version__,
                           "device": settings.device, "tiny": settings.tiny}
    if settings.device.startswith("cuda"):
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, gpu_total_gib=round(p.total_memory / GIB, 1), cuda=torch.version.cuda)
    try:
        import bitsandbytes

        env["bitsandbytes"] = bitsandbytes.__version__
    except ImportError:
        env["bitsandbytes"] = None
    env["shapes"] = {k: v for k, v in (TINY if settings.tiny else HUNYUAN_MT_7B).items()
                     if k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads", "num_key_value_heads", "head_dim")}
    return env


# ------------------------------------------------------------------------------------------------------------
# Output


def markdown(data: dict[str, Any]) -> str:
    env = data["environment"]
    sec = data["sections"]
    shapes = env["shapes"]

    def g(name: str, *keys: str, default: str = "n/a") -> Any:
        node: Any = sec.get(name, {})
        if node.get("status") not in (None, "ok"):
            return str(node.get("status"))  # the reason is listed once under the table
        for k in keys:
            if not isinstance(node, dict) or k not in node:
                return default
            node = node[k]
        return default if node is None else node

    title = "GPU check (tiny shapes, CPU: a dry run of the script)" if env["tiny"] else "GPU check: Hunyuan-MT-7B shapes"
    rows, pairs = g("engine", "rows"), g("engine", "pairs")
    lines = [
        f"## {title}",
        "",
        f"`bench/gpu_check.sh` on {env.get('gpu', env['device'])} (torch {env['torch']}, CUDA {env.get('cuda', '-')}, "
        f"transformers {env['transformers']}, peft {env['peft']}); total {data['total_s']} s. Random weights, no "
        f"download: HunYuanDenseV1 with hidden {shapes['hidden_size']}, {shapes['num_hidden_layers']} layers, "
        f"{shapes['num_attention_heads']}/{shapes['num_key_value_heads']} heads, vocab {shapes['vocab_size']}, bf16, "
        f"SDPA, weights on {env.get('workdir_fs', '?')}; 38 LoRA adapters r={g('adapters', 'rank')} on q/k/v/o "
        f"({g('adapters', 'mib_each')} MiB each); 5 pinned + 3 slots; every row generates "
        f"{g('engine', 'new_tokens')} tokens.",
        "",
        "| measure | value | target |",
        "| --- | --- | --- |",
        f"| backbone load | {g('load', 'load_s')} s, {g('load', 'gpu_gib')} GiB | |",
        f"| + slot layers, 5 pinned + 3 slots | {g('cache', 'gpu_gib')} GiB (+{g('cache', 'added_gib')}) | |",
        f"| slot copy of one adapter ({g('attach', 'adapter_mib')} MiB), p50 | {g('attach', 'slot_copy', 'p50_ms')} "
        f"ms | ≤ 3 ms |",
        f"| attach through the cache: disk / RAM tier, p50 | {g('attach', 'disk_attach', 'p50_ms')} / "
        f"{g('attach', 'ram_tier_attach', 'p50_ms')} ms | |",
        f"| {rows} rows over {pairs} pairs, the engine (static cache, CUDA graphs {g('engine', 'cuda_graphs')}) | "
        f"{g('engine', 'mixed_tok_s')} tok/s ({g('engine', 'mixed_ms')} ms) | ≥ 2,000 tok/s |",
        f"| same rows, PEFT serial set_adapter / one generate with adapter_names | "
        f"{g('peft_baseline', 'serial_tok_s')} / {g('peft_baseline', 'mixed_tok_s')} tok/s | |",
        f"| engine vs PEFT serial set_adapter | {g('engine', 'vs_peft_serial')}× | ≥ 5× |",
        f"| one row, ms per generated token | {g('engine', 'one_row_ms_per_token')} | ≤ 12 |",
        f"| mixed 8-pair decode step / bare-model step (p50) | {g('step_ratio', 'mixed_over_bare')} "
        f"({g('step_ratio', 'mixed', 'p50_ms')} / {g('step_ratio', 'bare', 'p50_ms')} ms) | ≤ 1.3 |",
        f"| pinned pair, first request / steady state | {g('engine', 'pinned_first_over_steady')} "
        f"({g('engine', 'pinned_first_ms')} / {g('engine', 'pinned_steady_ms')} ms) | ≤ 1.1 |",
        f"| rows equal to the row alone, bf16 / fp32 | {g('engine', 'bf16_rows_equal_alone')} / "
        f"{g('exactness_fp32', 'fp32_rows_equal_alone')} | report / 32/32 |",
        f"| light mode: GPU memory before → after entering → after leaving | {g('light_mode', 'gpu_gib_before')} → "
        f"{g('light_mode', 'gpu_gib_after')} → {g('light_mode', 'gpu_gib_after_leaving')} GiB (budget "
        f"{g('light_mode', 'budget_gib')}) | ≤ backbone + pinned + 10 % |",
        f"| light mode: KV cache, latency of {g('light_mode', 'light_rows')} rows (p50) | "
        f"{g('light_mode', 'kv_cache_gib_before')} → {g('light_mode', 'kv_cache_gib_after')} GiB (fp8), "
        f"{g('light_mode', 'light_latency', 'p50_ms')} ms | |",
        "| 4-bit NF4 backbone + 8 adapters | " + (
            f"{g('four_bit', 'nf4_with_8_adapters_gib')} GiB, {g('four_bit', 'mixed_tok_s')} tok/s"
            if sec.get("four_bit", {}).get("status") == "ok" else
            f"not measured ({g('four_bit', 'status')}); computed estimate "
            f"{sec.get('four_bit', {}).get('nf4_estimate_gib', 'n/a')} GiB") + " | ≤ 6 GiB |",
        "",
    ]
    failed = [f"{k}: {v.get('error') or v.get('reason')}" for k, v in sec.items() if v.get("status") != "ok"]
    if failed:
        lines += ["Not measured: " + "; ".join(failed), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="shrink every shape (CPU dry run of the whole path)")
    ap.add_argument("--out", default=None, help="output folder (default: $OUT, else bench/results)")
    ap.add_argument("--workdir", default=None, help="where the random model is written (default: a temp folder)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no new section after this many seconds")
    args = ap.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("[gpu_check] torch is not installed: nothing to check. Exiting 0.")
        return 0
    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print("[gpu_check] no CUDA device visible (torch.cuda.is_available() is False): the GPU check needs one. "
              "Run it on a GPU machine, or `--tiny` for a CPU dry run. Exiting 0.")
        return 0
    try:
        import cachetools  # noqa: F401
    except ImportError:
        print("[gpu_check] the server's adapter cache needs cachetools, which this python lacks: carry its wheel "
              "(docs/GPU.md, 'Running the GPU check'). Exiting 1.")
        return 1
    device = "cuda:0" if cuda else "cpu"
    settings = Settings(tiny=args.tiny, device=device, budget_s=args.budget_s)
    if args.tiny:
        settings.rank, settings.rows, settings.new_tokens, settings.reps = 4, 8, 6, 2
    out_dir = Path(args.out or os.environ.get("OUT") or Path(__file__).resolve().parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)

    report = Report(settings)
    report.data["environment"] = environment(settings)
    report.data["environment"]["workdir_fs"] = filesystem_of(work)
    print(f"[gpu_check] {json.dumps(report.data['environment'])}", flush=True)
    check = Check(settings, work)
    try:
        check.model_dir.mkdir(parents=True, exist_ok=True)
        built = report.section("build", lambda: build_model(settings, check.model_dir))
        made = report.section("adapters", lambda: make_adapters(settings, check.model_dir, check.adapters_dir))
        if built and built["status"] == "ok" and made and made["status"] == "ok":
            loaded = report.section("load", check.load)
            if loaded and loaded["status"] == "ok":
                report.section("peft_baseline", check.peft_baseline)
                cached = report.section("cache", check.cache_section)
                if cached and cached["status"] == "ok":
                    report.section("attach", check.attach)
                    ran = report.section("engine", check.engine_section)
                    report.section("step_ratio", check.step_ratio)
                    if ran and ran["status"] == "ok":
                        report.section("light_mode", check.light_mode)
                report.section("exactness_fp32", check.exactness_fp32)
            report.section("four_bit", check.four_bit)
    finally:
        if check.engine is not None:
            check.engine.close()
        check.engine = check.cache = check.backbone = None
        _free(device)
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    report.data["total_s"] = round(report.elapsed(), 1)
    ok = all(v.get("status") in ("ok", "skipped") for v in report.data["sections"].values())
    report.data["all_ok"] = ok
    (out_dir / "gpu_check.json").write_text(json.dumps(report.data, indent=2, default=str))
    (out_dir / "gpu_check.md").write_text(markdown(report.data))
    print(markdown(report.data))
    print(f"[gpu_check] {'all sections ok' if ok else 'SOME SECTIONS FAILED'}; wrote {out_dir}/gpu_check.json "
          f"and gpu_check.md in {report.data['total_s']} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
