"""`NativeModel`: an AOTInductor package's model called through its C interface, without holding the GIL.

torch's loader for a compiled package (`aoti_load_package(...).loader.boxed_run`) keeps the GIL for the whole
call: while a decode step runs (about half of the engine's time), no other Python thread of the process runs at
all, not the HTTP handlers, not the tokenizer, not the next request's detection. Measured on the 2-core box: a
Python loop in a second thread ran at 5-10 % of its speed while the package ran, at 99-100 % beside `torch.mm`
(which releases the GIL) or beside this class.

The package's shared library exports a small C interface (torch's `aoti_runtime/interface.h`): create a model
container, run it on an array of tensor handles, delete it. This class calls those functions with ctypes, which
releases the GIL for the duration of each foreign call. Tensor handles are made and taken back by torch's own
helpers (`torch._C._aoti`), the same ones inductor's C++ wrapper uses from Python. The output of a call is bit for
bit the loader's (the same library computes it); an error inside the library comes back only as a status code,
so the caller (`decode/aot.py`) repeats a failed call through torch's loader to get its message.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import torch

_handle = ctypes.c_void_p
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype, _get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype, _new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class NativeUnavailable(RuntimeError):
    """The package cannot be run this way (it keeps its weights outside the library, or the library does not
    load or lacks the interface); torch's loader serves it."""


class NativeFailed(RuntimeError):
    """The library reported an error (its message went to stderr; torch's loader can reproduce it)."""


def _library(package: Path) -> str:
    """The package's model library, extracted to a temporary file (the caller loads and then removes it)."""
    with zipfile.ZipFile(package) as archive:
        names = [n for n in archive.namelist() if "/data/aotinductor/" in n]
        libraries = [n for n in names if n.endswith(".so")]
        # Anything but the library, its C++ source and metadata would be weights kept beside it, which the
        # container would have to be given: torch's loader does that.
        extra = [n for n in names if not n.endswith((".so", ".cpp", ".json"))]
        if len(libraries) != 1 or extra:
            raise NativeUnavailable(f"{package.name}: {len(libraries)} libraries, other files {extra[:3]}")
        fd, path = tempfile.mkstemp(suffix=".so", prefix="hmt-aoti-")
        with os.fdopen(fd, "wb") as out, archive.open(libraries[0]) as src:
            shutil.copyfileobj(src, out)
    return path


class NativeModel:
    """One model container of a CPU package; `run` takes the flat input tensors and returns the outputs."""

    def __init__(self, package: Path) -> None:
        path = _library(package)
        try:
            # RTLD_LOCAL (ctypes' default): two packages' libraries export the same names.
            self._lib = ctypes.CDLL(path)
        except OSError as exc:
            raise NativeUnavailable(f"{package.name}: {exc}") from exc
        finally:
            os.unlink(path)  # the mapping stays while the process lives; nothing is left on disk
        try:
            create = self._lib.AOTInductorModelContainerCreateWithDevice
            self._run = self._lib.AOTInductorModelContainerRun
            self._delete = self._lib.AOTInductorModelContainerDelete
            outputs_of = self._lib.AOTInductorModelContainerGetNumOutputs
        except AttributeError as exc:
            raise NativeUnavailable(f"{package.name}: {exc}") from exc
        self._run.argtypes = [_handle, ctypes.POINTER(_handle), ctypes.c_size_t, ctypes.POINTER(_handle),
                              ctypes.c_size_t, _handle, _handle]
        self._container = _handle()
        if create(ctypes.byref(self._container), ctypes.c_size_t(1), b"cpu", None) != 0:
            raise NativeUnavailable(f"{package.name}: creating the model container failed")
        count = ctypes.c_size_t()
        outputs_of(self._container, ctypes.byref(count))
        self._outputs = count.value

    def run(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        # New handles to the inputs' tensors (the library takes them over and releases them), as raw pointers.
        handles = [_get_pointer(c, None) for c in torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(tensors)]
        inputs = (_handle * len(handles))(*handles)
        outputs = (_handle * self._outputs)()
        # ctypes releases the GIL for the call: other Python threads run while the model computes.
        if self._run(self._container, inputs, len(handles), outputs, self._outputs, None, None) != 0:
            raise NativeFailed("the compiled model reported an error")
        return torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs(
            [_new_capsule(outputs[i], None, None) for i in range(self._outputs)])

    def __del__(self) -> None:
        container = getattr(self, "_container", None)
        if container is not None and container.value:
            self._delete(container)
