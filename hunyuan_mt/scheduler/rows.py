"""What the engine passes around: a row to translate (`Row`), the engine's record of it while it waits and runs
(`Pending`), what its future carries back, and what the engine counts (`StepRecord`, `EngineStats`)."""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from ..lora import BASE_SLOT

if TYPE_CHECKING:
    from ..adapters.cache import Lease
    from ..adapters.request import Pair
    from ..runtime.backbone import Encoded
    from .ticket import Ticket

BASE_KEY = "__base__"


@dataclass(frozen=True)
class Row:
    """One segment to translate with one adapter (None: the bare backbone)."""

    text: str
    src: str
    tgt: str
    adapter: "Pair | None"
    #: A tighter cap on new tokens for this row than limits.max_new_tokens (None: the limit).
    max_new_tokens: int | None = None
    #: More than 1: the row's future resolves to its `n_best` best translations (a list, best first), found by
    #: beam search outside the decode loop (LibreTranslate's `alternatives`).
    n_best: int = 1
    #: Text that shapes the translation and is not translated (the prompt's context; decoder-only backbones).
    context: str | None = None
    #: Glossary terms of the segment for the terminology prompt, (source, target) (glossary.mode: prompt).
    terms: tuple[tuple[str, str], ...] = ()
    #: Which of the text's sentinels are a document's inline markup (inline.py): the backbone shows them to the
    #: model in its own form, and the service reads them back (`Backbone.read_output`).
    markup: tuple[int, ...] = ()
    #: Score the translation as it is decoded: its future then carries `score`, the mean log-probability of its
    #: tokens (`future_scores`). Rows that leave the decode loop (beam search, n_best) get None.
    scored: bool = False

    @property
    def key(self) -> str:
        return BASE_KEY if self.adapter is None else self.adapter.key


@dataclass(eq=False)
class Pending:
    """A row in the engine: queued, then running, with its future, lease and slot."""

    row: Row
    future: Future
    seq: int
    encoded: "Encoded"
    max_new: int
    enqueued: float
    skips: int = 0
    #: When the row first found every slot leased (for the Busy deadline), or None.
    blocked_since: float | None = None
    lease: "Lease | None" = None
    slot: int = BASE_SLOT
    #: The engine's decode-step count when the row was queued (how long it has waited to join, in steps).
    steps_at_submit: int = 0
    #: Whether the loop guard watches this row (not when its source repeats itself).
    guarded: bool = False
    #: Whether max_new comes from the cap relative to the source (limits.max_output_ratio).
    capped: bool = False
    #: The caller's handle (cancel, background priority, token listener), shared by the rows of one submit.
    ticket: "Ticket | None" = None
    #: The row's position in its submit (what the ticket's listener is told).
    index: int = 0

    #: Whether background tickets are honoured (engine.documents_yield).
    yields: bool = True

    @property
    def background(self) -> bool:
        return self.yields and self.ticket is not None and self.ticket.background

    @property
    def owner(self) -> str | None:
        return self.ticket.owner if self.ticket is not None else None

    @property
    def cancelled(self) -> bool:
        return self.ticket is not None and self.ticket.cancelled

    @property
    def tokens(self) -> int:
        return self.encoded.tokens


def future_scores(futures: Sequence[Future]) -> list[float | None]:
    """Each answered row's mean token log-probability (`Row.scored`), or None."""
    return [getattr(f, "score", None) for f in futures]


def future_tokens(futures: Sequence[Future]) -> list[tuple[list[int], list[float]] | None]:
    """Each answered row's output tokens and their log-probabilities (`Row.scored`), or None."""
    return [getattr(f, "tokens", None) for f in futures]


@dataclass(frozen=True)
class StepRecord:
    """One forward of the engine: for tests, metrics and the status page."""

    kind: str  # "prefill" | "decode" | "static"
    rows: int
    pairs: tuple[str, ...]  # per row, the pair key ("en2es") or "__base__"
    slots: tuple[int, ...]  # per row, the slot index it read (0: the bare backbone)
    distinct_nonpinned: int
    padded_tokens: int
    ms: float
    #: Sequence numbers of the rows, in batch order (tests use them to check fairness).
    seqs: tuple[int, ...] = ()


@dataclass
class EngineStats:
    prefills: int = 0
    decode_steps: int = 0
    static_batches: int = 0
    #: Rows answered (translated or failed in a forward).
    rows: int = 0
    decode_rows: int = 0
    oom_splits: int = 0
    oom_failures: int = 0
    #: Forwards split because a non-OOM error hit them (to find the row that causes it).
    error_splits: int = 0
    #: Rows sent back to the queue to make room (out of memory) or to find a failing row.
    preempted: int = 0
    #: Rows stopped in a repetition loop and cut to one copy of it; rows that ran into the cap relative to
    #: their source without ending.
    loops_cut: int = 0
    length_capped: int = 0
    #: Rows taken out because their ticket was cancelled (a client went away, a job was cancelled): queued rows,
    #: and rows that left the running batch mid-decode.
    cancelled: int = 0
    cancelled_running: int = 0
    #: Background (document) rows sent back to the queue to make room for interactive ones.
    yielded: int = 0
    max_rows_seen: int = 0
    max_distinct_nonpinned: int = 0
    step_ms: deque = field(default_factory=lambda: deque(maxlen=2000))
    queue_ms: deque = field(default_factory=lambda: deque(maxlen=2000))
