"""No lock the start takes outlives its owner (locks.py): a start killed with SIGKILL in the middle of the CPU
kernels' build, of a compiled package's build or of the store's migration leaves the next start free to go on, with
no hand work; a live owner is named in one log line, and waited for only up to a bound.

Each killed "start" is a process doing exactly that part of a start (a real server's first start spends minutes
before it reaches some of them); the kernels' case builds a small extension of its own through the same builder,
so that the kill lands inside torch's build, where its own lock file is.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hunyuan_mt.host import locks
from hunyuan_mt.errors import StoreUnavailable

ROOT = Path(__file__).resolve().parents[1]


def _spawn(code: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A Python process running `code` from a file of its own (the compiled function's source must be readable)."""
    script = Path(env["HMT_TEST_SCRIPT"]) if env and "HMT_TEST_SCRIPT" in env else None
    if script is not None:
        script.write_text(textwrap.dedent(code))
    extra = (env or {}).get("HMT_TEST_ARGS", "").split()
    argv = [sys.executable, str(script), *extra] if script is not None else [sys.executable, "-c",
                                                                               textwrap.dedent(code)]
    return subprocess.Popen(argv, cwd=ROOT, text=True, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _kill_when(proc: subprocess.Popen[str], ready: Path, timeout: float = 120) -> None:
    """SIGKILL the process and everything it started as soon as `ready` exists (its build is under way)."""
    deadline = time.monotonic() + timeout
    while not ready.exists():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, f"{ready} never appeared"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def _run(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    proc = _spawn(code, env)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"the next start did not finish in {timeout} s:\n{out[-3000:]}") from None
    assert proc.returncode == 0, out[-3000:]
    return out


def test_a_live_holder_is_named_once_and_waited_for_up_to_the_bound(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    lock = tmp_path / "thing.lock"
    holder = _spawn(f"""
        import time
        from hunyuan_mt.host.locks import owned_lock
        with owned_lock({str(lock)!r}, "building a thing", 5):
            open({str(tmp_path / 'held')!r}, "w").close()
            time.sleep(60)
    """)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "held").exists():
            assert time.monotonic() < deadline and holder.poll() is None
            time.sleep(0.02)
        with caplog.at_level(logging.INFO, logger="hunyuan_mt.host.locks"):
            with pytest.raises(locks.LockTimeout) as info:
                with locks.owned_lock(lock, "building a thing", 0.6):
                    pass
        assert f"process {holder.pid} on" in info.value.args[0] and "building a thing" in info.value.args[0]
        waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for")]
        assert len(waits) == 1 and f"process {holder.pid}" in waits[0], waits
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(30)
    # The holder is gone (SIGKILL): the lock is free at once, its stale owner record notwithstanding.
    t0 = time.monotonic()
    with locks.owned_lock(lock, "building a thing", 5):
        assert locks.owner_of(lock)["pid"] == os.getpid()
    assert time.monotonic() - t0 < 1.0
    assert locks.owner_of(lock) is None


# torch/library.h alone (no ATen/ATen.h): half the compile time (9 s against 18 s on 2 cores), and the builds are
# what these tests take their time in.
_TINY_OP = """
#include <torch/library.h>

at::Tensor twice(const at::Tensor& x) { return x.mul(2); }

TORCH_LIBRARY(hmt_lock_test, m) { m.def("twice(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(hmt_lock_test, CPU, m) { m.impl("twice", &twice); }
"""


@pytest.mark.timeout(300)
def test_a_kernels_build_killed_midway_does_not_hold_up_the_next(tmp_path: Path) -> None:
    source = tmp_path / "tiny_op.cpp"
    source.write_text(_TINY_OP)
    folder = tmp_path / "build"
    code = f"""
        import logging, torch
        from pathlib import Path
        logging.basicConfig(level=logging.INFO)
        from hunyuan_mt import kernels
        kernels.build_extension("hmt_lock_test_ext", [Path({str(source)!r})], Path({str(folder)!r}), ["-O1"], [])
        assert torch.ops.hmt_lock_test.twice(torch.ones(2)).tolist() == [2.0, 2.0]
        print("BUILT")
    """
    first = _spawn(code)
    _kill_when(first, folder / "lock")  # torch's own lock file: its build has begun
    stale = (folder / "lock").stat().st_mtime_ns
    # The next start clears the dead build's file and builds (torch's builder takes its file again): it is not
    # held up. Before, it slept beside that file for as long as it was there. The build itself is every kernel
    # test's; this one stops the second start once it is under way.
    second = _spawn(code)
    try:
        deadline = time.monotonic() + 120
        while not ((folder / "lock").exists() and (folder / "lock").stat().st_mtime_ns != stale):
            if second.poll() is not None:
                break  # it finished already (its output says how)
            assert time.monotonic() < deadline, "the next build never began: it waits on the dead build's lock"
            time.sleep(0.02)
    finally:
        os.killpg(second.pid, signal.SIGKILL)
        out, _ = second.communicate()
    assert "removing the lock file of a build that did not finish" in out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_second_checkout_of_the_same_sources_loads_the_library_built(tmp_path: Path) -> None:
    """Two checkouts (a clone, a worktree) of the same kernel sources share one build: the second loads the library
    the first built instead of building it again (torch's builder rebuilt whenever the sources' paths changed)."""
    folder = tmp_path / "build"
    sources = []
    for checkout in ("one", "two"):
        (tmp_path / checkout).mkdir()
        sources.append(tmp_path / checkout / "tiny_op.cpp")
        sources[-1].write_text(_TINY_OP)

    def build(source: Path) -> None:
        code = f"""
            import torch
            from pathlib import Path
            from hunyuan_mt import kernels
            kernels.build_extension("hmt_share_test_ext", [Path({str(source)!r})], Path({str(folder)!r}), ["-O1"],
                                    [])
            assert torch.ops.hmt_lock_test.twice(torch.ones(2)).tolist() == [2.0, 2.0]
            print("BUILT")
        """
        process = _spawn(code)
        out, _ = process.communicate(timeout=280)
        assert process.returncode == 0 and "BUILT" in out, out

    build(sources[0])
    library = folder / "hmt_share_test_ext.so"
    before = library.stat().st_mtime_ns
    build(sources[1])
    assert library.stat().st_mtime_ns == before, "the second checkout built the library again"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_compile_killed_midway_does_not_hold_up_the_next(tmp_path: Path) -> None:
    env = {"HMT_AOT_CACHE": str(tmp_path / "aot"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "HMT_TEST_SCRIPT": str(tmp_path / "compile_case.py")}
    code = """
        import os, sys, torch
        from hunyuan_mt.decode import aot
        from hunyuan_mt.decode.aot import AotFunction, mark_dynamic

        def scaled(x, w):
            return torch.relu(x @ w) * 0.5 + 1.0

        if "--until-compiling" in sys.argv:
            # The next start got the lock and began its own compile: that is all this test needs to see (the
            # compile itself is tests/test_aot.py's), so it stops there instead of spending half a minute.
            def stop(label, event, seconds):
                if event == "compiling":
                    print("COMPILING", label, flush=True)
                    os._exit(0)
            aot.LISTENERS.append(stop)
        fn = AotFunction(scaled)
        x, w = torch.randn(4, 16), torch.randn(16, 8)
        mark_dynamic(x, 0)
        out = fn((x, w))
        print("COMPILED", fn.packages[0].compiled)
    """
    first = _spawn(code, env)
    deadline = time.monotonic() + 300
    while not list((tmp_path / "aot").glob("*.lock.owner")):  # the owned lock is held: the compile has begun
        assert first.poll() is None, first.stdout.read() if first.stdout else ""
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(2.0)  # inside export or inductor
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(30)
    assert not list((tmp_path / "aot").glob("*.pt2")) or all(".partial." in p.name
                                                            for p in (tmp_path / "aot").glob("*.pt2"))
    out = _run(code, {**env, "HMT_TEST_ARGS": "--until-compiling"}, timeout=120)
    assert "COMPILING scaled" in out


def test_a_migration_killed_midway_does_not_hold_up_the_next(tmp_path: Path) -> None:
    from hunyuan_mt.store import Store

    held = tmp_path / "held"
    holder = _spawn(f"""
        import time
        from hunyuan_mt.store.db import _migration_lock, open_engine
        engine = open_engine("sqlite:///{tmp_path / 'hunyuan.db'}")
        with _migration_lock(engine):
            open({str(held)!r}, "w").close()
            time.sleep(120)
    """)
    _kill_when(holder, held)
    t0 = time.monotonic()
    store = Store.open(f"sqlite:///{tmp_path / 'hunyuan.db'}", tmp_path)
    try:
        assert time.monotonic() - t0 < 10
        assert store.kind == "sqlite"
    finally:
        store.engine.dispose()


def test_a_live_migration_is_waited_for_up_to_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hunyuan_mt.store import db

    held = tmp_path / "held"
    holder = _spawn(f"""
        import time
        from hunyuan_mt.store.db import _migration_lock, open_engine
        engine = open_engine("sqlite:///{tmp_path / 'other.db'}")
        with _migration_lock(engine):
            open({str(held)!r}, "w").close()
            time.sleep(120)
    """)
    try:
        deadline = time.monotonic() + 60
        while not held.exists():
            assert time.monotonic() < deadline and holder.poll() is None
            time.sleep(0.02)
        monkeypatch.setattr(db, "MIGRATION_WAIT_S", 0.5)
        with pytest.raises(StoreUnavailable) as info:
            db.open_engine(f"sqlite:///{tmp_path / 'other.db'}")
        assert f"process {holder.pid}" in info.value.message and "migrating the store's schema" in info.value.message
        assert "gave up after 0.5 s" in info.value.message
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(30)
