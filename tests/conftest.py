"""Shared fixtures: tiny models and adapters built once per session (see tests/tiny_models.py).

Other test modules may append fixtures here; keep the session builds below as they are.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# A service that warms up compiles its decode step (~20 s a model on 2 cores): tests/test_compiled_step.py does that
# on purpose; everywhere else, and in the processes tests start, the step stays eager.
os.environ.setdefault("HMT_MODEL__COMPILE", "false")
# What a server writes (its database, document jobs' files) goes to a folder of this test process's own, never
# the project's data/: a job one test left unfinished must not be run again by the next test's server.
import tempfile  # noqa: E402

os.environ["HMT_DATA"] = tempfile.mkdtemp(prefix="hmt-data-")
# Gradio keeps the files a page hands out in one folder per content hash under GRADIO_TEMP_DIR, and a page that
# closes deletes the files it made: two test processes translating the same document made the same folder, and one
# server's shutdown took the other's download away (a 500 in test_access). Each test process gets its own.
os.environ["GRADIO_TEMP_DIR"] = tempfile.mkdtemp(prefix="hmt-gradio-")

import pytest
import torch

import tiny_models  # tests/ is on sys.path (rootdir conftest, no __init__.py)

# Tests run beside other work on small machines; one thread keeps them predictable.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def own_data_folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's servers keep their database and job files in a folder of the test's own (servers that a
    module or session shares were made with the process's)."""
    folder = tmp_path_factory.mktemp("data")
    monkeypatch.setenv("HMT_DATA", str(folder))
    return folder


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def marian_dir(tiny_root: Path) -> Path:
    """A tiny MarianMTModel (encoder-decoder) folder: config.json, tokenizer.json, model.safetensors."""
    return tiny_models.build_marian(tiny_root / "marian")


@pytest.fixture(scope="session")
def hunyuan_dir(tiny_root: Path) -> Path:
    """A tiny HunYuanDenseV1ForCausalLM (decoder-only) folder with a chat-template tokenizer."""
    return tiny_models.build_hunyuan(tiny_root / "hunyuan")


@pytest.fixture(scope="session")
def marian_adapters(tiny_root: Path, marian_dir: Path) -> Path:
    """Adapters folder for the Marian model: tiny_models.DEFAULT_PAIRS (read-only; copy it to modify)."""
    root = tiny_root / "marian_adapters"
    tiny_models.make_adapters(marian_dir, root)
    return root


@pytest.fixture(scope="session")
def hunyuan_adapters(tiny_root: Path, hunyuan_dir: Path) -> Path:
    """Adapters folder for the HunYuan model: tiny_models.DEFAULT_PAIRS (read-only; copy it to modify)."""
    root = tiny_root / "hunyuan_adapters"
    tiny_models.make_adapters(hunyuan_dir, root)
    return root


@pytest.fixture()
def adapters_copy(tmp_path: Path, marian_adapters: Path) -> Path:
    """A private, modifiable copy of the Marian adapters folder."""
    import shutil

    dest = tmp_path / "adapters"
    shutil.copytree(marian_adapters, dest)
    return dest


@pytest.fixture()
def fresh_backbone():
    """Factory: a private backbone for a model folder (not the process-wide one), so a test's adapters never
    leak into another test. `fresh_backbone(marian_dir)`."""
    from hunyuan_mt.runtime.backbone import Backbone
    from hunyuan_mt.config import ModelConfig

    def make(model_dir: Path, **kw) -> Backbone:
        return Backbone.load_uncached(ModelConfig(path=str(model_dir), warmup=False, **kw))

    return make


@pytest.fixture()
def make_cache():
    """Factory: `make_cache(backbone, adapters_dir, slots=3, pinned=[...], ...)` → started AdapterCache."""
    from hunyuan_mt.adapters.cache import AdapterCache
    from hunyuan_mt.adapters.registry import AdapterRegistry
    from hunyuan_mt.config import CacheConfig

    def make(backbone, adapters_dir: Path, start: bool = True, **cfg) -> AdapterCache:
        registry = AdapterRegistry(adapters_dir, backbone.spec)
        registry.scan()
        cache = AdapterCache(backbone, registry, CacheConfig(adapters_dir=str(adapters_dir), **cfg))
        if start:
            cache.start()
        return cache

    return make


# Web tests: the real app on 127.0.0.1 over one session-wide service (tests/web_server.py).
from web_server import live_server, web_cfg, web_service  # noqa: E402,F401


@pytest.fixture()
def two_threads():
    """As the CPU profile runs: MKL and the kernels split their work by thread, and that is part of what must not
    change a row's result."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


# The suite runs on two pytest-xdist workers (pytest.ini). Tests that start a Ray cluster stay on one worker, one
# after the other: two local clusters and their Serve proxies on a 2-core machine would starve each other. A module
# whose module fixtures compile a decode step runs whole on one worker too: spread over both, the second worker set
# up the same fixture and sat waiting on the compile's lock (decode/aot.py) while the first compiled.
_ONE_WORKER = {"test_serve_ray.py": "ray", "test_serve_ray_cli.py": "ray",
               "test_compiled_step.py": "compiled step", "test_llama_step.py": "llama step"}


def _one_worker_group(nodeid: str) -> str | None:
    """The group a test must share a worker with ("ray", ...), from its node id alone, or None."""
    path, _, name = nodeid.partition("::")
    return _ONE_WORKER.get(path.rsplit("/", 1)[-1]) or ("ray" if "serve_ray" in name else None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's loadgroup, with the groups read from the node ids here. xdist's own loadgroup reads `xdist_group`
    marks into a suffix of each node id, which pytest 9.2 no longer lets a plugin change (Node.nodeid is derived):
    under pytest 9.2 the Ray tests were spread over both workers, each setting up a cluster of its own (60 s
    apiece) while the other's replicas competed for the same 2 cores. Groups go out largest first (xdist's
    loadscope reorder), then the other tests one by one in collection order (`pytest_collection_modifyitems`)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _one_worker_group(nodeid) or nodeid

    return OneWorkerGroups(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The Ray group (minutes on one worker) first, so the other worker runs everything else beside it; then the
    # other groups and the modules with a slow test (`slow`: more than ~20 s), so that no long test is left for the
    # end, when one worker runs it while the other has nothing left (the tail was 3 minutes of one worker). A module
    # moves whole: its module fixtures are set up once.
    slow_modules = {item.module.__name__ for item in items
                    if item.get_closest_marker("slow") is not None and getattr(item, "module", None) is not None}

    def rank(item: pytest.Item) -> int:
        group = _one_worker_group(item.nodeid)
        if group == "ray":
            return 0
        module = getattr(item, "module", None)
        return 1 if group is not None or (module is not None and module.__name__ in slow_modules) else 2

    items.sort(key=rank)


# The process that builds the CPU kernels for the run (`_start_kernel_build`), named to the workers by its pid; in
# the process that started it, the process and the file its stderr goes to.
_KERNEL_BUILD_PID = "HMT_TEST_KERNEL_BUILD_PID"
_KERNEL_BUILD: tuple[Any, Any] | None = None


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and not config.option.collectonly:
        _start_kernel_build()


def _start_kernel_build() -> None:
    """The CPU kernels (hunyuan_mt/kernels), built once for the run, in the folder every test process and every
    server it starts reads them from (`kernels.cache_folder`). Built on first use instead, on a fresh machine the
    first test to decode built them while the other worker's first decoding test, and the replicas of a Ray test,
    waited on the build's lock. The build (one translation unit, one core) runs in a process of its own while the
    workers start and collect on the other core; each worker waits for it before its first test
    (`pytest_runtestloop`). Where they cannot be built, the tests that need them say so, as before."""
    import subprocess
    import sys
    import tempfile

    from hunyuan_mt import kernels

    if kernels.built() or os.environ.get("HMT_CPU_KERNELS", "1").strip().lower() in ("0", "false", "off", "no"):
        return
    print("conftest: building the CPU kernels once for the whole run, beside the workers' start", file=sys.stderr,
          flush=True)
    # Its stderr goes to a file, not a pipe: nobody reads a pipe until the run ends, and a full one would stop it.
    log = tempfile.TemporaryFile("w+")
    build = subprocess.Popen([sys.executable, "-c", "from hunyuan_mt import kernels; kernels.decode_attention()"],
                             cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL, stderr=log,
                             text=True)
    os.environ[_KERNEL_BUILD_PID] = str(build.pid)  # the workers, started after this hook, inherit it
    global _KERNEL_BUILD
    _KERNEL_BUILD = (build, log)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """Before a process's first test: wait for the run's kernel build if it is still going (under `-n 0` this
    process's own child, which counts as gone once it has exited: `_alive`)."""
    import sys
    import time

    from hunyuan_mt import kernels

    pid = int(os.environ.get(_KERNEL_BUILD_PID) or 0)
    if not pid or kernels.built() or session.config.pluginmanager.hasplugin("dsession"):
        return  # nothing to wait for, or this is xdist's controller, which runs no test
    t0 = time.monotonic()
    while not kernels.built() and _alive(pid) and time.monotonic() - t0 < 900:
        time.sleep(0.1)
    state = "built" if kernels.built() else "not built (the tests that need them say so)"
    print(f"conftest: the CPU kernels: {state}, waited {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    import sys

    if _KERNEL_BUILD is not None:
        build, log = _KERNEL_BUILD
        build.wait(900)
        log.seek(0)
        err = log.read()
        log.close()
        if build.returncode:
            print(f"conftest: the CPU kernels' build ended with exit {build.returncode}: {err.strip()[-500:]}",
                  file=sys.stderr, flush=True)


def _alive(pid: int) -> bool:
    """Whether the build process still runs (a zombie, finished but not yet reaped by the controller, does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
