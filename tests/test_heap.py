"""When freed heap memory goes back to the system (hunyuan_mt/host/heap.py): after a batch that left much behind, not
after every batch (the next request would page-fault what the last one handed back)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hunyuan_mt.host import heap

MB = 1 << 20


class _Libc:
    def __init__(self) -> None:
        self.trims = 0

    def malloc_trim(self, pad: int) -> int:
        self.trims += 1
        return 1


def test_the_decode_loop_trims_only_when_the_heap_grew_by_the_slack(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = _Libc()
    resident = [500 * MB]
    monkeypatch.setattr(heap, "_after_last_trim", None)   # restored afterwards: the fakes' baseline stays here
    monkeypatch.setattr(heap, "_libc", lambda: libc)
    monkeypatch.setattr(heap, "anonymous_resident", lambda: resident[0])
    heap.trim()                                       # after a load: the baseline is what is left
    assert libc.trims == 1
    resident[0] = 500 * MB + heap.DRAIN_SLACK_BYTES - 1
    assert heap.trim_if_grown() is False and libc.trims == 1
    resident[0] = 500 * MB + heap.DRAIN_SLACK_BYTES
    assert heap.trim_if_grown() is True and libc.trims == 2
    resident[0] = 520 * MB                            # the new baseline is the one after that trim
    assert heap.trim_if_grown() is False and libc.trims == 2
    resident[0] = None
    assert heap.trim_if_grown() is True and libc.trims == 3   # unknown: trim, as before
    resident[0] = 500 * MB
    heap.trim()
    resident[0] = 400 * MB                            # less than after the last trim: memory pressure still trims
    assert heap.trim_if_grown(0) is True and libc.trims == 5


def test_the_first_drained_batch_trims(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = _Libc()
    monkeypatch.setattr(heap, "_libc", lambda: libc)
    monkeypatch.setattr(heap, "_after_last_trim", None)
    monkeypatch.setattr(heap, "anonymous_resident", lambda: 100 * MB)
    assert heap.trim_if_grown() is True and libc.trims == 1


@pytest.mark.skipif(heap._libc() is None or heap.anonymous_resident() is None, reason="glibc on Linux only")
def test_freed_heap_pages_stay_for_the_next_request_until_the_slack_is_reached() -> None:
    """On the real allocator: 64 MB in blocks below glibc's mmap threshold, freed, stay resident through a
    `trim_if_grown` with a larger slack and go back with a smaller one."""
    heap.trim()
    blocks: list[Any] = [torch.ones(8192) for _ in range(2048)]   # 32 KB each, from the heap
    pin = torch.ones(8192)   # allocated last: the freed blocks are not the heap's top, which free() trims itself
    grown = heap.anonymous_resident()
    del blocks
    held = heap.anonymous_resident()
    assert grown is not None and held is not None and held > grown - 16 * MB
    assert heap.trim_if_grown(slack=1 << 40) is False
    assert heap.anonymous_resident() > held - 16 * MB          # kept for the next request
    assert heap.trim_if_grown(slack=16 * MB) is True
    assert heap.anonymous_resident() < held - 40 * MB          # handed back
    del pin
