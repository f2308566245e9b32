"""GPU check: prove the Hunyuan-MT-7B path end to end on one GPU, with no download.

What it does (about 3-5 minutes on one H200, well under 8):
  1. builds a HunYuanDenseV1ForCausalLM with Hunyuan-MT-7B's published shapes and random bf16 weights, saves it
     as safetensors (into a temporary folder, deleted at the end);
  2. writes 38 PEFT LoRA adapters (r=16 on q/k/v/o projections), one per direction zh<->X;
  3. measures backbone load time, GPU memory (backbone only; 3 slots + 5 pinned; all 38 attached), adapter
     attach times (from disk, from the host-RAM tier, hotswap into a preallocated slot), mixed-pair throughput
     (one generate with per-row adapter_names) against serial set_adapter, 4-bit NF4 memory (when bitsandbytes
     is importable), and light-mode switching under a forced memory threshold;
  4. writes gpu_check.json and gpu_check.md (a section for BENCHMARKS.md) to $OUT, else bench/results/.

It imports only torch, transformers, peft and safetensors (what the GPU machine's python3 has), so it runs
outside the project's venv. Without CUDA it prints why and exits 0; `--tiny` shrinks every shape so the whole path
runs on a CPU in well under a minute (how the script itself is tested).

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
# standard library (bench/profile.py hides `profile`, which torch._dynamo imports through cProfile): drop it.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != _HERE]

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
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
GIB = 1024 ** 3


@dataclass
class Settings:
    tiny: bool
    device: str
    rank: int = 16
    rows: int = 32
    prompt_len: int = 64
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
                   "traceback": traceback.format_exc(limit=6)}
            print(out["traceback"], file=sys.stderr, flush=True)
        out["section_s"] = round(time.perf_counter() - t, 2)
        self.data["sections"][name] = out
        shown = {k: v for k, v in out.items() if k != "traceback"}
        print(f"[gpu_check] {name}: {json.dumps(shown, default=str)[:600]}", flush=True)
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


def param_bytes(model: Any) -> int:
    """Bytes of every parameter and buffer (what the weights occupy, whatever the device)."""
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


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
    return {"n": len(values), "p50_ms": round(statistics.median(values), 2), "p95_ms": round(p95, 2),
            "min_ms": round(ordered[0], 2), "max_ms": round(ordered[-1], 2)}


def gib(n: int | None) -> float | None:
    return None if n is None else round(n / GIB, 3)


# ------------------------------------------------------------------------------------------------------------
# Building the model and the adapters


def model_config(settings: Settings) -> Any:
    from transformers import HunYuanDenseV1Config

    return HunYuanDenseV1Config(**(TINY if settings.tiny else HUNYUAN_MT_7B))


def attn_implementation(device: str) -> str:
    """flash_attention_2 when the package is installed and we run on CUDA, else sdpa (as the profile does)."""
    if device.startswith("cuda"):
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            pass
    return "sdpa"


def build_model(settings: Settings, model_dir: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16
    cfg = model_config(settings)
    t = time.perf_counter()
    with torch.device(settings.device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    _sync(settings.device)
    build_s = time.perf_counter() - t
    n_params = sum(p.numel() for p in model.parameters())
    t = time.perf_counter()
    model.save_pretrained(model_dir)
    save_s = time.perf_counter() - t
    files = sorted(p.name for p in model_dir.iterdir())
    size = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    del model
    _free(settings.device)
    if not any(f.endswith(".safetensors") for f in files):
        raise RuntimeError(f"save_pretrained wrote no safetensors: {files}")
    return {"params": n_params, "params_b": round(n_params / 1e9, 3), "build_s": round(build_s, 2),
            "save_s": round(save_s, 2), "safetensors_gib": gib(size), "files": len(files)}


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
                b = torch.randn(out_f, r, generator=gen, device=gen_device) * 0.02
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
    """Holds the loaded model between sections."""

    def __init__(self, settings: Settings, work: Path, report: Report) -> None:
        self.s = settings
        self.work = work
        self.model_dir = work / "hunyuan-mt-7b-random"
        self.adapters_dir = work / "adapters"
        self.report = report
        self.model: Any = None   # PeftModel once adapters are attached
        self.base: Any = None
        self.ram_tier: dict[str, dict[str, Any]] = {}
        self.mem: dict[str, Any] = {}

    # -- load ------------------------------------------------------------------------------------------------

    def load(self) -> dict[str, Any]:
        import torch
        from transformers import AutoModelForCausalLM

        # On the GPU machine the just-written weights would otherwise load from the page cache.
        dropped = False if self.s.tiny else _drop_page_cache()
        _free(self.s.device)
        if self.s.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        attn = attn_implementation(self.s.device)
        t = time.perf_counter()
        self.base = AutoModelForCausalLM.from_pretrained(
            self.model_dir, dtype=torch.bfloat16, device_map=self.s.device, attn_implementation=attn)
        self.base.eval()
        _sync(self.s.device)
        load_s = time.perf_counter() - t
        self.mem["backbone"] = gpu_bytes(self.s.device)
        out = {"load_s": round(load_s, 2), "attn_implementation": attn, "page_cache_dropped": dropped,
               "gpu_gib": gib(self.mem["backbone"]), "param_gib": gib(param_bytes(self.base)),
               "dtype": str(next(self.base.parameters()).dtype)}
        if self.s.device.startswith("cuda"):
            out["peak_gib_during_load"] = gib(torch.cuda.max_memory_allocated())
        return out

    # -- attach ------------------------------------------------------------------------------------------------

    def attach_disk(self, pairs: list[str], times: list[float]) -> None:
        """Attach from disk the way hunyuan_mt.adapters.cache does: read the safetensors into RAM, then inject
        (get_peft_model for the first adapter, add_adapter after) and load the state dict."""
        for pair in pairs:
            path = self.adapters_dir / pair
            with timed(self.s.device, times):
                from safetensors.torch import load_file

                self.inject(pair, load_file(str(path / "adapter_model.safetensors")), self.lora_config(pair))

    def lora_config(self, pair: str) -> Any:
        from peft import LoraConfig

        cfg = LoraConfig.from_pretrained(str(self.adapters_dir / pair))
        cfg.inference_mode = True
        return cfg

    def inject(self, pair: str, state_dict: dict[str, Any], cfg: Any) -> None:
        from peft import get_peft_model, set_peft_model_state_dict

        if self.model is None:
            self.model = get_peft_model(self.base, cfg, adapter_name=pair)
        else:
            self.model.add_adapter(pair, cfg)
        result = set_peft_model_state_dict(self.model, state_dict, adapter_name=pair)
        missing = [k for k in result.missing_keys if "lora_" in k and f".{pair}." in k]
        if missing:
            raise RuntimeError(f"adapter {pair} lacks weights for {missing[0]}")
        self.model.eval()

    def attach_pinned_and_slots(self) -> dict[str, Any]:
        times: list[float] = []
        first = PINNED + [p for p in PAIRS if p not in PINNED][:SLOTS]
        self.attach_disk(first, times)
        self.mem["3_slots_5_pinned"] = gpu_bytes(self.s.device)
        added = self._lora_bytes()
        return {"attached": first, "disk_attach": summary_ms(times[1:] or times), "first_wrap_ms": round(times[0], 1),
                "gpu_gib": gib(self.mem["3_slots_5_pinned"]),
                "adapter_gib": gib(None if self.mem["3_slots_5_pinned"] is None else
                                   self.mem["3_slots_5_pinned"] - self.mem["backbone"]),
                "lora_param_mib": round(added / 2**20, 1)}

    def _lora_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for n, p in self.model.named_parameters() if "lora_" in n)

    def ram_tier_and_hotswap(self) -> dict[str, Any]:
        """RAM tier: detach an adapter, keep its state dict in host RAM, re-attach from it (no disk).
        Hotswap: copy another pair's weights into an attached slot's tensors (same rank and targets)."""
        from safetensors.torch import load_file

        slot_pairs = [p for p in PAIRS if p not in PINNED][:SLOTS]
        tail = [p for p in PAIRS if p not in PINNED and p not in slot_pairs]
        # What the RAM tier holds: CPU state dicts (pinned memory so the copy to the GPU is a fast DMA).
        t = time.perf_counter()
        for pair in tail[:6] + slot_pairs:
            sd = load_file(str(self.adapters_dir / pair / "adapter_model.safetensors"))
            if self.s.device.startswith("cuda"):
                sd = {k: v.pin_memory() for k, v in sd.items()}
            self.ram_tier[pair] = sd
        fill_s = time.perf_counter() - t
        cfg = self.lora_config(slot_pairs[0])

        ram_times: list[float] = []
        victim = slot_pairs[-1]
        for pair in tail[:5]:
            # evict the slot's adapter (as the cache's eviction hook does) then attach `pair` from RAM
            self.model.delete_adapter(victim)
            with timed(self.s.device, ram_times):
                self.inject(pair, self.ram_tier[pair], cfg)
            victim = pair
        # restore the original slot pair so later sections see the usual residents
        self.model.delete_adapter(victim)
        self.inject(slot_pairs[-1], self.ram_tier[slot_pairs[-1]], cfg)

        out: dict[str, Any] = {"ram_tier_fill_s": round(fill_s, 2), "ram_attach": summary_ms(ram_times)}
        try:
            from peft.utils.hotswap import hotswap_adapter_from_state_dict
        except ImportError as exc:
            out["hotswap"] = {"status": "skipped", "reason": f"peft has no hotswap: {exc}"}
            return out
        swap_times: list[float] = []
        slot = slot_pairs[0]
        for pair in tail[:5] + [slot]:  # the last swap puts the slot's own weights back
            with timed(self.s.device, swap_times):
                # the saved keys carry no adapter name; the slot's live tensors are named "<...>.lora_A.<slot>.weight"
                sd = {k.replace(".lora_A.weight", f".lora_A.{slot}.weight").replace(".lora_B.weight",
                                                                                    f".lora_B.{slot}.weight"): v
                      for k, v in self.ram_tier[pair].items()}
                hotswap_adapter_from_state_dict(self.model, sd, adapter_name=slot, config=cfg)
        out["hotswap"] = summary_ms(swap_times[:-1])
        return out

    def attach_all(self) -> dict[str, Any]:
        times: list[float] = []
        rest = [p for p in PAIRS if p not in self.model.peft_config]
        self.attach_disk(rest, times)
        self.mem["all_38"] = gpu_bytes(self.s.device)
        return {"attached_now": len(self.model.peft_config), "disk_attach": summary_ms(times),
                "gpu_gib": gib(self.mem["all_38"]),
                "adapters_gib": gib(None if self.mem["all_38"] is None else self.mem["all_38"] - self.mem["backbone"]),
                "lora_param_gib": gib(self._lora_bytes())}

    # -- throughput --------------------------------------------------------------------------------------------

    def throughput(self) -> dict[str, Any]:
        """32 rows over 8 pairs: one generate with per-row adapter_names vs one set_adapter + generate per pair."""
        import torch

        pairs = PINNED + [p for p in PAIRS if p not in PINNED][:SLOTS]
        rows = self.s.rows
        names = [pairs[i % len(pairs)] for i in range(rows)]
        vocab = self.base.config.vocab_size
        gen = torch.Generator(device="cpu").manual_seed(0)
        ids = torch.randint(10, vocab - 10, (rows, self.s.prompt_len), generator=gen).to(self.s.device)
        mask = torch.ones_like(ids)
        kw = dict(max_new_tokens=self.s.new_tokens, min_new_tokens=self.s.new_tokens, do_sample=False,
                  pad_token_id=self.base.config.pad_token_id)

        def mixed() -> Any:
            with torch.inference_mode():
                return self.model.generate(input_ids=ids, attention_mask=mask, adapter_names=names, **kw)

        def serial() -> dict[int, Any]:
            out = {}
            with torch.inference_mode():
                for pair in pairs:
                    idx = [i for i, n in enumerate(names) if n == pair]
                    self.model.set_adapter(pair)
                    res = self.model.generate(input_ids=ids[idx], attention_mask=mask[idx], **kw)
                    for j, i in enumerate(idx):
                        out[i] = res[j]
            return out

        mixed()  # warm-up (kernels, allocator)
        serial()
        t_mixed: list[float] = []
        t_serial: list[float] = []
        for _ in range(self.s.reps):
            with timed(self.s.device, t_mixed):
                a = mixed()
            with timed(self.s.device, t_serial):
                b = serial()
        same = sum(bool(torch.equal(a[i], b[i])) for i in range(rows))
        tokens = rows * self.s.new_tokens
        m, s = statistics.median(t_mixed), statistics.median(t_serial)
        return {"rows": rows, "pairs_in_batch": len(pairs), "prompt_tokens": self.s.prompt_len,
                "new_tokens": self.s.new_tokens, "adapters_attached": len(self.model.peft_config),
                "mixed_ms": round(m, 1), "serial_set_adapter_ms": round(s, 1),
                "mixed_tok_s": round(tokens / m * 1000, 1), "serial_tok_s": round(tokens / s * 1000, 1),
                "speedup": round(s / m, 2), "rows_identical_to_serial": f"{same}/{rows}"}

    # -- light mode ------------------------------------------------------------------------------------------

    def light_mode(self) -> dict[str, Any]:
        """Force the memory threshold below current use: the policy detaches every non-pinned adapter (their state
        stays in the RAM tier), generates with a smaller batch (and a quantized KV cache where a backend is
        installed), then leaves light mode by re-attaching the slot adapters from RAM."""
        import torch

        used = gpu_bytes(self.s.device) or param_bytes(self.model)
        threshold = int(used * 0.9)  # forced: current use is above it
        pressure = used > threshold
        before = list(self.model.peft_config)
        t = time.perf_counter()
        evicted = [p for p in before if p not in PINNED]
        for pair in evicted:
            self.model.delete_adapter(pair)
        _free(self.s.device)
        _trim_host()
        enter_ms = (time.perf_counter() - t) * 1000
        after = gpu_bytes(self.s.device)

        kv = _quantized_kv_backend()
        light_rows = max(1, self.s.rows // 4)
        names = [PINNED[i % len(PINNED)] for i in range(light_rows)]
        ids = torch.randint(10, self.base.config.vocab_size - 10, (light_rows, self.s.prompt_len),
                            device=self.s.device)
        kw = dict(max_new_tokens=self.s.new_tokens, do_sample=False, pad_token_id=self.base.config.pad_token_id)
        gen_out: dict[str, Any] = {"rows": light_rows}
        gen_t: list[float] = []
        with torch.inference_mode(), timed(self.s.device, gen_t):
            if kv:
                try:
                    cache_config = {"backend": kv} if kv == "fp8" else {"backend": kv, "nbits": 4}
                    self.model.generate(input_ids=ids, adapter_names=names, cache_implementation="quantized",
                                        cache_config=cache_config, **kw)
                    gen_out["kv_cache"] = f"quantized ({kv})"
                except Exception as exc:  # report the failure, keep measuring with the default cache
                    gen_out["kv_cache"] = f"quantized failed: {type(exc).__name__}: {exc}"[:200]
                    self.model.generate(input_ids=ids, adapter_names=names, **kw)
            else:
                gen_out["kv_cache"] = "default (no fp8/quanto/HQQ KV-cache backend here: quantized KV cache skipped)"
                self.model.generate(input_ids=ids, adapter_names=names, **kw)
        gen_out["generate_ms"] = round(gen_t[0], 1)

        # leave light mode: pressure gone, the slots come back from the RAM tier
        cfg = self.lora_config(PINNED[0])
        slot_pairs = [p for p in PAIRS if p not in PINNED][:SLOTS]
        t = time.perf_counter()
        for pair in slot_pairs:
            sd = self.ram_tier.get(pair)
            if sd is None:
                self.attach_disk([pair], [])
            else:
                self.inject(pair, sd, cfg)
        _sync(self.s.device)
        exit_ms = (time.perf_counter() - t) * 1000
        return {"forced_threshold_gib": gib(threshold), "used_gib": gib(used), "pressure": pressure,
                "evicted": len(evicted), "kept_pinned": [p for p in self.model.peft_config if p in PINNED],
                "enter_ms": round(enter_ms, 1), "gpu_gib_before": gib(used if self.s.device.startswith("cuda")
                                                                       else None),
                "gpu_gib_after": gib(after), "light_generate": gen_out, "exit_ms_reattach_3_from_ram": round(exit_ms, 1),
                "resident_after_exit": len(self.model.peft_config)}

    # -- 4 bit -----------------------------------------------------------------------------------------------

    def four_bit(self) -> dict[str, Any]:
        import torch

        try:
            import bitsandbytes  # noqa: F401
            from transformers import BitsAndBytesConfig
        except ImportError as exc:
            return {"status": "skipped", "reason": f"bitsandbytes not importable here ({exc})",
                    "nf4_estimate_gib": nf4_estimate_gib(self.s)}
        if not self.s.device.startswith("cuda"):
            return {"status": "skipped", "reason": "NF4 needs CUDA"}
        from transformers import AutoModelForCausalLM

        # free the bf16 copy first: both at once would only measure their sum
        self.model = self.base = None
        self.ram_tier.clear()
        _free(self.s.device)
        base_mem = gpu_bytes(self.s.device)
        q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
                               bnb_4bit_use_double_quant=True)
        t = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, quantization_config=q, device_map=self.s.device,
                                                     dtype=torch.bfloat16)
        load_s = time.perf_counter() - t
        mem = (gpu_bytes(self.s.device) or 0) - (base_mem or 0)
        ids = torch.randint(10, 1000, (4, 32), device=self.s.device)
        with torch.inference_mode():
            model.generate(input_ids=ids, max_new_tokens=8, do_sample=False, pad_token_id=model.config.pad_token_id)
        del model
        _free(self.s.device)
        return {"nf4_gpu_gib": gib(mem), "bf16_gpu_gib": gib(self.mem.get("backbone")), "load_s": round(load_s, 2),
                "generates": True}


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


def _trim_host() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _quantized_kv_backend() -> str | None:
    """The KV-cache quantization backend light mode would use: transformers' built-in fp8 first (what
    hunyuan_mt.memory selects), else quanto or HQQ when installed."""
    try:
        from transformers.cache_utils import Fp8QuantizedLayer  # noqa: F401

        return "fp8"
    except ImportError:
        pass
    for module, backend in (("optimum.quanto", "quanto"), ("hqq", "HQQ")):
        try:
            __import__(module)
            return backend
        except ImportError:
            continue
    return None


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
                           "device": settings.device, "tiny": settings.tiny,
                           "attn_implementation": attn_implementation(settings.device),
                           "quantized_kv_backend": _quantized_kv_backend()}
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
    lines = [
        f"## {title}",
        "",
        f"`bench/gpu_check.sh` on {env.get('gpu', env['device'])} (torch {env['torch']}, CUDA {env.get('cuda', '-')}, "
        f"transformers {env['transformers']}, peft {env['peft']}); total {data['total_s']} s. Random weights, no download: "
        f"HunYuanDenseV1 with hidden {shapes['hidden_size']}, {shapes['num_hidden_layers']} layers, "
        f"{shapes['num_attention_heads']}/{shapes['num_key_value_heads']} heads, vocab {shapes['vocab_size']}, "
        f"bf16, attention `{env['attn_implementation']}`, weights on {env.get('workdir_fs', '?')}; 38 LoRA adapters r={g('adapters', 'rank')} on q/k/v/o "
        f"({g('adapters', 'mib_each')} MiB each).",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| parameters | {g('build', 'params_b')} B ({g('build', 'safetensors_gib')} GiB safetensors, "
        f"saved in {g('build', 'save_s')} s) |",
        f"| backbone load (safetensors → GPU{', page cache dropped' if g('load', 'page_cache_dropped') is True else ''}) "
        f"| {g('load', 'load_s')} s |",
        f"| GPU memory: backbone only | {g('load', 'gpu_gib')} GiB |",
        f"| GPU memory: 5 pinned + 3 slots | {g('pinned_and_slots', 'gpu_gib')} GiB |",
        f"| GPU memory: all 38 attached | {g('all_38', 'gpu_gib')} GiB |",
        f"| attach from disk (p50 / p95) | {g('all_38', 'disk_attach', 'p50_ms')} / "
        f"{g('all_38', 'disk_attach', 'p95_ms')} ms |",
        f"| attach from the RAM tier (p50 / p95) | {g('ram_tier_hotswap', 'ram_attach', 'p50_ms')} / "
        f"{g('ram_tier_hotswap', 'ram_attach', 'p95_ms')} ms |",
        f"| hotswap into a slot (p50 / p95) | {g('ram_tier_hotswap', 'hotswap', 'p50_ms')} / "
        f"{g('ram_tier_hotswap', 'hotswap', 'p95_ms')} ms |",
        f"| mixed batch, {g('throughput', 'rows')} rows / {g('throughput', 'pairs_in_batch')} pairs, "
        f"one generate with adapter_names | {g('throughput', 'mixed_tok_s')} tok/s "
        f"({g('throughput', 'mixed_ms')} ms) |",
        f"| same rows, serial set_adapter per pair | {g('throughput', 'serial_tok_s')} tok/s "
        f"({g('throughput', 'serial_set_adapter_ms')} ms); speedup {g('throughput', 'speedup')}× |",
        f"| rows identical, mixed vs serial (greedy, bf16) | {g('throughput', 'rows_identical_to_serial')} |",
        "| 4-bit NF4 backbone memory | " + (
            f"{g('four_bit', 'nf4_gpu_gib')} GiB" if sec.get("four_bit", {}).get("status") == "ok" else
            f"not measured ({g('four_bit', 'status')}); computed estimate "
            f"{sec.get('four_bit', {}).get('nf4_estimate_gib', 'n/a')} GiB") + " |",
        f"| light mode: enter (detach {g('light_mode', 'evicted')} non-pinned) | {g('light_mode', 'enter_ms')} ms, "
        f"GPU {g('light_mode', 'gpu_gib_before')} → {g('light_mode', 'gpu_gib_after')} GiB |",
        f"| light mode: generate ({g('light_mode', 'light_generate', 'rows')} rows) | "
        f"{g('light_mode', 'light_generate', 'generate_ms')} ms, KV cache: "
        f"{g('light_mode', 'light_generate', 'kv_cache')} |",
        f"| light mode: leave (3 slots back from RAM) | {g('light_mode', 'exit_ms_reattach_3_from_ram')} ms |",
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
    device = "cuda:0" if cuda else "cpu"
    settings = Settings(tiny=args.tiny, device=device, budget_s=args.budget_s)
    if args.tiny:
        settings.rank, settings.rows, settings.prompt_len, settings.new_tokens, settings.reps = 4, 8, 8, 4, 1
        torch.set_num_threads(min(2, torch.get_num_threads()))
    out_dir = Path(args.out or os.environ.get("OUT") or Path(__file__).resolve().parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)

    report = Report(settings)
    report.data["environment"] = environment(settings)
    report.data["environment"]["workdir_fs"] = filesystem_of(work)
    print(f"[gpu_check] {json.dumps(report.data['environment'])}", flush=True)
    check = Check(settings, work, report)
    try:
        check.model_dir.mkdir(parents=True, exist_ok=True)
        built = report.section("build", lambda: build_model(settings, check.model_dir))
        made = report.section("adapters", lambda: make_adapters(settings, check.model_dir, check.adapters_dir))
        if built and built["status"] == "ok" and made and made["status"] == "ok":
            loaded = report.section("load", check.load)
            if loaded and loaded["status"] == "ok":
                report.section("pinned_and_slots", check.attach_pinned_and_slots)
                if check.model is not None:
                    report.section("ram_tier_hotswap", check.ram_tier_and_hotswap)
                    report.section("all_38", check.attach_all)
                    report.section("throughput", check.throughput)
                    report.section("light_mode", check.light_mode)
            report.section("four_bit", check.four_bit)
    finally:
        check.model = check.base = None
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
