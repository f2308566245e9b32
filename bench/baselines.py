"""The baselines, written the way people write them, with plain transformers + PEFT (nothing from our engine).

- B0 `ReloadPerRequest`: every request loads the model and its adapter from disk, translates, drops them. This is
  what a naive web UI does (a pipeline built inside the handler). Requests are serialized like Gradio's default
  `concurrency_limit=1`; running them in parallel on 2 cores only multiplies the loads and the memory.
- B1 `SetAdapterServer`: the backbone stays resident; each request takes a global lock, attaches its adapter on
  first use (and keeps it: no eviction, which is the cheapest policy for B1), calls `set_adapter` and runs a
  one-row `generate`. The usual hand-written server.
- B2 `AllAttached`: like B1 but every registered adapter is attached at start. It exists for the memory comparison.

All three use the same tokenizer input, greedy settings and `max_new_tokens` as ours, so each row does the same work.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hunyuan_mt.text import prompts

from .workload import Request


@dataclass(frozen=True)
class ModelSpec:
    """What a baseline needs to load and run the same model as ours."""
    model_dir: Path
    adapters_dir: Path
    device: str
    dtype: str
    max_new_tokens: int
    num_beams: int = 1
    repetition_penalty: float = 1.0


def resolve_device_dtype(device: str, dtype: str) -> tuple[str, torch.dtype]:
    """Same defaults as the backbone: "auto" → cuda:0 with bfloat16 when CUDA exists, else cpu with float32."""
    dev = ("cuda:0" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    if dtype == "auto":
        return dev, torch.bfloat16 if dev.startswith("cuda") else torch.float32
    return dev, getattr(torch, dtype)


class PlainModel:
    """Tokenizer + model class + the input format; shared by the baselines and the cold-start reference."""

    def __init__(self, spec: ModelSpec) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self.spec = spec
        self.device, self.dtype = resolve_device_dtype(spec.device, spec.dtype)
        self.config = AutoConfig.from_pretrained(spec.model_dir)
        self.encoder_decoder = bool(getattr(self.config, "is_encoder_decoder", False))
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model_dir)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    def model_class(self) -> Any:
        from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

        return AutoModelForSeq2SeqLM if self.encoder_decoder else AutoModelForCausalLM

    def load_model(self) -> Any:
        model = self.model_class().from_pretrained(self.spec.model_dir, dtype=self.dtype)
        return model.to(self.device).eval()

    def encode(self, req: Request) -> tuple[dict[str, torch.Tensor], int]:
        """Model inputs for one row, built like the backbone builds them; returns (inputs, prompt tokens to cut)."""
        tok = self.tokenizer
        if self.encoder_decoder:
            vocab = tok.get_vocab()
            prefix = f">>{req.tgt}<<"  # Marian multi-target models mark the target in the source
            text = f"{prefix} {req.text}" if prefix in vocab else req.text
            batch = dict(tok([text], return_tensors="pt"))
            tag = vocab.get(f"__{req.tgt}__")  # the demo forces a target-language token as 2nd decoder input
            cut = 1
            if tag is not None:
                start = self.config.decoder_start_token_id
                batch["decoder_input_ids"] = torch.tensor([[start, tag]])
                cut = 2
        else:
            prompt = prompts.build("hunyuan-mt", req.text, req.src, req.tgt)
            templated = bool(tok.chat_template)
            if templated:
                ending = prompts.recipe("hunyuan-mt").add_generation_prompt  # as the server renders it
                prompt = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=ending)
            batch = dict(tok([prompt], return_tensors="pt", add_special_tokens=not templated))
            cut = batch["input_ids"].shape[1]
        return {k: v.to(self.device) for k, v in batch.items()}, cut

    @torch.inference_mode()
    def generate(self, model: Any, req: Request) -> str:
        batch, cut = self.encode(req)
        out = model.generate(**batch, max_new_tokens=self.spec.max_new_tokens, num_beams=self.spec.num_beams,
                             do_sample=False, repetition_penalty=self.spec.repetition_penalty,
                             temperature=None, top_p=None, top_k=None, pad_token_id=self.tokenizer.pad_token_id)
        return self.tokenizer.decode(out[0, cut:], skip_special_tokens=True).strip()


class Variant:
    """One way of serving requests. `translate` is called from many client threads at once."""

    name = "?"

    def start(self) -> None: ...

    def translate(self, req: Request) -> str:
        raise NotImplementedError

    def counters(self) -> dict[str, float]:
        """Cumulative adapter counters: lookups, hits, disk_loads, ram_hits (deltas are taken per cell)."""
        return {}

    def close(self) -> None: ...


class ReloadPerRequest(Variant):
    """B0: load model + adapter for every request (tokenizer kept, the cheapest part, so B0 is not inflated)."""

    name = "B0"

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._lock = threading.Lock()
        self._n = 0

    def start(self) -> None:
        self.plain = PlainModel(self.spec)

    def translate(self, req: Request) -> str:
        from peft import PeftModel

        with self._lock:
            model = self.plain.load_model()
            model = PeftModel.from_pretrained(model, self.spec.adapters_dir / req.pair, adapter_name=req.pair)
            self._n += 1
            try:
                return self.plain.generate(model, req)
            finally:
                del model

    def counters(self) -> dict[str, float]:
        return {"lookups": self._n, "hits": 0, "disk_loads": self._n, "ram_hits": 0}


class SetAdapterServer(Variant):
    """B1: resident backbone, attach-on-first-use (kept forever), `set_adapter` + generate under one lock."""

    name = "B1"

    def __init__(self, spec: ModelSpec, preload: list[str] | None = None,
                 preload_deadline_s: float | None = None) -> None:
        self.spec = spec
        self.preload = preload or []
        self.preload_deadline_s = preload_deadline_s
        self.preload_s = 0.0
        self._lock = threading.Lock()
        self._model: Any = None
        self._loaded: set[str] = set()
        self._lookups = 0
        self._loads = 0
        self.load_ms: list[float] = []

    def start(self) -> None:
        self.plain = PlainModel(self.spec)
        self._model = self.plain.load_model()
        t0 = time.perf_counter()
        for pair in self.preload:
            if self.preload_deadline_s is not None and time.perf_counter() - t0 > self.preload_deadline_s:
                break  # bounded: PEFT's attach cost grows with the adapters already attached (see BENCHMARKS.md)
            self._attach(pair)
        self.preload_s = time.perf_counter() - t0
        self.preload = [p for p in self.preload if p in self._loaded]

    def _attach(self, pair: str) -> None:
        from peft import PeftModel

        t0 = time.perf_counter()
        path = self.spec.adapters_dir / pair
        if not self._loaded:
            self._model = PeftModel.from_pretrained(self._model, path, adapter_name=pair)
        else:
            self._model.load_adapter(path, adapter_name=pair)
        self._loaded.add(pair)
        self._loads += 1
        self.load_ms.append((time.perf_counter() - t0) * 1000)

    def translate(self, req: Request) -> str:
        with self._lock:
            self._lookups += 1
            if req.pair not in self._loaded:
                self._attach(req.pair)
            self._model.set_adapter(req.pair)
            return self.plain.generate(self._model, req)

    def extra(self) -> dict[str, Any]:
        """`load_adapter` timings: the conventional PEFT disk attach (inject LoRA layers), for comparison."""
        ordered = sorted(self.load_ms)
        n = len(self.load_ms)
        return {"adapters_attached": len(self._loaded), "preload_s": round(self.preload_s, 2),
                "load_adapter_ms_median": round(ordered[n // 2], 2) if ordered else None,
                # Attach time of the first and the last tenth of the attaches, in order: PEFT walks every module
                # and parameter (all adapters included) on each load_adapter, so attaches slow down as N grows.
                "load_adapter_ms_first_tenth": round(sum(self.load_ms[:max(1, n // 10)]) / max(1, n // 10), 2)
                if n else None,
                "load_adapter_ms_last_tenth": round(sum(self.load_ms[-max(1, n // 10):]) / max(1, n // 10), 2)
                if n else None}

    def counters(self) -> dict[str, float]:
        # Preloaded adapters are not request-time loads.
        return {"lookups": self._lookups, "hits": self._lookups - (self._loads - len(self.preload)),
                "disk_loads": self._loads - len(self.preload), "ram_hits": 0}


class AllAttached(SetAdapterServer):
    """B2: every registered adapter attached at start (memory grows with the number of pairs)."""

    name = "B2"

    def __init__(self, spec: ModelSpec, preload_deadline_s: float | None = None) -> None:
        registered = sorted(p.name for p in spec.adapters_dir.iterdir() if (p / "adapter_config.json").is_file())
        super().__init__(spec, preload=registered, preload_deadline_s=preload_deadline_s)
