"""Serve at once, compile beside: what makes the CPU step fast (our C++ kernels, the compiled decode step's
packages) is built by a process of its own while the server answers with the eager step, and the server switches
to it, between two decode steps, once it is on disk.

On a fresh machine that build took 190 s of a first start (the kernels 40 s, three packages 150 s on 2 AMD EPYC
cores), all of it before the first answer. Now:

- The server (`TranslationService`) leaves the kernels unbuilt (`kernels.defer`) and serves eagerly: tensor
  operations for attention, fbgemm called through Python. Its answers are the same translations, slower.
- `BackgroundBuild` starts `python -m hunyuan_mt.service.prebuild` (this module's `main`), niced, with the server's
  configuration as it resolved it (the int8 kernel, the thread count: both are part of a package's key). The worker
  builds the kernels, then loads the same model with the same pinned adapters and compiles the step, reporting each
  part on its standard output as one JSON line.
- When a part set is done, the service asks the engine for an upgrade: at a point where no row is decoding it
  activates the kernels or loads the packages (`Backbone.compile_step(build=False)`, a second) and makes a new
  running batch. A row therefore never changes steps midway; eager and compiled steps give the same bits
  (tests/test_compiled_step.py), the attention kernel agrees with the tensor operations to 1e-5.
- A separate process, not a thread: the export and inductor's lowering are Python that would take the GIL from the
  decode thread for seconds at a time, and niced, the worker's compilers yield the cores to requests.

The worker dies with the server (PR_SET_PDEATHSIG), and every lock it takes is an owned one (`locks.py`): a start
killed midway leaves nothing that holds up the next.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Any, Callable

log = logging.getLogger(__name__)

#: The parts a build reports, by name: the kernels, then the packages `decode/compiled.py` makes per architecture.
KERNELS = "CPU kernels"
PACKAGES = {"encoder-decoder": ("encode_cross (one row)", "decoder_step", "encode_cross"),
            "decoder-only": ("llama_step",)}
#: How much the worker's compilers yield to the server (os.nice).
NICENESS = 10


@dataclass
class Part:
    """One thing the background build makes."""

    name: str
    #: "waiting", "building", "done", "failed" or "skipped".
    state: str = "waiting"
    #: Seconds it took (done), or has taken so far (building).
    seconds: float | None = None
    detail: str = ""
    started: float | None = field(default=None, repr=False)

    def view(self) -> dict[str, Any]:
        seconds = self.seconds
        if self.state == "building" and self.started is not None:
            seconds = time.monotonic() - self.started
        out = {"name": self.name, "state": self.state,
               "seconds": None if seconds is None else round(seconds, 1)}
        if self.detail:
            out["detail"] = self.detail
        return out


class BackgroundBuild:
    """The worker process and what it has reported. `on_ready(what)` is called from the reader thread with
    "kernels" when the kernels are on disk and "packages" when every package is."""

    def __init__(self, config: dict[str, Any], kernels: bool, packages: tuple[str, ...],
                 on_ready: Callable[[str], None]) -> None:
        self.config = config
        self.parts = ([Part(KERNELS)] if kernels else []) + [Part(name) for name in packages]
        self.on_ready = on_ready
        self.started = time.monotonic()
        self.finished: float | None = None
        #: Why the build as a whole failed (the worker exited early), or None.
        self.error: str | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: deque[str] = deque(maxlen=20)
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        from ..config import PROJECT_ROOT

        self._proc = subprocess.Popen([sys.executable, "-m", "hunyuan_mt.service.prebuild"], cwd=str(PROJECT_ROOT),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, bufsize=1, start_new_session=True)
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"config": self.config, "parent": os.getpid(),
                                           "kernels": any(p.name == KERNELS for p in self.parts),
                                           "packages": [p.name for p in self.parts if p.name != KERNELS]}))
        self._proc.stdin.close()
        threading.Thread(target=self._read_errors, name="hmt-prebuild-stderr", daemon=True).start()
        threading.Thread(target=self._read_events, name="hmt-prebuild", daemon=True).start()
        log.info("building %s in the background (pid %d); requests are served by the eager step meanwhile",
                 ", ".join(p.name for p in self.parts), self._proc.pid)

    def close(self) -> None:
        """Stop the worker if it still runs (the server is stopping)."""
        self._closed = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    @property
    def done(self) -> bool:
        return self.finished is not None

    def status(self) -> dict[str, Any]:
        with self._lock:
            parts = [p.view() for p in self.parts]
            finished = self.finished
        done = sum(p["state"] in ("done", "skipped") for p in parts)
        state = ("failed" if self.error or any(p["state"] == "failed" for p in parts)
                 else "done" if finished is not None else "building")
        out: dict[str, Any] = {"state": state, "parts": parts, "done": done, "total": len(parts),
                               "seconds": round((finished or time.monotonic()) - self.started, 1)}
        if self.error:
            out["error"] = self.error
        return out

    def _part(self, name: str) -> Part | None:
        return next((p for p in self.parts if p.name == name), None)

    def _read_errors(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in self._proc.stderr:
            line = line.rstrip()
            if line:
                self._stderr.append(line)
                log.debug("prebuild: %s", line)

    def _read_events(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self._apply(event)
        code = self._proc.wait()
        with self._lock:
            self.finished = time.monotonic()
            unfinished = [p for p in self.parts if p.state in ("waiting", "building")]
            if code != 0 and not self._closed:
                last = next((x for x in reversed(self._stderr) if x.strip()), f"exit status {code}")
                self.error = f"the build process stopped early ({last[:300]})"
                for part in unfinished:
                    part.state, part.detail = "failed", "the build process stopped early"
        if self.error:
            log.warning("background build: %s; requests stay on the eager step", self.error)
        else:
            log.info("background build finished in %.1f s", self.finished - self.started)

    def _apply(self, event: dict[str, Any]) -> None:
        name, what = event.get("part"), event.get("event")
        ready: str | None = None
        with self._lock:
            part = self._part(str(name)) if name is not None else None
            if part is None:
                if name is not None and what in ("building", "done"):
                    # A package this build did not foresee (a model of another shape): shown all the same.
                    part = Part(str(name))
                    self.parts.append(part)
                else:
                    return
            if what == "building":
                part.state, part.started = "building", time.monotonic()
            elif what in ("done", "failed", "skipped"):
                part.state = what
                part.seconds = event.get("seconds", part.seconds)
                part.detail = str(event.get("detail", ""))
            if what in ("done", "failed", "skipped"):
                if part.name == KERNELS:
                    ready = "kernels"
                elif all(p.state in ("done", "failed", "skipped") for p in self.parts if p.name != KERNELS):
                    ready = "packages"
        if what in ("done", "failed", "skipped"):
            level = logging.WARNING if what == "failed" else logging.INFO
            log.log(level, "background build: %s %s%s%s", part.name, what,
                    f" in {part.seconds:.1f} s" if part.seconds is not None else "",
                    f" ({part.detail})" if part.detail else "")
        if ready is not None and not self._closed:
            try:
                self.on_ready(ready)
            except Exception:  # noqa: BLE001 - the switch is the service's; its failure must not stop the reader
                log.exception("background build: switching to the %s failed", ready)


def config_for_worker(cfg: Any, backbone: Any) -> dict[str, Any]:
    """The service's configuration as its backbone resolved it: a package's key holds the int8 kernel and the
    thread count, so the worker must not choose them again (a timing probe may choose otherwise)."""
    import torch

    data = cfg.to_dict()
    data["model"].update(quantization=backbone.cfg.quantization, int8_kernel=backbone.int8_kernel or "auto",
                         cpu_threads=torch.get_num_threads(), warmup=False, compile="off")
    return data


def describe(status: dict[str, Any]) -> str:
    """One line for the page and the log: what is still being built and how far it is."""
    parts = status.get("parts", [])
    if status.get("state") == "done":
        return f"full speed: built {status['done']} of {status['total']} parts in {status['seconds']:.0f} s"
    if status.get("state") == "failed":
        failed = ", ".join(p["name"] for p in parts if p["state"] == "failed")
        return f"eager step: building {failed or 'the fast step'} failed ({status.get('error') or 'see the log'})"
    now = next((p for p in parts if p["state"] == "building"), None)
    doing = f"; now {now['name']} ({now['seconds']:.0f} s)" if now else ""
    return (f"compiling for this CPU in the background: {status['done']} of {status['total']} parts done{doing}; "
            "the eager step answers meanwhile")


# ---------------------------------------------------------------------------------------------------------------
# The worker


class _Events:
    """The worker's report: one JSON line per event on the standard output it was started with (everything else
    that writes to fd 1, tqdm bars or libraries' prints, goes to standard error instead)."""

    def __init__(self) -> None:
        self._out: IO[str] = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)

    def __call__(self, part: str, event: str, seconds: float | None = None, detail: str = "") -> None:
        record: dict[str, Any] = {"part": part, "event": event}
        if seconds is not None:
            record["seconds"] = round(seconds, 2)
        if detail:
            record["detail"] = detail[:300]
        self._out.write(json.dumps(record) + "\n")


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:250]}"


def _build_kernels(tell: _Events) -> bool:
    from .. import kernels

    tell(KERNELS, "building")
    t0 = time.perf_counter()
    if kernels.activate():
        tell(KERNELS, "done", time.perf_counter() - t0)
        return True
    tell(KERNELS, "failed", time.perf_counter() - t0, "the C++ kernels could not be built here (the server log says "
         "why); attention runs as tensor operations")
    return False


def _compile_packages(config: dict[str, Any], names: list[str], tell: _Events) -> None:
    from .. import kernels
    from ..runtime.backbone import load_backbone
    from ..config import config_from_dict
    from ..decode import aot
    from ..adapters.attach import attach_adapters
    from ..store import Store

    cfg = config_from_dict(config)
    if kernels.state() == "unknown":
        kernels.activate()  # a package calls the kernels where they are built: load them as the server will

    def listener(label: str, event: str, seconds: float) -> None:
        tell(label, "building" if event == "compiling" else "done", None if event == "compiling" else seconds,
             "" if event != "loaded" else "on disk already")

    aot.LISTENERS.append(listener)
    backbone = load_backbone(cfg.model)
    store = Store.open(cfg.store.url, cfg.store.dir)
    attach_adapters(cfg, backbone, store)
    if not backbone.compile_step(build=True):
        step = backbone.compiled[0] if backbone.compiled else None
        reason = (step.error if step is not None and step.error else backbone.compile_note() or "compiling failed")
        for name in names:
            tell(name, "failed", None, reason)


def main() -> int:
    """`python -m hunyuan_mt.service.prebuild`: reads {"config", "parent", "kernels", "packages"} as JSON on standard
    input; builds; reports on standard output. Exit status 0 when it got to the end (parts may have failed)."""
    from ..host.helpers import become_helper

    request = json.loads(sys.stdin.read())
    become_helper(int(request["parent"]), "hmt-prebuild", die_with_spawner=True)
    os.nice(NICENESS)  # inherited by the compilers it starts
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    tell = _Events()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if request.get("kernels"):
        _build_kernels(tell)
    names = list(request.get("packages") or [])
    if names:
        try:
            _compile_packages(request["config"], names, tell)
        except Exception as exc:  # noqa: BLE001 - whatever stops the compile is reported, the server goes on eagerly
            for name in names:
                tell(name, "failed", None, _first_line(exc))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

