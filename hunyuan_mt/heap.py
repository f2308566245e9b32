"""Handing freed heap memory back to the operating system.

glibc's allocator serves large blocks from mmap only up to a threshold that rises, up to 32 MB, each time such a
block is freed; from then on blocks of that size come from the heap, and freed heap pages stay resident until the
heap is trimmed. Loading a 1.8B Hunyuan in int8 frees its bfloat16 layers one by one as they are quantized and
packed: 3,475 MB resident after load, 2,098 MB after one `malloc_trim(0)` (HY-MT1.5-1.8B shapes, Intel Xeon,
BENCHMARKS.md "Issue 46"); a prefill of 16 prompts leaves some 400 MB the same way. A trim costs a few
milliseconds when there is little to give back, so the service trims after a load, after adapters are dropped, and
when the decode loop has drained a batch; not per step."""

from __future__ import annotations

import ctypes
import gc
import logging

log = logging.getLogger(__name__)

_LIBC: ctypes.CDLL | None | bool = None


def _libc() -> ctypes.CDLL | None:
    global _LIBC
    if _LIBC is None:
        try:
            libc = ctypes.CDLL("libc.so.6")
            _LIBC = libc if hasattr(libc, "malloc_trim") else False
        except OSError:       # not glibc (musl, macOS): nothing to trim this way
            _LIBC = False
    return _LIBC or None


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
