"""CPU threads for torch: how many, and which OpenMP runtime runs them.

torch's CPU wheels parallelise with GNU OpenMP (libgomp). Measured on the 2-core box (torch 2.13): a parallel
region started from any thread but the process's first costs far more there (layer norm of 32×384: 9 µs from the
main thread, 55-78 µs from another; an int8 384×1152 GEMM: 65 vs 120-160 µs), and the engine decodes in a thread
of its own. With libgomp two intra-op threads made the engine slower than one (600 sentences: 6.9 s vs 4.5 s).
Intel's OpenMP runtime (the `intel-openmp` wheel, libiomp5) implements the same interface without that cost, so
`./start.sh` preloads it (LD_PRELOAD) where the wheel is installed, and then every core is used.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

IOMP = "libiomp5.so"


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers narrow; cpu_count is the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def intel_openmp_loaded() -> bool:
    """Whether Intel's OpenMP runtime is mapped into this process (preloaded by start.sh)."""
    return openmp_runtime() == "intel"


def openmp_runtime() -> str:
    """The OpenMP runtime mapped into this process: "intel" (libiomp5, which then serves every OpenMP call), "gnu"
    (libgomp, torch's own), or "none" (none yet, or /proc cannot be read)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "none"
    return "intel" if IOMP in maps else "gnu" if "libgomp" in maps else "none"


def default_threads() -> int:
    """torch's intra-op threads when model.cpu_threads is 0: every core under Intel's OpenMP; one less than the
    cores under libgomp (where more threads in the engine's thread cost more than they give, see above), so the
    request threads keep a core."""
    cores = usable_cores()
    return cores if intel_openmp_loaded() else max(1, cores - 1)


def intel_openmp_path() -> Path | None:
    """The libiomp5.so the intel-openmp wheel installed into this environment, if any."""
    found = Path(sys.prefix) / "lib" / IOMP
    return found if found.is_file() else None


def with_intel_openmp(env: dict[str, str]) -> dict[str, str]:
    """`env` with Intel's OpenMP preloaded (for subprocesses such as benchmark workers), when it is installed."""
    path = intel_openmp_path()
    if path is None or IOMP in env.get("LD_PRELOAD", ""):
        return env
    preload = ":".join(p for p in (str(path), env.get("LD_PRELOAD", "")) if p)
    return {**env, "LD_PRELOAD": preload, "KMP_BLOCKTIME": env.get("KMP_BLOCKTIME", "1")}
