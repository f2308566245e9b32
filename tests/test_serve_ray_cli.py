"""`python -m hunyuan_mt serve-ray` as a user runs it, in a subprocess with its own local Ray cluster.

The README's example, `serve-ray --replicas 2`, on a 2-CPU Ray node: 4 replicas of 1 CPU cannot all be placed,
so the CLI sizes their CPU reservations to fit, says so in one line, and becomes healthy. A group that needs GPUs
on a node without any is refused before anything is deployed. This module runs after test_serve_ray.py, whose
in-process cluster is shut down by then (the subprocess must start its own, not join that one).
"""

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
import pytest
import yaml
from ports import free_port

pytest.importorskip("ray")

from hunyuan_mt.config import PROJECT_ROOT  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # start a cluster of its own
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Lines:
    """A subprocess's merged output, read in a thread, so the test can wait for a line without blocking."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._cv = threading.Condition()
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()

    def wait_for(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                found = next((line for line in self.lines if line.startswith(prefix)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line starting {prefix!r} in:\n" + "\n".join(self.lines[-40:]))
                self._cv.wait(left)


def _sigint_ignored(argv: list[str]) -> list[str]:
    """`argv` run by a shell that ignores SIGINT and execs it, so that it starts with SIGINT ignored. Not a
    `preexec_fn`: that runs Python in the forked child of this multi-threaded worker, where the Ray tests leave
    gRPC's fork handlers, and such a child once aborted in them (SIGABRT, "epoll_wait error: Bad file
    descriptor") before it ran anything."""
    return ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]


@pytest.fixture()
def serve_ray() -> Iterator[tuple[subprocess.Popen, Lines, int]]:
    port = free_port()
    # Started as a script starts it in the background: with SIGINT ignored (POSIX shells do that when job control
    # is off, and so does a test runner run with `&`); serve-ray must still stop on it.
    proc = subprocess.Popen(
        _sigint_ignored([sys.executable, "-m", "hunyuan_mt", "serve-ray", "--replicas", "2", "--num-cpus", "2",
                         "--port", str(port)]),
        cwd=PROJECT_ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield proc, Lines(proc), port
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def test_readme_example_replicas_2_on_two_cpus_becomes_healthy(serve_ray) -> None:
    proc, out, port = serve_ray
    sized = out.wait_for("serve-ray: the groups ask for 4 CPUs", 120)
    assert "each replica reserves less instead (hot 0.5, tail 0.5 CPU), so all 4 start" in sized
    out.wait_for("serve-ray: ready in ", 360)
    url = f"http://127.0.0.1:{port}"
    # `ready` is printed only once every replica is up and warm: /health cannot reach one that is starting.
    for _ in range(10):
        assert httpx.get(f"{url}/health", timeout=60).json() == {"status": "ok"}
    groups = httpx.get(f"{url}/status", timeout=60).json()["ray"]["groups"]
    assert [(g["name"], g["running"]) for g in groups] == [("hot", 2), ("tail", 2)]
    r = httpx.post(f"{url}/translate", json={"q": "Unknown error", "source": "en", "target": "es"}, timeout=120)
    assert r.status_code == 200 and r.json()["translatedText"]
    assert r.headers["x-served-by"].startswith("hot#")
    assert proc.poll() is None
    # Ctrl-C (the README's way out) stops Serve and the local cluster, and the command ends cleanly.
    proc.send_signal(signal.SIGINT)
    assert proc.wait(120) == 0
    out.wait_for("serve-ray: shutting down", 5)


def test_groups_needing_gpus_on_a_cpu_node_are_refused_before_deploying(tmp_path: Path) -> None:
    doc = yaml.safe_load((PROJECT_ROOT / "configs/serve_ray.yaml").read_text())
    for group in doc["applications"][0]["args"]["groups"]:
        group["ray_actor_options"] = {"num_cpus": 1, "num_gpus": 1}
    config = tmp_path / "gpu_groups.yaml"
    config.write_text(yaml.safe_dump(doc))
    done = subprocess.run(
        [sys.executable, "-m", "hunyuan_mt", "serve-ray", "--config", str(config), "--num-cpus", "2",
         "--num-gpus", "0", "--port", str(free_port())],
        cwd=PROJECT_ROOT, env=_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 2
    refusal = [line for line in done.stderr.splitlines() if line.startswith("serve-ray:")]
    assert refusal == ["serve-ray: the groups do not fit this Ray cluster: they need 2 GPUs (the cluster has 0) for "
                       "hot 1 × 1 CPU + 1 GPU, tail 1 × 1 CPU + 1 GPU; use fewer --replicas, change the groups' "
                       "ray_actor_options, or join a bigger cluster with --address"]
    assert "starting" not in done.stdout  # nothing was deployed
    assert "Started a local Ray instance" not in done.stderr  # refused before Ray started the node


def test_sigint_and_sigterm_stop_serve_ray_even_when_sigint_was_inherited_ignored() -> None:
    """`_stop_on_signals` (run once Ray is up): SIGINT raises KeyboardInterrupt though the process started with it
    ignored, and SIGTERM does the same, so both reach serve-ray's shutdown."""
    code = (
        "import os, signal\n"
        "from hunyuan_mt.serve_ray.cli import _stop_on_signals\n"
        "assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN\n"
        "_stop_on_signals()\n"
        "for sig in (signal.SIGINT, signal.SIGTERM):\n"
        "    try:\n"
        "        os.kill(os.getpid(), sig)\n"
        "        __import__('time').sleep(5)\n"
        "        raise SystemExit(f'{sig!r} did not stop it')\n"
        "    except KeyboardInterrupt:\n"
        "        print('stopped by', signal.Signals(sig).name)\n")
    done = subprocess.run(_sigint_ignored([sys.executable, "-c", code]), cwd=PROJECT_ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["stopped by SIGINT", "stopped by SIGTERM"]


def test_without_an_address_serve_ray_starts_a_node_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--address` unset: a local node of its own (address "local"), never a cluster that another process on the
    machine started (ray.init() without an address joins one, and fails when --num-cpus is given)."""
    import argparse

    import ray

    from hunyuan_mt.serve_ray import cli

    asked: list[dict] = []

    class Stop(Exception):
        pass

    def init(**kw: object) -> None:
        asked.append(kw)
        raise Stop

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # run() sets PYTHONPATH for the workers it starts
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    for argv, expected in ((["--num-cpus", "2"], {"address": "local", "num_cpus": 2.0}),
                           (["--address", "ray://head:10001"], {"address": "ray://head:10001"})):
        with pytest.raises(Stop):
            cli.run(parser.parse_args(argv))
        assert asked.pop() == expected
