"""`decode/aot.py`: what an ahead-of-time compiled call is handed, and when a kept package is found again.

The compiled step itself (its logits against the eager step, one package for every batch, the fallbacks) is
tested in test_compiled_step.py; these are the wrapper's own promises, on plain functions that compile in seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import torch.utils._pytree as pytree

from hunyuan_mt.decode import aot


class _Pair(NamedTuple):
    weight: torch.Tensor
    bias: torch.Tensor | None


def _nested() -> tuple:
    t = [torch.full((2, 3), float(i)) for i in range(8)]
    return (t[0], [t[1], None, (t[2], 3, (4, 5))], _Pair(t[3], None), (t[4], [t[5], t[6]], 0.5, "gelu"), t[7])


def test_the_tensors_come_in_pytree_order_and_a_list_is_read_again() -> None:
    """The compiled package takes its inputs in pytree's leaf order: `_tensors` must give exactly that order, and a
    list inside a remembered tuple (a cache's per-layer tensors, replaced when the cache grows) is read afresh."""
    args = _nested()
    memo: dict = {}
    got: list[torch.Tensor] = []
    aot._tensors(args, got, memo)
    expected = [x for x in pytree.tree_flatten(args)[0] if isinstance(x, torch.Tensor)]
    assert [id(t) for t in got] == [id(t) for t in expected]
    inner_list = args[3][1]
    inner_list[0] = torch.zeros(1)  # the tuple args[3] is the same object; the list in it changed
    again: list[torch.Tensor] = []
    aot._tensors(args, again, memo)
    assert again[5] is inner_list[0]


def _affine(x: torch.Tensor, params: tuple) -> torch.Tensor:
    (w, b), scale = params
    return (x @ w + b) * scale


@pytest.mark.timeout(300)
def test_a_package_is_kept_and_found_by_a_new_function(tmp_path: Path, monkeypatch) -> None:
    """The first call compiles and keeps the package; a new AotFunction for the same code and shapes (a restart)
    loads it; a dimension marked dynamic takes other sizes; one left static, or a strided view where the package
    reads a contiguous tensor, is refused (AotMismatch)."""
    monkeypatch.setenv("HMT_AOT_CACHE", str(tmp_path))
    params = ((torch.randn(4, 3), torch.randn(3)), 2.0)
    x = torch.randn(5, 4)
    aot.mark_dynamic(x, 0)
    first = aot.AotFunction(_affine)
    torch.testing.assert_close(first((x, params), static=(1,)), _affine(x, params))
    (package,) = first.packages
    assert package.compiled and list(tmp_path.glob("_affine-*.pt2"))

    again = aot.AotFunction(_affine)
    y = torch.randn(9, 4)
    aot.mark_dynamic(y, 0)
    torch.testing.assert_close(again((y, params), static=(1,)), _affine(y, params))
    (loaded,) = again.packages
    assert not loaded.compiled and loaded.key == package.key

    wide = torch.randn(5, 6)  # the weight's 4 input features are static in the package
    aot.mark_dynamic(wide, 0)
    with pytest.raises(aot.AotMismatch, match="unmatched dim value"):
        again((wide, ((torch.randn(6, 3), torch.randn(3)), 2.0)), static=())
    view = torch.randn(4, 7)[:, :4].t()  # the right shape, but a transposed view: read as contiguous, it would be
    aot.mark_dynamic(view, 0)            # another matrix
    with pytest.raises(aot.AotMismatch, match="not contiguous"):
        again((view, params), static=(1,))


def _project(x: torch.Tensor, params: tuple) -> torch.Tensor:
    (w, b), scale = params
    return torch.nn.functional.linear(x, w, b) * scale


@pytest.mark.timeout(300)
def test_frozen_weights_are_compiled_in_and_key_the_package(tmp_path: Path, monkeypatch) -> None:
    """With `freeze`, the static arguments' tensors become constants of the package (for float32 linears inductor
    then packs them for oneDNN): a call passes only the other tensors. The weights' values key the package: the
    same weights in a new tuple find it again, other weights make a package of their own, and each computes with
    its own weights."""
    monkeypatch.setenv("HMT_AOT_CACHE", str(tmp_path))
    params = ((torch.randn(6, 4), torch.randn(6)), 0.5)
    x = torch.randn(5, 4)
    aot.mark_dynamic(x, 0)
    fn = aot.AotFunction(_project, freeze=True)
    seen: list[int] = []
    first = fn((x, params), static=(1,))
    torch.testing.assert_close(first, _project(x, params))
    (package,) = fn.packages
    real_run = package.loader.boxed_run
    package.loader = _Spy(real_run, seen)
    same = ((params[0][0].clone(), params[0][1].clone()), 0.5)  # equal values, new tensors and tuple
    y = torch.randn(3, 4)
    aot.mark_dynamic(y, 0)
    torch.testing.assert_close(fn((y, same), static=(1,)), _project(y, same))
    assert seen == [1] and len(fn.packages) == 1  # the input alone; the weights are in the package
    wrapper = next(text for name, text in _sources(package.path).items() if name.endswith("wrapper.cpp"))
    assert "_linear_pointwise" in wrapper  # frozen float32 linear: oneDNN on weights packed at compile time

    other = ((torch.randn(6, 4), torch.randn(6)), 0.5)
    torch.testing.assert_close(fn((y, other), static=(1,)), _project(y, other))
    assert len(fn.packages) == 2 and len(list(tmp_path.glob("_project-*.pt2"))) == 2


class _Spy:
    """Stands in for torch's loader: counts the tensors of each call."""

    def __init__(self, run, seen: list[int]) -> None:
        self._run, self._seen = run, seen

    def boxed_run(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        self._seen.append(len(tensors))
        return self._run(tensors)


def _sources(package: Path) -> dict[str, str]:
    """The generated C++ files of a package by name."""
    import zipfile

    with zipfile.ZipFile(package) as archive:
        return {name: archive.read(name).decode() for name in archive.namelist() if name.endswith(".cpp")}
