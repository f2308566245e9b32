"""`AotFunction`: a pure function of tensors compiled ahead of time by AOTInductor and called from C++.

`torch.compile` (the JIT) runs a compiled graph from Python: every call first checks dynamo's guards on each
input tensor, then inductor's Python wrapper calls each kernel and library GEMM in turn. For the demo model's
decode step of one or two rows that Python costs about as much as the arithmetic (torch.profiler over a captured
step: guard evaluation ~0.24 ms, the wrapper's own time ~0.38 ms of a 1.7 ms step). AOTInductor compiles the same
graph, through the same inductor passes, into a shared library whose wrapper is C++; a call hands it the flat list
of input tensors and nothing runs in Python in between. Measured alternating in one process (BENCHMARKS.md): a
2-row step on captured real inputs 1.79 → 1.23 ms and a 64-row step 6.50 → 6.10 ms, the same logits bit for bit;
a short request through the service 23.4 → 19.8 ms.

What this wrapper adds to `torch.export` + `torch._inductor.aoti_compile_and_package`:

- The function takes nested tuples and lists (the model's weights, the caches, the LoRA terms) with Python
  constants among the tensors (floats, the activation function, LoRA layouts). The first call splits them: every
  tensor becomes an input of the exported graph, everything else is baked in. Later calls only collect the tensors
  in the same order (`_tensors`, a few µs for the decode step's ~170; `pytree.tree_flatten` took ~0.4 ms).
- Dimensions that vary are the ones marked with `mark_dynamic` (rows, cache columns, source length, LoRA columns);
  they are exported as `Dim.DYNAMIC`, so torch refuses the export rather than silently fixing one of them.
- A compiled package is kept on disk, keyed by everything that shapes the code (torch's version, the source of the
  modules the function runs, the structure of its arguments, the static sizes, dtypes and strides, the thread
  count, the CPU's instruction set): the first start compiles (51 s for the demo's decode step on the 2-core box), later
  starts load it in well under a second. Packages live next to inductor's own cache (`TORCHINDUCTOR_CACHE_DIR`).
- The compiled code checks each call's inputs (dtype, static sizes and strides) in C++
  (`AOTI_RUNTIME_CHECK_INPUTS`), and this wrapper that every tensor with a dynamic dimension is contiguous (the
  strides the code computes from its sizes), so a call that does not fit the package raises `AotMismatch` instead
  of computing garbage; the caller falls back to eager.

A package is compiled under an owned lock of its own (`locks.py`): two processes that need the same package (Ray
replicas starting together, a server and its background build) compile it once, and a compile killed midway frees
the lock for the next. `AotFunction.build = False` makes a missing package an error (`AotNotBuilt`) instead of a
compile: a serving process whose packages are built by another (`prebuild.py`) must never compile in its decode
thread.

The package's generated code runs on a fixed number of threads (inductor writes it into each parallel loop), hence
the thread count in the key: callers keep compiled forwards on one thread count (`decode/compiled.py`).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import os
import time
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.utils._pytree as pytree

from ..kernels import cache_folder

log = logging.getLogger(__name__)

# Read once per process by the compiled code, at its first call: set before any package runs.
os.environ.setdefault("AOTI_RUNTIME_CHECK_INPUTS", "1")

#: Set on a tensor by `mark_dynamic`: the dimensions of it that vary between calls.
_DYNAMIC = "_hmt_dynamic"

#: Tuples `AotFunction` remembers the tensors of before it starts over (a decode step passes ~20 LoRA terms, new
#: ones when the rows' adapters change).
_MEMO = 512

#: Packages kept per function on disk (the most recently used): a code change or a new model shape makes new ones.
_KEEP = 12


class AotMismatch(RuntimeError):
    """A call's inputs do not fit the compiled package (the C++ input check refused them)."""


class AotNotBuilt(RuntimeError):
    """The package a call needs is not on disk, and this function may not compile it (`AotFunction.build`)."""


#: Called as listener(label, "compiling" | "compiled" | "loaded", seconds) around each package a process compiles
#: or loads (the background build reports its progress through it).
LISTENERS: list[Callable[[str, str, float], None]] = []

#: Seconds a compile waits for another process compiling the same package before it gives up.
COMPILE_WAIT_S = 1800.0


def _tell(label: str, event: str, seconds: float) -> None:
    for listener in list(LISTENERS):
        listener(label, event, seconds)


def mark_dynamic(t: torch.Tensor | None, *dims: int) -> None:
    """Mark `dims` of `t` as varying between calls (kept on the tensor; marking again replaces the set)."""
    if t is not None:
        setattr(t, _DYNAMIC, tuple(dims))


def is_marked(t: torch.Tensor) -> bool:
    return hasattr(t, _DYNAMIC)


def _tensors(obj: Any, out: list[torch.Tensor], memo: dict[int, tuple[Any, list[torch.Tensor]]]) -> bool:
    """Append the tensors of nested tuples/lists to `out`, depth first, in pytree's order (its leaves, less the
    non-tensors). Returns whether `obj` holds no list, at any depth.

    A tuple of tuples and tensors cannot change what it holds, so its tensors are remembered by identity in `memo`
    (the LoRA terms are the same tuples step after step, and so is the tuple of all of them while the rows and
    slots stay: `MarianBatch._lora_terms`; with that, the Python around a one-row step's package went from ~195 to
    ~165 µs, BENCHMARKS.md).
    A tuple with a list inside is walked every time: the list may have changed (a cache's per-layer tensors are
    replaced when it grows)."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
        return True
    if isinstance(obj, list):
        for x in obj:
            _tensors(x, out, memo)
        return False
    if not isinstance(obj, tuple):
        return True
    found = memo.get(id(obj))
    if found is not None and found[0] is obj:
        out.extend(found[1])
        return True
    mine: list[torch.Tensor] = []
    fixed = True
    for x in obj:
        fixed = _tensors(x, mine, memo) and fixed
    if fixed and mine:
        # An entry keeps its tensors alive until the memo is cleared (past _MEMO entries): the tuples passed are
        # kept by their makers anyway (the weights, the LoRA terms); per-step containers are lists.
        memo[id(obj)] = (obj, mine)
    out.extend(mine)
    return fixed


def _describe(leaf: Any) -> str:
    """A non-tensor argument as it enters the package key."""
    if isinstance(leaf, (types.FunctionType, types.BuiltinFunctionType)):
        return f"{leaf.__module__}.{leaf.__qualname__}"
    return repr(leaf)


def _tensor_key(t: torch.Tensor) -> tuple[Any, ...]:
    dims = getattr(t, _DYNAMIC, ())
    sizes = tuple(-1 if d in dims else s for d, s in enumerate(t.shape))
    # A row-major stride follows the sizes of the dimensions after it.
    strides = tuple(-1 if any(d > i for d in dims) else s for i, s in enumerate(t.stride()))
    return str(t.dtype), t.device.type, sizes, strides, dims


class _Flat(torch.nn.Module):
    """`fn` over the flat list of its input tensors, the rest of its arguments baked in (what is exported): the
    constants, and the frozen tensors as the module's buffers (`frozen`: leaf position → tensor)."""

    def __init__(self, fn: Callable[..., Any], spec: Any, constants: list[Any], is_tensor: list[bool],
                 frozen: dict[int, torch.Tensor]) -> None:
        super().__init__()
        self.fn, self.spec, self.constants, self.is_tensor = fn, spec, constants, is_tensor
        #: leaf position → buffer name; a tensor that appears twice (tied embeddings) is one buffer.
        self.frozen: dict[int, str] = {}
        names: dict[int, str] = {}
        for i, t in frozen.items():
            if id(t) not in names:
                names[id(t)] = f"frozen_{len(names)}"
                self.register_buffer(names[id(t)], t.detach())
            self.frozen[i] = names[id(t)]

    def forward(self, tensors: list[torch.Tensor]) -> Any:
        it = iter(tensors)
        leaves = [getattr(self, self.frozen[i]) if i in self.frozen else next(it) if t else c
                  for i, (t, c) in enumerate(zip(self.is_tensor, self.constants))]
        return self.fn(*pytree.tree_unflatten(leaves, self.spec))


def _fingerprint(tensors: Iterable[torch.Tensor]) -> str:
    """A digest of the tensors' values (frozen weights are part of a package)."""
    digest = hashlib.blake2b(digest_size=16)
    for t in tensors:
        digest.update(repr((str(t.dtype), tuple(t.shape))).encode())
        digest.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


@dataclass
class _Package:
    key: str
    path: Path
    loader: Any
    seconds: float         # to compile or load
    compiled: bool         # False: read from the disk cache
    dynamic: list[int]     # positions of the tensors with dimensions marked dynamic

    def run(self, flat: list[torch.Tensor]) -> torch.Tensor:
        # torch's loader keeps the GIL while the package computes. On a small CPU that is what we want: the step's
        # OpenMP threads take every core, and a Python thread let in beside them (calling the library through its C
        # interface with ctypes, which releases the GIL, was tried) preempts one and stalls the others at their
        # barriers: a 2-row package call ran 9x slower beside a spinning thread, and a short request 1.5 ms slower
        # (BENCHMARKS.md).
        try:
            return self.loader.boxed_run(flat)[0]
        except RuntimeError as exc:
            # The generated input check's message: "input_handles[i]: unmatched dim value at 0, ...".
            if "input_handles[" in str(exc):
                raise AotMismatch(str(exc).strip().splitlines()[0]) from exc
            raise


def cache_dir() -> Path:
    """Where packages are kept: `HMT_AOT_CACHE`, else beside inductor's cache."""
    return cache_folder("HMT_AOT_CACHE", "hunyuan-mt-aot")


def _prune(folder: Path, name: str) -> None:
    """Remove all but the _KEEP most recently used packages of the function `name` (housekeeping: a folder this
    process may not write, or a file another process removes first, is left as it is)."""
    try:
        packages = sorted(folder.glob(f"{name}-*.pt2"), key=lambda p: p.stat().st_mtime, reverse=True)
        for stale in packages[_KEEP:]:
            stale.unlink(missing_ok=True)
            stale.with_suffix(".lock").unlink(missing_ok=True)
    except OSError as exc:
        log.debug("not pruning %s: %s", folder, exc)


class AotFunction:
    """`fn` (a pure function of nested tuples/lists of tensors and constants, returning one tensor) compiled ahead
    of time on its first call's arguments. `sources`: the modules whose code it runs (part of the package key)."""

    def __init__(self, fn: Callable[..., Any], sources: Iterable[types.ModuleType] = (), freeze: bool = False,
                 label: str | None = None) -> None:
        self.fn = fn
        #: The package's name in logs and progress ("encode_cross (one row)"): functions compiled more than once,
        #: for calls of different structure, get a label each.
        self.label = label or fn.__name__
        #: False: a missing package raises `AotNotBuilt` instead of being compiled here.
        self.build = True
        #: The `static` arguments' tensors are compiled into the package as constants (inductor's freezing) instead
        #: of being inputs: for float32 CPU linears it then packs their weights for oneDNN (see `_compile`). Their
        #: values key the package; they are read again when a static argument is a new object, so weights changed
        #: in place under the same argument tuple would go unnoticed (the service never changes its base weights).
        self.freeze = freeze
        digest = hashlib.sha256()
        for module in (inspect.getmodule(fn), *sources):
            if module is not None:
                digest.update(inspect.getsource(module).encode())
        self._source = digest.hexdigest()
        #: Loaded packages by the number of tensors a call passes and the frozen weights' fingerprint (one per
        #: argument structure and model; in practice one).
        self._packages: dict[tuple[int, str], _Package] = {}
        #: position → (object, its tensors) for arguments that stay the same object call after call (the weights).
        self._static: dict[int, tuple[Any, list[torch.Tensor]]] = {}
        #: The frozen tensors' fingerprint, and what identified them when it was taken (`_refingerprint`).
        self._frozen: tuple[Any, str] = ((), "")
        #: Tuples seen lately → their tensors (`_tensors`); cleared when it grows past _MEMO entries.
        self._memo: dict[int, tuple[Any, list[torch.Tensor]]] = {}

    @property
    def packages(self) -> list[_Package]:
        return list(self._packages.values())

    def __call__(self, args: tuple[Any, ...], static: tuple[int, ...] = ()) -> torch.Tensor:
        """`fn(*args)`. `static`: positions of arguments that are the same object at every call (their tensors
        are collected once)."""
        flat: list[torch.Tensor] = []
        memo = self._memo
        if len(memo) > _MEMO:
            memo.clear()
        changed = False
        for i, arg in enumerate(args):
            if i in static:
                found = self._static.get(i)
                if found is None or found[0] is not arg:
                    found = self._static[i] = (arg, [])
                    _tensors(arg, found[1], {})
                    changed = True
                if not self.freeze:
                    flat.extend(found[1])
            else:
                _tensors(arg, flat, memo)
        if changed and self.freeze:
            self._refingerprint(static)
        package = self._packages.get((len(flat), self._frozen[1]))
        if package is None:
            package = self._packages[(len(flat), self._frozen[1])] = self._load(args, static)
        for i in package.dynamic:
            # The compiled code reads a dynamic tensor's strides as those of a contiguous one (the C++ check skips
            # strides that follow dynamic sizes): a view would be read wrong, silently.
            if not flat[i].is_contiguous():
                raise AotMismatch(f"input {i} {tuple(flat[i].shape)} is not contiguous")
        return package.run(flat)

    def _refingerprint(self, static: tuple[int, ...]) -> None:
        """Fingerprint the frozen tensors again if they are not the ones (same storage, same version) it was taken
        of: a rebuilt argument tuple over the same weights keeps its package."""
        tensors = [t for i in sorted(static) for t in self._static[i][1]]
        ident = tuple((id(t), t.data_ptr(), -1 if t.is_inference() else t._version) for t in tensors)
        if ident != self._frozen[0]:
            self._frozen = (ident, _fingerprint(tensors))

    def _load(self, args: tuple[Any, ...], static: tuple[int, ...]) -> _Package:
        leaves, spec = pytree.tree_flatten(args)
        is_tensor = [isinstance(x, torch.Tensor) for x in leaves]
        frozen: dict[int, torch.Tensor] = {}
        if self.freeze:
            start = 0
            for i, arg in enumerate(args):
                count = len(pytree.tree_leaves(arg))
                if i in static:
                    frozen.update((j, leaves[j]) for j in range(start, start + count) if is_tensor[j])
                start += count
        tensors = [x for j, x in enumerate(leaves) if is_tensor[j] and j not in frozen]
        constants = [None if t else x for x, t in zip(leaves, is_tensor)]
        key = hashlib.sha256(repr((
            torch.__version__, self._source, self.fn.__qualname__, str(spec),
            [_describe(c) for c, t in zip(constants, is_tensor) if not t],
            [_tensor_key(t) for t in tensors], sorted(frozen), self._frozen[1],
            torch.get_num_threads(), torch.backends.cpu.get_cpu_capability(),
        )).encode()).hexdigest()[:24]
        path = cache_dir() / f"{self.fn.__name__}-{key}.pt2"
        t0 = time.perf_counter()
        compiled = not path.exists()
        if compiled and not self.build:
            raise AotNotBuilt(f"{self.label}: no compiled package {path.name} on disk")
        if compiled:
            from ..host.locks import owned_lock

            with owned_lock(path.with_suffix(".lock"), f"compiling {self.label}", COMPILE_WAIT_S, log):
                # Whoever held the lock before may have written it meanwhile.
                compiled = not path.exists()
                if compiled:
                    _tell(self.label, "compiling", 0.0)
                    self._compile(_Flat(self.fn, spec, constants, is_tensor, frozen), tensors, path)
                    _prune(path.parent, self.fn.__name__)
        if not compiled:
            with contextlib.suppress(OSError):  # a read-only cache still serves its packages
                os.utime(path)  # used now: pruning keeps the packages in use
        with warnings.catch_warnings():
            # torch's own pytree use inside the loader (a FutureWarning about LeafSpec): not ours to act on.
            warnings.simplefilter("ignore", FutureWarning)
            loader = torch._inductor.aoti_load_package(str(path)).loader
        package = _Package(key, path, loader, time.perf_counter() - t0, compiled,
                           [i for i, t in enumerate(tensors) if getattr(t, _DYNAMIC, ())])
        log.info("%s: %s in %.1f s (%s)", self.label, "compiled ahead of time" if compiled else "loaded",
                 package.seconds, path)
        _tell(self.label, "compiled" if compiled else "loaded", package.seconds)
        return package

    def _compile(self, module: _Flat, tensors: list[torch.Tensor], path: Path) -> None:
        dynamic = [{d: torch.export.Dim.DYNAMIC for d in getattr(t, _DYNAMIC, ())} or None for t in tensors]
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.stem}.{os.getpid()}.partial.pt2")
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            program = torch.export.export(module, (tensors,), dynamic_shapes=(dynamic,), strict=False)
            # Freezing (it applies with gradients off, as here) folds the module's buffers into the code as
            # constants; a float32 linear over a constant weight then runs oneDNN's `_linear_pointwise` on a copy
            # packed at compile time, the layout the eager step packs its weights into (decode/dense.py).
            configs = {"freezing": True} if module.frozen else {}
            torch._inductor.aoti_compile_and_package(program, package_path=str(partial), inductor_configs=configs)
        os.replace(partial, path)  # another process compiling the same key finds a whole file or none
