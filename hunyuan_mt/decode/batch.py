"""The running batch: rows join between decode steps and leave as soon as they finish (iteration-level batching).

A `RunningBatch` holds the KV cache of every live row in one padded tensor per layer. Rows are aligned on the
right: a row that joins with a shorter history is padded on the left and its padding is masked, and every row
carries its own position ids, so a row computes what it would compute alone. When rows leave, their cache rows are
dropped and columns that are padding for every remaining row are cut.

`add(sequences)` runs one prefill forward over the entering rows only and merges their cache into the batch;
`step()` runs one decode forward over every live row; `pop_finished()` hands back the rows that hit an end token or
their token limit, at once. Their cache rows are cut out lazily ("compaction"): with the next merge, or once a
quarter of the batch is finished. Every compaction changes the row → slot mapping, so each LoRA layer gathers its
per-row weights again (one copy per layer); pairing a leave with the next join halves those copies, and a finished
row that rides along costs less than a gather on this hardware (measured in BENCHMARKS.md). Architecture subclasses (`causal.CausalBatch`, `marian.MarianBatch`) supply the forwards and the
cache surgery; token choice is `picker.TokenPicker`'s. Every forward sets the slot mapping first, so each row runs
with its own adapter (slot 0: the bare backbone).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from ..lora.mapping import SlotMapping
from .guard import LoopGuard
from .picker import RowTokens, TokenPicker


#: Work a forward needs per intra-op thread before a second thread pays for its synchronisation: rows of a decode
#: step, tokens of a prefill (measured on the demo model, 2 cores; BENCHMARKS.md "threads per forward").
DECODE_ROWS_PER_THREAD = 8
PREFILL_TOKENS_PER_THREAD = 32


@dataclass(frozen=True)
class Sequence:
    """A row entering the batch. `input_ids` is the prompt (decoder-only) or the source (encoder-decoder)."""

    tag: Any
    input_ids: tuple[int, ...]
    slot: int
    max_new_tokens: int
    #: Decoder tokens before the first generated one: (decoder_start,) or (decoder_start, target-language token).
    decoder_prefix: tuple[int, ...] = ()
    #: Stop the row when it falls into a repetition loop (the batch's `guard`).
    guarded: bool = False
    #: Keep the log-probability of each token the row takes (`Live.logprobs`): its translation's confidence.
    scored: bool = False


@dataclass
class Live:
    """A row in the batch: what it generated so far."""

    seq: Sequence
    tokens: RowTokens
    generated: list[int] = field(default_factory=list)
    done: bool = False
    #: Handed back by pop_finished; the row only rides along until the next compaction.
    answered: bool = False
    #: Set when the loop guard stopped the row: how many generated tokens make its output.
    cut: int | None = None
    #: For a `scored` row, the model's log-probability of each token it took (its raw distribution's, before
    #: the picking rules), as bergamot-translator's quality estimate reads them.
    logprobs: list[float] = field(default_factory=list)

    @property
    def output(self) -> list[int]:
        return self.generated if self.cut is None else self.generated[:self.cut]

    @property
    def mean_logprob(self) -> float | None:
        """The mean log-probability of the output's tokens (None for a row not scored, or with no output)."""
        taken = self.logprobs if self.cut is None else self.logprobs[:self.cut]
        return sum(taken) / len(taken) if taken else None

    @property
    def position(self) -> int:
        """Position id of the row's last token (prompt or decoder prefix counted, padding not)."""
        return len(self.tokens.seen) - 1


def pad_left(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def pad_right(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t, t.new_zeros(shape)], dim=dim)


def left_padded(rows: list[tuple[int, ...]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids padded on the left to the longest row, and the matching 0/1 mask."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([(pad_id,) * (width - len(r)) + tuple(r) for r in rows], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
    return ids, mask


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Per-row position ids of a left-padded block: 0 at each row's first real token (padding gets 0)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def leading_padding(mask: torch.Tensor) -> int:
    """How many leading columns are padding for every row."""
    used = mask.any(dim=0).nonzero()
    return int(used[0]) if used.numel() else mask.shape[1]


#: What one forward of a prefill yields (`RunningBatch._prefill_pieces`): its rows, and (logits, cache state) once
#: they are complete (None: a piece of a long prompt).
PrefillPiece = tuple[list[Sequence], "tuple[torch.Tensor | None, Any] | None"]


class Prefill:
    """A prefill under way (`RunningBatch.begin`): `advance()` runs its next forward and returns the rows that
    became live with it. `pending` are the tags of rows still to come; `last` the tags the last forward ran for.
    `drop(tags)` takes rows out before they become live (cancelled, or sent back to the queue)."""

    def __init__(self, batch: "RunningBatch", sequences: list[Sequence]) -> None:
        self._batch = batch
        self.pending: list[Any] = [s.tag for s in sequences]
        self.last: list[Any] = []
        self._dropped: set[Any] = set()
        self._pieces = batch._prefill_pieces(list(sequences), self._dropped)

    @property
    def done(self) -> bool:
        return not self.pending

    def advance(self) -> list[Live]:
        """One forward. On an error the prefill is over: rows it made live stay live, `pending` may be retried."""
        if self.done:
            return []
        try:
            piece = next(self._pieces)
        except StopIteration:
            self.pending = []  # every row left was dropped
            return []
        except BaseException:
            self._pieces.close()
            raise
        rows, result = piece
        self.last = [s.tag for s in rows]
        if result is None:
            return []   # a piece of a long prompt: its row needs more
        live = self._batch._enter(rows, *result)
        done = set(self.last)
        self.pending = [t for t in self.pending if t not in done]
        return live

    def drop(self, tags: set[Any]) -> None:
        """Rows that must not become live: the pieces still to run skip them."""
        self._dropped |= tags
        self.pending = [t for t in self.pending if t not in tags]
        if not self.pending:
            self._pieces.close()


def logsumexp_in_place(x: torch.Tensor) -> torch.Tensor:
    """`torch.logsumexp(x, dim=-1)`, to the bit (the same operations in the same order: its row maximum, ±inf
    maxima taken as 0, exp of the difference, sum, log, plus the maximum), computed in `x`, which it overwrites.
    torch's allocates two temporaries the size of `x`, 2 MB each at 64 rows of the demo's 8,012 logits, on fresh
    pages where the engine's other allocations come between. With the `index_select` copy, the 600-sentence
    benchmark's 184 token choices took 0.218-0.227 s against 0.254-0.270 (Intel Xeon, 2026-12-08). Back to back in
    a loop, where the allocator hands the same pages out again, the two take the same time (311-345 µs at 64 rows,
    EPYC Zen 5)."""
    maxes = x.amax(dim=-1, keepdim=True)
    maxes.masked_fill_(maxes.abs() == float("inf"), 0)
    return x.sub_(maxes).exp_().sum(dim=-1).log_().add_(maxes[:, 0])


class RunningBatch(ABC):
    """Shared bookkeeping; subclasses implement `_prefill`, `_merge`, `_decode` and `_select`."""

    def __init__(self, model: Any, mapping: SlotMapping | None, picker: TokenPicker, device: torch.device,
                 pad_id: int) -> None:
        self.model = model
        self.mapping = mapping
        self.picker = picker
        self.device = torch.device(device)
        self.pad_id = pad_id
        self.rows: list[Live] = []
        #: Test seam: called before each forward with ("prefill" | "decode", the rows' tags).
        self.before_forward: Callable[[str, list[Any]], None] | None = None
        #: Stops guarded rows caught in a repetition loop (set by the engine from limits.loop_repeats).
        self.guard: LoopGuard | None = None
        #: torch's intra-op threads for a forward with enough work (the configured count when the batch is made).
        self.threads = torch.get_num_threads()
        #: Finished rows ride along in the steps until this share of the rows has finished, then the cache is
        #: compacted (`pop_finished`): a compaction's cost against the steps' for rows whose output is thrown away.
        self.compact_share = 0.25

    def release_idle(self) -> None:
        """Free what the batch keeps between forwards only to be faster (a lean step's stacked LoRA weights): the
        engine calls it when the batch has drained. Nothing here."""

    def __len__(self) -> int:
        """Rows still generating (finished rows riding along until compaction are not counted)."""
        return sum(1 for r in self.rows if not r.done)

    @property
    def live(self) -> list[Live]:
        return [r for r in self.rows if not r.done]

    @property
    @abstractmethod
    def cache_length(self) -> int:
        """Padded length of the self-attention cache (0 when empty)."""

    @property
    def padded_tokens(self) -> int:
        return len(self.rows) * self.cache_length

    @property
    def slots(self) -> list[int]:
        """Slot of every row of the next forward, in batch order (finished rows riding along included)."""
        return [r.seq.slot for r in self.rows]

    # ------------------------------------------------------------------ the three moves

    def add(self, sequences: list[Sequence]) -> list[Live]:
        """Prefill `sequences` and make them live rows, in one move. Returns the new rows. Each gets its first
        token here, or, when the architecture folds the first decoder token into the next `step` (`_prefill`
        returns no logits), at that step."""
        prefill = self.begin(sequences)
        live: list[Live] = []
        while not prefill.done:
            live += prefill.advance()
        return live

    def begin(self, sequences: list[Sequence]) -> "Prefill":
        """A prefill of `sequences` to run piece by piece (`Prefill.advance`, one forward each), with decode steps
        of the live rows between the pieces: what the engine does, so that a long prompt does not stall every
        running stream for its whole prefill (chunked prefill, as vLLM and Sarathi-Serve schedule it). Rows
        become live as their last piece completes."""
        return Prefill(self, sequences)

    def _prefill_pieces(self, sequences: list[Sequence], dropped: set[Any]) -> Iterator[PrefillPiece]:
        """The forwards of a prefill, one per `next`: each yields the rows it ran and, once they are complete,
        (their logits, their cache state); None for a piece of a long prompt that needs more. Rows whose tag is
        in `dropped` when their turn comes are skipped. Here: every row in one forward; `llama.LlamaBatch` runs
        groups of rows and cuts long prompts into pieces."""
        rows = [s for s in sequences if s.tag not in dropped]
        if rows:
            with self._prefill_forward(rows, sum(len(s.input_ids) for s in rows)):
                logits, state = self._prefill(rows)
            yield rows, (logits, state)

    @contextlib.contextmanager
    def _prefill_forward(self, sequences: list[Sequence], tokens: int) -> Iterator[None]:
        """Around one prefill forward: the test seam, the rows' adapters, the threads for `tokens`."""
        if self.before_forward is not None:
            self.before_forward("prefill", [s.tag for s in sequences])
        self._use_slots([s.slot for s in sequences])
        with self._prefill_threads(tokens):
            yield

    def _enter(self, sequences: list[Sequence], logits: torch.Tensor | None, state: Any) -> list[Live]:
        """Make prefilled rows live: their first token, their cache after the live rows'."""
        live = [Live(s, RowTokens(seen=list(s.decoder_prefix or s.input_ids), generated=0,
                                  max_new=s.max_new_tokens, prefix_len=len(s.decoder_prefix)))
                for s in sequences]
        if logits is not None:
            self._choose(logits, live)
        self.compact()  # the merge copies the cache anyway: drop finished rows in the same pass
        self._merge(state)
        self.rows.extend(live)
        return live

    def step(self) -> None:
        """One token for every live row."""
        if not any(not r.done for r in self.rows):
            return
        if self.before_forward is not None:
            self.before_forward("decode", [r.seq.tag for r in self.rows if not r.done])
        self._use_slots(self.slots)
        # A finished row riding along repeats its last token at its last position: its output is thrown away,
        # and its position never runs past the model's table.
        last = torch.tensor([[r.tokens.seen[-1]] for r in self.rows], dtype=torch.long, device=self.device)
        pos = torch.tensor([[r.position - (1 if r.done else 0)] for r in self.rows], dtype=torch.long,
                           device=self.device)
        with self._decode_threads():
            logits = self._decode(last, pos)
        live = [i for i, r in enumerate(self.rows) if not r.done]
        if len(live) != len(self.rows):
            logits = logits[live]
        self._choose(logits, [self.rows[i] for i in live])

    def pop_finished(self) -> list[Live]:
        """Rows that finished since the last call. Their cache rows go at the next compaction."""
        done = [r for r in self.rows if r.done and not r.answered]
        for row in done:
            row.answered = True
        finished = sum(1 for r in self.rows if r.done)
        if finished and (finished == len(self.rows) or finished >= self.compact_share * len(self.rows)):
            self.compact()
        return done

    def compact(self) -> None:
        """Cut finished rows out of the cache now.

        The kept rows that sit past the new end move into the places of finished rows before it, and every other
        row stays where it is: a compaction copies as many cache rows as finished, not every row kept. Rows do not
        keep their order (nothing depends on it: each row carries its own slot, positions and mask)."""
        done = [i for i, r in enumerate(self.rows) if r.done]
        if not done:
            return
        n = len(self.rows) - len(done)
        movers = [i for i in range(n, len(self.rows)) if not self.rows[i].done]
        holes = iter(movers)
        keep = [i if not self.rows[i].done else next(holes) for i in range(n)]
        self.rows = [self.rows[i] for i in keep]
        self._select(keep)

    def drop(self, tags: set[Any]) -> list[Live]:
        """Take rows out unfinished (preemption after out-of-memory); they can be added again from scratch."""
        keep = [i for i, r in enumerate(self.rows) if r.seq.tag not in tags and not r.done]
        dropped = [r for r in self.rows if r.seq.tag in tags and not r.done]
        if dropped:
            self.rows = [self.rows[i] for i in keep]
            self._select(keep)
        return dropped

    # ------------------------------------------------------------------ shared helpers

    def _decode_threads(self) -> contextlib.AbstractContextManager[None]:
        """The threads of a decode step (see `_threads`)."""
        return self._threads(DECODE_ROWS_PER_THREAD, len(self.rows))

    def _prefill_threads(self, tokens: int) -> contextlib.AbstractContextManager[None]:
        """The threads of a prefill of `tokens` input tokens (see `_threads`)."""
        return self._threads(PREFILL_TOKENS_PER_THREAD, tokens)

    @contextlib.contextmanager
    def _threads(self, per_thread: int, work: int) -> Iterator[None]:
        """Run a forward on as many of `self.threads` as it has work for: one thread for a few rows, where the
        threads' synchronisation costs more than it shares (decode step, demo model, Intel OpenMP: 1.8 ms with
        one thread, 3.4 ms with two for one row; 12.8 vs 8.0 ms for 64 rows)."""
        want = max(1, min(self.threads, work // per_thread))
        if want == torch.get_num_threads():
            yield
            return
        torch.set_num_threads(want)  # about 0.1 µs
        try:
            yield
        finally:
            torch.set_num_threads(self.threads)

    def _use_slots(self, slots: list[int]) -> None:
        if self.mapping is not None:
            self.mapping.set(slots)

    def _choose(self, logits: torch.Tensor, live: list[Live]) -> None:
        forbidden: dict[int, int] = {}
        if self.guard is not None and self.guard.enabled and self.guard.stutter:
            for i, row in enumerate(live):
                if row.seq.guarded:
                    token = self.guard.third_copy(row.generated)
                    if token is not None:
                        forbidden[i] = token
        scored = [i for i, row in enumerate(live) if row.seq.scored]
        # Copied before the picking rules, which may write into the logits (bans, penalties): the model's own
        # distribution. Only the scored rows: a 64-row step of the demo spent 0.24 ms on the whole block. Through
        # index_select: indexing with the Python list took 200 µs for 64 demo rows on 2 threads, index_select 62
        # (the same values). With that and `logsumexp_in_place`, the token choice of the 600-sentence benchmark's
        # 184 steps took 0.218-0.227 s against 0.254-0.270 (Intel Xeon, 2026-12-08).
        raw = (logits.index_select(0, torch.tensor(scored, device=logits.device)).float() if scored else None)
        tokens = self.picker.pick(logits, [r.tokens for r in live], forbidden)
        if raw is not None:
            # Each row's log-softmax of its own logits: a row's value is the same alone or in any batch (tested).
            taken = raw.gather(1, torch.tensor([tokens[i] for i in scored], device=raw.device)[:, None])[:, 0]
            for i, value in zip(scored, (taken - logsumexp_in_place(raw)).tolist()):
                live[i].logprobs.append(value)
        for row, token in zip(live, tokens):
            row.generated.append(token)
            row.tokens.seen.append(token)
            row.tokens.generated += 1
            row.done = self.picker.finished(token, row.tokens)
            if not row.done and row.seq.guarded and self.guard is not None:
                row.cut = self.guard.cut(row.generated)
                row.done = row.cut is not None

    # ------------------------------------------------------------------ per architecture

    @abstractmethod
    def _prefill(self, sequences: list[Sequence]) -> tuple[torch.Tensor | None, Any]:
        """Forward over the entering rows alone: (last-position logits [n, vocab], their cache state). Logits None:
        the rows' last prefix token is still to be fed, by the next `step`, with every other row."""

    @abstractmethod
    def _merge(self, state: Any) -> None:
        """Append the entering rows' cache state (from `_prefill`) after the live rows'."""

    @abstractmethod
    def _decode(self, last: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Forward of every live row's last token [B, 1] at its position [B, 1]: logits [B, vocab]."""

    @abstractmethod
    def _select(self, keep: list[int]) -> None:
        """Keep only the cache rows `keep` (indices into the rows before the change), then trim padding."""
