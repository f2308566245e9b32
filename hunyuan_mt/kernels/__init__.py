"""CPU kernels of our own, built from C++ source on first use: `decode_attention`; `fbgemm_linear`, the int8 GEMM
of `quant.fbgemm` called without Python in between (fbgemm_linear.cpp says why); `move_rows`, a running batch's
cache compaction in one call (move_rows.cpp); `qgemm`, the 8-bit and 4-bit weight GEMM of a large decoder-only
model's steps (qgemm.cpp, `quant.packed`).

A Marian decode step's attention (one new query per row, over the keys and values the rows have cached) is a pass
over memory, and memory is what a CPU has least of: on the 2-core box ~9 GB/s, and the key/value slices a 64-row
step of the demo model reads at 31 columns are 36 MB (4.3 ms just to sum them). Written with tensor operations
(compiled, `kvcache._attend`), the step reads the whole rectangle of the batch's cache, rows × the longest history,
but rows that joined later see fewer columns and rows with shorter sources mask the rest: over the 600-sentence peer
benchmark 55 % of the self-attention columns read and 35 % of the cross-attention ones were masked.
`decode_attention.cpp` reads each row's own columns only (and prefetches them), from a float32 or a float16 cache
(`model.kv_cache`); a row's result stays its own to the bit (tests/test_kernels.py). A 64-row compiled step took
0.82–0.90× the time of the step before it, which attended with tensor operations over a float32 cache (`python -m
bench.attention`, BENCHMARKS.md).

The kernels are compiled with torch's extension builder (g++ and ninja, both already needed: inductor compiles
the decode step with g++; ninja comes with requirements.txt), once per machine and source (one translation unit:
~11 s on 2 cores of an AVX-512 Xeon), then loaded from disk. Where they cannot be built (no compiler), or with
`HMT_CPU_KERNELS=0`, `decode_attention()` returns None and the step attends with tensor operations, and
`fbgemm_linear()` returns None and the int8 layers call fbgemm through Python: the same arithmetic, slower.

A server that must build them does so in the background while it serves (`prebuild.py`): it calls `defer()` first,
so that asking for a kernel answers None at once instead of starting a build, and `activate()` once the build is
on disk, at a point where no row is decoding (the engine's upgrade). The build itself holds an owned lock
(`locks.py`): a build killed midway leaves nothing that makes the next one wait.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from ..host.paths import cache_home

log = logging.getLogger(__name__)

_SOURCES = tuple(Path(__file__).with_name(name)
                 for name in ("decode_attention.cpp", "fbgemm_linear.cpp", "move_rows.cpp", "qgemm.cpp"))
_LOCK = threading.Lock()
#: Whether the library is loaded; None until the first call decides it (once per process).
_LOADED: bool | None = None
#: Set by `defer`: until `activate`, the library counts as absent and nothing builds it in this process.
_DEFERRED = False
#: Seconds a build waits for another process building the same kernels before it gives up (and the kernels are
#: then absent in this process: the slower tensor operations serve).
BUILD_WAIT_S = 900.0
#: Written into the build folder once the library has been built and loaded there (`built`).
_MARKER = "built.ok"


def _library() -> bool:
    """Build or load the library once: whether its ops are there. False, without building, while deferred."""
    global _LOADED
    if _LOADED is None:
        if _DEFERRED:
            return False
        with _LOCK:
            if _LOADED is None:
                _LOADED = _load()
    return _LOADED


def defer() -> None:
    """Until `activate`, the kernels count as absent: callers take their fallbacks, and nothing waits for a build
    (another process builds them: `prebuild.py`)."""
    global _DEFERRED
    with _LOCK:
        if _LOADED is None:
            _DEFERRED = True


def activate() -> bool:
    """End `defer`: load the library now (built already, this is fast) and say whether its ops are there."""
    global _DEFERRED
    with _LOCK:
        _DEFERRED = False
    return _library()


def state() -> str:
    """"loaded", "unavailable" (off, or the build failed), "deferred" (another process builds them) or
    "unknown" (not asked for yet)."""
    if _LOADED is not None:
        return "loaded" if _LOADED else "unavailable"
    return "deferred" if _DEFERRED else "unknown"


def built() -> bool:
    """Whether the library for these sources, flags and torch is on disk already (loading it then takes about a
    second, not a build)."""
    return (_build_folder() / _MARKER).is_file()


def decode_attention() -> Any:
    """`torch.ops.hmt_cpu.decode_attention(q, k, v, bias, scale)`, built or loaded on the first call, or None where
    it cannot be (the reason is logged once). q [rows, heads, 1, head_dim]; k, v [≥ rows, kv heads, ≥ width,
    head_dim] (a cache with spare room; kv heads divide heads: grouped-query attention); bias [rows, 1, 1, width],
    additive; returns [rows, heads, head_dim]."""
    return torch.ops.hmt_cpu.decode_attention if _library() else None


def fbgemm_linear() -> Any:
    """`torch.ops.hmt_cpu.fbgemm_linear(x, handle)`, what `quant.fbgemm`'s Python op computes, from C++, or None
    where the library cannot be built. Its packed weights are registered with `torch.ops.hmt_cpu.fbgemm_register
    (handle, packed)` and dropped with `torch.ops.hmt_cpu.fbgemm_forget(key)` (`quant.fbgemm` does both)."""
    return torch.ops.hmt_cpu.fbgemm_linear if _library() else None


def move_rows() -> Any:
    """`torch.ops.hmt_cpu.move_rows(tensors, dst, src, used)`: rows `src` of every tensor [rows, heads, columns,
    dim] (the first `used` columns) copied onto rows `dst`, in one call (move_rows.cpp), or None where the library
    cannot be built."""
    return torch.ops.hmt_cpu.move_rows if _library() else None


def qgemm() -> Any:
    """`torch.ops.hmt_cpu.qgemm(x, packed, scales, bias, n, bits, group)`: x [M, K] float32 times 8-bit or 4-bit
    weights packed by `quant.packed` (qgemm.cpp), or None where the library cannot be built."""
    return torch.ops.hmt_cpu.qgemm if _library() else None


def usable(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the kernel takes a model's queries: float32 on the CPU, head_dim a multiple of 8 up to 128 (what the
    kernel holds in registers on every CPU at::vec builds for: 32 vectors of 8 lanes with AVX2, of 4 on ARM)."""
    return device.type == "cpu" and dtype == torch.float32 and head_dim % 8 == 0 and head_dim <= 128


def compile_cache() -> Path:
    """Inductor's cache folder: TORCHINDUCTOR_CACHE_DIR, else ~/.cache/hunyuan-mt/torchinductor (under
    XDG_CACHE_HOME where set), which is then set for inductor too. Inductor's own default is under /tmp: a server
    started without ./start.sh (`python app.py`, the CLI, serve-ray's replicas) compiled its step anew, ~135 s on 2
    cores, after every reboot. Every entry point reaches this before its first compile (`cache_folder`)."""
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not folder:
        folder = os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_home() / "torchinductor")
    return Path(folder)


def cache_folder(variable: str, name: str) -> Path:
    """Where compiled code of ours is kept (these kernels, the compiled step's packages): the folder the environment
    variable `variable` names, else `name` beside inductor's own cache (`compile_cache`)."""
    explicit = os.environ.get(variable)
    if explicit:
        return Path(explicit)
    return compile_cache() / name


def _flags() -> list[str]:
    # -fopenmp: at::parallel_for is inline in ATen's headers, an OpenMP pragma; without the flag the kernel ran on
    # one thread while the other waited (perf: all of its samples on the main thread). Built for AVX2 where the
    # CPU has it (at::vec then uses 8-lane registers and Sleef's vector exp); elsewhere the generic at::vec code.
    flags = ["-O3", "-fopenmp"]
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        flags += ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]
    return flags


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """torch's builder runs `ninja` from PATH: the one requirements.txt installs sits beside this interpreter, which
    is not on PATH when .venv/bin/python is run without activating the environment. PATH is put back after."""
    here, before = str(Path(sys.executable).parent), os.environ.get("PATH")
    if here in (before or "").split(os.pathsep):
        yield
        return
    os.environ["PATH"] = here + (os.pathsep + before if before else "")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before


def _toolchain() -> list[str]:
    """What else goes into the compiler's command line: the compiler and the header folders of this torch and this
    Python. Two checkouts with a .venv each share the cache folder but not these paths; with one folder for both,
    torch's builder (ninja) saw a changed command and rebuilt the library each time the other checkout had built it
    (a minute on 2 cores, inside whichever server or test loaded the kernels first)."""
    from torch.utils import cpp_extension

    return [os.environ.get("CXX", "c++"), *cpp_extension.include_paths("cpu"),
            sysconfig.get_path("include", scheme="posix_prefix") or ""]


def _build_folder() -> Path:
    """Where the library for these sources, flags, toolchain and torch is built (its name carries their digest)."""
    digest = hashlib.sha256(repr(([src.read_bytes() for src in _SOURCES], _flags(), _toolchain(),
                                  torch.__version__)).encode()).hexdigest()[:12]
    return cache_folder("HMT_KERNEL_CACHE", "hunyuan-mt-kernels") / f"hmt_cpu_kernels_{digest}"


def build_extension(name: str, sources: list[Path], folder: Path, cflags: list[str], ldflags: list[str]) -> None:
    """torch's extension builder on `sources` into `folder`, loaded into this process, under an owned lock
    (`locks.py`) so that a build killed midway never leaves a later one waiting: under it, no other process of ours
    builds here, so torch's own `lock` file, if there is one, is a dead build's and is removed first."""
    from torch.utils import cpp_extension

    from ..host.locks import owned_lock

    folder.mkdir(parents=True, exist_ok=True)
    with owned_lock(folder / "build.lock", f"building {name}", BUILD_WAIT_S, log):
        stale = folder / "lock"
        if stale.exists():
            log.warning("%s: removing the lock file of a build that did not finish (%s)", name, stale)
            stale.unlink(missing_ok=True)
        # Built from copies inside the folder: torch's builder also keys its rebuild checks on where the sources
        # are, so two checkouts of the same sources (a second clone, a worktree) rebuilt each other's library in
        # turn, a minute each on 2 cores.
        copies = folder / "sources"
        copies.mkdir(exist_ok=True)
        for src in sources:
            _write_if_changed(copies / src.name, src.read_bytes())
        # One translation unit that includes every source: with ATen.h each file spent ~8 of its ~9 s of g++ on
        # torch's headers, and four units took ~35 s of CPU where this one takes ~9 (AVX-512 Xeon; the build runs
        # beside a serving process, or while a test run's workers start). The sources' anonymous namespaces become
        # one here: a name defined in two of them fails the build (none is).
        unit = copies / f"{name}_all.cpp"
        _write_if_changed(unit, "".join(f'#include "{src.name}"\n' for src in sources).encode())
        with _ninja_on_path():
            cpp_extension.load(name=name, sources=[str(unit)], extra_cflags=cflags, extra_ldflags=ldflags,
                               build_directory=str(folder), is_python_module=False, verbose=False)
        (folder / _MARKER).write_text(name, encoding="utf-8")


def _write_if_changed(path: Path, data: bytes) -> None:
    """Write `data` unless the file holds it already: torch's builder rebuilds when a source's mtime moves."""
    if not path.is_file() or path.read_bytes() != data:
        path.write_bytes(data)


def _load() -> bool:
    if os.environ.get("HMT_CPU_KERNELS", "1").strip().lower() in ("0", "false", "off", "no"):
        log.info("CPU kernels off (HMT_CPU_KERNELS): decode attention runs as tensor operations, int8 layers call "
                 "fbgemm through Python")
        return False
    folder = _build_folder()
    t0 = time.perf_counter()
    try:
        build_extension(folder.name, list(_SOURCES), folder, _flags(), ["-fopenmp"])
    except Exception as exc:  # noqa: BLE001 - the compiler, ninja, the loader and the lock fail in many ways
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        log.warning("building the CPU kernels failed, attention runs as tensor operations and int8 layers call "
                    "fbgemm through Python (same output, slower): %s: %s", type(exc).__name__, first[:300])
        return False

    @torch.library.register_fake("hmt_cpu::decode_attention")
    def _fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
        return q.new_empty(q.shape[0], q.shape[1], q.shape[3])

    @torch.library.register_fake("hmt_cpu::fbgemm_linear")
    def _fake_linear(x: torch.Tensor, handle: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], handle.shape[0])

    @torch.library.register_fake("hmt_cpu::qgemm")
    def _fake_qgemm(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, n: int,
                    bits: int, group: int) -> torch.Tensor:
        return x.new_empty(x.shape[0], n)

    log.info("CPU kernels ready in %.1f s (%s)", time.perf_counter() - t0, folder)
    return True
