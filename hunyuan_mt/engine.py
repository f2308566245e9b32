"""The batching engine: rows of many pairs, one `generate` per batch, each row with its own adapter.

Callers (any thread) submit rows; one scheduler thread forms batches and runs them. A batch is formed after the
oldest waiting row has waited `max_wait_ms` (or at once when `max_rows` rows wait), within these bounds:

- at most `max_rows` rows and `max_tokens` padded input tokens (rows × longest prompt);
- at most `slots` distinct non-pinned adapters, so the batch's single lease can always be granted;
- rows whose adapter needs no load (pinned, resident, or the bare backbone) go first, which keeps the hit rate up;
  a row passed over `fairness_max_skips` times jumps ahead of all of them, so a cold pair cannot starve.

The whole batch runs under ONE cache lease. An out-of-memory error splits the batch in halves and retries them
under the same lease; a single row that still does not fit fails alone with `OutOfMemory`. A lease failure for
one adapter (broken or missing) fails only the rows of that pair: the batch is retried per pair. A row longer than
the model's input limit (`backbone.max_input_tokens`) fails with `InputTooLarge` when it is counted, before any
batch is formed.

Greedy output per row equals that row run alone: padding is chosen by the backbone so rows do not see each
other, and `max_new_tokens` is the same for every row.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from .config import EngineConfig, GenerationConfig, LimitsConfig
from .errors import InputTooLarge, InvalidInput, OutOfMemory, TranslationError
from .memory import QUANTIZED_KV_KWARGS, quantized_kv_support

if TYPE_CHECKING:
    from .adapters.cache import AdapterCache
    from .adapters.request import Pair
    from .backbone import Backbone

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Row:
    """One segment to translate with one adapter (None: the bare backbone)."""

    text: str
    src: str
    tgt: str
    adapter: "Pair | None"


@dataclass
class _Pending:
    row: Row
    future: Future
    seq: int
    #: Prompt length in tokens; counted by the scheduler thread (the tokenizer is not shared across threads).
    tokens: int | None
    enqueued: float
    skips: int = 0


@dataclass(frozen=True)
class BatchRecord:
    """What one generate call held: for tests, metrics and the status page."""

    rows: int
    pairs: tuple[str, ...]  # per row, the pair key ("en2es") or "__base__" for the bare backbone
    adapter_names: tuple[str, ...]  # per row, the PEFT adapter name the lease gave (slot or pinned name)
    distinct_nonpinned: int
    padded_tokens: int
    generate_ms: float
    splits: int
    #: Sequence numbers of the rows, in batch order (tests use them to check fairness).
    seqs: tuple[int, ...] = ()


@dataclass
class EngineStats:
    batches: int = 0
    rows: int = 0
    oom_splits: int = 0
    oom_failures: int = 0
    #: Batches split because a non-OOM error hit them (to find the row that causes it).
    error_splits: int = 0
    max_rows_seen: int = 0
    max_distinct_nonpinned: int = 0
    generate_ms: deque = field(default_factory=lambda: deque(maxlen=1000))
    queue_ms: deque = field(default_factory=lambda: deque(maxlen=1000))


def is_oom(exc: BaseException) -> bool:
    """CUDA OOM, or the CPU allocator's equivalent (which torch raises as a plain RuntimeError)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


class BatchEngine:
    """Thread-safe front: `run(rows)` blocks until every row is translated (or raises the first row's error)."""

    def __init__(self, backbone: "Backbone", cache: "AdapterCache", engine_cfg: EngineConfig,
                 gen_cfg: GenerationConfig, limits: LimitsConfig) -> None:
        self.backbone = backbone
        self.cache = cache
        self.cfg = engine_cfg
        self.gen = gen_cfg
        self.limits = limits
        self.max_rows = engine_cfg.max_rows
        self.max_tokens = engine_cfg.max_tokens
        self.light = False
        self.kv_quantization: str | None = None
        self.kv_quantization_note = ""
        #: Test seam: called with the rows of every generate attempt, before the model runs. Raising
        #: torch.OutOfMemoryError here behaves exactly like the model running out of memory.
        self.before_generate: Callable[[list[Row]], None] | None = None
        self.stats = EngineStats()
        self.history: deque[BatchRecord] = deque(maxlen=2000)
        self._queue: list[_Pending] = []
        self._cv = threading.Condition()
        self._seq = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="hmt-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public

    def submit(self, rows: Sequence[Row]) -> list[Future]:
        """Queue rows; each future resolves to the translation or raises that row's error."""
        now = time.monotonic()
        futures: list[Future] = []
        with self._cv:
            if self._closed:
                raise RuntimeError("engine is closed")
            for row in rows:
                fut: Future = Future()
                if row.text.strip():
                    self._queue.append(_Pending(row, fut, next(self._seq), None, now))
                else:
                    # Nothing to translate (e.g. a pivot's first hop produced nothing); models cannot encode an
                    # empty input either.
                    fut.set_result("")
                futures.append(fut)
            self._cv.notify_all()
        return futures

    def run(self, rows: Sequence[Row], timeout: float | None = None) -> list[str]:
        """Translate `rows` (shared batches with concurrent callers). Raises the first failing row's error."""
        futures = self.submit(rows)
        return [f.result(timeout=timeout) for f in futures]

    def run_each(self, rows: Sequence[Row], timeout: float | None = None) -> list[str | BaseException]:
        """Like `run`, but returns each row's error in its place instead of raising."""
        out: list[str | BaseException] = []
        for f in self.submit(rows):
            try:
                out.append(f.result(timeout=timeout))
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller, per row
                out.append(exc)
        return out

    def close(self) -> None:
        with self._cv:
            self._closed = True
            pending, self._queue = self._queue, []
            self._cv.notify_all()
        for p in pending:
            p.future.set_exception(RuntimeError("engine closed"))
        self._thread.join(timeout=10)

    def queued(self) -> int:
        with self._cv:
            return len(self._queue)

    def set_light_mode(self, on: bool) -> dict[str, Any]:
        """Light mode: a quarter of the rows and tokens per batch, quantized KV cache where supported."""
        with self._cv:
            self.light = on
            if on:
                self.max_rows = max(1, self.cfg.max_rows // 4)
                self.max_tokens = max(16, self.cfg.max_tokens // 4)
                ok, note = quantized_kv_support(self.backbone.model, self.backbone.arch)
                self.kv_quantization = "fp8" if ok else None
                self.kv_quantization_note = note
            else:
                self.max_rows, self.max_tokens = self.cfg.max_rows, self.cfg.max_tokens
                self.kv_quantization, self.kv_quantization_note = None, ""
            return {"max_rows": self.max_rows, "max_tokens": self.max_tokens,
                    "kv_cache": self.kv_quantization or "default",
                    **({"kv_cache_note": self.kv_quantization_note} if self.kv_quantization_note else {})}

    def status(self) -> dict[str, Any]:
        s = self.stats
        gen = sorted(s.generate_ms.copy())  # deque.copy is atomic; iterating a deque being appended to is not
        queue = sorted(s.queue_ms.copy())
        return {
            "batches": s.batches, "rows": s.rows,
            "mean_batch_rows": round(s.rows / s.batches, 2) if s.batches else None,
            "max_rows_seen": s.max_rows_seen, "max_distinct_nonpinned": s.max_distinct_nonpinned,
            "oom_splits": s.oom_splits, "oom_failures": s.oom_failures, "error_splits": s.error_splits,
            "generate_ms_p50": _pct(gen, 0.5), "generate_ms_p95": _pct(gen, 0.95),
            "queue_ms_p50": _pct(queue, 0.5), "queue_ms_p95": _pct(queue, 0.95),
            "queued": self.queued(), "light_mode": self.light, "max_rows": self.max_rows,
            "max_tokens": self.max_tokens, "kv_cache": self.kv_quantization or "default",
            "kv_cache_note": self.kv_quantization_note,
        }

    # ------------------------------------------------------------------ scheduling

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                # Fill the window: wait until the oldest row has waited max_wait_ms, or a full batch is there.
                deadline = self._queue[0].enqueued + self.cfg.max_wait_ms / 1000
                while len(self._queue) < self.max_rows and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                if self._closed:
                    return
                uncounted = [p for p in self._queue if p.tokens is None]
            try:
                # Token counts and cache views are taken outside the engine lock, so callers can keep queueing.
                self._count_tokens(uncounted)
                pinned = set(self.cache.pinned())
                resident = set(self.cache.lru_order())
                with self._cv:
                    batch = self._form_batch(pinned, resident)
            except Exception as exc:  # the scheduler must survive anything; the rows it held hear about it
                log.exception("engine: scheduling failed")
                with self._cv:
                    failed, self._queue = self._queue, []
                _fail(failed, exc)
                continue
            if batch:
                now = time.monotonic()
                for p in batch:
                    self.stats.queue_ms.append((now - p.enqueued) * 1000)
                self._execute(batch, pinned)

    def _count_tokens(self, pending: list[_Pending]) -> None:
        if not pending:
            return
        try:
            lengths = self.backbone.prompt_lengths([self._prompt_row(p.row) for p in pending])
        except Exception:  # find the row the tokenizer refuses; only it fails
            lengths = []
            for p in pending:
                try:
                    lengths.extend(self.backbone.prompt_lengths([self._prompt_row(p.row)]))
                except Exception as exc:  # noqa: BLE001
                    with self._cv:
                        self._queue = [q for q in self._queue if q is not p]
                    _fail([p], InvalidInput(f"This text cannot be tokenized: {type(exc).__name__}."))
                    lengths.append(0)
        for p, n in zip(pending, lengths):
            p.tokens = n
        self._refuse_over_long(pending)

    def _refuse_over_long(self, pending: list[_Pending]) -> None:
        """Fail rows longer than the model's input limit now, so they never join (and fail) a batch."""
        limit = self.backbone.max_input_tokens
        if limit is None:
            return
        over = [p for p in pending if p.tokens is not None and p.tokens > limit and not p.future.done()]
        if not over:
            return
        with self._cv:
            self._queue = [q for q in self._queue if all(q is not p for p in over)]
        for p in over:
            log.info("engine: refused a %s→%s row of %d tokens (model limit %d)", p.row.src, p.row.tgt, p.tokens,
                     limit)
            _fail([p], InputTooLarge(f"A segment of {p.tokens} tokens is longer than this model's limit of "
                                     f"{limit} tokens; split the text into shorter segments."))

    def _form_batch(self, pinned: set[str], resident: set[str]) -> list[_Pending]:
        """Pick rows for one batch and drop them from the queue (caller holds the lock)."""
        slots = self.cache.cfg.slots
        bound = self.cfg.fairness_max_skips

        def cheap(p: _Pending) -> bool:
            a = p.row.adapter
            return a is None or a.key in pinned or a.key in resident

        starved = [p for p in self._queue if p.skips >= bound]
        rest = [p for p in self._queue if p.skips < bound]
        order = starved + [p for p in rest if cheap(p)] + [p for p in rest if not cheap(p)]
        # Rows queued after the counts were taken wait for the next round.
        order = [p for p in order if p.tokens is not None]
        chosen: list[_Pending] = []
        adapters: set[str] = set()
        longest = 0
        for p in order:
            if len(chosen) >= self.max_rows:
                break
            key = None if p.row.adapter is None else p.row.adapter.key
            new_adapter = key is not None and key not in pinned and key not in adapters
            if new_adapter and len(adapters) >= slots:
                continue
            tokens = max(longest, p.tokens) * (len(chosen) + 1)
            if chosen and tokens > self.max_tokens:
                continue
            chosen.append(p)
            longest = max(longest, p.tokens)
            if new_adapter:
                adapters.add(key)
        taken = {id(p) for p in chosen}
        for p in order:
            if id(p) not in taken:
                p.skips += 1
        self._queue = [p for p in self._queue if id(p) not in taken]
        chosen.sort(key=lambda p: p.seq)
        return chosen

    # ------------------------------------------------------------------ execution

    def _execute(self, batch: list[_Pending], pinned: set[str]) -> None:
        try:
            with self.cache.lease([p.row.adapter for p in batch]) as lease:
                self._generate(batch, list(lease.adapter_names), pinned, splits=0)
        except TranslationError as exc:
            batch = [p for p in batch if not p.future.done()]
            by_pair: dict[str | None, list[_Pending]] = {}
            for p in batch:
                by_pair.setdefault(None if p.row.adapter is None else p.row.adapter.key, []).append(p)
            if len(by_pair) == 1:
                _fail(batch, exc)
                return
            # One adapter could not be leased (broken, missing, busy): retry per pair, so only its rows fail.
            for rows in by_pair.values():
                self._execute(rows, pinned)
        except BaseException as exc:  # noqa: BLE001 - the rows' callers must hear about it, the loop must live
            log.exception("engine: batch of %d rows failed", len(batch))
            _fail(batch, exc)

    def _generate(self, batch: list[_Pending], names: list[str], pinned: set[str], splits: int) -> None:
        rows = [p.row for p in batch]
        try:
            if self.before_generate is not None:
                self.before_generate(rows)
            t0 = time.perf_counter()
            outs = self.backbone.generate([self._prompt_row(r) for r in rows], names, self.gen,
                                          self._max_new_tokens(batch), **self._extra_kwargs())
            ms = (time.perf_counter() - t0) * 1000
        except Exception as exc:  # noqa: BLE001
            if not is_oom(exc):
                if len(batch) == 1:
                    log.error("engine: a %s→%s row failed: %s: %s", rows[0].src, rows[0].tgt, type(exc).__name__,
                              exc)
                    _fail(batch, exc)
                    return
                # Isolate the row that breaks the model rather than fail every caller in the batch.
                self.stats.error_splits += 1
                half = len(batch) // 2
                self._generate(batch[:half], names[:half], pinned, splits + 1)
                self._generate(batch[half:], names[half:], pinned, splits + 1)
                return
            self._free_memory()
            if len(batch) == 1:
                self.stats.oom_failures += 1
                row = batch[0].row
                log.warning("engine: one row (%d tokens, %s→%s) does not fit in memory", batch[0].tokens,
                            row.src, row.tgt)
                _fail(batch, OutOfMemory(
                    f"Out of memory translating one segment of {batch[0].tokens} tokens ({row.src}→{row.tgt}), "
                    "even alone; shorten the text or try again later."))
                return
            self.stats.oom_splits += 1
            half = len(batch) // 2
            log.info("engine: out of memory on %d rows, retrying as %d + %d", len(batch), half, len(batch) - half)
            self._generate(batch[:half], names[:half], pinned, splits + 1)
            self._generate(batch[half:], names[half:], pinned, splits + 1)
            return
        keys = tuple("__base__" if p.row.adapter is None else p.row.adapter.key for p in batch)
        distinct = len({k for k in keys if k != "__base__" and k not in pinned})
        record = BatchRecord(len(batch), keys, tuple(names), distinct,
                             max(p.tokens for p in batch) * len(batch), ms, splits, tuple(p.seq for p in batch))
        self.history.append(record)
        s = self.stats
        s.batches += 1
        s.rows += len(batch)
        s.max_rows_seen = max(s.max_rows_seen, len(batch))
        s.max_distinct_nonpinned = max(s.max_distinct_nonpinned, distinct)
        s.generate_ms.append(ms)
        for p, text in zip(batch, outs):
            p.future.set_result(text)

    def _max_new_tokens(self, batch: list[_Pending]) -> int:
        """limits.max_new_tokens, capped so positions stay inside the model's max_position_embeddings.

        Encoder-decoder: the cap does not depend on the batch. Decoder-only: it binds only for prompts within
        max_new_tokens of the context length, the one case where a row's output could depend on its batch.
        """
        limit = self.limits.max_new_tokens
        config = getattr(self.backbone.base_model, "config", None)
        max_pos = getattr(config, "max_position_embeddings", None)
        if isinstance(max_pos, int) and max_pos > 0:
            if self.backbone.arch == "encoder-decoder":
                limit = min(limit, max_pos - 2)  # decoder start + target-language token
            else:
                limit = min(limit, max_pos - max((p.tokens or 0 for p in batch), default=0))
        return max(1, limit)

    def _extra_kwargs(self) -> dict[str, Any]:
        return dict(QUANTIZED_KV_KWARGS) if self.kv_quantization else {}

    def _free_memory(self) -> None:
        if str(self.backbone.device).startswith("cuda"):
            torch.cuda.empty_cache()

    @staticmethod
    def _prompt_row(row: Row) -> Any:
        from .backbone import PromptRow

        return PromptRow(row.text, row.src, row.tgt)


def _fail(batch: list[_Pending], exc: BaseException) -> None:
    for p in batch:
        if not p.future.done():
            p.future.set_exception(exc)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 2)
