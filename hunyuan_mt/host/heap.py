"""Handing freed heap memory back to the operating system.

glibc's allocator serves large blocks from mmap only up to a threshold that rises, up to 32 MB, each time such a
block is freed; from then on blocks of that size come from the heap, and freed heap pages stay resident until the
heap is trimmed. Loading a 1.8B Hunyuan in int8 frees its bfloat16 layers one by one as they are quantized and
packed: 3,475 MB resident after load, 2,098 MB after one `malloc_trim(0)` (HY-MT1.5-1.8B shapes, Intel Xeon,
BENCHMARKS.md, bench/hunyuan_cpu.py); right after a prefill of 16 prompts it held 3,351 MB, and 2,650 MB once the batch had
drained and the heap was trimmed. A trim took 0.25-0.5 ms when there was little to give back, so the service
trims after a load, after adapters are dropped, and when the decode loop has drained a batch that left enough
behind (`trim_if_grown`); not per step.

Why not after every drained batch: the pages a trim gives back are the ones the next request touches first. A lone
stream on the demo (AMD EPYC, 2 cores, 2026-12-06) sent its first piece after 11.4 ms with a trim after every
batch and 7.9-8.8 ms without: its encoder's activations and its first step's cache (1.1 ms against 0.4 ms for
the three reallocations) page-faulted memory the previous request had just handed back."""

from __future__ import annotations

import ctypes
import functools
import gc
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:       # not glibc (musl, macOS): nothing to trim this way
        return None
    if not hasattr(libc, "malloc_trim"):
        return None
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc


#: How much more anonymous memory than right after the last trim a drained batch must leave resident before the
#: decode loop trims: a 16-prompt prefill of the 1.8B leaves ~700 MB (above), a lone demo request a few MB.
DRAIN_SLACK_BYTES = 64 << 20

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

#: Resident anonymous bytes right after the last trim (None before the first, or where they cannot be read).
_after_last_trim: int | None = None


def anonymous_resident() -> int | None:
    """This process's resident anonymous memory in bytes (Linux: /proc/self/statm, resident minus file-backed and
    shared pages: what the heap and tensors hold, not the mapped weights), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            fields = statm.read().split()
        return (int(fields[1]) - int(fields[2])) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def trim() -> None:
    """Give freed heap pages back to the OS (glibc's malloc_trim; nothing elsewhere)."""
    global _after_last_trim
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
    _after_last_trim = anonymous_resident()


def trim_if_grown(slack: int = DRAIN_SLACK_BYTES) -> bool:
    """`trim`, unless the process holds less than `slack` more anonymous memory than right after the last trim:
    then what the last batch freed stays for the next one (see the module's docstring). True if it trimmed. Memory
    that stays in use (an adapter attached since) counts as growth too, and so costs at most one trim more. A slack
    of 0 (memory pressure) always trims, also where the process holds less than after the last trim."""
    if slack > 0:
        now = anonymous_resident()
        if now is not None and _after_last_trim is not None and now - _after_last_trim < slack:
            return False
    trim()
    return True


def collect_and_trim() -> None:
    """After deletes: objects in reference cycles (PEFT's layers) are freed first. A full gc.collect costs 0.3-1 s
    in a process holding transformers: once per operation that drops many objects, never per step."""
    gc.collect()
    trim()


MADV_DONTNEED = 4


def release_file_pages(tensors: Iterable["torch.Tensor"], path: Path) -> int:
    """Take this process's pages of the mappings of the file `path` that hold `tensors` out of its resident set
    (madvise MADV_DONTNEED). The pages stay in the kernel's page cache, so touching the tensors again reads them
    back without the disk while memory allows, and costs nothing while it does not: the adapter cache's copy of an
    attached adapter, which its slot holds too (BENCHMARKS.md: 36 MB an adapter of HY-MT1.5-1.8B's shapes).

    Only a private mapping of that very file is advised: an anonymous page, or a page of a file mapping written
    to, would be lost, and these are never written. Returns the bytes advised (0 where there is nothing to do or
    no glibc)."""
    libc = _libc()
    if libc is None:
        return 0
    target = str(Path(path).resolve())
    pointers = {t.untyped_storage().data_ptr() for t in tensors if t.device.type == "cpu"}
    advised = 0
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            lines = maps.readlines()
    except OSError:
        return 0
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[5].strip() != target or not fields[1].endswith("p"):
            continue
        low, high = (int(x, 16) for x in fields[0].split("-"))
        if any(low <= p < high for p in pointers):
            if libc.madvise(ctypes.c_void_p(low), ctypes.c_size_t(high - low), MADV_DONTNEED) == 0:
                advised += high - low
    return advised
