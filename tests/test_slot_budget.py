"""LRU slots that follow a memory budget (`cache.slot_budget_mb`): more adapters stay attached while memory allows,
`cache.slots` is the floor under pressure, and the memory policy closes the extra slots in light mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from hunyuan_mt.adapters.cache import lru_slots
from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.config import CacheConfig, MemoryConfig
from hunyuan_mt.errors import Busy
from hunyuan_mt.runtime.pressure import MemoryMonitor, MemoryPolicy, MemoryReading

PAIRS = ["en2es", "es2en", "en2de", "de2en", "en2fr", "fr2en", "en2zh", "zh2en"]


def _per_slot(backbone, adapters: Path) -> int:
    """Bytes one slot of every wrapped layer takes (A [in, r] + B [r, out], float32) for the tiny adapters."""
    from hunyuan_mt.adapters.registry import AdapterRegistry

    registry = AdapterRegistry(adapters, backbone.spec)
    registry.scan()
    infos = [i for i in registry.infos() if i.usable]
    modules = {m for i in infos for m in i.modules}
    rank = max(i.max_rank for i in infos)
    return sum(sum(backbone.spec.shapes[m]) for m in modules) * rank * 4


def test_the_budget_opens_as_many_slots_as_it_holds_and_no_more_than_the_adapters(
        hunyuan_dir: Path, hunyuan_adapters: Path, fresh_backbone, make_cache) -> None:
    backbone = fresh_backbone(hunyuan_dir, quantization="none")
    per_slot = _per_slot(backbone, hunyuan_adapters)
    budget = 5.5 * per_slot / 2**20
    cache = make_cache(backbone, hunyuan_adapters, slots=3, slot_budget_mb=budget)
    assert cache.stats().slots == 5
    assert backbone.lora.capacity == 5  # the slot layers hold them, no pins
    with cache.lease([Pair.parse(p) for p in PAIRS[:5]]) as lease:
        assert sorted(lease.slots) == [1, 2, 3, 4, 5]
    assert cache.lru_order() == PAIRS[:5]
    huge = make_cache(fresh_backbone(hunyuan_dir, quantization="none"), hunyuan_adapters, slots=3,
                      slot_budget_mb=1e6, pinned=["en2es"])
    assert huge.stats().slots == 7  # the 8 adapters less the pinned one
    assert make_cache(fresh_backbone(hunyuan_dir, quantization="none"), hunyuan_adapters,
                      slots=3).stats().slots == 3  # no budget: exactly `slots`
    registry = cache.registry
    tight = CacheConfig(adapters_dir=str(hunyuan_adapters), slots=3, slot_budget_mb=per_slot / 2**20)
    assert lru_slots(tight, registry, backbone.spec.shapes, backbone.dtype) == 3  # never below the floor


def test_under_pressure_new_pairs_go_only_into_the_floor(hunyuan_dir: Path, hunyuan_adapters: Path, fresh_backbone,
                                                        make_cache) -> None:
    backbone = fresh_backbone(hunyuan_dir, quantization="none")
    budget = 5.5 * _per_slot(backbone, hunyuan_adapters) / 2**20
    cache = make_cache(backbone, hunyuan_adapters, slots=3, slot_budget_mb=budget, lease_timeout_s=0.2)
    for pair in PAIRS[:5]:
        with cache.lease([Pair.parse(pair)]):
            pass
    assert cache.lru_order() == PAIRS[:5]
    assert cache.limit_slots(True) is True and cache.limit_slots(True) is False
    with pytest.raises(Busy, match="asked for 4 adapter slots at once; 3 exist"):
        with cache.lease([Pair.parse(p) for p in PAIRS[4:]]):
            pass
    # en2fr (slot 5) and de2en (slot 4) keep serving; a new pair evicts the least recently used of slots 1-3.
    with cache.lease([Pair.parse("fr2en"), Pair.parse("de2en")]) as lease:
        assert lease.slots[1] == 4 and lease.slots[0] == 1
    assert cache.lru_order() == ["es2en", "en2de", "en2fr", "de2en", "fr2en"]
    cache.limit_slots(False)
    with cache.lease([Pair.parse(p) for p in ("en2zh", "zh2en", "en2es", "es2en", "en2de")]) as lease:
        assert len(set(lease.slots)) == 5


class _Cache:
    def __init__(self) -> None:
        self.calls: list[object] = []

    def limit_slots(self, pressure: bool) -> bool:
        self.calls.append(("limit", pressure))
        return True

    def evict_idle(self, keep_ram: bool = True) -> list:
        self.calls.append(("evict", keep_ram))
        return []


def test_light_mode_closes_the_extra_slots_before_evicting_and_reopens_them() -> None:
    readings = iter([0.95, 0.5])

    def reader() -> MemoryReading:
        used = next(readings)
        return MemoryReading("host", used, int(used * 100), 100, used, 0)

    cache = _Cache()
    policy = MemoryPolicy(MemoryConfig(enabled=True, high_watermark=0.9, low_watermark=0.8),
                          MemoryMonitor("cpu", reader), cache=cache)
    assert policy.check() == "light"
    assert cache.calls == [("limit", True), ("evict", False)]
    assert policy.check() == "normal"
    assert cache.calls[-1] == ("limit", False)
