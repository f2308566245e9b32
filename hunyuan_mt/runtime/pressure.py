"""Memory-pressure monitor and the light-mode policy.

The monitor reads GPU memory on CUDA (`torch.cuda.mem_get_info`) and host memory otherwise (psutil); tests inject
readings through its `reader` seam. The policy has hysteresis: above `high_watermark` it enters light mode, below
`low_watermark` it returns to normal, in between it keeps its mode. Light mode:

- closes the LRU slots a memory budget opened beyond `cache.slots` to new pairs (`cache.limit_slots`), and detaches
  every idle non-pinned adapter (`cache.evict_idle`), keeping them in the RAM tier while host memory allows;
- shrinks the engine's rows and token budget per batch;
- switches decoder-only models to a quantized KV cache (transformers' built-in fp8 backend) where supported;
- lowers log verbosity to warnings.

Every transition is logged (at WARNING, so it survives the lowered verbosity), counted and exposed by `status()`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Protocol

import psutil

from ..config import MemoryConfig

log = logging.getLogger(__name__)

NORMAL = "normal"
LIGHT = "light"
#: Loggers quieted in light mode (their level is restored on return).
QUIET_LOGGERS = ("hunyuan_mt", "transformers", "peft")


@dataclass(frozen=True)
class MemoryReading:
    #: "cuda" when the fraction is GPU memory, "host" when it is system RAM.
    source: str
    #: Fraction in use of the memory the policy watches, 0..1.
    used_fraction: float
    used_bytes: int
    total_bytes: int
    #: Host memory in use, 0..1 (also on CUDA: decides whether evicted adapters may stay in the RAM tier).
    host_fraction: float
    #: This process's resident set size.
    rss_bytes: int


class MemoryMonitor:
    """Reads memory use. `reader` replaces the real reading (the test seam)."""

    def __init__(self, device: str = "cpu", reader: Callable[[], MemoryReading] | None = None) -> None:
        self.device = device
        self._reader = reader
        self._process = psutil.Process()

    def read(self) -> MemoryReading:
        if self._reader is not None:
            return self._reader()
        vm = psutil.virtual_memory()
        host_used = vm.total - vm.available
        host_fraction = host_used / vm.total if vm.total else 0.0
        rss = self._process.memory_info().rss
        if self.device.startswith("cuda"):
            import torch

            free, total = torch.cuda.mem_get_info(torch.device(self.device))
            return MemoryReading("cuda", (total - free) / total, total - free, total, host_fraction, rss)
        return MemoryReading("host", host_fraction, host_used, vm.total, host_fraction, rss)

    def gpu(self) -> dict[str, int] | None:
        """Allocator figures for the status page, or None without CUDA."""
        if not self.device.startswith("cuda"):
            return None
        import torch

        dev = torch.device(self.device)
        free, total = torch.cuda.mem_get_info(dev)
        return {"used_bytes": total - free, "total_bytes": total, "allocated_bytes": torch.cuda.memory_allocated(dev),
                "reserved_bytes": torch.cuda.memory_reserved(dev), "peak_allocated_bytes":
                torch.cuda.max_memory_allocated(dev)}


class LightModeTarget(Protocol):
    """The engine's side of light mode (see BatchEngine.set_light_mode)."""

    def set_light_mode(self, on: bool) -> dict[str, Any]: ...


class EvictingCache(Protocol):
    def evict_idle(self, keep_ram: bool = True) -> list[Any]: ...
    def limit_slots(self, pressure: bool) -> bool: ...


@dataclass
class Transition:
    at: float
    mode: str
    used_fraction: float
    source: str
    evicted: list[str] = field(default_factory=list)


class MemoryPolicy:
    """Hysteresis between normal and light mode, applied to the cache, the engine and the log level."""

    def __init__(self, cfg: MemoryConfig, monitor: MemoryMonitor, cache: EvictingCache | None = None,
                 engine: LightModeTarget | None = None) -> None:
        self.cfg = cfg
        self.monitor = monitor
        self.cache = cache
        self.engine = engine
        self.mode = NORMAL
        self.transitions = 0
        self.history: list[Transition] = []
        self.last_reading: MemoryReading | None = None
        self.engine_effect: dict[str, Any] = {}
        self._saved_levels: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ decisions

    def check(self) -> str:
        """Take one reading and change mode if a watermark was crossed. Returns the mode after the check."""
        reading = self.monitor.read()
        with self._lock:
            self.last_reading = reading
            if self.mode == NORMAL and reading.used_fraction > self.cfg.high_watermark:
                self._enter_light(reading)
            elif self.mode == LIGHT and reading.used_fraction < self.cfg.low_watermark:
                self._leave_light(reading)
            return self.mode

    def _enter_light(self, reading: MemoryReading) -> None:
        evicted: list[str] = []
        if self.cache is not None:
            # New pairs only into the configured slots (the floor), then the idle ones out: the slots a memory
            # budget opened beyond the floor (cache.slot_budget_mb) take no new adapter while under pressure.
            self.cache.limit_slots(True)
            # Keep evicted adapters in host RAM unless host RAM is itself what is under pressure.
            keep_ram = reading.host_fraction < self.cfg.high_watermark
            evicted = [getattr(p, "key", str(p)) for p in self.cache.evict_idle(keep_ram=keep_ram)]
        if self.engine is not None:
            self.engine_effect = self.engine.set_light_mode(True)
        self.mode = LIGHT
        self.transitions += 1
        self.history.append(Transition(time.time(), LIGHT, reading.used_fraction, reading.source, evicted))
        log.warning("memory: entering light mode (%s at %.0f%% > %.0f%%): evicted %s, engine %s",
                    reading.source, reading.used_fraction * 100, self.cfg.high_watermark * 100,
                    evicted or "nothing", self.engine_effect or "unchanged")
        for name in QUIET_LOGGERS:
            logger = logging.getLogger(name)
            self._saved_levels[name] = logger.level
            if logger.getEffectiveLevel() < logging.WARNING:
                logger.setLevel(logging.WARNING)

    def _leave_light(self, reading: MemoryReading) -> None:
        for name, level in self._saved_levels.items():
            logging.getLogger(name).setLevel(level)
        self._saved_levels.clear()
        if self.cache is not None:
            self.cache.limit_slots(False)
        if self.engine is not None:
            self.engine_effect = self.engine.set_light_mode(False)
        self.mode = NORMAL
        self.transitions += 1
        self.history.append(Transition(time.time(), NORMAL, reading.used_fraction, reading.source))
        log.warning("memory: back to normal mode (%s at %.0f%% < %.0f%%)", reading.source,
                    reading.used_fraction * 100, self.cfg.low_watermark * 100)

    # ------------------------------------------------------------------ background polling

    def start(self) -> None:
        """Poll every `poll_interval_s` in a daemon thread (no-op when disabled or already running)."""
        if not self.cfg.enabled or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="hmt-memory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.poll_interval_s):
            try:
                self.check()
            except Exception:  # a failed reading must not kill the monitor; the next poll tries again
                log.exception("memory: reading failed")

    # ------------------------------------------------------------------ reporting

    def status(self) -> dict[str, Any]:
        reading = self.last_reading
        return {
            "mode": self.mode,
            "transitions": self.transitions,
            "high_watermark": self.cfg.high_watermark,
            "low_watermark": self.cfg.low_watermark,
            "enabled": self.cfg.enabled,
            "last_reading": None if reading is None else asdict(reading),
            "engine": dict(self.engine_effect),
            "history": [asdict(t) for t in self.history[-20:]],
        }


def quantized_kv_support(model: Any, arch: str) -> tuple[bool, str]:
    """Whether light mode can switch this model to a quantized KV cache, and why not.

    transformers 5.24's `QuantizedCache` has three backends: quanto (needs optimum-quanto), HQQ (needs hqq) and
    a built-in per-tensor fp8 one. We use fp8: it needs nothing extra. Encoder-decoder models (Marian) are
    refused by transformers itself.
    """
    if arch != "decoder-only":
        return False, "not supported for encoder-decoder models (transformers' QuantizedCache is decoder-only)"
    try:
        import torch
        from transformers.cache_utils import Fp8QuantizedLayer  # noqa: F401
    except ImportError:
        return False, "this transformers version has no fp8 KV-cache backend"
    if not hasattr(torch, "float8_e4m3fn"):
        return False, "this torch build has no float8_e4m3fn dtype"
    base = getattr(model, "get_base_model", lambda: model)()
    supports = getattr(base, "_supports_default_dynamic_cache", None)
    if callable(supports) and not supports():
        return False, f"{type(base).__name__} does not use the dynamic cache that quantization needs"
    return True, "fp8 (transformers built-in QuantizedCache backend)"


#: generate() keyword arguments that select the quantized KV cache.
QUANTIZED_KV_KWARGS: dict[str, Any] = {"cache_implementation": "quantized", "cache_config": {"backend": "fp8"}}
