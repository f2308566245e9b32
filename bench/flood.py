"""A flood of one kind of request from one client address, in a process of its own: what bench/fair_shares.py
and tests/test_fair_shares.py turn on against a server while they time another caller.

The flood runs apart from the server's process on purpose: a client loop in the server's own interpreter would
compete with it for the interpreter lock, and a test would time that instead of the server's fairness.

    python -m bench.flood '<spec as JSON>'      # runs until its stdin closes (or `seconds`), then prints results

The spec: url, path, method ("POST"), address (the client's, 127.0.0.x), workers, pace_s (at most one attempt a
worker every pace_s: the flood this reproduces was 1,000 calls in 24 s), seconds, and the request: json, or files
({field: [name, text or "@path", content type]} with `repeat` times the text; `unique`: each attempt's file a
different one), data, headers, params. The results, one JSON
line: the status codes in order, and the last refusals (status, Retry-After, body).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REFUSALS = (408, 413, 429, 503)
#: The project folder, where `-m bench.flood` is found.
_ROOT = str(Path(__file__).resolve().parent.parent)


def _request(spec: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for name in ("json", "data", "headers", "params"):
        if spec.get(name) is not None:
            kw[name] = spec[name]
    if spec.get("files"):
        kw["files"] = {field: (name, _content(text, int(spec.get("repeat", 1))), kind)
                       for field, (name, text, kind) in spec["files"].items()}
    return kw


def _unique(request: dict[str, Any], n: int) -> dict[str, Any]:
    """The request with each file's content made its own (a first line naming the attempt): a server that stores
    uploads by content would keep one copy of the same file sent a hundred times."""
    files = {field: (name, f"attempt {n}\n".encode() + data, kind)
             for field, (name, data, kind) in request.get("files", {}).items()}
    return {**request, "files": files}


def _content(text: str, repeat: int) -> bytes:
    """A file's bytes: "@<path>" reads them from that file (large or binary ones, which a command line cannot
    carry), anything else is the text itself, `repeat` times."""
    if text.startswith("@"):
        return Path(text[1:]).read_bytes()
    return text.encode("utf-8") * repeat


def flood(spec: dict[str, Any], stop: threading.Event) -> dict[str, Any]:
    import httpx

    request = _request(spec)
    counter = itertools.count()
    codes: list[int] = []
    refusals: list[dict[str, Any]] = []
    ends = time.monotonic() + float(spec.get("seconds", 60))
    pace = float(spec.get("pace_s", 0.2))

    def worker() -> None:
        transport = httpx.HTTPTransport(local_address=spec.get("address", "127.0.0.2"))
        with httpx.Client(transport=transport, base_url=spec["url"], timeout=120) as client:
            while not stop.is_set() and time.monotonic() < ends:
                started = time.monotonic()
                kw = _unique(request, next(counter)) if spec.get("unique") else request
                try:
                    reply = client.request(spec.get("method", "POST"), spec["path"], **kw)
                except httpx.HTTPError:
                    codes.append(0)
                else:
                    codes.append(reply.status_code)
                    if reply.status_code in REFUSALS:
                        refusals.append({"status": reply.status_code, "retry_after": reply.headers.get("retry-after"),
                                         "body": reply.text[:300], "at": time.monotonic()})
                        del refusals[:-200]
                stop.wait(max(0.0, pace - (time.monotonic() - started)))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(int(spec.get("workers", 8)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(float(spec.get("seconds", 60)) + 130)
    return {"codes": codes, "refusals": refusals}


class Flood:
    """`with Flood(spec) as f:` runs the flood in a child process while the block runs; `f.codes` and
    `f.refusals` once it has ended."""

    def __init__(self, **spec: Any) -> None:
        self.spec = spec
        self.codes: list[int] = []
        self.refusals: list[dict[str, Any]] = []

    def __enter__(self) -> "Flood":
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.flood", json.dumps(self.spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=_ROOT)
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()  # the flood stops at its workers' next attempt
        out = self.proc.stdout.read()
        self.proc.wait(timeout=150)
        result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"codes": [], "refusals": []}
        self.codes, self.refusals = result["codes"], result["refusals"]


def main() -> int:
    spec = json.loads(sys.argv[1])
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    print(json.dumps(flood(spec, stop)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
