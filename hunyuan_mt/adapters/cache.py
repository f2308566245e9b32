"""The adapter cache: the only owner of adapter lifetime (attach, evict, free) and of the slot tensors.

The backbone's target linears are wrapped once in slot layers (`lora.SlotLoRA`, created here): every layer holds
the weights of every resident adapter as stacked slots, and a forward pass reads each row's slot index. Slot 0 is
the bare backbone.
- **Pinned** pairs are copied into slots of their own at start (indices after the LRU slots) and never evicted;
  they do not count against `cfg.slots`.
- **LRU slots** are indices 1..N, N = `cfg.slots`, or more where `cfg.slot_budget_mb` holds more (`lru_slots`:
  never more than the registered adapters). A pair that is not pinned is copied into one of them, and
  `Lease.slots` carries the index for its rows. Under memory pressure (`limit_slots(True)`, light mode) new pairs go
  only into the first `cfg.slots`, the floor; the rest open again once pressure is gone. Attaching is a copy of the
  adapter's weights into the slot's rows of the stacked buffers (about a millisecond for the demo's adapters): no module surgery.
- **RAM tier**: an evicted pair's weights stay in a bounded host-RAM LRU (`cachetools.LRUCache`), already scaled
  and converted for the copy, so re-attaching it does not touch the disk. The slot LRU is a plain OrderedDict
  instead: eviction must skip leased entries in LRU order, and cachetools neither exposes its order nor lets popitem
  skip an entry.

The slot layers are sized at start for the union of the modules the registered adapters target and their largest
rank; an adapter registered later that needs more grows them once (counted as `grows`).

Concurrency: one condition variable guards the bookkeeping; disk reads and slot copies run outside it.
A lease holds a reference count on every entry it uses; eviction only picks unleased slots, and when every slot
is leased a request waits up to `lease_timeout_s` and then raises Busy (`try_acquire` returns None instead of
waiting, for the decode loop, which must not block). Concurrent requests for one missing pair share one load
(single-flight: the first becomes the loader, the others wait on its `_Load`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Sequence

import cachetools

from ..host import heap
from ..config import CacheConfig
from ..errors import AdapterUnusable, Busy, ModelUnavailable, TranslationError
from ..lora import BASE_SLOT, PreparedAdapter, SlotLoRA, prepare
from ..lora.peft_format import AdapterWeights
from .registry import AdapterRegistry, fingerprint_of, read_adapter
from .request import Pair

if TYPE_CHECKING:
    import torch

    from ..runtime.backbone import Backbone

log = logging.getLogger(__name__)

#: Adapters whose mapped tensors are smaller than this keep their pages after an attach: finding the file's
#: mappings reads /proc/self/maps, 2.8 ms of every attach of the demo's 2.9 MB adapters (1.2-1.5 ms the read alone,
#: AMD EPYC), for 2.9 MB of resident memory; an adapter of HY-MT1.5-1.8B's shapes gives back 36 MB.
RELEASE_MIN_BYTES = 16 << 20

BASE = "__base__"


@dataclass(eq=False)  # identity: leases are counted per object
class _Slot:
    #: Index into the slot layers' stacked buffers (1..cfg.slots).
    index: int
    pair: Pair | None = None
    weights: AdapterWeights | None = None
    #: True while the slot's buffers may hold non-zero weights (cleared by light mode and unload).
    written: bool = False
    leases: int = 0
    #: False while the owning load is still attaching; nobody else may use it yet.
    ready: bool = False
    #: True while the slot is being cleared outside the lock; not eligible for reservation.
    detaching: bool = False


@dataclass(eq=False)  # identity: leases are counted per object
class _Pinned:
    pair: Pair
    weights: AdapterWeights
    index: int
    leases: int = 0
    #: unpin() arrived while leased: detach once the last lease is released.
    unpin_pending: bool = False
    #: Replaced by a new version of its adapter while rows used it: its slot is freed after the last of them.
    retired: bool = False


@dataclass(eq=False)  # identity: leases are counted per object
class _Load:
    """A single-flight load in progress. Waiters are counted so the loader can lease the slot for them."""

    pair: Pair
    done: threading.Event = field(default_factory=threading.Event)
    waiters: int = 0
    slot: _Slot | None = None
    error: BaseException | None = None
    #: Taken out of the RAM tier before the slot's old pair was pushed in (which could have dropped it).
    from_ram: AdapterWeights | None = None


@dataclass
class ResidentAdapter:
    key: str
    #: Index in the slot layers (pinned pairs have slots of their own, after the LRU slots).
    slot: int
    pinned: bool
    leases: int


@dataclass
class CacheStats:
    slots: int
    hits: int
    pinned_hits: int
    ram_hits: int
    #: Lookups that read the adapter from disk (misses).
    disk_loads: int
    #: Pinned adapters read from disk (at start or by pin()): preloads, not lookups, so not in the hit rate.
    pin_loads: int
    #: Adapters copied into a slot (from disk or the RAM tier).
    attaches: int
    #: Times the slot layers had to grow (new target modules, a larger rank, more slots).
    grows: int
    evictions: int
    failures: int
    busy: int
    #: Reservations that found every slot leased and had to wait.
    slot_waits: int
    load_ms_p50: float | None
    load_ms_p95: float | None
    attach_ms_p50: float | None
    #: Slot layers: wrapped modules, adapter slots, rank, bytes of the stacked buffers.
    layers: dict
    resident: list[ResidentAdapter]
    ram_tier: list[str]
    failed: dict[str, str]

    @property
    def hit_rate(self) -> float | None:
        lookups = self.hits + self.pinned_hits + self.ram_hits + self.disk_loads
        return None if lookups == 0 else (self.hits + self.pinned_hits) / lookups

    @property
    def resident_count(self) -> int:
        return len(self.resident)


@dataclass
class Lease:
    """Adapters held for some rows. `slots[i]` is the slot index for `pairs[i]` (0, the bare backbone, for None).

    Release it once: with `cache.lease(...)` as a context manager, or `release()` after `try_acquire`."""

    pairs: list[Pair | None]
    slots: list[int]
    _held: list = field(default_factory=list, repr=False)
    _release: object = field(default=None, repr=False)

    def release(self) -> None:
        held, self._held = self._held, []
        if held and callable(self._release):
            self._release(held)


def _slot_shape(registry: AdapterRegistry) -> tuple[list[str], int]:
    """The modules the registered usable adapters target (sorted) and their largest rank: what a slot must hold."""
    usable = [i for i in registry.infos() if i.usable]
    return sorted({m for i in usable for m in i.modules}), max((i.max_rank for i in usable), default=0)


def slot_dtype(cfg: CacheConfig, model_dtype: "torch.dtype") -> "torch.dtype":
    """The dtype the slot layers keep adapters in (`cache.slot_dtype`; "auto": the model's)."""
    import torch

    return model_dtype if cfg.slot_dtype == "auto" else getattr(torch, cfg.slot_dtype)


def lru_slots(cfg: CacheConfig, registry: AdapterRegistry, shapes: dict[str, tuple[int, int]],
              dtype: "torch.dtype") -> int:
    """LRU slots for this cache: `cfg.slots`, or as many as `cfg.slot_budget_mb` holds at the registered adapters'
    modules and largest rank (one slot of every layer: A [in, r] and B [r, out]), capped at the usable adapters."""
    if cfg.slot_budget_mb <= 0:
        return cfg.slots
    modules, rank = _slot_shape(registry)
    per_slot = sum(sum(shapes[m]) for m in modules if m in shapes) * rank * dtype.itemsize
    if not per_slot:
        return cfg.slots
    fits = int(cfg.slot_budget_mb * 2**20 // per_slot)
    pinned = set(cfg.pinned)
    unpinned = sum(1 for i in registry.infos() if i.usable and i.pair.key not in pinned)
    return max(cfg.slots, min(fits, unpinned))


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class AdapterCache:
    """Slots, pins, RAM tier, leases and single-flight loading over one backbone.

    One cache per backbone: a new cache on a backbone takes it over and removes the slot layers an earlier cache
    put in (so that earlier cache must no longer be used). Build services through `get_service()`.
    """

    def __init__(self, backbone: Backbone, registry: AdapterRegistry, cfg: CacheConfig) -> None:
        self.backbone = backbone
        self.registry = registry
        self.cfg = cfg
        #: What the slot layers keep adapters in (`cache.slot_dtype`).
        self.slot_dtype = slot_dtype(cfg, backbone.dtype)
        self._cv = threading.Condition(threading.Lock())
        count = lru_slots(cfg, registry, backbone.spec.shapes, self.slot_dtype)
        self._slots = [_Slot(i + 1) for i in range(count)]
        #: LRU slots new pairs may take: all of them, or the configured floor under memory pressure.
        self._limit = count
        #: Resident non-pinned pairs, least recently used first.
        self._lru: OrderedDict[Pair, _Slot] = OrderedDict()
        self._pinned: dict[Pair, _Pinned] = {}
        self._ram: cachetools.LRUCache[Pair, AdapterWeights] = cachetools.LRUCache(maxsize=max(cfg.ram_tier, 1))
        self._loading: dict[Pair, _Load] = {}
        #: pair → (monotonic time of failure, reason)
        self._failures: dict[Pair, tuple[float, str]] = {}
        #: Serialises slot writes and layer growth; forwards are kept out by the backbone's model_lock, taken inside.
        self._mutate = threading.Lock()
        self._counts = dict(hits=0, pinned_hits=0, ram_hits=0, disk_loads=0, pin_loads=0, attaches=0, grows=0,
                            evictions=0,
                            failures=0, busy=0, slot_waits=0)
        self._load_ms: list[float] = []
        self._attach_ms: list[float] = []
        #: Slot indices for pins: after the LRU slots; an unpinned index is reused before the layers grow.
        self._pin_free: list[int] = []
        self._pin_next = count + 1
        self.lora = self._take_over_backbone()

    def _take_over_backbone(self) -> SlotLoRA:
        """Wrap the backbone's target modules in slot layers sized for the registered adapters. This cache owns
        them: slot layers left by an earlier cache on the same backbone (tests and benchmarks build several
        services in one process) are removed first."""
        bb = self.backbone
        with bb.model_lock:
            old = getattr(bb, "lora", None)
            if old is not None:
                log.warning("adapter cache: removing the slot layers of an earlier cache (%d layers)", len(old.layers))
                old.remove()
            lora = SlotLoRA(bb.model, bb.spec.shapes, self.slot_dtype)
            modules, rank = _slot_shape(self.registry)
            capacity = len(self._slots) + len(self.cfg.pinned)
            if modules:
                lora.ensure(modules, rank, capacity)
            bb.lora = lora
        if modules:
            info = lora.info()
            log.info("slot LoRA layers: %d modules, %d adapter slots, rank %d, %.1f MB", info["layers"],
                     info["slots"], info["rank"], info["bytes"] / 1e6)
        return lora

    # ------------------------------------------------------------------ start / pins

    def start(self) -> None:
        """Attach pinned pairs. A pinned pair that fails is logged and remembered; the service still starts."""
        for name in self.cfg.pinned:
            try:
                self.pin(Pair.parse(name))
            except TranslationError as exc:
                log.error("pinned adapter %s not attached: %s", name, exc.message)
        with self._cv:
            pinned = sorted(p.key for p in self._pinned)
        log.info("dynamic adapter loader ready: %d slots, pinned %s, RAM tier %d", len(self._slots), pinned,
                 self.cfg.ram_tier)

    def pin(self, pair: Pair) -> bool:
        """Attach `pair` into a slot of its own, outside the LRU, never evicted. False if it already was pinned."""
        with self._cv:
            entry = self._pinned.get(pair)
            if entry is not None:
                changed = entry.unpin_pending
                entry.unpin_pending = False
                return changed
            self._raise_if_failed(pair)
            slot = self._lru.get(pair)
            weights = slot.weights if slot is not None and slot.ready else self._ram.pop(pair, None)
            source = "slot" if slot is not None and slot.ready else ("ram" if weights is not None else "disk")
        if weights is None:
            weights = self._read_disk(pair, counter="pin_loads")
        try:
            index = self._attach_pin(weights)
        except Exception as exc:
            reason = exc.message if isinstance(exc, TranslationError) else self._remember_failure(pair, exc)
            raise AdapterUnusable(reason) from None
        with self._cv:
            self._pinned[pair] = _Pinned(pair, weights, index)
            # A copy of it in a slot is no longer needed; free the slot unless rows still use it.
            slot = self._lru.get(pair)
            if slot is not None and slot.ready:
                del self._lru[pair]
                slot.pair = None
                if slot.leases == 0:
                    slot.weights = None
            self._cv.notify_all()
        log.info("pinned adapter %s attached (from %s)", pair.key, source)
        return True

    def unpin(self, pair: Pair) -> bool:
        """Detach a pinned pair (its weights go to the RAM tier). Deferred while leased. False if not pinned."""
        with self._cv:
            entry = self._pinned.get(pair)
            if entry is None or entry.unpin_pending:
                return False
            if entry.leases > 0:
                entry.unpin_pending = True
                return True
            del self._pinned[pair]
            self._to_ram(pair, entry.weights)
        self._free_pin_index(entry.index)
        log.info("unpinned adapter %s", pair.key)
        return True

    def _take_pin_index(self) -> int:
        """A slot index for a new pin: a freed one, else the next (the layers grow on attach). Caller holds _cv."""
        if self._pin_free:
            self._pin_free.sort()
            return self._pin_free.pop(0)
        index, self._pin_next = self._pin_next, self._pin_next + 1
        return index

    def unload(self, pair: Pair) -> bool:
        """Detach `pair` now (pinned or slotted). False if it is not resident or rows are using it."""
        with self._cv:
            pinned = self._pinned.get(pair)
            slot = self._lru.get(pair)
            if pinned is not None:
                if pinned.leases > 0:
                    return False
            elif slot is None or slot.leases > 0 or not slot.ready:
                return False
            else:
                self._release_slot_for_delete(slot, keep_ram=True)
        if pinned is not None:
            return self.unpin(pair)
        self._delete_slot(slot)
        log.info("unloaded adapter %s", pair.key)
        return True

    def evict_idle(self, keep_ram: bool = True) -> list[Pair]:
        """Light mode: detach every unleased non-pinned adapter (its slot is zeroed; the slot buffers themselves
        stay allocated, they are what the next attach copies into). Without `keep_ram` the RAM tier is emptied
        too and its memory returned. Returns the pairs evicted."""
        with self._cv:
            victims = [s for s in self._lru.values() if s.leases == 0 and s.ready]
            pairs = [s.pair for s in victims if s.pair is not None]
            for slot in victims:
                self._release_slot_for_delete(slot, keep_ram=keep_ram)
            # Slots emptied earlier (a pair moved to the pins) still hold its weights; zero those too.
            stale = [s for s in self._slots if s.pair is None and s.written and s.leases == 0
                     and not s.detaching]
            for slot in stale:
                slot.detaching = True
            if not keep_ram:
                self._ram.clear()
        for slot in victims + stale:
            self._delete_slot(slot)
        if not keep_ram:
            heap.collect_and_trim()
        if pairs:
            log.info("evicted idle adapters %s (RAM tier kept: %s)", [p.key for p in pairs], keep_ram)
        return [p for p in pairs if p is not None]

    def rescan(self) -> None:
        """Re-read the adapters folder and forget remembered failures. Copies of folders that changed or vanished
        are dropped from the RAM tier and the slots (a slot still leased is retired once its rows finish)."""
        self.registry.scan()
        current = {i.pair: i.fingerprint for i in self.registry.infos() if i.usable}
        stale_slots: list[_Slot] = []
        with self._cv:
            self._failures.clear()
            for pair in [p for p in self._ram.keys() if current.get(p) != self._ram[p].fingerprint]:
                del self._ram[pair]
            for pair, slot in list(self._lru.items()):
                if not slot.ready or slot.weights is None or current.get(pair) == slot.weights.fingerprint:
                    continue
                if slot.leases == 0:
                    self._release_slot_for_delete(slot, keep_ram=False)
                    stale_slots.append(slot)
                else:
                    # Rows in flight keep their weights; new requests load the new version into another slot.
                    del self._lru[pair]
                    slot.pair = None
            changed_pins = [pair for pair, entry in self._pinned.items()
                            if current.get(pair) != entry.weights.fingerprint]
            self._cv.notify_all()
        for slot in stale_slots:
            self._delete_slot(slot)
        if stale_slots:
            log.info("rescan dropped %d stale adapters from the slots", len(stale_slots))
        for pair in changed_pins:
            if pair in current:
                self._swap_pinned(pair)
            else:
                log.warning("pinned adapter %s vanished on disk; it stays attached until unpinned", pair.key)

    def _swap_pinned(self, pair: Pair) -> None:
        """A pinned pair's new version attached in a slot of its own; rows in flight finish on the old one, whose
        slot is freed after the last of them (a hot swap: no request waits, none sees two versions)."""
        weights = self._read_disk(pair, counter="pin_loads")
        try:
            index = self._attach_pin(weights)
        except Exception as exc:  # the old version keeps serving
            log.error("pinned adapter %s: its new version could not be attached (%s); the old one serves", pair.key,
                      exc.message if isinstance(exc, TranslationError) else self._remember_failure(pair, exc))
            return
        with self._cv:
            old = self._pinned.get(pair)
            self._pinned[pair] = _Pinned(pair, weights, index)
            free_now = old is not None and old.leases == 0
            if old is not None and not free_now:
                old.retired = True
            self._cv.notify_all()
        if free_now:
            self._free_pin_index(old.index)
        log.info("pinned adapter %s swapped to its new version", pair.key)

    def _attach_pin(self, weights: AdapterWeights) -> int:
        """`weights` attached in a pin slot of their own; the slot's index. The index is given back when the
        attach fails, and the error raised."""
        with self._cv:
            index = self._take_pin_index()
        try:
            self._attach(index, weights)
        except BaseException:
            with self._cv:
                self._pin_free.append(index)
            raise
        return index

    def _free_pin_index(self, index: int) -> None:
        """A pin slot cleared and given back (an unpinned pair's, a replaced version's after its last row)."""
        self._clear(index)
        with self._cv:
            self._pin_free.append(index)
            self._cv.notify_all()

    # ------------------------------------------------------------------ leases

    @contextlib.contextmanager
    def lease(self, pairs: Sequence[Pair | None]) -> Iterator[Lease]:
        """Hold every distinct adapter of `pairs` for the duration of the block (see module docstring)."""
        lease = self._acquire(pairs, wait=True)
        assert lease is not None
        try:
            yield lease
        finally:
            lease.release()

    def try_acquire(self, pairs: Sequence[Pair | None]) -> Lease | None:
        """Like `lease`, without waiting for a slot: None when the missing pairs need more unleased slots than
        there are now. A pair that needs loading is loaded before this returns (a slot copy, plus a disk read
        when it is not in the RAM tier). Typed errors as for `lease`. The caller must `release()` the lease."""
        return self._acquire(pairs, wait=False)

    def _acquire(self, pairs: Sequence[Pair | None], wait: bool) -> Lease | None:
        if getattr(self.lora, "removed", False):
            # Another cache took over this backbone's slot layers; the slot numbers this cache hands out would
            # now select that cache's adapters. Refuse rather than translate with the wrong adapter.
            raise ModelUnavailable("This adapter cache's slot layers were taken over by another service on the "
                                   "same backbone; use that service (one service per backbone).")
        distinct = list(dict.fromkeys(p for p in pairs if p is not None))
        deadline = time.monotonic() + self.cfg.lease_timeout_s
        held: list[_Slot | _Pinned] = []
        try:
            slots = self._acquire_all(distinct, deadline, held, wait)
        except BaseException:
            self._release(held)
            raise
        if slots is None:
            return None
        return Lease(list(pairs), [BASE_SLOT if p is None else slots[p] for p in pairs], held, self._release)

    def _acquire_all(self, distinct: list[Pair], deadline: float, held: list[_Slot | _Pinned],
                     wait: bool = True) -> dict[Pair, int] | None:
        """Lease all of `distinct`, appending what is held to `held` (released by the caller). None when `wait`
        is False and the missing pairs do not fit the unleased slots now.

        Slots for the missing pairs are reserved all at once or not at all: a lease never holds some slots while
        waiting for more, so two multi-pair leases cannot deadlock each other.
        """
        with self._cv:
            needed = [p for p in distinct if p not in self._pinned]
        limit = self._limit
        if len(needed) > limit:
            self._count("busy")
            raise Busy(f"A batch asked for {len(needed)} adapter slots at once; {limit} exist.")
        names: dict[Pair, int] = {}
        owned: list[_Load] = []
        waiting: list[_Load] = []
        waited = False
        with self._cv:
            while True:
                for pair in distinct:
                    self._raise_if_failed(pair)
                    if not (pair in self._pinned or pair in self._lru or pair in self._loading or pair in self._ram):
                        # Unknown or unusable at scan time: fail before a slot is taken (and its pair evicted).
                        self.registry.get(pair)
                entries: list[_Slot | _Pinned] = []
                joins: list[_Load] = []
                missing: list[Pair] = []
                for pair in distinct:
                    entry = self._pinned.get(pair) or self._ready_slot(pair)
                    if entry is not None:
                        entry.leases += 1
                        entries.append(entry)
                    elif pair in self._loading:
                        self._loading[pair].waiters += 1
                        joins.append(self._loading[pair])
                    else:
                        missing.append(pair)
                slots = self._free_slots(len(missing))
                if slots is not None:
                    break
                # Not enough unleased slots: give everything back and wait for a release (no hold-and-wait).
                for entry in entries:
                    entry.leases -= 1
                for load in joins:
                    load.waiters -= 1
                if not wait:
                    return None
                if not waited:
                    waited = True
                    self._counts["slot_waits"] += 1
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._counts["busy"] += 1
                    open_slots = self._slots[:self._limit]
                    leased = sum(1 for s in open_slots if s.leases > 0)
                    keys = ", ".join(p.key for p in missing)
                    if leased == len(open_slots):
                        why = f"all {leased} slots are leased by running requests"
                    else:
                        why = (f"it needs {len(missing)} free slots and only {len(open_slots) - leased} of "
                               f"{len(open_slots)} are not leased by running requests")
                    raise Busy(f"Cannot attach adapter {keys}: {why} (waited {self.cfg.lease_timeout_s:g} s); "
                               "try again.")
                self._cv.wait(remaining)
            for entry in entries:
                held.append(entry)
                names[entry.pair] = entry.index  # type: ignore[index]
                if isinstance(entry, _Pinned):
                    self._counts["pinned_hits"] += 1
                else:
                    self._lru.move_to_end(entry.pair)  # type: ignore[arg-type]
                    self._counts["hits"] += 1
            waiting = joins
            for pair in missing:
                owned.append(self._loading.setdefault(pair, _Load(pair, from_ram=self._ram.pop(pair, None))))
            for load, slot in zip(owned, slots):
                self._occupy(slot, load.pair)
                load.slot = slot
                held.append(slot)
        error: BaseException | None = None
        for load in owned:
            # Every owned load runs even if an earlier one failed: other requests may be waiting on each.
            try:
                self._load(load)
                names[load.pair] = load.slot.index  # type: ignore[union-attr]
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                held.remove(load.slot)  # type: ignore[arg-type]  # _load dropped the loader's lease
                error = error or exc
        if error is not None:
            for load in waiting:
                self._abandon(load)
            raise error
        for i, load in enumerate(waiting):
            try:
                slot = self._wait_for(load, deadline)
            except BaseException:
                for rest in waiting[i + 1:]:
                    self._abandon(rest)
                raise
            held.append(slot)
            names[load.pair] = slot.index
        return names

    def _abandon(self, load: _Load) -> None:
        """Stop waiting for another request's load: undo the waiter count, or the lease its loader gave us."""
        with self._cv:
            if not load.done.is_set():
                load.waiters -= 1
            elif load.error is None and load.slot is not None:
                load.slot.leases -= 1
                self._cv.notify_all()

    def limit_slots(self, pressure: bool) -> bool:
        """Under memory pressure new pairs go only into the first `cfg.slots` LRU slots (the floor; the others keep
        what they hold until `evict_idle` or their turn); without it, into every slot. Whether it changed."""
        limit = min(self.cfg.slots, len(self._slots)) if pressure else len(self._slots)
        with self._cv:
            changed, self._limit = limit != self._limit, limit
            self._cv.notify_all()
        if changed:
            log.info("adapter slots open to new pairs: %d of %d%s", limit, len(self._slots),
                     " (memory pressure)" if pressure else "")
        return changed

    def _ready_slot(self, pair: Pair) -> _Slot | None:
        slot = self._lru.get(pair)
        return slot if slot is not None and slot.ready else None

    def _free_slots(self, n: int) -> list[_Slot] | None:
        """`n` slots that can take a new pair: empty ones first, then unleased ones in LRU order. None if fewer
        exist. Picks only; nothing is evicted until `_occupy`. Caller holds _cv."""
        if n == 0:
            return []
        empty = [s for s in self._slots[:self._limit] if s.pair is None and s.leases == 0 and not s.detaching]
        victims = [s for s in self._lru.values() if s.leases == 0 and s.ready and s.index <= self._limit]
        chosen = (empty + victims)[:n]
        return chosen if len(chosen) == n else None

    def _occupy(self, slot: _Slot, pair: Pair) -> None:
        """Evict the slot's pair (to the RAM tier) and reserve it for `pair`, leased by the loader. Caller holds _cv."""
        if slot.pair is not None:
            victim = slot.pair
            del self._lru[victim]
            self._to_ram(victim, slot.weights)
            self._counts["evictions"] += 1
            log.debug("evicted %s from slot %d", victim.key, slot.index)
        slot.pair, slot.weights, slot.ready, slot.leases = pair, None, False, 1
        self._lru[pair] = slot

    def _wait_for(self, load: _Load, deadline: float) -> _Slot:
        """Wait for another request's load of the same pair; its loader leases the slot for us when done."""
        finished = load.done.wait(timeout=max(0.0, deadline - time.monotonic()))
        with self._cv:
            if not finished and not load.done.is_set():
                load.waiters -= 1
                self._counts["busy"] += 1
                raise Busy(f"Adapter {load.pair.key} is still loading after {self.cfg.lease_timeout_s:g} s; "
                           "try again.")
            if load.error is not None:
                raise load.error
            assert load.slot is not None
            return load.slot

    def _load(self, load: _Load) -> None:
        """Single-flight owner: fetch weights (RAM tier or disk) and attach them into the reserved slot."""
        pair, slot = load.pair, load.slot
        assert slot is not None
        weights: AdapterWeights | None = None
        t0 = time.perf_counter()
        try:
            weights, load.from_ram = load.from_ram, None
            if weights is not None:
                self._count("ram_hits")
                # A stat, not a read: the folder may have been deleted or replaced while this copy sat in RAM.
                now = fingerprint_of(self.registry.get(pair).path)
                if now != weights.fingerprint:
                    weights = None
                    what = "was deleted or is incomplete" if now is None else "changed on disk"
                    raise AdapterUnusable(f"Adapter {pair.key} {what} since the last scan; rescan adapters.")
            if weights is None:
                weights = self._read_disk(pair)
            self._attach(slot.index, weights)
            slot.written = True
        except BaseException as exc:
            with self._cv:
                # Nothing usable is in the slot (a failed inject may have half-built it); the loader's own lease
                # is dropped here, so the caller must not release this slot again.
                if self._lru.get(pair) is slot:
                    del self._lru[pair]
                slot.pair, slot.weights, slot.ready, slot.leases = None, None, False, 0
                if isinstance(exc, AdapterUnusable):
                    self._remember_failure_locked(pair, exc)
                elif not isinstance(exc, TranslationError):
                    exc = AdapterUnusable(self._remember_failure_locked(pair, exc))
                load.error = exc
                self._loading.pop(pair, None)
                load.done.set()
                self._cv.notify_all()
            raise exc from None
        with self._cv:
            slot.weights = weights
            slot.ready = True
            slot.leases += load.waiters
            self._loading.pop(pair, None)
            load.done.set()
            self._load_ms.append((time.perf_counter() - t0) * 1000)
            self._cv.notify_all()

    def _release(self, held: list[_Slot | _Pinned]) -> None:
        to_unpin: list[Pair] = []
        retired: list[int] = []
        with self._cv:
            for entry in held:
                entry.leases -= 1
                if isinstance(entry, _Pinned) and entry.leases == 0 and entry.retired:
                    retired.append(entry.index)
                elif isinstance(entry, _Pinned) and entry.unpin_pending and entry.leases == 0:
                    to_unpin.append(entry.pair)
            self._cv.notify_all()
        for index in retired:
            self._free_pin_index(index)
        for pair in to_unpin:
            with self._cv:
                entry = self._pinned.get(pair)
                if entry is None or entry.leases > 0 or not entry.unpin_pending:
                    continue
                entry.unpin_pending = False
            self.unpin(pair)

    # ------------------------------------------------------------------ loading and model changes

    def _read_disk(self, pair: Pair, counter: str = "disk_loads") -> AdapterWeights:
        """Read from disk, remembering a failure (fail fast for failure_ttl_s); counted under `counter`."""
        try:
            info = self.registry.get(pair)
            t0 = time.perf_counter()
            weights = read_adapter(info)
        except AdapterUnusable as exc:
            self._remember_failure(pair, exc)
            raise
        with self._cv:
            self._counts[counter] += 1
        log.debug("read adapter %s from disk in %.1f ms", pair.key, (time.perf_counter() - t0) * 1000)
        return weights

    def _attach(self, index: int, weights: AdapterWeights) -> None:
        """Copy `weights` into slot `index` of every slot layer, growing the layers first if they do not fit it."""
        with self._mutate:
            t0 = time.perf_counter()
            if weights.prepared is None:
                weights.prepared = prepare(weights, self.slot_dtype,
                                           pin=str(self.backbone.device).startswith("cuda"))
                weights.state_dict = {}  # the prepared copy is all the cache needs from now on
            adapter: PreparedAdapter = weights.prepared
            lora = self.lora
            with self.backbone.model_lock:
                if not lora.fits(adapter) or index > lora.capacity:
                    grew = lora.ensure(adapter.modules, adapter.rank, max(index, lora.capacity))
                    if grew:
                        self._count("grows")
                        log.info("slot LoRA layers grew for %s: %s", weights.pair.key, lora.info())
                lora.load(index, adapter)
            if weights.source is not None and adapter.nbytes >= RELEASE_MIN_BYTES:
                # The slot holds the adapter now; the copy kept for re-attaching stays as the file's pages in the
                # page cache, out of this process's resident memory until it is attached again.
                heap.release_file_pages((t for pair in adapter.tensors.values() for t in pair), weights.source)
            self._count("attaches")
            self._attach_ms.append((time.perf_counter() - t0) * 1000)

    def _clear(self, index: int) -> None:
        with self._mutate, self.backbone.model_lock:
            self.lora.clear(index)

    def _delete_slot(self, slot: _Slot) -> None:
        if slot.written:
            self._clear(slot.index)
            slot.written = False
        with self._cv:
            slot.detaching = False
            self._cv.notify_all()

    def _release_slot_for_delete(self, slot: _Slot, keep_ram: bool) -> None:
        """Take an unleased slot out of the LRU before its layers are deleted outside the lock. Caller holds _cv."""
        assert slot.pair is not None
        self._lru.pop(slot.pair, None)
        if keep_ram and slot.weights is not None:
            self._to_ram(slot.pair, slot.weights)
        self._counts["evictions"] += 1
        slot.pair, slot.weights, slot.ready, slot.detaching = None, None, False, True

    def _to_ram(self, pair: Pair, weights: AdapterWeights | None) -> None:
        if weights is not None and self.cfg.ram_tier > 0:
            self._ram[pair] = weights

    # ------------------------------------------------------------------ failures

    def _raise_if_failed(self, pair: Pair) -> None:
        """Fail fast for a pair whose load failed less than failure_ttl_s ago. Caller holds _cv."""
        failed = self._failures.get(pair)
        if failed is None:
            return
        when, reason = failed
        if time.monotonic() - when < self.cfg.failure_ttl_s:
            raise AdapterUnusable(reason)
        del self._failures[pair]

    def _remember_failure(self, pair: Pair, exc: BaseException) -> str:
        with self._cv:
            return self._remember_failure_locked(pair, exc)

    def _remember_failure_locked(self, pair: Pair, exc: BaseException) -> str:
        if isinstance(exc, TranslationError):
            reason = exc.message
        else:
            # PEFT's own text can run to kilobytes of internal module names: callers get one line, the log the rest.
            log.warning("adapter %s failed to attach: %s: %s", pair.key, type(exc).__name__, exc)
            log.debug("adapter %s attach traceback", pair.key, exc_info=exc)
            reason = (f"Adapter {pair.key} could not be attached to this backbone ({type(exc).__name__}); it may be "
                      "incompatible with the model. The server log has the details.")
        if pair not in self._failures:
            self._counts["failures"] += 1
        self._failures[pair] = (time.monotonic(), reason)
        log.error("adapter %s failed: %s", pair.key, reason)
        return reason

    # ------------------------------------------------------------------ introspection

    def _count(self, name: str) -> None:
        with self._cv:
            self._counts[name] += 1

    def count_busy(self) -> None:
        """A caller gave up waiting for a slot (the engine's queue deadline)."""
        self._count("busy")

    def hit_rate(self) -> float | None:
        """Share of adapter lookups served by an attached adapter (what `stats().hit_rate` gives, without
        building the whole snapshot; every request records it)."""
        with self._cv:
            c = self._counts
            lookups = c["hits"] + c["pinned_hits"] + c["ram_hits"] + c["disk_loads"]
            return None if lookups == 0 else (c["hits"] + c["pinned_hits"]) / lookups

    def lru_order(self) -> list[str]:
        """Resident non-pinned keys, least recently used first."""
        with self._cv:
            return [p.key for p, s in self._lru.items() if s.ready]

    def loading(self) -> dict[str, int]:
        """Pairs being loaded right now → how many other requests wait for that same load."""
        with self._cv:
            return {p.key: load.waiters for p, load in self._loading.items()}

    def pinned(self) -> list[str]:
        with self._cv:
            return sorted(p.key for p in self._pinned)

    def ram_tier(self) -> list[str]:
        """RAM-tier keys, least recently used first."""
        with self._cv:
            return [p.key for p in self._ram.keys()] if self.cfg.ram_tier > 0 else []

    def stats(self) -> CacheStats:
        with self._cv:
            resident = [ResidentAdapter(p.key, e.index, True, e.leases) for p, e in sorted(self._pinned.items())]
            resident += [ResidentAdapter(p.key, s.index, False, s.leases) for p, s in self._lru.items() if s.ready]
            return CacheStats(
                slots=len(self._slots), **self._counts,
                load_ms_p50=_percentile(self._load_ms, 0.5), load_ms_p95=_percentile(self._load_ms, 0.95),
                attach_ms_p50=_percentile(self._attach_ms, 0.5),
                layers=self.lora.info(),
                resident=resident,
                ram_tier=[p.key for p in self._ram.keys()] if self.cfg.ram_tier > 0 else [],
                failed={p.key: r for p, (_, r) in self._failures.items()},
            )
