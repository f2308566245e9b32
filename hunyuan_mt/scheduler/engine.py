"""The engine: iteration-level batching of rows of many pairs, each row with its own adapter.

Callers (any thread) submit rows; their text is tokenized in the caller's thread. One scheduler thread runs the
decode loop over a running batch (`decode.RunningBatch`):

    admit waiting rows → prefill them (one forward over the entering rows) → one decode step for every live
    row → hand back the rows that finished → repeat

A row that arrives while others decode joins at the next step instead of waiting for the whole batch, and a row
that finishes is answered at once (Orca's iteration-level scheduling, as in vLLM). Admission is bounded by:

- `max_rows` live rows and `max_tokens` padded prompt tokens (rows × longest prompt);
- the adapter slots: an entering row takes a lease on its pair (`cache.try_acquire`), which never waits; when
  every slot is leased by running rows, the row waits in the queue for one to finish (at most
  `cache.lease_timeout_s`, then `Busy`);
- rows whose adapter needs no load (pinned, resident, or the bare backbone) are considered first, which keeps the
  hit rate up; a row passed over `fairness_max_skips` times (a younger row entered ahead of it) stops every younger
  row that would hold a slot from entering until it is in (rows of pinned pairs and of the bare backbone hold
  none, so they still enter), so a cold pair cannot starve;
- the rows' owners (`Ticket.owner`, the caller): waiting rows of different owners enter in turn, an owner's
  running rows counting as turns taken (`admission.owner_turns`), and while several owners have interactive rows
  each has its share of the batch (`max_rows // owners`): an owner under its share takes the place of the newest
  row of an owner over it (`_share_batch`). One caller's flood then delays another's row by a round, not by the
  flood.

Leases are per row and end when the row does, so an adapter is never evicted or overwritten while a row uses it.

Out of memory: a prefill that does not fit is split in halves; a decode step that does not fit sends the newest
half of the batch back to the queue (they start again later: greedy output is the same); a single row that does
not fit even alone fails with `OutOfMemory`. Any other error in a forward is isolated the same way, so only the
row that causes it fails. A row longer than the model's input limit fails with `InputTooLarge` at submit.

Beam search, light mode's quantized KV cache and models the decode loop does not cover run whole batches through
transformers' `generate` instead ("static" batches, the same bounds), with the same per-row leases.

Greedy output per row equals that row run alone: each row has its own padding mask, positions and token rules,
and its own token limit.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from ..host import heap
from ..config import EngineConfig, GenerationConfig, LimitsConfig
from ..decode import RunningBatch
from ..decode.batch import Prefill
from ..decode.static import FP8
from ..decode import Sequence as DecodeSequence
from ..decode.guard import LoopGuard, output_cap
from ..errors import Busy, Cancelled, InputTooLarge, InvalidInput, OutOfMemory, TranslationError
from ..runtime.pressure import QUANTIZED_KV_KWARGS, quantized_kv_support
from .admission import Admission
from .rows import BASE_KEY, EngineStats, Pending, Row, StepRecord, future_scores, future_tokens

if TYPE_CHECKING:
    from .ticket import Ticket
    from ..adapters.cache import AdapterCache
    from ..runtime.backbone import Backbone

log = logging.getLogger(__name__)

#: How often an engine whose queued rows all wait for adapter slots held outside its batch looks again (seconds).
SLOT_POLL_S = 0.01


def is_oom(exc: BaseException) -> bool:
    """CUDA OOM, or the CPU allocator's equivalent (which torch raises as a plain RuntimeError)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


class _ForwardFailed(Exception):
    """A forward raised; `cause` is what it raised."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class BatchEngine(Admission):
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
        #: Test seam: called with the rows of every forward (prefill, decode step or static batch), before the
        #: model runs. Raising torch.OutOfMemoryError here behaves exactly like the model running out of memory.
        self.before_generate: Callable[[list[Row]], None] | None = None
        self.stats = EngineStats()
        self.guard = LoopGuard(repeats=limits.loop_repeats, stutter=limits.loop_stutter)
        self.history: deque[StepRecord] = deque(maxlen=4000)
        self._queue: list[Pending] = []
        self._cv = threading.Condition()
        self._seq = itertools.count()
        #: Rows queued so far (under _cv): the loop's slot poll does not sleep past rows queued during its round.
        self._entered = 0
        self._closed = False
        #: Callers between the start and the end of a submit (tokenizing): what an idle loop may wait for.
        self._submitting = 0
        #: When an interactive row last arrived (monotonic; -inf: never): document prefills are kept small only
        #: while interactive traffic is about.
        self._last_interactive = float("-inf")
        #: Set when a ticket of a queued or running row is cancelled: the loop looks for its rows only then
        #: (scanning the queue every round cost 0.14 ms per 1,000 queued rows).
        self._cancel_seen = False
        #: seq → pending row, for the rows in the running batch.
        self._running: dict[int, Pending] = {}
        self._batch: RunningBatch | None = self._new_batch()
        #: Prefills under way, a forward a round (`decode.Prefill`): their rows are in `_running`, not yet live.
        #: At most two: an interactive one may start beside a document's, and runs first (the last one here).
        self._prefills: list[Prefill] = []
        self.iteration_level = self._batch is not None
        #: Light mode's (KV dtype, rows) for a static cache, applied by the loop between two steps once the live
        #: rows fit (None: nothing pending).
        self._kv_switch: tuple[Any, int] | None = None
        steps = getattr(self._batch, "steps", None)
        if steps is not None:
            # Capture the decode-step graphs now, for every bucket up to max_rows, so no request pays a capture.
            with backbone.model_lock, torch.inference_mode():
                captured = steps.warm(list(range(1, self.cfg.max_rows + 1)))
            log.info("engine: decode steps captured as CUDA graphs for batch sizes %s", captured)
        #: A switch of the decode step (the background build's kernels or compiled packages: prebuild.py) to apply
        #: once no row is decoding: (what, the function that applies it, monotonic time asked).
        self._upgrade: tuple[str, Callable[[], Any], float] | None = None
        #: The switches applied so far: (what, wall-clock time, ms the loop spent on it, how long it waited).
        self._upgrades: list[dict[str, Any]] = []
        #: After an out-of-memory prefill of one row: admit nothing until the running batch drains.
        self._drain = False
        #: After an out-of-memory decode step: at most this many live rows until the batch drains.
        self._oom_cap: int | None = None
        self._thread = threading.Thread(target=self._loop, name="hmt-engine", daemon=True)
        self._thread.start()

    def _new_batch(self) -> RunningBatch | None:
        """A running batch from the backbone as it is now (its kernels, its compiled step), set up for this loop."""
        batch = self.backbone.new_batch(self.gen, self._static_cache_spec())
        if batch is not None:
            batch.before_forward = self._seam
            batch.guard = self.guard
            chunk = self.cfg.prefill_chunk
            if chunk != "auto" and hasattr(batch, "prefill_tokens"):
                batch.prefill_tokens = chunk
        return batch

    def request_upgrade(self, what: str, apply: Callable[[], Any]) -> None:
        """Run `apply` (it changes how the backbone decodes: kernels, compiled packages) on the loop's thread at the
        first point where no row is decoding, then decode with a new running batch. A row thus never changes steps
        midway. Rows keep being admitted for UPGRADE_HOLD_S; after that the queue waits for the running rows to
        finish, so that a busy server switches too."""
        with self._cv:
            if self._upgrade is not None:
                # Both are applied: the later one runs after the earlier one.
                first = self._upgrade[1]
                later = apply

                def apply() -> Any:  # noqa: F811 - the two switches chained
                    first()
                    return later()

                what = f"{self._upgrade[0]} and {what}"
            self._upgrade = (what, apply, time.monotonic() if self._upgrade is None else self._upgrade[2])
            self._cv.notify_all()

    @property
    def upgrade_pending(self) -> bool:
        return self._upgrade is not None

    def upgrades(self) -> list[dict[str, Any]]:
        return list(self._upgrades)

    def _apply_upgrade(self) -> None:
        with self._cv:
            pending, self._upgrade = self._upgrade, None
        if pending is None:
            return
        what, apply, asked = pending
        t0 = time.monotonic()
        try:
            apply()
        except Exception:  # noqa: BLE001 - a failed switch leaves the step it had; the loop goes on
            log.exception("engine: switching to %s failed; decoding goes on as before", what)
        with self.backbone.model_lock:
            self._batch = self._new_batch()
        ms = (time.monotonic() - t0) * 1000
        self._upgrades.append({"what": what, "at": round(time.time(), 3), "ms": round(ms, 1),
                               "waited_s": round(t0 - asked, 3)})
        log.info("engine: decoding with %s from now on (switched in %.0f ms, %.2f s after it was ready)", what, ms,
                 t0 - asked)

    def _static_cache_spec(self) -> Any:
        """The static cache to ask the backbone for, or None (engine.kv_cache; "auto": decoder-only on CUDA)."""
        from ..runtime.backbone import StaticCache

        mode = self.cfg.kv_cache
        bb = self.backbone
        if mode == "dynamic" or (mode == "auto" and not (bb.arch == "decoder-only" and bb.device.startswith("cuda"))):
            return None
        spec = StaticCache(rows=self.cfg.max_rows, max_len=self.cfg.max_seq_len, cuda_graphs=self.cfg.cuda_graphs)
        note = bb.static_cache_note(spec)
        if note is not None:
            log.log(logging.WARNING if mode == "static" else logging.INFO,
                    "engine: no static KV cache (%s); the dynamic one serves", note)
            return None
        return spec

    @property
    def static_cache(self) -> bool:
        return hasattr(self._batch, "storage")

    # ------------------------------------------------------------------ public

    def submit(self, rows: Sequence[Row], ticket: "Ticket | None" = None) -> list[Future]:
        """Queue rows; each future resolves to the translation or raises that row's error. The rows are tokenized
        here, in the caller's thread. `ticket` (one for all the rows) can cancel them, marks them background, and
        hears their tokens after each step (see ticket.py)."""
        now = time.monotonic()
        if ticket is not None:
            ticket.watch(self._note_cancel)
        with self._cv:
            # An idle loop holds its first forward while a submit is under way (see _loop).
            self._submitting += 1
        futures: list[Future | None] = [None] * len(rows)
        submitting = True
        try:
            # One caller's rows enter shortest first (their answers keep the caller's order): rows of similar
            # length prefill together with less padding and finish near the same step, so they leave and are
            # replaced in groups. Rows of different callers keep their arrival order. The order is by characters,
            # known before tokenizing, so a large submit is tokenized and queued a batch's worth at a time: the
            # loop starts on the first rows while the caller tokenizes the rest (600 rows took ~0.14 s to
            # tokenize, time a waiting loop did nothing).
            order = sorted(range(len(rows)), key=lambda i: len(rows[i].text))
            chunk = max(1, self.max_rows)
            for start in range(0, len(order), chunk):
                part = order[start:start + chunk]
                prepared = self._prepare([rows[i] for i in part], now, ticket, part)
                for i, (fut, _) in zip(part, prepared):
                    futures[i] = fut
                entering = sorted((p for _, p in prepared if p is not None), key=lambda p: p.tokens)
                last = start + chunk >= len(order)
                with self._cv:
                    if last:
                        # In the same step as the last rows enter: the loop must not wait for this submit then.
                        self._submitting -= 1
                        submitting = False
                    if self._closed:
                        raise RuntimeError("engine is closed")
                    self._entered += len(entering)
                    for pending in entering:
                        pending.seq = next(self._seq)
                        pending.steps_at_submit = self.stats.decode_steps
                        self._queue.append(pending)
                    if any(not p.background for p in entering):
                        self._last_interactive = now
                    self._cv.notify_all()
        finally:
            if submitting:
                with self._cv:
                    self._submitting -= 1
                    self._cv.notify_all()
        return [fut for fut in futures if fut is not None]

    def _prepare(self, rows: Sequence[Row], now: float, ticket: "Ticket | None",
                 indices: Sequence[int]) -> list[tuple[Future, "Pending | None"]]:
        """Tokenize and check each row; a row that cannot run gets its future failed (or answered) here."""
        prepared: list[tuple[Future, Pending | None]] = []
        for row, index in zip(rows, indices):
            fut: Future = Future()
            if not row.text.strip():
                # Nothing to translate (e.g. a pivot's first hop produced nothing); models cannot encode an
                # empty input either.
                fut.set_result([""] if row.n_best > 1 else "")
                prepared.append((fut, None))
                continue
            try:
                encoded = self.backbone.encode(self._prompt_row(row))
                self.backbone.check_length(encoded)
            except TranslationError as exc:
                log.info("engine: refused a %s→%s row: %s", row.src, row.tgt, exc.message)
                fut.set_exception(exc)
                prepared.append((fut, None))
                continue
            except Exception as exc:  # noqa: BLE001 - a tokenizer refusing one text fails only that row
                fut.set_exception(InvalidInput(f"This text cannot be tokenized: {type(exc).__name__}."))
                prepared.append((fut, None))
                continue
            cap = self.limits.max_new_tokens
            if row.max_new_tokens is not None:
                cap = max(1, min(cap, row.max_new_tokens))
            max_new = self.backbone.max_new_tokens(encoded, cap)
            relative = output_cap(encoded.tokens, max_new, self.limits.max_output_ratio,
                                  self.limits.output_slack_tokens)
            capped, max_new = relative < max_new, relative
            width = getattr(self._batch, "max_len", None)
            if width is not None and row.n_best == 1:  # n-best rows run outside the decode loop's cache
                if encoded.tokens >= width:
                    fut.set_exception(InputTooLarge(
                        f"A segment of {encoded.tokens} tokens is longer than the {width} tokens a row of the KV cache "
                        "holds (engine.max_seq_len); split the text into shorter segments."))
                    prepared.append((fut, None))
                    continue
                max_new = min(max_new, width - encoded.tokens)
            guarded = self.guard.enabled and not self.guard.has_loop(list(encoded.input_ids))
            prepared.append((fut, Pending(row, fut, 0, encoded, max_new, now, guarded=guarded, capped=capped,
                                           ticket=ticket, index=index, yields=self.cfg.documents_yield)))
        return prepared

    def run(self, rows: Sequence[Row], timeout: float | None = None, ticket: "Ticket | None" = None) -> list[str]:
        """Translate `rows` (shared batches with concurrent callers). Raises the first failing row's error.
        A row with `n_best` > 1 answers a list of translations, best first, in place of a string. (A scored row's
        mean token log-probability is on its future: `submit`, then `future_scores`.)"""
        futures = self.submit(rows, ticket)
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
        self._thread.join(timeout=10)
        for p in pending + list(self._running.values()):
            self._finish(p, error=RuntimeError("engine closed"))
        self._running.clear()

    def queued(self) -> int:
        with self._cv:
            return len(self._queue)

    def running(self) -> int:
        return len(self._running)

    def set_light_mode(self, on: bool) -> dict[str, Any]:
        """Light mode: a quarter of the rows and tokens per batch, fp8 KV cache where supported. A static cache is
        converted in place by the loop, between two steps (live rows keep going); other decoder-only models run
        whole batches through transformers' generate, which has that cache."""
        with self._cv:
            self.light = on
            if on:
                self.max_rows = max(1, self.cfg.max_rows // 4)  # the static cache shrinks to these rows too
                self.max_tokens = max(16, self.cfg.max_tokens // 4)
                if self.static_cache and FP8 is not None:
                    self.kv_quantization, self.kv_quantization_note = "fp8", "fp8 in the static cache"
                    self._kv_switch = (FP8, self.max_rows)
                else:
                    ok, note = quantized_kv_support(self.backbone.model, self.backbone.arch)
                    self.kv_quantization = "fp8" if ok else None
                    self.kv_quantization_note = note
            else:
                self.max_rows, self.max_tokens = self.cfg.max_rows, self.cfg.max_tokens
                self.kv_quantization, self.kv_quantization_note = None, ""
                if self.static_cache:
                    self._kv_switch = (None, self.cfg.max_rows)
            self._cv.notify_all()
            return {"max_rows": self.max_rows, "max_tokens": self.max_tokens,
                    "kv_cache": self.kv_quantization or "default",
                    **({"kv_cache_note": self.kv_quantization_note} if self.kv_quantization_note else {})}

    def status(self) -> dict[str, Any]:
        s = self.stats
        steps = sorted(s.step_ms.copy())  # deque.copy is atomic; iterating a deque being appended to is not
        queue = sorted(s.queue_ms.copy())
        forwards = s.prefills + s.decode_steps + s.static_batches
        graphs = getattr(self._batch, "steps", None)
        return {
            "mode": "static" if self._static() else "iteration",
            "kv_cache_layout": "static" if self.static_cache else ("dynamic" if self._batch is not None else "none"),
            "kv_cache_bytes": getattr(self._batch, "kv_bytes", None),
            "cuda_graphs": None if graphs is None else {"captured": sorted(graphs.graphs),
                                                         "eager": sorted(graphs.failed)},
            "batches": forwards, "prefills": s.prefills, "decode_steps": s.decode_steps,
            "static_batches": s.static_batches, "rows": s.rows,
            "mean_batch_rows": round(s.decode_rows / s.decode_steps, 2) if s.decode_steps else None,
            "max_rows_seen": s.max_rows_seen, "max_distinct_nonpinned": s.max_distinct_nonpinned,
            "oom_splits": s.oom_splits, "oom_failures": s.oom_failures, "error_splits": s.error_splits,
            "preempted": s.preempted, "loops_cut": s.loops_cut, "length_capped": s.length_capped,
            "cancelled": s.cancelled, "cancelled_running": s.cancelled_running, "yielded": s.yielded,
            "generate_ms_p50": _pct(steps, 0.5), "generate_ms_p95": _pct(steps, 0.95),
            "queue_ms_p50": _pct(queue, 0.5), "queue_ms_p95": _pct(queue, 0.95),
            "queued": self.queued(), "running": self.running(),
            "prefilling": sum(len(prefill.pending) for prefill in list(self._prefills)), "light_mode": self.light,
            "max_rows": self.max_rows, "max_tokens": self.max_tokens,
            "kv_cache": self.kv_quantization or "default", "kv_cache_note": self.kv_quantization_note,
        }

    # ------------------------------------------------------------------ the loop

    def _static(self) -> bool:
        return self._batch is None or (self.kv_quantization is not None and not self.static_cache)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while (not self._queue and not self._running and not self._closed and self._kv_switch is None
                       and self._upgrade is None):
                    self._cv.wait()
                if self._closed:
                    return
                if not self._running and self._queue:
                    # Idle: rows another caller is still tokenizing may share the first prefill, so wait for them,
                    # at most max_wait_ms. With no submit under way nothing is coming: start at once.
                    deadline = self._queue[0].enqueued + self.cfg.max_wait_ms / 1000
                    while self._submitting and len(self._queue) < self.max_rows and not self._closed:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cv.wait(left)
                    if self._closed:
                        return
            entered = self._entered
            try:
                progressed = self._iterate()
            except Exception as exc:  # the loop must survive anything; the rows it held hear about it
                log.exception("engine: the decode loop failed")
                self._fail_everything(exc)
                continue
            if not self._running and not self._queue:
                # A drained batch gives back what it kept only for speed, and the heap what that left behind
                # (heap.py: when it is much); under memory pressure, any.
                if self._batch is not None and not self._prefills:
                    self._batch.release_idle()
                heap.trim_if_grown(0 if self.light else heap.DRAIN_SLACK_BYTES)
            if not progressed:
                # Every queued row waits for a slot that someone outside the running batch holds: poll, do not spin;
                # but not past rows queued since this round looked (their submit's notify came before this wait).
                with self._cv:
                    if self._entered == entered and not self._closed:
                        self._cv.wait(SLOT_POLL_S)

    def _iterate(self) -> bool:
        """One round of the loop. False when nothing could run (rows wait for slots)."""
        self._reap_cancelled()
        if self._upgrade is not None and not self._running and not self._prefills:
            self._apply_upgrade()
        if self._kv_switch is not None:
            dtype, rows = self._kv_switch
            batch: Any = self._batch
            with self.backbone.model_lock:
                before = batch.kv_bytes
                if batch.set_kv(dtype, rows):
                    self._kv_switch = None
                    log.warning("engine: KV cache now %s for %d rows (%.0f → %.0f MB)", "fp8" if dtype is not None
                                else "full precision", rows, before / 1e6, batch.kv_bytes / 1e6)
            self._free_memory()
        if self._prefills and (self._static() or not self._may_admit_beside()):
            # The next piece of the prefill under way, then a step of the live rows (the rows it completed join).
            # (Light mode switched on meanwhile: the prefill completes, then the running batch drains.)
            self._advance()
            self._reap_cancelled()
            if self._batch is not None and len(self._batch):
                self._decode()
            return True
        if self._static() and self._running:
            self._decode()  # light mode was switched on mid-flight: the running batch drains first
            return True
        admitted = self._admit()
        nbest = [p for p in admitted if p.row.n_best > 1]
        if nbest:
            # Beam search with n returned sequences: whole-batch generate, one group per n, between decode steps.
            admitted = [p for p in admitted if p.row.n_best == 1]
            for n in sorted({p.row.n_best for p in nbest}):
                self._run_static([p for p in nbest if p.row.n_best == n])
        if self._static():
            if admitted:
                self._run_static(admitted)
            return bool(admitted) or bool(nbest)
        if admitted:
            self._prefill(admitted)
            self._reap_cancelled()  # a client that left during the prefill does not get its first decode step
        elif self._prefills:
            self._advance()
            self._reap_cancelled()
        if self._batch is not None and len(self._batch):
            # A step ran: True even when it finished the last rows. Read after the step, the emptied batch said
            # "nothing could run", and the loop slept its slot poll (10 ms) with a request that arrived meanwhile
            # queued: a lone stream's first piece came 10 ms late whenever the next request was that quick.
            self._decode()
            return True
        return bool(admitted) or bool(nbest) or bool(self._prefills)


    def _note_cancel(self) -> None:
        with self._cv:
            self._cancel_seen = True
            self._cv.notify_all()

    def _reap_cancelled(self) -> None:
        """Rows whose ticket was cancelled leave the queue and the running batch now, with their leases."""
        if not self._cancel_seen:
            return
        with self._cv:
            self._cancel_seen = False  # a cancel from now on sets it again: the next round looks once more
            gone = [p for p in self._queue if p.cancelled]
            if gone:
                self._queue = [p for p in self._queue if not p.cancelled]
        running = [p for p in self._running.values() if p.cancelled]
        if running:
            self._drop(running)
            for p in running:
                self._running.pop(p.seq, None)
        for p in gone + running:
            assert p.ticket is not None
            self._finish(p, error=Cancelled(f"Cancelled: {p.ticket.reason or 'cancelled'}."))
        if gone or running:
            self.stats.cancelled += len(gone) + len(running)
            self.stats.cancelled_running += len(running)
            log.info("engine: %d rows cancelled (%d of them mid-decode)", len(gone) + len(running), len(running))


    def _requeue(self, rows: list[Pending], preempted: bool) -> None:
        """Send rows back to the front of the queue (their leases are released; they re-enter from scratch)."""
        for p in rows:
            self._running.pop(p.seq, None)
            self._release(p)
        if preempted:
            self.stats.preempted += len(rows)
        with self._cv:
            self._queue = sorted(rows, key=lambda p: p.seq) + self._queue
            self._cv.notify_all()

    # ------------------------------------------------------------------ forwards

    def _seam(self, kind: str, tags: list[Any]) -> None:
        if self.before_generate is not None:
            self.before_generate([self._lookup(t).row for t in tags])

    def _lookup(self, seq: int) -> Pending:
        return self._running[seq]

    def _sequence(self, p: Pending) -> DecodeSequence:
        return DecodeSequence(p.seq, p.encoded.input_ids, p.slot, p.max_new, p.encoded.decoder_prefix, p.guarded,
                              p.row.scored)

    def _forward(self, kind: str, rows: list[Pending] | Callable[[], list[Pending]], fn: Callable[[], Any]) -> Any:
        """Run one forward under the model lock, timed and recorded (`rows`, or what `rows()` says once it ran);
        errors come back as _ForwardFailed."""
        t0 = time.perf_counter()
        try:
            with self.backbone.model_lock, torch.inference_mode():
                result = fn()
        except Exception as exc:  # noqa: BLE001 - sorted out by the caller (OOM split, error isolation)
            raise _ForwardFailed(exc) from exc
        ms = (time.perf_counter() - t0) * 1000
        self._record(kind, rows() if callable(rows) else rows, ms)
        return result

    def _prefill(self, rows: list[Pending]) -> None:
        """Start the rows' prefill and run its first forward; the loop runs the rest a forward a round."""
        assert self._batch is not None
        for p in rows:
            self._running[p.seq] = p
        self._prefills.append(self._batch.begin([self._sequence(p) for p in rows]))
        self._advance()


    def _advance(self) -> None:
        """The next forward of the newest prefill under way (an interactive one beside a document's goes first).
        A failure sends its rows not yet live to `_prefill_failed`."""
        prefill = self._prefills[-1]
        try:
            # Recorded with the rows the forward ran for: one group, or the row of a piece.
            self._forward("prefill", lambda: [self._running[t] for t in prefill.last if t in self._running],
                          prefill.advance)
        except _ForwardFailed as failed:
            self._prefills.remove(prefill)
            rows = [self._running[t] for t in prefill.pending if t in self._running]
            if rows:
                self._prefill_failed(rows, failed.cause)
            return
        if prefill.done:
            self._prefills.remove(prefill)
        self._collect()

    def _drop(self, rows: list[Pending]) -> None:
        """Take rows out of the running batch, or out of a prefill under way before they become live."""
        tags = {p.seq for p in rows}
        if self._batch is not None:
            self._batch.drop(tags)
        for prefill in list(self._prefills):
            prefill.drop(tags)
            if prefill.done:
                self._prefills.remove(prefill)

    def _prefill_failed(self, rows: list[Pending], exc: BaseException) -> None:
        oom = self._after_failure(exc)
        if len(rows) > 1:
            # Split: the halves enter separately (the first now, the second at the next admission).
            self._count_split(oom)
            half = len(rows) // 2
            self._requeue(rows[half:], preempted=False)
            for p in rows[half:]:
                p.skips = self.cfg.fairness_max_skips  # they were admitted already: first in line again
            self._running_drop(rows[:half])
            self._prefill(rows[:half])
            return
        p = rows[0]
        if oom and self._running_others(p):
            # It might fit once the running rows are done: wait for the batch to drain, then try it alone.
            self._drain = True
            self._requeue([p], preempted=True)
            return
        self._fail_alone(p, exc, oom)

    def _after_failure(self, exc: BaseException) -> bool:
        """Whether a forward's error is out of memory (then the device's cached blocks are given back first)."""
        oom = is_oom(exc)
        if oom:
            self._free_memory()
        return oom

    def _count_split(self, oom: bool) -> None:
        if oom:
            self.stats.oom_splits += 1
        else:
            self.stats.error_splits += 1

    def _fail_alone(self, p: Pending, exc: BaseException, oom: bool) -> None:
        """A row that fails on its own: OutOfMemory quoting its size, or the error it raised."""
        self._running.pop(p.seq, None)
        if oom:
            self.stats.oom_failures += 1
            log.warning("engine: one row (%d tokens, %s→%s) does not fit in memory", p.tokens, p.row.src, p.row.tgt)
            exc = OutOfMemory(f"Out of memory translating one segment of {p.tokens} tokens "
                              f"({p.row.src}→{p.row.tgt}), even alone; shorten the text or try again later.")
        else:
            log.error("engine: a %s→%s row failed: %s: %s", p.row.src, p.row.tgt, type(exc).__name__, exc)
        self._finish(p, error=exc)

    def _running_others(self, p: Pending) -> bool:
        return any(seq != p.seq for seq in self._running)

    def _running_drop(self, rows: list[Pending]) -> None:
        for p in rows:
            self._running.pop(p.seq, None)

    def _decode(self) -> None:
        assert self._batch is not None
        live = [self._running[r.seq.tag] for r in self._batch.live]
        try:
            self._forward("decode", live, self._batch.step)
        except _ForwardFailed as failed:
            self._decode_failed(live, failed.cause)
            return
        self._collect()

    def _decode_failed(self, live: list[Pending], exc: BaseException) -> None:
        """Preempt the newest half of the batch (they start again later); a lone row fails."""
        assert self._batch is not None
        oom = self._after_failure(exc)
        if len(live) == 1:
            self._batch.drop({live[0].seq})
            self._fail_alone(live[0], exc, oom)
            return
        self._count_split(oom)
        newest = sorted(live, key=lambda p: p.seq)[len(live) // 2:]
        self._batch.drop({p.seq for p in newest})
        if oom:
            self._oom_cap = len(live) - len(newest)  # what did fit, until the batch drains
        log.info("engine: %s in a decode step of %d rows; %d rows go back to the queue",
                 "out of memory" if oom else type(exc).__name__, len(live), len(newest))
        self._requeue(newest, preempted=True)

    def _collect(self) -> None:
        """Answer the rows that finished; tell the listening tickets what the others generated so far."""
        assert self._batch is not None
        for live in self._batch.pop_finished():
            p = self._running.pop(live.seq.tag, None)
            if p is not None:
                if live.cut is not None:
                    self.stats.loops_cut += 1
                elif p.capped and len(live.generated) >= p.max_new and live.generated[-1] not in \
                        self._batch.picker.eos:
                    self.stats.length_capped += 1
                self._tell(p, live.output, True)
                output = live.output
                self._finish(p, result=self.backbone.decode(output), score=live.mean_logprob,
                             tokens=(list(output), live.logprobs[:len(output)]) if live.logprobs else None)
        if any(p.ticket is not None and p.ticket.on_tokens is not None and not p.ticket.final_only
               for p in self._running.values()):
            for live in self._batch.live:
                p = self._running.get(live.seq.tag)
                # Rows without a ticket (a warm-up, a caller that does not listen) share the step with a stream's.
                if p is not None and p.ticket is not None and not p.ticket.final_only:
                    self._tell(p, live.generated, False)

    @staticmethod
    def _tell(p: Pending, ids: list[int], done: bool) -> None:
        listener = p.ticket.on_tokens if p.ticket is not None else None
        if listener is None:
            return
        try:
            listener(p.index, list(ids), done)
        except Exception:  # noqa: BLE001 - a listener's bug must not stop the loop or the other rows
            log.exception("engine: a token listener failed")

    # ------------------------------------------------------------------ static batches

    def _run_static(self, rows: list[Pending]) -> None:
        """A whole batch through transformers' generate (beam search, light mode's quantized cache, or a model the
        decode loop does not cover). Splits in halves on out-of-memory or an error, like the loop."""
        for p in rows:
            self._running[p.seq] = p
        try:
            self._static_split(rows)
        finally:
            for p in rows:
                if p.seq in self._running:
                    self._running.pop(p.seq)
                    self._finish(p, error=RuntimeError("engine: row was not answered"))

    def _static_split(self, rows: list[Pending]) -> None:
        extra = dict(QUANTIZED_KV_KWARGS) if self.kv_quantization else {}
        prompts, slots = [self._prompt_row(p.row) for p in rows], [p.slot for p in rows]
        n = rows[0].row.n_best
        try:
            self._seam("static", [p.seq for p in rows])
            if n > 1:
                outs = self._forward("static", rows, lambda: self.backbone.nbest(
                    prompts, slots, self.gen, max(p.max_new for p in rows), n))
            else:
                outs = self._forward("static", rows, lambda: self.backbone.generate(
                    prompts, slots, self.gen, self.limits.max_new_tokens, **extra))
        except (_ForwardFailed, Exception) as failed:
            exc = failed.cause if isinstance(failed, _ForwardFailed) else failed
            oom = self._after_failure(exc)
            if len(rows) > 1:
                self._count_split(oom)
                half = len(rows) // 2
                self._static_split(rows[:half])
                self._static_split(rows[half:])
                return
            self._fail_alone(rows[0], exc, oom)
            return
        for p, text in zip(rows, outs):
            self._running.pop(p.seq, None)
            if p.guarded:
                # generate() does not ask the guard per token: cut a loop of words at the end afterwards.
                cut = [self.guard.cut_words(t) for t in text] if isinstance(text, list) else self.guard.cut_words(text)
                self.stats.loops_cut += int(cut != text)
                text = cut
            self._finish(p, result=text)

    # ------------------------------------------------------------------ bookkeeping

    def _finish(self, p: Pending, result: str | None = None, error: BaseException | None = None,
                score: float | None = None, tokens: tuple[list[int], list[float]] | None = None) -> None:
        self._release(p)
        if p.future.done():
            return
        self.stats.rows += 1
        if error is not None:
            p.future.set_exception(error)
        else:
            p.future.score = score  # type: ignore[attr-defined]  # read by `future_scores`, set before it wakes
            p.future.tokens = tokens  # type: ignore[attr-defined]  # read by `future_tokens`
            p.future.set_result(result if result is not None else "")

    @staticmethod
    def _release(p: Pending) -> None:
        lease, p.lease = p.lease, None
        if lease is not None:
            lease.release()

    def _fail_everything(self, exc: BaseException) -> None:
        with self._cv:
            queued, self._queue = self._queue, []
        running = list(self._running.values())
        self._running.clear()
        self._drop(running)
        self._prefills.clear()
        for p in queued + running:
            self._finish(p, error=exc)

    def _record(self, kind: str, rows: list[Pending], ms: float) -> None:
        pinned = set(self.cache.pinned())
        keys = tuple(p.row.key for p in rows)
        distinct = len({k for k in keys if k != BASE_KEY and k not in pinned})
        if kind == "decode" and self._batch is not None:
            padded = self._batch.padded_tokens
        else:
            padded = max((p.tokens for p in rows), default=0) * len(rows)
        self.history.append(StepRecord(kind, len(rows), keys, tuple(p.slot for p in rows), distinct, padded,
                                       ms, tuple(p.seq for p in rows)))
        s = self.stats
        if kind == "prefill":
            s.prefills += 1
        elif kind == "decode":
            s.decode_steps += 1
            s.decode_rows += len(rows)
        else:
            s.static_batches += 1
        s.max_rows_seen = max(s.max_rows_seen, len(rows) if kind != "prefill" else len(self._running))
        s.max_distinct_nonpinned = max(s.max_distinct_nonpinned, distinct)
        s.step_ms.append(ms)

    def _free_memory(self) -> None:
        if str(self.backbone.device).startswith("cuda"):
            torch.cuda.empty_cache()

    @staticmethod
    def _prompt_row(row: Row) -> Any:
        from ..runtime.backbone import PromptRow

        return PromptRow(row.text, row.src, row.tgt, row.context, row.terms, row.markup)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 2)
