"""The adapter cache: the only owner of adapter lifetime (attach, evict, free).

Layout inside the PEFT model:
- **Pinned** pairs are attached under their own key ("en2es") at start and never evicted; they do not use slots.
- **Slots** are `cfg.slots` fixed PEFT adapter names ("slot0_", "slot1_", ...). A pair that is not pinned is
  attached into a slot, and `Lease.adapter_names` carries the slot name for its rows. Re-attaching into a slot
  whose injected layers have the same tensor names and shapes (modules, layers, rank) only copies weights
  (`peft.utils.hotswap.hotswap_adapter_from_state_dict`, a few ms); otherwise the slot's layers are deleted and
  re-injected from the state dict. Fixed slot names keep hotswap valid: PEFT keeps the adapter *name* across a
  hotswap, so naming slots by pair would leave "en2es" serving es2de weights.
- **RAM tier**: an evicted pair's state dict stays in a bounded host-RAM LRU (`cachetools.LRUCache`), so
  re-attaching it does not touch the disk. The slot LRU is a plain OrderedDict instead: eviction must skip leased
  entries in LRU order, and cachetools neither exposes its order nor lets popitem skip an entry.

Concurrency: one condition variable guards the bookkeeping; disk reads and model changes run outside it.
A lease holds a reference count on every entry it uses; eviction only picks unleased slots, and when every slot
is leased a request waits up to `lease_timeout_s` and then raises Busy. Concurrent requests for one missing pair
share one load (single-flight: the first becomes the loader, the others wait on its `_Load`).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Sequence

import cachetools

from ..config import CacheConfig
from ..errors import AdapterUnusable, Busy, TranslationError
from .registry import AdapterRegistry, AdapterWeights, fingerprint_of, read_adapter
from .request import Pair

if TYPE_CHECKING:
    from ..backbone import Backbone

log = logging.getLogger(__name__)

BASE = "__base__"
_PREFIX = "lora_"


def slot_name(index: int) -> str:
    # The trailing "_" keeps "slot1_" from being a substring of "slot11_" (hotswap matches adapter keys by substring).
    return f"slot{index}_"


@dataclass(eq=False)  # identity: leases are counted per object
class _Slot:
    name: str
    pair: Pair | None = None
    weights: AdapterWeights | None = None
    #: `_signature` of the layers currently injected under `name` (None: nothing injected).
    injected: tuple | None = None
    leases: int = 0
    #: False while the owning load is still attaching; nobody else may use it yet.
    ready: bool = False
    #: True while the layers are being deleted outside the lock; not eligible for reservation.
    detaching: bool = False


@dataclass(eq=False)  # identity: leases are counted per object
class _Pinned:
    pair: Pair
    weights: AdapterWeights
    leases: int = 0
    #: unpin() arrived while leased: detach once the last lease is released.
    unpin_pending: bool = False

    @property
    def name(self) -> str:
        return self.pair.key


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
    slot: str | None
    pinned: bool
    leases: int


@dataclass
class CacheStats:
    slots: int
    hits: int
    pinned_hits: int
    ram_hits: int
    disk_loads: int
    hotswaps: int
    injections: int
    evictions: int
    failures: int
    busy: int
    #: Reservations that found every slot leased and had to wait.
    slot_waits: int
    load_ms_p50: float | None
    load_ms_p95: float | None
    attach_ms_p50: float | None
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
    """Adapters held for one batch. `adapter_names[i]` is the PEFT name for `pairs[i]` ("__base__" for None)."""

    pairs: list[Pair | None]
    adapter_names: list[str]


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _free_memory() -> None:
    """After deletes: PEFT layers sit in reference cycles, and glibc keeps freed pages. A full gc.collect costs
    0.3-1 s in a process holding transformers, so it runs once per detach operation, never per slot overwrite."""
    gc.collect()
    _malloc_trim()


def _malloc_trim() -> None:
    """Give freed heap pages back to the OS; without it RSS does not shrink after delete_adapter (glibc only)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _signature(weights: AdapterWeights) -> tuple:
    """What hotswap needs to match: the exact tensor names and shapes (so the same modules, layers and ranks).
    Alpha, rsLoRA and rank/alpha patterns may differ: hotswap recomputes each layer's scaling."""
    return tuple(sorted((k, tuple(v.shape)) for k, v in weights.state_dict.items()))


def _keep_active_valid(model: object) -> None:
    """PeftModel.generate reads the config of the *active* adapter even when adapter_names picks adapters per row;
    after deletes it can name a deleted adapter. Point it at any attached one (rows never depend on it)."""
    configs = getattr(model, "peft_config", {})
    if configs and model.active_adapter not in configs:  # type: ignore[attr-defined]
        model.set_adapter(next(iter(configs)), inference_mode=True)  # type: ignore[attr-defined]


class AdapterCache:
    """Slots, pins, RAM tier, leases and single-flight loading over one backbone.

    One cache per backbone: a new cache on a backbone takes it over and detaches the adapters an earlier cache
    attached (so that earlier cache must no longer be used). Build services through `get_service()`.
    """

    def __init__(self, backbone: Backbone, registry: AdapterRegistry, cfg: CacheConfig) -> None:
        self.backbone = backbone
        self.registry = registry
        self.cfg = cfg
        self._cv = threading.Condition(threading.Lock())
        self._slots = [_Slot(slot_name(i)) for i in range(cfg.slots)]
        #: Resident non-pinned pairs, least recently used first.
        self._lru: OrderedDict[Pair, _Slot] = OrderedDict()
        self._pinned: dict[Pair, _Pinned] = {}
        self._ram: cachetools.LRUCache[Pair, AdapterWeights] = cachetools.LRUCache(maxsize=max(cfg.ram_tier, 1))
        self._loading: dict[Pair, _Load] = {}
        #: pair → (monotonic time of failure, reason)
        self._failures: dict[Pair, tuple[float, str]] = {}
        #: Serialises structural changes to the PEFT model (inject/delete/hotswap); generate is kept out by the
        #: backbone's model_lock, taken inside.
        self._mutate = threading.Lock()
        self._counts = dict(hits=0, pinned_hits=0, ram_hits=0, disk_loads=0, hotswaps=0, injections=0, evictions=0,
                            failures=0, busy=0, slot_waits=0)
        self._load_ms: list[float] = []
        self._attach_ms: list[float] = []
        self._forget_foreign_adapters()

    def _forget_foreign_adapters(self) -> None:
        """This cache owns every adapter on the backbone: drop any left by an earlier cache on the same backbone
        (tests and benchmarks build several services in one process)."""
        from peft import PeftModel

        model = self.backbone.model
        if isinstance(model, PeftModel):
            names = list(model.peft_config)
            if names:
                log.warning("adapter cache: detaching %d adapters left by an earlier cache: %s", len(names), names)
            for name in names:
                self._delete(name, free=False)
            if names:
                _free_memory()

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
        """Attach `pair` under its own name, outside the slots, never evicted. False if it already was pinned."""
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
            weights = self._read_disk(pair)
        with self._mutate:
            t0 = time.perf_counter()
            try:
                self._inject(pair.key, weights)
            except Exception as exc:
                reason = self._remember_failure(pair, exc)
                raise AdapterUnusable(reason) from None
            self._attach_ms.append((time.perf_counter() - t0) * 1000)
        with self._cv:
            self._pinned[pair] = _Pinned(pair, weights)
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
        with self._mutate:
            self._delete(entry.name, free=False)
        _free_memory()
        log.info("unpinned adapter %s", pair.key)
        return True

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
        _free_memory()
        log.info("unloaded adapter %s", pair.key)
        return True

    def evict_idle(self, keep_ram: bool = True) -> list[Pair]:
        """Light mode: detach every unleased non-pinned adapter and free its layers. Returns the pairs evicted."""
        with self._cv:
            victims = [s for s in self._lru.values() if s.leases == 0 and s.ready]
            pairs = [s.pair for s in victims if s.pair is not None]
            for slot in victims:
                self._release_slot_for_delete(slot, keep_ram=keep_ram)
            # Slots emptied earlier (a pair moved to the pins) still hold injected layers; free those too.
            stale = [s for s in self._slots if s.pair is None and s.injected is not None and s.leases == 0
                     and not s.detaching]
            for slot in stale:
                slot.detaching = True
            if not keep_ram:
                self._ram.clear()
        for slot in victims + stale:
            self._delete_slot(slot)
        if victims or stale:
            _free_memory()
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
            for pair, entry in self._pinned.items():
                if current.get(pair) != entry.weights.fingerprint:
                    log.warning("pinned adapter %s changed or vanished on disk; unpin and pin it to reload", pair.key)
            self._cv.notify_all()
        for slot in stale_slots:
            self._delete_slot(slot)
        if stale_slots:
            _free_memory()
            log.info("rescan dropped %d stale adapters from the slots", len(stale_slots))

    # ------------------------------------------------------------------ leases

    @contextlib.contextmanager
    def lease(self, pairs: Sequence[Pair | None]) -> Iterator[Lease]:
        """Hold every distinct adapter of `pairs` for the duration of the block (see module docstring)."""
        distinct = list(dict.fromkeys(p for p in pairs if p is not None))
        deadline = time.monotonic() + self.cfg.lease_timeout_s
        held: list[_Slot | _Pinned] = []
        try:
            names = self._acquire_all(distinct, deadline, held)
            yield Lease(list(pairs), [BASE if p is None else names[p] for p in pairs])
        finally:
            self._release(held)

    def _acquire_all(self, distinct: list[Pair], deadline: float, held: list[_Slot | _Pinned]) -> dict[Pair, str]:
        """Lease all of `distinct`, appending what is held to `held` (released by the caller).

        Slots for the missing pairs are reserved all at once or not at all: a lease never holds some slots while
        waiting for more, so two multi-pair leases cannot deadlock each other.
        """
        with self._cv:
            needed = [p for p in distinct if p not in self._pinned]
        if len(needed) > len(self._slots):
            self._count("busy")
            raise Busy(f"A batch asked for {len(needed)} adapter slots at once; {len(self._slots)} exist.")
        names: dict[Pair, str] = {}
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
                if not waited:
                    waited = True
                    self._counts["slot_waits"] += 1
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._counts["busy"] += 1
                    leased = sum(1 for s in self._slots if s.leases > 0)
                    keys = ", ".join(p.key for p in missing)
                    if leased == len(self._slots):
                        why = f"all {leased} slots are leased by running requests"
                    else:
                        why = (f"it needs {len(missing)} free slots and only {len(self._slots) - leased} of "
                               f"{len(self._slots)} are not leased by running requests")
                    raise Busy(f"Cannot attach adapter {keys}: {why} (waited {self.cfg.lease_timeout_s:g} s); "
                               "try again.")
                self._cv.wait(remaining)
            for entry in entries:
                held.append(entry)
                names[entry.pair] = entry.name  # type: ignore[index]
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
                names[load.pair] = load.slot.name  # type: ignore[union-attr]
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
            names[load.pair] = slot.name
        return names

    def _abandon(self, load: _Load) -> None:
        """Stop waiting for another request's load: undo the waiter count, or the lease its loader gave us."""
        with self._cv:
            if not load.done.is_set():
                load.waiters -= 1
            elif load.error is None and load.slot is not None:
                load.slot.leases -= 1
                self._cv.notify_all()

    def _ready_slot(self, pair: Pair) -> _Slot | None:
        slot = self._lru.get(pair)
        return slot if slot is not None and slot.ready else None

    def _free_slots(self, n: int) -> list[_Slot] | None:
        """`n` slots that can take a new pair: empty ones first, then unleased ones in LRU order. None if fewer
        exist. Picks only; nothing is evicted until `_occupy`. Caller holds _cv."""
        if n == 0:
            return []
        empty = [s for s in self._slots if s.pair is None and s.leases == 0 and not s.detaching]
        victims = [s for s in self._lru.values() if s.leases == 0 and s.ready]
        chosen = (empty + victims)[:n]
        return chosen if len(chosen) == n else None

    def _occupy(self, slot: _Slot, pair: Pair) -> None:
        """Evict the slot's pair (to the RAM tier) and reserve it for `pair`, leased by the loader. Caller holds _cv."""
        if slot.pair is not None:
            victim = slot.pair
            del self._lru[victim]
            self._to_ram(victim, slot.weights)
            self._counts["evictions"] += 1
            log.debug("evicted %s from %s", victim.key, slot.name)
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
            self._attach(slot, weights)
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
        with self._cv:
            for entry in held:
                entry.leases -= 1
                if isinstance(entry, _Pinned) and entry.unpin_pending and entry.leases == 0:
                    to_unpin.append(entry.pair)
            self._cv.notify_all()
        for pair in to_unpin:
            with self._cv:
                entry = self._pinned.get(pair)
                if entry is None or entry.leases > 0 or not entry.unpin_pending:
                    continue
                entry.unpin_pending = False
            self.unpin(pair)

    # ------------------------------------------------------------------ loading and model changes

    def _read_disk(self, pair: Pair) -> AdapterWeights:
        """Read from disk, remembering a failure (fail fast for failure_ttl_s)."""
        try:
            info = self.registry.get(pair)
            t0 = time.perf_counter()
            weights = read_adapter(info)
        except AdapterUnusable as exc:
            self._remember_failure(pair, exc)
            raise
        with self._cv:
            self._counts["disk_loads"] += 1
        log.debug("read adapter %s from disk in %.1f ms", pair.key, (time.perf_counter() - t0) * 1000)
        return weights

    def _attach(self, slot: _Slot, weights: AdapterWeights) -> None:
        """Put `weights` into `slot`'s layers: hotswap when the tensors match, else delete + inject."""
        with self._mutate:
            t0 = time.perf_counter()
            signature = _signature(weights)
            swapped = False
            if self.cfg.hotswap and slot.injected == signature:
                try:
                    self._hotswap(slot.name, weights)
                    swapped = True
                    self._count("hotswaps")
                except (RuntimeError, ValueError) as exc:  # never fail a pair over the fast path
                    log.warning("hotswap into %s failed (%s); re-injecting %s", slot.name, exc, weights.pair.key)
            if not swapped:
                if slot.injected is not None:
                    self._delete(slot.name, free=False)
                    slot.injected = None
                self._inject(slot.name, weights)
                slot.injected = signature
                self._count("injections")
            self._attach_ms.append((time.perf_counter() - t0) * 1000)

    def _peft_state_dict(self, name: str, weights: AdapterWeights) -> dict:
        from peft.utils.save_and_load import _insert_adapter_name_into_state_dict

        return _insert_adapter_name_into_state_dict(weights.state_dict, adapter_name=name, parameter_prefix=_PREFIX)

    def _hotswap(self, name: str, weights: AdapterWeights) -> None:
        from peft.utils.hotswap import hotswap_adapter_from_state_dict

        bb = self.backbone
        with bb.model_lock:
            hotswap_adapter_from_state_dict(bb.model, self._peft_state_dict(name, weights), adapter_name=name,
                                            config=weights.config, parameter_prefix=_PREFIX)

    def _inject(self, name: str, weights: AdapterWeights) -> None:
        """Add adapter `name` to the model from an in-memory state dict (wrapping the model on first use)."""
        import copy

        from peft import PeftModel, get_peft_model, set_peft_model_state_dict

        bb = self.backbone
        config = copy.deepcopy(weights.config)
        config.task_type = "SEQ_2_SEQ_LM" if bb.arch == "encoder-decoder" else "CAUSAL_LM"
        config.inference_mode = True
        with bb.model_lock:
            if not isinstance(bb.model, PeftModel):
                # Layers are created on their base layer's device (works with device_map and quantized models).
                bb.model = get_peft_model(bb.base_model, config, adapter_name=name)
            else:
                if name in bb.model.peft_config:
                    bb.model.delete_adapter(name)
                bb.model.add_adapter(name, config)
            try:
                result = set_peft_model_state_dict(bb.model, weights.state_dict, adapter_name=name)
                missing = [k for k in result.missing_keys if _PREFIX in k and f".{name}." in k]
                if missing:
                    raise AdapterUnusable(f"Adapter {weights.pair.key} lacks weights for {missing[0]}")
            except BaseException:
                bb.model.delete_adapter(name)
                _keep_active_valid(bb.model)
                raise
            _keep_active_valid(bb.model)
            bb.model.eval()

    def _delete(self, name: str, free: bool = True) -> None:
        """Delete adapter `name` from the model. `free` returns the memory to the OS at once; callers deleting
        several adapters pass False and call `_free_memory` once, outside `_mutate`."""
        bb = self.backbone
        with bb.model_lock:
            model = bb.model
            if name in getattr(model, "peft_config", {}):
                model.delete_adapter(name)
                _keep_active_valid(model)
        if free:
            _free_memory()

    def _delete_slot(self, slot: _Slot) -> None:
        with self._mutate:
            if slot.injected is not None:
                self._delete(slot.name, free=False)
                slot.injected = None
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
            resident = [ResidentAdapter(p.key, None, True, e.leases) for p, e in sorted(self._pinned.items())]
            resident += [ResidentAdapter(p.key, s.name, False, s.leases) for p, s in self._lru.items() if s.ready]
            return CacheStats(
                slots=len(self._slots), **self._counts,
                load_ms_p50=_percentile(self._load_ms, 0.5), load_ms_p95=_percentile(self._load_ms, 0.95),
                attach_ms_p50=_percentile(self._attach_ms, 0.5),
                resident=resident,
                ram_tier=[p.key for p in self._ram.keys()] if self.cfg.ram_tier > 0 else [],
                failed={p.key: r for p, (_, r) in self._failures.items()},
            )
