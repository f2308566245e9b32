"""Adapter cache: exact LRU order, pins, RAM tier, leases under pressure, Busy, single-flight, fault containment.

Races are made reproducible with events: a gate in the disk reader holds a load open, a thread holds a lease
open, and the test proceeds only when the cache's own counters show the state it needs.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from peft import PeftModel

import tiny_models
from hunyuan_mt.adapters import cache as cache_mod
from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.runtime.backbone import PromptRow
from hunyuan_mt.config import GenerationConfig
from hunyuan_mt.errors import AdapterNotFound, AdapterUnusable, Busy

P = Pair.parse
GREEDY = GenerationConfig()
ROW = PromptRow("Hello world, how are you today?", "en", "es")


def touch(cache, *keys: str) -> None:
    with cache.lease([P(k) for k in keys]):
        pass


def run(backbone, cache, key: str | None, row: PromptRow = ROW) -> str:
    with cache.lease([None if key is None else P(key)]) as lease:
        return backbone.generate([row], lease.slots, GREEDY, max_new_tokens=10)[0]


def wait_until(predicate, what: str, timeout: float = 30.0) -> None:
    """Poll the cache's own state (not a timing assertion: the timeout only guards against a hang)."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


class DiskSpy:
    """Wraps the cache's one disk read path; optionally holds each read until `gate` is set."""

    def __init__(self, monkeypatch, gate: threading.Event | None = None, only: str | None = None) -> None:
        self.calls: list[str] = []
        self.entered = threading.Event()
        self.gate = gate
        real = cache_mod.read_adapter

        def spy(info):
            self.calls.append(info.key)
            if only is None or info.key == only:
                self.entered.set()
                if self.gate is not None:
                    assert self.gate.wait(30)
            return real(info)

        monkeypatch.setattr(cache_mod, "read_adapter", spy)


@pytest.fixture()
def marian(fresh_backbone, marian_dir: Path):
    return fresh_backbone(marian_dir)


@pytest.fixture(scope="module")
def references(marian_dir: Path, marian_adapters: Path) -> dict[str | None, str]:
    """Each adapter's output for ROW, computed on a separate model through plain PEFT (independent of the cache)."""
    from hunyuan_mt.runtime.backbone import Backbone
    from hunyuan_mt.config import ModelConfig

    bb = Backbone.load_uncached(ModelConfig(path=str(marian_dir), warmup=False))
    refs: dict[str | None, str] = {None: bb.generate([ROW], [0], GREEDY, max_new_tokens=10)[0]}
    refs.update(peft_references(bb, marian_adapters, tiny_models.DEFAULT_PAIRS, ROW))
    assert len(set(refs.values())) == len(refs), "test adapters must give distinct outputs"
    return refs


def peft_references(bb, root: Path, keys, row: PromptRow) -> dict[str, str]:
    """`row` under each adapter alone, through PEFT's own layers and transformers' generate."""
    peft_model = PeftModel.from_pretrained(bb.model, root / keys[0], adapter_name=keys[0])
    for key in keys[1:]:
        peft_model.load_adapter(root / key, adapter_name=key)
    bb.model = peft_model
    out = {}
    for key in keys:
        peft_model.set_adapter(key)
        out[key] = bb._hf_generate([bb.encode(row)], [0], GREEDY, 10)[0]
    bb.model = peft_model.unload()
    return out


def test_exact_lru_order_after_each_step(marian, make_cache, marian_adapters: Path) -> None:
    cache = make_cache(marian, marian_adapters, slots=3, ram_tier=2)
    steps = [
        # (pair leased, LRU order after, RAM tier after)
        ("en2de", ["en2de"], []),
        ("en2fr", ["en2de", "en2fr"], []),
        ("fr2en", ["en2de", "en2fr", "fr2en"], []),
        ("en2de", ["en2fr", "fr2en", "en2de"], []),            # hit: moves to the end
        ("en2zh", ["fr2en", "en2de", "en2zh"], ["en2fr"]),     # evicts the least recently used
        ("zh2en", ["en2de", "en2zh", "zh2en"], ["en2fr", "fr2en"]),
        ("de2en", ["en2zh", "zh2en", "de2en"], ["fr2en", "en2de"]),  # RAM tier holds 2: en2fr dropped
        ("fr2en", ["zh2en", "de2en", "fr2en"], ["en2de", "en2zh"]),  # back from RAM
        ("en2fr", ["de2en", "fr2en", "en2fr"], ["en2de", "en2zh", "zh2en"][1:]),  # from disk again
    ]
    for key, lru, ram in steps:
        touch(cache, key)
        assert (cache.lru_order(), cache.ram_tier()) == (lru, ram), key
    s = cache.stats()
    assert (s.hits, s.ram_hits, s.disk_loads, s.evictions) == (1, 1, 7, 5)
    assert (s.attaches, s.grows) == (8, 0)  # every load is a copy into a slot; the layers were sized at start


def test_pins_are_never_evicted_and_not_counted(marian, make_cache, marian_adapters: Path) -> None:
    cache = make_cache(marian, marian_adapters, slots=2, pinned=["en2es", "es2en"])
    assert cache.pinned() == ["en2es", "es2en"] and cache.lru_order() == []
    # Preloading the pins is not a lookup: no misses, and no hit rate before the first request.
    start = cache.stats()
    assert (start.pin_loads, start.disk_loads, start.hit_rate, cache.hit_rate()) == (2, 0, None, None)
    for key in ["en2de", "de2en", "en2fr", "fr2en", "en2zh", "zh2en", "en2es", "es2en"]:
        touch(cache, key)
        assert cache.pinned() == ["en2es", "es2en"]
        assert len(cache.lru_order()) <= 2 and not {"en2es", "es2en"} & set(cache.lru_order())
    s = cache.stats()
    assert cache.lru_order() == ["en2zh", "zh2en"]
    assert s.pinned_hits == 2 and s.evictions == 4 and s.resident_count == 4
    assert (s.pin_loads, s.disk_loads) == (2, 6) and s.hit_rate == 2 / 8
    # LRU slots are 1..2; the pins have slots of their own after them.
    assert [(r.key, r.pinned, r.slot) for r in s.resident] == [
        ("en2es", True, 3), ("es2en", True, 4), ("en2zh", False, 1), ("zh2en", False, 2)]


def test_pinned_lease_uses_the_pins_slot(marian, make_cache, marian_adapters: Path, references) -> None:
    cache = make_cache(marian, marian_adapters, slots=2, pinned=["en2es"])
    with cache.lease([P("en2es"), None, P("en2de")]) as lease:
        assert lease.slots == [3, 0, 1]  # pin after the 2 LRU slots, 0 = the bare backbone
    assert run(marian, cache, "en2es") == references["en2es"]


def test_ram_tier_hit_does_not_read_disk(marian, make_cache, marian_adapters: Path, references, monkeypatch) -> None:
    import safetensors.torch

    cache = make_cache(marian, marian_adapters, slots=1, ram_tier=4)
    touch(cache, "en2de")
    touch(cache, "en2fr")  # pushes en2de into the RAM tier
    assert cache.ram_tier() == ["en2de"]
    spy = DiskSpy(monkeypatch)
    monkeypatch.setattr(safetensors.torch, "load_file", lambda *a, **k: pytest.fail("read the disk"))
    before = cache.stats()
    assert run(marian, cache, "en2de") == references["en2de"]
    after = cache.stats()
    assert spy.calls == []
    assert (after.ram_hits - before.ram_hits, after.disk_loads - before.disk_loads) == (1, 0)
    assert cache.ram_tier() == ["en2fr"] and cache.lru_order() == ["en2de"]


def _resident_kb(path: Path) -> tuple[int, int]:
    """(mappings of `path` in this process, their resident kB), from /proc/self/smaps."""
    target, mappings, resident, inside = str(path.resolve()), 0, 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's header line
            inside = len(fields) == 6 and fields[5] == target
            mappings += inside
        elif inside and fields[0] == "Rss:":
            resident += int(fields[1])
    return mappings, resident


def test_the_copy_kept_for_re_attaching_is_not_resident_while_its_slot_holds_it(marian, make_cache, adapters_copy,
                                                                                 references, monkeypatch) -> None:
    """A float32 slot on the CPU is copied from the adapter file's own pages, which are then given back: the
    cache's RAM-tier copy costs no resident memory (the slot holds the adapter), and re-attaching from it reads
    the same numbers (the reference is PEFT's output). The tiny adapters stand for large ones here (a file under
    RELEASE_MIN_BYTES keeps its pages: see the next test)."""
    import hunyuan_mt.adapters.cache as cache_module

    monkeypatch.setattr(cache_module, "RELEASE_MIN_BYTES", 0)
    weights = adapters_copy / "en2de" / "adapter_model.safetensors"
    cache = make_cache(marian, adapters_copy, slots=1, ram_tier=4)
    assert run(marian, cache, "en2de") == references["en2de"]
    mappings, resident = _resident_kb(weights)
    assert mappings >= 1 and resident == 0
    touch(cache, "en2fr")                      # en2de to the RAM tier, still mapped, still not resident
    assert cache.ram_tier() == ["en2de"] and _resident_kb(weights) == (mappings, 0)
    before = cache.stats()
    assert run(marian, cache, "en2de") == references["en2de"]
    assert cache.stats().disk_loads == before.disk_loads and _resident_kb(weights)[1] == 0


def test_a_small_adapter_file_keeps_its_pages_and_spares_the_attach_the_search(marian, make_cache, adapters_copy,
                                                                                 references, monkeypatch) -> None:
    """Below RELEASE_MIN_BYTES the attach does not look for the file's mappings (a read of /proc/self/maps, ms of
    every attach) to give back a few MB."""
    import hunyuan_mt.adapters.cache as cache_module

    searched: list[object] = []
    monkeypatch.setattr(cache_module.heap, "release_file_pages", lambda tensors, path: searched.append(path) or 0)
    cache = make_cache(marian, adapters_copy, slots=1, ram_tier=4)
    assert run(marian, cache, "en2de") == references["en2de"]
    assert searched == []
    monkeypatch.setattr(cache_module, "RELEASE_MIN_BYTES", 1)
    assert run(marian, cache, "en2fr") == references["en2fr"]
    assert searched == [adapters_copy / "en2fr" / "adapter_model.safetensors"]


def test_only_the_named_files_mapping_is_given_back(tmp_path: Path) -> None:
    """An anonymous tensor, or one mapped from another file, is never advised (its pages would be lost)."""
    import safetensors.torch

    from hunyuan_mt.host import heap

    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    safetensors.torch.save_file({"w": torch.arange(300_000, dtype=torch.float32)}, str(first))
    safetensors.torch.save_file({"w": torch.ones(300_000)}, str(second))
    mapped = safetensors.torch.load_file(str(first))["w"]
    anonymous = torch.arange(300_000, dtype=torch.float32)
    assert heap.release_file_pages([anonymous, mapped], second) == 0
    assert _resident_kb(first)[1] > 0
    assert heap.release_file_pages([anonymous, mapped], first) > 0 and _resident_kb(first)[1] == 0
    assert torch.equal(anonymous, torch.arange(300_000, dtype=torch.float32))
    assert torch.equal(mapped, torch.arange(300_000, dtype=torch.float32))   # read back from the page cache


def test_leased_adapter_survives_eviction_pressure(marian, make_cache, marian_adapters: Path, references) -> None:
    """Invariant 3: a generation holding en2de runs while five other pairs churn through the slots."""
    cache = make_cache(marian, marian_adapters, slots=3)
    held, go = threading.Event(), threading.Event()
    result: dict[str, str] = {}

    def holder() -> None:
        with cache.lease([P("en2de")]) as lease:
            result["slot"] = lease.slots[0]
            held.set()
            assert go.wait(30)
            result["out"] = marian.generate([ROW], lease.slots, GREEDY, max_new_tokens=10)[0]

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(30)
    for key in ["en2fr", "fr2en", "en2zh", "zh2en", "de2en", "es2en"]:
        touch(cache, key)
        assert "en2de" in cache.lru_order()
        assert next(r.slot for r in cache.stats().resident if r.key == "en2de") == result["slot"]
    assert cache.lru_order()[0] == "en2de"  # least recently used, yet never picked: it is leased
    assert cache.stats().evictions == 4
    go.set()
    t.join(30)
    assert result["out"] == references["en2de"]
    touch(cache, "en2es")  # released: now it is the victim
    assert "en2de" not in cache.lru_order()


def test_busy_when_all_slots_are_leased(marian, make_cache, marian_adapters: Path) -> None:
    cache = make_cache(marian, marian_adapters, slots=2, lease_timeout_s=0.2)
    with cache.lease([P("en2de"), P("de2en")]):
        with pytest.raises(Busy) as err:
            touch(cache, "en2fr")
        assert err.value.message == ("Cannot attach adapter en2fr: all 2 slots are leased by running requests "
                                     "(waited 0.2 s); try again.")
        assert err.value.retryable
        assert cache.lru_order() == ["en2de", "de2en"]
        touch(cache, "en2de")  # a resident pair is still served while every slot is leased
        assert cache.lru_order() == ["de2en", "en2de"]
    with cache.lease([P("en2de")]):
        with pytest.raises(Busy) as err:
            touch(cache, "en2fr", "fr2en")
        assert err.value.message == ("Cannot attach adapter en2fr, fr2en: it needs 2 free slots and only 1 of 2 "
                                     "are not leased by running requests (waited 0.2 s); try again.")
    s = cache.stats()
    assert (s.busy, s.slot_waits) == (2, 2)
    touch(cache, "en2fr")  # once released, the same request succeeds
    assert cache.lru_order() == ["en2de", "en2fr"]


def test_batch_asking_for_more_slots_than_exist_is_busy_at_once(marian, make_cache, marian_adapters) -> None:
    cache = make_cache(marian, marian_adapters, slots=2, pinned=["en2es"])
    with pytest.raises(Busy, match=r"^A batch asked for 3 adapter slots at once; 2 exist\.$"):
        touch(cache, "en2de", "de2en", "en2fr", "en2es")
    touch(cache, "en2de", "de2en", "en2es")  # pinned pairs do not need a slot


def test_waiting_request_gets_the_slot_when_a_lease_ends(marian, make_cache, marian_adapters: Path) -> None:
    cache = make_cache(marian, marian_adapters, slots=1, lease_timeout_s=30)
    done = threading.Event()
    release = threading.Event()

    def first() -> None:
        with cache.lease([P("en2de")]):
            assert release.wait(30)

    def second() -> None:
        touch(cache, "en2fr")
        done.set()

    a = threading.Thread(target=first)
    a.start()
    wait_until(lambda: cache.lru_order() == ["en2de"], "first lease")
    b = threading.Thread(target=second)
    b.start()
    wait_until(lambda: cache.stats().slot_waits == 1, "second request waiting for a slot")
    assert not done.is_set()
    release.set()
    a.join(30)
    b.join(30)
    assert done.is_set() and cache.lru_order() == ["en2fr"] and cache.stats().busy == 0


def test_single_flight_under_concurrent_first_requests(marian, make_cache, marian_adapters, references,
                                                       monkeypatch) -> None:
    """Invariant 4: six requests for a missing pair cause one disk read and one attach."""
    cache = make_cache(marian, marian_adapters, slots=3)
    gate = threading.Event()
    spy = DiskSpy(monkeypatch, gate)
    outs: list[str] = []
    names: list[int] = []

    def request() -> None:
        with cache.lease([P("en2de")]) as lease:
            names.append(lease.slots[0])
            outs.append(marian.generate([ROW], lease.slots, GREEDY, max_new_tokens=10)[0])

    threads = [threading.Thread(target=request) for _ in range(6)]
    for t in threads:
        t.start()
    assert spy.entered.wait(30)
    wait_until(lambda: cache.loading() == {"en2de": 5}, "five requests waiting on the one load")
    gate.set()
    for t in threads:
        t.join(30)
    s = cache.stats()
    assert spy.calls == ["en2de"] and s.disk_loads == 1 and s.attaches == 1
    assert names == [1] * 6 and outs == [references["en2de"]] * 6
    assert [r.leases for r in s.resident] == [0] and cache.loading() == {}


def test_waiters_share_the_failure_of_a_single_flight_load(marian, make_cache, adapters_copy, monkeypatch) -> None:
    cache = make_cache(marian, adapters_copy, slots=3)
    data = (adapters_copy / "en2de" / "adapter_model.safetensors")
    stat = data.stat()
    data.write_bytes(b"\x00" * stat.st_size)  # corrupt, same size and mtime: only reading finds out
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    gate = threading.Event()
    spy = DiskSpy(monkeypatch, gate)
    errors: list[str] = []

    def request() -> None:
        try:
            touch(cache, "en2de")
        except AdapterUnusable as exc:
            errors.append(exc.message)

    threads = [threading.Thread(target=request) for _ in range(3)]
    for t in threads:
        t.start()
    assert spy.entered.wait(30)
    wait_until(lambda: cache.loading() == {"en2de": 2}, "two waiters")
    gate.set()
    for t in threads:
        t.join(30)
    assert len(errors) == 3 and len(set(errors)) == 1 and errors[0].startswith("Adapter en2de could not be read")
    assert spy.calls == ["en2de"] and cache.stats().failures == 1


def test_corrupt_adapter_fails_only_its_pair_and_is_remembered(marian, make_cache, adapters_copy, references,
                                                               monkeypatch) -> None:
    """Invariant 6, plus fail-fast: the second request does not touch the disk again; rescan clears it."""
    cache = make_cache(marian, adapters_copy, slots=2, failure_ttl_s=3600)
    data = adapters_copy / "en2de" / "adapter_model.safetensors"
    good = data.read_bytes()
    stat = data.stat()
    data.write_bytes(good[:8] + b"\xff" * (len(good) - 8))
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    spy = DiskSpy(monkeypatch)
    with pytest.raises(AdapterUnusable, match="^Adapter en2de could not be read") as first:
        run(marian, cache, "en2de")
    assert run(marian, cache, "en2fr") == references["en2fr"]  # the others keep working
    with pytest.raises(AdapterUnusable) as second:
        run(marian, cache, "en2de")
    assert second.value.message == first.value.message
    assert spy.calls == ["en2de", "en2fr"]  # remembered: no second read
    s = cache.stats()
    assert s.failures == 1 and s.failed == {"en2de": first.value.message} and cache.lru_order() == ["en2fr"]
    cache.rescan()  # the damage is now seen at scan time
    with pytest.raises(AdapterUnusable, match="^Adapter en2de is unusable: adapter_model.safetensors is corrupt"):
        run(marian, cache, "en2de")
    data.write_bytes(good)
    cache.rescan()
    assert run(marian, cache, "en2de") == references["en2de"]


def test_truncated_or_deleted_after_scan_fails_only_its_pair(marian, make_cache, adapters_copy, references) -> None:
    cache = make_cache(marian, adapters_copy, slots=2)
    tiny_models.corrupt_adapter(adapters_copy / "en2de", "truncate")
    shutil.rmtree(adapters_copy / "en2fr")
    with pytest.raises(AdapterUnusable, match="^Adapter en2de changed on disk since the last scan; rescan"):
        run(marian, cache, "en2de")
    with pytest.raises(AdapterUnusable, match="^Adapter en2fr was deleted or is incomplete since the last scan"):
        run(marian, cache, "en2fr")
    assert run(marian, cache, "fr2en") == references["fr2en"]
    cache.rescan()
    with pytest.raises(AdapterNotFound, match="No adapter for en2fr"):
        run(marian, cache, "en2fr")


def test_deleted_while_in_ram_tier_fails_clearly(marian, make_cache, adapters_copy, references) -> None:
    cache = make_cache(marian, adapters_copy, slots=1)
    touch(cache, "en2de")
    touch(cache, "en2fr")
    assert cache.ram_tier() == ["en2de"]
    shutil.rmtree(adapters_copy / "en2de")
    with pytest.raises(AdapterUnusable, match="^Adapter en2de was deleted or is incomplete since the last scan"):
        touch(cache, "en2de")
    assert run(marian, cache, "en2fr") == references["en2fr"]


def test_replaced_adapter_is_reloaded_after_rescan(marian, make_cache, adapters_copy, marian_dir) -> None:
    cache = make_cache(marian, adapters_copy, slots=2)
    old = run(marian, cache, "en2de")
    tiny_models.make_adapter(marian_dir, adapters_copy / "en2de", seed=1234)
    assert run(marian, cache, "en2de") == old  # resident copy keeps serving until a rescan
    cache.rescan()
    assert cache.lru_order() == []  # the stale copy was dropped
    assert run(marian, cache, "en2de") != old


def test_failure_ttl_expiry_retries(marian, make_cache, adapters_copy, monkeypatch) -> None:
    cache = make_cache(marian, adapters_copy, slots=2, failure_ttl_s=0)
    tiny_models.corrupt_adapter(adapters_copy / "en2de", "truncate")
    spy = DiskSpy(monkeypatch)
    for _ in range(2):
        with pytest.raises(AdapterUnusable):
            touch(cache, "en2de")
    assert spy.calls == ["en2de", "en2de"]


def test_broken_pinned_adapter_does_not_stop_start(marian, make_cache, adapters_copy, references) -> None:
    cache = make_cache(marian, adapters_copy, slots=2, pinned=["en2de", "en2es"], start=False)
    tiny_models.corrupt_adapter(adapters_copy / "en2de", "garbage")
    cache.start()
    assert cache.pinned() == ["en2es"] and "en2de" in cache.stats().failed
    assert run(marian, cache, "en2es") == references["en2es"]


def test_adapters_of_other_ranks_and_modules_share_the_slot_layers(marian, make_cache, adapters_copy, marian_dir,
                                                                  references, fresh_backbone) -> None:
    """The layers are sized at start for every registered adapter (largest rank, union of modules): copying any
    of them into any slot is a plain copy. An adapter registered later that needs more grows them once."""
    tiny_models.make_adapter(marian_dir, adapters_copy / "it2en", seed=5, r=8)  # a larger rank than the others
    cache = make_cache(marian, adapters_copy, slots=1)
    assert cache.stats().layers["rank"] == 8
    assert run(marian, cache, "en2de") == references["en2de"]
    it = run(marian, cache, "it2en")
    assert run(marian, cache, "en2de") == references["en2de"]  # rank 4 in a rank-8 slot: zero-padded
    assert (cache.stats().attaches, cache.stats().grows) == (3, 0)
    tiny_models.make_adapter(marian_dir, adapters_copy / "pt2en", seed=6, r=12,
                             target_modules=("q_proj", "v_proj", "out_proj", "fc1"))
    cache.rescan()
    with cache.lease([P("en2fr")]) as held:  # a row in flight across the growth keeps its output
        assert marian.generate([ROW], held.slots, GREEDY, max_new_tokens=10)[0] == references["en2fr"]
    pt = run(marian, cache, "pt2en")
    s = cache.stats()
    assert s.grows == 1 and s.layers["rank"] == 12
    assert run(marian, cache, "it2en") == it and it not in references.values()
    assert run(marian, cache, "en2fr") == references["en2fr"]
    ref = peft_references(fresh_backbone(marian_dir), adapters_copy, ["pt2en", "it2en"], ROW)
    assert (pt, it) == (ref["pt2en"], ref["it2en"])


def test_pin_unpin_unload_and_evict_idle(marian, make_cache, marian_adapters, references) -> None:
    cache = make_cache(marian, marian_adapters, slots=3, pinned=["en2es"])
    touch(cache, "en2de", "en2fr")
    assert cache.pin(P("en2de")) is True and cache.pin(P("en2de")) is False
    assert cache.pinned() == ["en2de", "en2es"] and cache.lru_order() == ["en2fr"]
    assert run(marian, cache, "en2de") == references["en2de"]
    assert cache.unpin(P("en2de")) is True and cache.unpin(P("en2de")) is False
    assert cache.pinned() == ["en2es"] and cache.ram_tier() == ["en2de"]
    assert cache.unload(P("zh2en")) is False
    assert cache.unload(P("en2fr")) is True and cache.lru_order() == [] and cache.ram_tier() == ["en2de", "en2fr"]
    touch(cache, "fr2en", "de2en")
    with cache.lease([P("de2en")]):
        assert cache.unload(P("de2en")) is False  # leased
        assert cache.evict_idle() == [P("fr2en")]
        assert cache.lru_order() == ["de2en"]
    assert cache.evict_idle(keep_ram=False) == [P("de2en")] and cache.ram_tier() == []
    assert run(marian, cache, "en2fr") == references["en2fr"]  # from disk again, into a freed slot
    assert run(marian, cache, None) == references[None] and run(marian, cache, "en2es") == references["en2es"]


def test_unpin_of_a_leased_pin_waits_for_the_lease(marian, make_cache, marian_adapters, references) -> None:
    cache = make_cache(marian, marian_adapters, slots=1, pinned=["en2es"])
    with cache.lease([P("en2es")]) as lease:
        assert cache.unpin(P("en2es")) is True
        assert cache.pinned() == ["en2es"]  # still attached: a row uses it
        assert marian.generate([ROW], lease.slots, GREEDY, max_new_tokens=10)[0] == references["en2es"]
    assert cache.pinned() == [] and cache.ram_tier() == ["en2es"]
    assert run(marian, cache, "en2es") == references["en2es"]


def test_churn_keeps_slots_bounded_and_outputs_exact(marian, make_cache, marian_adapters, references) -> None:
    """Six threads, nine keys (eight pairs and the base), three slots: every output is that adapter's own, the bound always holds."""
    cache = make_cache(marian, marian_adapters, slots=3, pinned=["en2es"], lease_timeout_s=60)
    keys = list(tiny_models.DEFAULT_PAIRS) + [None]
    failures: list[str] = []

    def client(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(8):
            batch = rng.sample(keys, 2)
            with cache.lease([None if k is None else P(k) for k in batch]) as lease:
                if len(cache.lru_order()) > 3:
                    failures.append(f"resident {cache.lru_order()}")
                outs = marian.generate([ROW, ROW], lease.slots, GREEDY, max_new_tokens=10)
            for key, out in zip(batch, outs):
                if out != references[key]:
                    failures.append(f"{key}: {out!r}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failures == []
    s = cache.stats()
    assert all(r.leases == 0 for r in s.resident) and s.busy == 0 and cache.loading() == {}


def test_unknown_or_unusable_pair_fails_without_evicting(marian, make_cache, adapters_copy, marian_dir) -> None:
    tiny_models.make_incompatible_adapter(marian_dir, adapters_copy / "de2fr")
    cache = make_cache(marian, adapters_copy, slots=1)
    touch(cache, "en2de")
    with pytest.raises(AdapterNotFound, match="^No adapter for it2en.$"):
        touch(cache, "it2en")
    with pytest.raises(AdapterUnusable, match="^Adapter de2fr is unusable: shape mismatch"):
        touch(cache, "de2fr")
    s = cache.stats()
    assert cache.lru_order() == ["en2de"] and s.evictions == 0 and s.disk_loads == 1


def test_all_adapters_detached_then_base_and_adapters_still_work(marian, make_cache, marian_adapters,
                                                                 references) -> None:
    cache = make_cache(marian, marian_adapters, slots=2)
    touch(cache, "en2de", "en2fr")
    assert cache.evict_idle(keep_ram=False) == [P("en2de"), P("en2fr")]
    assert cache.stats().resident == []  # nothing attached at all: every adapter slot is zero again
    assert not any(layer.a_t.any() or layer.b_t.any() for layer in cache.lora.layers.values())
    assert run(marian, cache, None) == references[None]
    assert run(marian, cache, "fr2en") == references["fr2en"]


def test_rescan_retires_a_leased_stale_slot_after_its_rows(marian, make_cache, adapters_copy, marian_dir,
                                                           references) -> None:
    cache = make_cache(marian, adapters_copy, slots=2)
    with cache.lease([P("en2de")]) as lease:
        tiny_models.make_adapter(marian_dir, adapters_copy / "en2de", seed=4321)
        cache.rescan()
        assert cache.lru_order() == []  # new requests will load the new version
        # the row in flight still runs on the weights it started with
        assert marian.generate([ROW], lease.slots, GREEDY, max_new_tokens=10)[0] == references["en2de"]
        new = run(marian, cache, "en2de")
        assert new != references["en2de"] and cache.lru_order() == ["en2de"]
    assert run(marian, cache, "en2de") == new


def test_concurrent_generates_are_serialised_and_exact(marian, make_cache, marian_adapters, references) -> None:
    cache = make_cache(marian, marian_adapters, slots=3, pinned=["en2es", "es2en"])
    keys = ["en2es", "es2en", None, "en2es"]
    barrier = threading.Barrier(len(keys))
    outs: dict[int, str] = {}

    def worker(i: int, key: str | None) -> None:
        barrier.wait()
        outs[i] = run(marian, cache, key)

    threads = [threading.Thread(target=worker, args=(i, k)) for i, k in enumerate(keys)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [outs[i] for i in range(len(keys))] == [references[k] for k in keys]


def test_failed_multi_pair_lease_leaks_no_lease(marian, make_cache, adapters_copy, monkeypatch) -> None:
    """A lease that joined another request's load and then failed on its own pair gives everything back."""
    cache = make_cache(marian, adapters_copy, slots=3)
    data = adapters_copy / "en2fr" / "adapter_model.safetensors"
    stat = data.stat()
    data.write_bytes(b"\x00" * stat.st_size)
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    gate = threading.Event()
    spy = DiskSpy(monkeypatch, gate, only="en2de")
    loader = threading.Thread(target=touch, args=(cache, "en2de"))
    loader.start()
    assert spy.entered.wait(30)
    with pytest.raises(AdapterUnusable, match="^Adapter en2fr could not be read"):
        touch(cache, "en2de", "en2fr")
    assert cache.loading() == {"en2de": 0}  # our wait was withdrawn
    gate.set()
    loader.join(30)
    s = cache.stats()
    assert [(r.key, r.leases) for r in s.resident] == [("en2de", 0)]
    touch(cache, "en2de", "fr2en", "de2en")  # all three slots still usable: nothing leaked


def test_read_error_fails_only_its_pair(marian, make_cache, marian_adapters, references, monkeypatch) -> None:
    import errno

    import safetensors.torch

    real = safetensors.torch.load_file

    def flaky(path, *a, **k):
        if "en2de" in str(path):
            raise OSError(errno.EIO, "Input/output error")
        return real(path, *a, **k)

    monkeypatch.setattr(safetensors.torch, "load_file", flaky)
    cache = make_cache(marian, marian_adapters, slots=2)
    with pytest.raises(AdapterUnusable) as err:
        run(marian, cache, "en2de")
    assert err.value.message == "Adapter en2de could not be read: [Errno 5] Input/output error"
    assert run(marian, cache, "en2fr") == references["en2fr"]
    assert cache.stats().failed == {"en2de": err.value.message}


def test_each_adapter_keeps_its_own_scaling(marian, fresh_backbone, make_cache, adapters_copy,
                                           marian_dir) -> None:
    """Same tensors, different lora_alpha, or fewer modules: copied into the same slot, each gives PEFT's output."""
    tiny_models.make_adapter(marian_dir, adapters_copy / "pt2en", seed=3, alpha=64)   # same tensors as en2fr's
    tiny_models.make_adapter(marian_dir, adapters_copy / "it2en", seed=3, target_modules=("q_proj",))
    ref = peft_references(fresh_backbone(marian_dir), adapters_copy, ["pt2en", "it2en", "en2fr"], ROW)
    assert len(set(ref.values())) == 3
    cache = make_cache(marian, adapters_copy, slots=1)
    for key in ("en2fr", "pt2en", "it2en", "en2fr"):
        assert run(marian, cache, key) == ref[key], key
    assert (cache.stats().attaches, cache.stats().grows) == (4, 0)


def test_scan_refuses_an_adapter_whose_targets_select_no_layer(marian, make_cache, adapters_copy,
                                                               references) -> None:
    """layers_to_transform naming a layer the backbone lacks: PEFT would refuse to inject it; the scan says so
    before any request, and the other pairs are untouched."""
    import json

    config_path = adapters_copy / "en2de" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["layers_to_transform"] = [99]
    config_path.write_text(json.dumps(config))
    cache = make_cache(marian, adapters_copy, slots=2)
    with pytest.raises(AdapterUnusable) as err:
        run(marian, cache, "en2de")
    assert err.value.message == ("Adapter en2de is unusable: its target_modules ['q_proj', 'v_proj'] (with "
                                 "layers_to_transform / exclude_modules) select no layer of this backbone (marian)")
    assert run(marian, cache, "en2fr") == references["en2fr"]


def test_attach_failure_reads_as_one_line_and_is_remembered(marian, make_cache, marian_adapters, references,
                                                            caplog, monkeypatch) -> None:
    """An adapter the scan accepts but the slot copy fails on: the caller gets one short line naming the pair and
    the cause class, not the library's text; the log keeps the full text; the failure is remembered."""
    import logging

    from hunyuan_mt.lora.inject import SlotLoRA

    real = SlotLoRA.load

    def load(self, slot, adapter):
        if adapter.key == "en2de":
            raise RuntimeError("a very long library message " * 50)
        return real(self, slot, adapter)

    monkeypatch.setattr(SlotLoRA, "load", load)
    cache = make_cache(marian, marian_adapters, slots=2)
    with caplog.at_level(logging.DEBUG, logger="hunyuan_mt.adapters.cache"):
        with pytest.raises(AdapterUnusable) as err:
            run(marian, cache, "en2de")
    assert err.value.message == ("Adapter en2de could not be attached to this backbone (RuntimeError); "
                                 "it may be incompatible with the model. The server log has the details.")
    assert cache.stats().failed == {"en2de": err.value.message}
    with pytest.raises(AdapterUnusable) as again:  # remembered: fails fast with the same reason
        run(marian, cache, "en2de")
    assert again.value.message == err.value.message
    full = [r for r in caplog.records if r.levelno == logging.WARNING and "a very long library message" in
            r.getMessage()]
    assert len(full) == 1 and "en2de" in full[0].getMessage()
    assert run(marian, cache, "en2fr") == references["en2fr"]  # the others keep working
    assert cache.lru_order() == ["en2fr"]


def test_try_acquire_never_waits_for_a_slot(marian, make_cache, marian_adapters) -> None:
    """The decode loop's lease: None at once when every slot is leased (no wait, no Busy), a lease otherwise."""
    cache = make_cache(marian, marian_adapters, slots=1, lease_timeout_s=30)
    with cache.lease([P("en2de")]):
        t0 = time.monotonic()
        assert cache.try_acquire([P("en2fr")]) is None
        assert time.monotonic() - t0 < 5  # a guard against hanging, not a timing assertion
        held = cache.try_acquire([P("en2de"), None])  # resident: shared
        assert held is not None and held.slots == [1, 0]
        held.release()
        held.release()  # releasing twice changes nothing
    s = cache.stats()
    assert s.busy == 0 and [r.leases for r in s.resident] == [0]
    lease = cache.try_acquire([P("en2fr")])
    assert lease is not None and cache.lru_order() == ["en2fr"]
    lease.release()


def test_a_cache_whose_slot_layers_were_taken_over_refuses_instead_of_serving_another_adapter(
        fresh_backbone, make_cache, marian_dir, marian_adapters) -> None:
    """Two services on one backbone: the second cache takes the slot layers over; the first one's slot numbers
    would now pick the second's adapters, so it refuses with a clear error (found when a test built a second
    service on the shared backbone and the first answered en→de in Spanish)."""
    from hunyuan_mt.errors import ModelUnavailable

    backbone = fresh_backbone(marian_dir)
    first = make_cache(backbone, marian_adapters)
    with first.lease([Pair.parse("en2de")]):
        pass
    second = make_cache(backbone, marian_adapters)
    with pytest.raises(ModelUnavailable, match="taken over by another service on the same backbone"):
        first.try_acquire([Pair.parse("en2de")])
    with second.lease([Pair.parse("en2de")]) as lease:
        assert lease is not None
