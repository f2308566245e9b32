"""Decoder-only models over a preallocated KV cache: rows have fixed storage rows, steps can be CUDA graphs.

The dynamic running batch (`causal.CausalBatch`) pads rows to a common length and copies the whole cache when rows
join or leave. Here every live row owns one row of a preallocated cache, `[rows, kv_heads, max_len, head_dim]`
per layer, filled from column 0: a row's token at position p sits in column p, so rows of any length share a step
without padding in front, and joining is a copy of the new row's prompt keys/values into its own storage row.
Each decode step writes every row's new key/value at that row's own column (`RowCache.update`) and attends over
its row with a mask of the columns it has filled.

That makes a decode step shape-stable: on CUDA it is captured once per batch-size bucket as a CUDA graph
(`GraphSteps`) and replayed with the step's token ids, positions, masks and slot indices copied into static input
buffers, so a step costs no Python dispatch over the model's layers. Capture is attempted per bucket; where it
fails (an op that syncs with the host, a model that is not capture-safe) the step runs eagerly, with one log line.
On the CPU steps always run eagerly (tests prove the same code path there).

`kv_dtype=torch.float8_e4m3fn` stores keys/values in fp8 with a scale per row and head, fixed when the row joins
(light mode halves the cache this way, `set_kv_dtype`); reads dequantize to the model's dtype.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .batch import Sequence
from .causal import CausalBatch

log = logging.getLogger(__name__)

FP8 = getattr(torch, "float8_e4m3fn", None)
_FP8_MAX = 448.0
#: Room above the prompt's largest value for the scale of an fp8 row (later tokens may run larger).
_FP8_HEADROOM = 2.0
#: Batch-size buckets captured as CUDA graphs; a step runs in the smallest bucket that holds its rows.
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


class RowLayer(CacheLayerMixin):
    """One layer's keys/values of the live rows: storage views, written at each row's own column."""

    is_sliding = False
    is_compileable = True

    def __init__(self, owner: "RowCache", index: int) -> None:
        super().__init__()
        self.owner = owner
        self.index = index
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        return None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.owner.write(self.index, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.max_len, 0

    def get_seq_length(self) -> int:
        return self.owner.max_len

    def get_max_length(self) -> int:
        return self.owner.max_len


class RowCache(Cache):
    """The transformers `Cache` a decode step runs with: `rows` rows of the storage, each written at `columns`."""

    def __init__(self, storage: "RowStorage", rows: int) -> None:
        self.storage = storage
        self.rows = rows
        self.max_len = storage.max_len
        #: Per row of this step, the column its new token goes to (a tensor, so a graph replays with new values).
        self.columns: torch.Tensor = storage.columns[:rows]
        self.row_index: torch.Tensor = storage.row_index[:rows]
        super().__init__(layers=[RowLayer(self, i) for i in range(storage.layers)])

    def write(self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.storage
        keys, values = s.keys[layer][: self.rows], s.values[layer][: self.rows]
        new_k, new_v = key_states[:, :, -1], value_states[:, :, -1]  # [rows, heads, dim]: one token per row
        if s.fp8:
            k_scale, v_scale = s.k_scale[layer][: self.rows], s.v_scale[layer][: self.rows]
            keys[self.row_index, :, self.columns] = _quantize(new_k, k_scale[:, :, 0, 0])
            values[self.row_index, :, self.columns] = _quantize(new_v, v_scale[:, :, 0, 0])
            return _dequantize(keys, k_scale, s.dtype), _dequantize(values, v_scale, s.dtype)
        keys[self.row_index, :, self.columns] = new_k.to(keys.dtype)
        values[self.row_index, :, self.columns] = new_v.to(values.dtype)
        return keys, values


def _quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale, clamped to fp8's range. `scale` broadcasts over x's last dimension."""
    return (x.float() / scale.unsqueeze(-1)).clamp(-_FP8_MAX, _FP8_MAX).to(FP8)


def _dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale).to(dtype)


class RowStorage:
    """The preallocated cache: per layer keys/values `[capacity, kv_heads, max_len, head_dim]`, the filled-column
    mask `[capacity, max_len]`, and (fp8) a scale per row and head."""

    def __init__(self, model: Any, capacity: int, max_len: int, device: torch.device, dtype: torch.dtype,
                 kv_dtype: torch.dtype | None) -> None:
        cfg = model.config
        self.layers = int(cfg.num_hidden_layers)
        self.heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.capacity, self.max_len, self.device, self.dtype = capacity, max_len, device, dtype
        self.valid = torch.zeros(capacity, max_len, dtype=torch.bool, device=device)
        self.columns = torch.zeros(capacity, dtype=torch.long, device=device)
        self.row_index = torch.arange(capacity, device=device)
        self.fp8 = False
        #: Bumped whenever the storage tensors are replaced (fp8 conversion): graphs read them by address.
        self.generation = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.k_scale: list[torch.Tensor] = []
        self.v_scale: list[torch.Tensor] = []
        self._allocate(kv_dtype)

    def _allocate(self, kv_dtype: torch.dtype | None) -> None:
        self.fp8 = kv_dtype is not None and kv_dtype == FP8
        shape = (self.capacity, self.heads, self.max_len, self.head_dim)
        store = FP8 if self.fp8 else self.dtype
        self.keys = [torch.zeros(shape, dtype=store, device=self.device) for _ in range(self.layers)]
        self.values = [torch.zeros(shape, dtype=store, device=self.device) for _ in range(self.layers)]
        scale_shape = (self.capacity, self.heads, 1, 1)
        self.k_scale = [torch.ones(scale_shape, device=self.device) for _ in range(self.layers)] if self.fp8 else []
        self.v_scale = [torch.ones(scale_shape, device=self.device) for _ in range(self.layers)] if self.fp8 else []

    @property
    def nbytes(self) -> int:
        per = sum(t.numel() * t.element_size() for t in self.keys + self.values)
        return per + sum(t.numel() * t.element_size() for t in self.k_scale + self.v_scale)

    def convert(self, kv_dtype: torch.dtype | None) -> None:
        """Switch the storage to fp8 (or back), keeping every row's contents; one layer at a time, so the peak is
        one layer above the smaller of the two."""
        to_fp8 = kv_dtype is not None and kv_dtype == FP8
        if to_fp8 == self.fp8:
            return
        for i in range(self.layers):
            for store, scales in ((self.keys, self.k_scale), (self.values, self.v_scale)):
                old = store[i]
                if to_fp8:
                    scale = (old.float().abs().amax(dim=(2, 3), keepdim=True) * _FP8_HEADROOM / _FP8_MAX
                             ).clamp(min=torch.finfo(torch.float32).tiny)
                    store[i] = (old.float() / scale).clamp(-_FP8_MAX, _FP8_MAX).to(FP8)
                    scales.append(scale)
                else:
                    store[i] = _dequantize(old, scales[i], self.dtype)
                del old
        if not to_fp8:
            self.k_scale, self.v_scale = [], []
        self.fp8 = to_fp8
        self.generation += 1

    def resize(self, capacity: int) -> None:
        """Keep `capacity` storage rows (rows 0..capacity-1 keep their contents): light mode shrinks the cache
        to the rows it still admits. Every row above must be free."""
        if capacity == self.capacity:
            return
        keep = min(capacity, self.capacity)

        def resized(t: torch.Tensor) -> torch.Tensor:
            out = t.new_zeros((capacity, *t.shape[1:]))
            out[:keep] = t[:keep]
            return out

        for store in (self.keys, self.values, self.k_scale, self.v_scale):
            for i, t in enumerate(store):
                store[i] = resized(t)
                del t
        self.valid = resized(self.valid)
        self.columns = resized(self.columns)
        self.row_index = torch.arange(capacity, device=self.device)
        self.capacity = capacity
        self.generation += 1

    def place(self, row: int, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """A joining row's prompt keys/values `[heads, tokens, dim]` into columns 0..tokens-1 of its storage row."""
        n = keys.shape[1]
        if self.fp8:
            for store, scales, x in ((self.keys, self.k_scale, keys), (self.values, self.v_scale, values)):
                scale = (x.float().abs().amax(dim=(1, 2)) * _FP8_HEADROOM / _FP8_MAX).clamp(
                    min=torch.finfo(torch.float32).tiny)
                scales[layer][row, :, 0, 0] = scale
                store[layer][row, :, :n] = (x.float() / scale[:, None, None]).clamp(-_FP8_MAX, _FP8_MAX).to(FP8)
            return
        self.keys[layer][row, :, :n] = keys.to(self.dtype)
        self.values[layer][row, :, :n] = values.to(self.dtype)

    def move(self, src: int, dst: int) -> None:
        """Storage row `src` into `dst` (compaction)."""
        for store in (self.keys, self.values, self.k_scale, self.v_scale):
            for t in store:
                t[dst] = t[src]
        self.valid[dst] = self.valid[src]
        self.columns[dst] = self.columns[src]

    def clear(self, row: int) -> None:
        self.valid[row] = False
        self.columns[row] = 0


class CudaGraphs:
    """Records a step as a CUDA graph: two warm-up runs on a side stream, then the capture, sharing one memory
    pool across the buckets."""

    def __init__(self) -> None:
        self.pool: Any = None

    def capture(self, step: Any) -> tuple[Any, torch.Tensor]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside the capture, as CUDA graphs require
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = step()
        self.pool = graph.pool()
        return graph.replay, out.logits[:, -1, :]


class EagerReplay:
    """A stand-in for CUDA graphs where there are none (tests on the CPU): a replay runs the recorded step again,
    reading the same static buffers a graph would read, so the buffer plumbing is what gets tested."""

    def capture(self, step: Any) -> tuple[Any, torch.Tensor]:
        out = step().logits[:, -1, :].clone()

        def replay() -> None:
            out.copy_(step().logits[:, -1, :])

        return replay, out


class GraphSteps:
    """CUDA graphs of the decode step, one per batch-size bucket, captured on first use.

    Inputs live in static buffers (token ids, positions = write columns, the attention mask, slot indices); a step
    copies its values in and replays. The slot layers read their row → slot indices from a static buffer too
    (`SlotMapping.set_static`), so a graph serves any mix of adapters. Buckets that fail to capture run eagerly."""

    def __init__(self, batch: "StaticCausalBatch", backend: Any = None) -> None:
        self.batch = batch
        self.backend = backend or CudaGraphs()
        self.graphs: dict[int, tuple[Any, torch.Tensor]] = {}
        self.failed: set[int] = set()
        storage = batch.storage
        cap, dev = storage.capacity, storage.device
        self.ids = torch.full((cap, 1), batch.pad_id, dtype=torch.long, device=dev)
        self.pos = torch.zeros(cap, 1, dtype=torch.long, device=dev)
        self.slots = torch.zeros(cap, dtype=torch.long, device=dev)
        self.mask = torch.zeros(cap, 1, 1, storage.max_len, dtype=torch.bool, device=dev)
        #: Structure the graphs were captured against (the slot layers' buffers, the cache dtype).
        self.signature: tuple | None = None

    def resize(self) -> None:
        """The storage was resized: input buffers follow (graphs are captured again through the signature)."""
        storage = self.batch.storage
        cap, dev = storage.capacity, storage.device
        self.ids = torch.full((cap, 1), self.batch.pad_id, dtype=torch.long, device=dev)
        self.pos = torch.zeros(cap, 1, dtype=torch.long, device=dev)
        self.slots = torch.zeros(cap, dtype=torch.long, device=dev)
        self.mask = torch.zeros(cap, 1, 1, storage.max_len, dtype=torch.bool, device=dev)
        self.graphs.clear()
        self.failed.clear()
        self.signature = None

    def warm(self, sizes: list[int]) -> list[int]:
        """Capture the graphs for these batch sizes now (at start, so no request pays for a capture); rows are
        free storage rows, their writes land in column 0 and are never read. Returns the sizes captured."""
        if self.batch.rows:
            raise RuntimeError("warm the graphs before rows join")
        done = []
        for size in sorted({b for b in (self.bucket(n) for n in sizes) if b is not None}):
            rows = size
            ids = torch.full((rows, 1), self.batch.pad_id, dtype=torch.long, device=self.ids.device)
            pos = torch.zeros(rows, 1, dtype=torch.long, device=self.ids.device)
            self.batch.storage.valid[:rows, 0] = True
            if self.run(rows, ids, pos, [0] * rows) is not None:
                done.append(size)
            self.batch.storage.valid[:rows] = False
        return done

    def bucket(self, rows: int) -> int | None:
        return next((b for b in BUCKETS if b >= rows and b <= self.batch.storage.capacity), None)

    def run(self, rows: int, ids: torch.Tensor, pos: torch.Tensor, slots: list[int]) -> torch.Tensor | None:
        """Logits [rows, vocab] from a replayed graph, or None when this bucket runs eagerly."""
        size = self.bucket(rows)
        if size is None or size in self.failed:
            return None
        signature = self.batch.signature()
        if signature != self.signature:
            self.graphs.clear()
            self.failed.clear()
            self.signature = signature
        storage = self.batch.storage
        self.ids[:rows] = ids
        self.ids[rows:size] = self.batch.pad_id
        self.pos[:rows] = pos
        self.pos[rows:size] = 0
        self.slots[:rows] = torch.tensor(slots, dtype=torch.long, device=self.slots.device)
        self.slots[rows:size] = 0
        self.mask[:size, 0, 0] = storage.valid[:size]
        self.mask[rows:size, 0, 0, 0] = True  # padding rows attend to one column (never to nothing: NaN)
        storage.columns[rows:size] = 0
        entry = self.graphs.get(size)
        if entry is None:
            entry = self._capture(size)
            if entry is None:
                return None
        replay, logits = entry
        replay()
        return logits[:rows]

    def _capture(self, size: int) -> tuple[Any, torch.Tensor] | None:
        batch = self.batch
        mapping = batch.mapping
        try:
            cache = RowCache(batch.storage, size)

            def step() -> Any:
                # The slot layers gather from the static slot buffer, and the mask is derived inside the recorded
                # region: a replay reads both buffers' contents of that moment.
                if mapping is not None:
                    mapping.set_static(self.slots[:size])
                return batch.model(input_ids=self.ids[:size], position_ids=self.pos[:size],
                                   attention_mask=batch.mask_for(self.mask[:size]), **batch.forward_kwargs(cache))

            entry = self.backend.capture(step)
            self.graphs[size] = entry
            log.info("decode step captured as a CUDA graph for %d rows", size)
            return entry
        except Exception as exc:  # noqa: BLE001 - an uncapturable model runs eagerly, it must not fail requests
            self.failed.add(size)
            log.warning("CUDA graph capture failed for %d rows (%s: %s); those steps run eagerly", size,
                        type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
            return None
        finally:
            if mapping is not None:
                mapping.clear()


class StaticCausalBatch(CausalBatch):
    """A running batch of decoder-only rows over `RowStorage` (see the module docstring)."""

    def __init__(self, model: Any, mapping: Any, picker: Any, device: torch.device, pad_id: int, capacity: int,
                 max_len: int, dtype: torch.dtype, kv_dtype: torch.dtype | None = None, graphs: bool = False,
                 graph_backend: Any = None) -> None:
        """`graphs`: record decode steps (CUDA graphs, or `graph_backend`, e.g. EagerReplay in tests)."""
        super().__init__(model, mapping, picker, device, pad_id)
        self.storage = RowStorage(model, capacity, max_len, torch.device(device), dtype, kv_dtype)
        self.max_len = max_len
        attn = getattr(model.config, "_attn_implementation", None) or "eager"
        self._additive_mask = attn == "eager"
        self.steps = GraphSteps(self, graph_backend) if graphs else None
        #: Live storage rows in batch order: row i of `self.rows` lives in storage row i.

    # ------------------------------------------------------------------ plumbing

    @property
    def cache_length(self) -> int:
        return self.max_len

    @property
    def padded_tokens(self) -> int:
        return int(self.storage.valid[: len(self.rows)].sum())

    def signature(self) -> tuple:
        """What captured graphs depend on: the slot layers' buffers and the cache's storage tensors."""
        return (getattr(self.mapping, "structure", 0), self.storage.generation)

    def forward_kwargs(self, cache: RowCache) -> dict[str, Any]:
        kwargs: dict[str, Any] = {self._cache_arg: cache, "use_cache": True}
        if self._keep_logits:
            kwargs["logits_to_keep"] = 1
        return kwargs

    def mask_for(self, valid: torch.Tensor) -> torch.Tensor:
        """The 4D mask transformers returns as is: boolean for SDPA, additive for eager attention."""
        if not self._additive_mask:
            return valid
        zero = torch.zeros((), dtype=self.storage.dtype, device=valid.device)
        low = torch.tensor(torch.finfo(self.storage.dtype).min, dtype=self.storage.dtype, device=valid.device)
        return torch.where(valid, zero, low)

    def set_kv(self, kv_dtype: torch.dtype | None, capacity: int) -> bool:
        """Light mode: store the cache in fp8 (None: the model's dtype) and hold `capacity` rows, keeping every live
        row. False (nothing changed) while more rows than `capacity` are in the batch: call again later."""
        if kv_dtype is not None and FP8 is None:
            raise RuntimeError("this torch build has no float8_e4m3fn dtype")
        self.compact()
        if len(self.rows) > capacity:
            return False
        if capacity < self.storage.capacity:  # shrink first: less to convert, lower peak
            self.storage.resize(capacity)
        self.storage.convert(kv_dtype)
        self.storage.resize(capacity)
        if self.steps is not None:
            self.steps.resize()
        return True

    @property
    def kv_bytes(self) -> int:
        return self.storage.nbytes

    # ------------------------------------------------------------------ RunningBatch moves

    def _prefill(self, sequences: list[Sequence]) -> tuple[torch.Tensor, Any]:
        too_long = [s for s in sequences if len(s.input_ids) + s.max_new_tokens > self.max_len]
        if too_long:
            raise ValueError(f"a row of {len(too_long[0].input_ids)} tokens + {too_long[0].max_new_tokens} new "
                             f"does not fit the static cache's {self.max_len} columns")
        return super()._prefill(sequences)

    def _merge(self, state: Any) -> None:
        cache, mask = state
        start = len(self.rows)
        if start + mask.shape[0] > self.storage.capacity:
            raise RuntimeError(f"static cache holds {self.storage.capacity} rows; {start + mask.shape[0]} asked")
        lengths = mask.sum(dim=1).tolist()
        width = mask.shape[1]
        for j, n in enumerate(lengths):
            row = start + j
            for layer_idx, layer in enumerate(cache.layers):
                # The prefill was left-padded: the row's own tokens are its last n columns.
                self.storage.place(row, layer_idx, layer.keys[j, :, width - n:], layer.values[j, :, width - n:])
            self.storage.valid[row] = False
            self.storage.valid[row, :n] = True
            self.storage.columns[row] = n

    def _decode(self, last: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        rows = len(self.rows)
        storage = self.storage
        columns = pos[:, 0]
        storage.columns[:rows] = columns
        storage.valid[storage.row_index[:rows], columns] = True
        if self.steps is not None:
            logits = self.steps.run(rows, last, pos, self.slots)
            if logits is not None:
                return logits
            self._use_slots(self.slots)  # the graph path left the mapping cleared
        cache = RowCache(storage, rows)
        out = self.model(input_ids=last, position_ids=pos,
                         attention_mask=self.mask_for(storage.valid[:rows, None, None, :]),
                         **self.forward_kwargs(cache))
        return out.logits[:, -1, :]

    def _select(self, keep: list[int]) -> None:
        """Compaction: the kept rows move down to storage rows 0..len(keep)-1, in order."""
        for dst, src in enumerate(keep):
            if dst != src:
                self.storage.move(src, dst)
        for row in range(len(keep), self.storage.capacity):
            self.storage.clear(row)
