"""Handing freed heap memory back to the operating system.

glibc's allocator serves large blocks from mmap only up to a threshold that rises, up to 32 MB, each time such a
block is freed; from then on blocks of that size come from the heap, and freed heap pages stay resident until the
heap is trimmed. Loading a 1.8B Hunyuan in int8 frees its bfloat16 layers one by one as they are quantized and
packed: 3,475 MB resident after load, 2,098 MB after one `malloc_trim(0)` (HY-MT1.5-1.8B shapes, Intel Xeon,
BENCHMARKS.md "Issue 46"); right after a prefill of 16 prompts it held 3,351 MB, and 2,650 MB once the batch had
drained and the heap was trimmed. A trim took 0.25-0.5 ms when there was little to give back, so the service trims after a load, after adapters are
dropped, and when the decode loop has drained a batch; not per step."""

from __future__ import annotations

import ctypes
import functools
import gc


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:       # not glibc (musl, macOS): nothing to trim this way
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def trim() -> None:
    """Give freed heap pages back to the OS (glibc's malloc_trim; nothing elsewhere)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def collect_and_trim() -> None:
    """After deletes: objects in reference cycles (PEFT's layers) are freed first. A full gc.collect costs 0.3-1 s
    in a process holding transformers: once per operation that drops many objects, never per step."""
    gc.collect()
    trim()
