"""Stopping the server as systemd, docker and a terminal do: SIGTERM or SIGINT, to the server alone or to its whole
process group. It must exit 0 without a warning or traceback, with the language detector's helper process gone
(not orphaned) and no file left in its temp folder; and a server killed outright takes the helper with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import psutil
import pytest

from ports import wait_healthy
from web_server import WEB_BACKEND, free_port

ROOT = Path(__file__).resolve().parents[1]


class AppProcess:
    """`python app.py` in a process group of its own, warm-up on (so the detector's helper runs), its output
    collected."""

    def __init__(self, tmp: Path, extra: list[str]) -> None:
        self.port = free_port()
        self.tmp = tmp
        env = dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=str(tmp), HMT_AUTH="")
        self.proc = subprocess.Popen(
            [sys.executable, "app.py", "--port", str(self.port), "--set", "model.warmup=true", *extra],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stdout.readline, "")),
                                        daemon=True)
        self._reader.start()

    def wait_healthy(self, timeout: float = 180.0) -> None:
        wait_healthy(self.port, self.proc, self.output, "server", timeout)

    def helpers(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def output(self) -> str:
        return "".join(self.lines)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


@pytest.fixture()
def app(tmp_path: Path, web_cfg) -> Iterator[AppProcess]:
    extra = [] if WEB_BACKEND == "demo" else [
        "--set", f"model.path={web_cfg.model.path}", "--set", f"cache.adapters_dir={web_cfg.cache.adapters_dir}",
        "--set", "cache.pinned=[en2es, es2en]", "--set", "routing.pivot=en"]
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = AppProcess(tmp, extra)
    try:
        yield proc
    finally:
        proc.close()


def _gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return alive


# Each signal, and each receiver, once (systemd and docker: SIGTERM to the group; a terminal's Ctrl-C: SIGINT to the
# group; `kill`: SIGTERM to the server). A server start costs ~18 s of the suite; the fourth pairing adds no path.
@pytest.mark.parametrize("to, sig", [("group", "SIGTERM"), ("group", "SIGINT"), ("server", "SIGTERM")])
def test_a_stop_signal_ends_the_server_cleanly(app: AppProcess, sig: str, to: str) -> None:
    app.wait_healthy()
    # A request that ran through the detector: its helper has served, not only started.
    r = httpx.post(f"http://127.0.0.1:{app.port}/translate", json={"q": "Hola amigo", "source": "auto",
                                                                     "target": "en"}, timeout=60)
    assert r.status_code == 200, r.text
    helpers = app.helpers()
    assert helpers, "the language detector's helper process should be running"
    number = getattr(signal, sig)
    if to == "group":
        os.killpg(app.proc.pid, number)
    else:
        os.kill(app.proc.pid, number)
    assert app.proc.wait(60) == 0, app.output()
    app._reader.join(10)
    out = app.output()
    for bad in ("Warning", "leaked", "Traceback", "Error"):
        assert bad not in out, out
    assert "hunyuan_mt.app: stopped" in out
    assert not _gone(helpers, 10), "the detector's helper outlived the server"
    left = [p for p in app.tmp.rglob("*") if p.is_file()]
    assert not left, left


def test_a_killed_server_takes_the_detector_helper_with_it(app: AppProcess) -> None:
    """SIGKILL leaves no chance to clean up: the helper notices its parent is gone and leaves by itself."""
    app.wait_healthy()
    helpers = app.helpers()
    assert helpers
    app.proc.kill()
    app.proc.wait(30)
    alive = _gone(helpers, 15)
    assert not alive, f"orphaned helper processes: {[p.pid for p in alive]}"


def test_a_stopping_server_leaves_a_stuck_request_thread_behind_after_its_wait() -> None:
    """A request thread still in a slow parse kept a SIGTERM'd server in `threading._shutdown` until it was killed.
    After its wait the server exits without it; a thread that ends in time is simply waited for."""
    import threading

    import app as entry

    release = threading.Event()
    stuck = threading.Thread(target=release.wait, name="AnyIO worker thread", daemon=False)
    quick = threading.Thread(target=lambda: release.wait(0.2), name="quick", daemon=False)
    stuck.start()
    quick.start()
    exits: list[int] = []
    try:
        t0 = time.monotonic()
        mine = lambda: [threading.current_thread(), stuck, quick]  # noqa: E731 - not the test runner's threads
        entry.exit_when_stuck(0.5, exit=exits.append, threads=mine)
        assert exits == [0] and 0.4 <= time.monotonic() - t0 < 5
        assert not quick.is_alive()
    finally:
        release.set()
        stuck.join(5)
    exits.clear()
    entry.exit_when_stuck(0.5, exit=exits.append, threads=mine)
    assert exits == []  # nothing left: the normal exit
