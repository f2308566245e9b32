"""Which OpenMP runtime a benchmark's worker process runs on (bench.peer, bench.hunyuan_cpu).

Ours runs on Intel's OpenMP, preloaded as `./start.sh` serves (hunyuan_mt/host/cpu.py says why). A peer engine runs
on the OpenMP its own build links, as its users get it, and again on Intel's, preloaded the same way (its rows carry
`IOMP_SUFFIX`), so that every ratio can be read against the peer on the runtime ours has: CTranslate2's wheel ran
2.6× faster on Intel's than on its vendored libgomp on a 2-core Xeon VM (BENCHMARKS.md). A worker's environment is
made here from the caller's less any preload the caller had, so the runtime never depends on how the bench was
started.
"""

from __future__ import annotations

from collections.abc import Mapping

from hunyuan_mt.host.cpu import intel_openmp_path, with_intel_openmp

#: The suffix of a peer's run on Intel's OpenMP.
IOMP_SUFFIX = "-iomp"


def peer_runtimes() -> tuple[str, ...]:
    """The suffixes of a peer's runs here: its own runtime (""), and Intel's where the intel-openmp wheel is
    installed."""
    return ("", IOMP_SUFFIX) if intel_openmp_path() is not None else ("",)


def worker_env(env: Mapping[str, str], intel: bool) -> dict[str, str]:
    """`env` without any OpenMP preload, and with Intel's runtime preloaded (`KMP_BLOCKTIME` as ./start.sh sets it)
    where `intel`."""
    clean = {k: v for k, v in env.items() if k not in ("LD_PRELOAD", "KMP_BLOCKTIME")}
    return with_intel_openmp(clean) if intel else clean
