"""Bounded soak: steady mixed load over HTTP against the real app, watching for leaks.

    python -m bench.soak                     # 10 minutes (2 of warm-up), 8 clients
    python -m bench.soak --minutes 3         # shorter, clearly labelled as such in the results

It starts `app.py` as a separate process on 127.0.0.1 (its own TMPDIR, so temp files can be counted), waits for
/health, and runs closed-loop clients that mix: direct-pair translations over every registered pair, pivot routes,
auto-detected sources, batches, /detect, /languages, small document uploads (translated), oversized uploads (over
the document character limit: refused with 413 after python-multipart spooled them to a temp file) and bad
requests (400). A sampler records the server's RSS, its temp files and the cache's leases.

Pass criteria: RSS at the end grows < 5% over RSS at the end of warm-up; no lease is held once the
load stops; no temp file is left behind that was not there at the end of warm-up; no 5xx and no lost request.
Results: bench/results/soak.json and soak.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import psutil

from hunyuan_mt.config import PROJECT_ROOT
from hunyuan_mt.host.cpu import with_intel_openmp

from .loadgen import percentile
from .workload import TEXTS

RESULTS = PROJECT_ROOT / "bench" / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def count_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


class Server:
    """app.py in its own process, with its own TMPDIR."""

    def __init__(self, port: int, tmpdir: Path, log_path: Path, config: str | None, sets: list[str]) -> None:
        cmd = [sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port)]
        if config:
            cmd += ["--config", config]
        for item in sets:
            cmd += ["--set", item]
        env = dict(os.environ, TMPDIR=str(tmpdir), GRADIO_TEMP_DIR=str(tmpdir / "gradio"), HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False")
        # As ./start.sh starts it: Intel's OpenMP preloaded (hunyuan_mt/host/cpu.py), whatever the caller's shell. From a
        # shell without the preload the server ran on torch's libgomp, where model.cpu_threads resolves to one
        # thread: not what a user runs.
        env = with_intel_openmp(env)
        # The compile cache: the server keeps ./start.sh's unless the environment names one (kernels.compile_cache;
        # inductor's default lives under TMPDIR, which would make every start here a first install's).
        self.log = log_path.open("w")
        self.proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.proc.pid)
        self.base = f"http://127.0.0.1:{port}"

    def wait_ready(self, timeout_s: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"server not ready after {timeout_s} s; see {self.log.name}")

    def rss_mb(self) -> float:
        return self.ps.memory_info().rss / 2**20

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Mix:
    """The request mix. Each op returns (name, expected status set, callable(client) -> response)."""

    def __init__(self, pairs: list[str], languages: list[dict[str, Any]]) -> None:
        self.pairs = pairs
        direct = set(pairs)
        codes = sorted({c for p in pairs for c in p.split("2", 1)})
        # Reachable two-hop routes (src→pivot→tgt) that have no direct adapter, from the service's own table.
        targets = {lang["code"]: set(lang.get("targets") or []) for lang in languages}
        self.pivots = [(s, t) for s in codes for t in sorted(targets.get(s, ())) if s != t and f"{s}2{t}" not in
                       direct][:20]
        self.small_doc = ("\n\n".join(TEXTS[:4]) + "\n").encode()
        # Over limits.max_doc_chars (200k by default) and over python-multipart's 1 MiB in-memory spool, so the
        # upload goes through a temp file that must be removed when the request is refused.
        self.big_doc = (("x" * 79 + "\n") * 14_000).encode()
        self.weights = {"direct": 60, "batch": 8, "pivot": 8, "auto": 6, "detect": 5, "languages": 3,
                        "doc": 4, "doc_too_big": 2, "bad": 4}
        if not self.pivots:
            self.weights["pivot"] = 0

    def pick(self, rng: random.Random) -> str:
        names = list(self.weights)
        return rng.choices(names, weights=[self.weights[n] for n in names])[0]

    def run(self, op: str, client: httpx.Client, rng: random.Random) -> tuple[int, set[int]]:
        text = rng.choice(TEXTS)
        if op == "direct":
            src, tgt = rng.choice(self.pairs).split("2", 1)
            r = client.post("/translate", json={"q": text, "source": src, "target": tgt})
            return r.status_code, {200}
        if op == "batch":
            src, tgt = rng.choice(self.pairs).split("2", 1)
            r = client.post("/translate", json={"q": rng.sample(TEXTS, 4), "source": src, "target": tgt})
            return r.status_code, {200}
        if op == "pivot":
            src, tgt = rng.choice(self.pivots)
            r = client.post("/translate", json={"q": text, "source": src, "target": tgt})
            return r.status_code, {200}
        if op == "auto":
            tgt = rng.choice(self.pairs).split("2", 1)[1]
            r = client.post("/translate", json={"q": text, "source": "auto", "target": tgt})
            return r.status_code, {200, 400}  # detection may pick a language with no route to tgt: a clean 400
        if op == "detect":
            return client.post("/detect", json={"q": text}).status_code, {200}
        if op == "languages":
            return client.get("/languages").status_code, {200}
        if op == "doc":
            src, tgt = rng.choice(self.pairs).split("2", 1)
            r = client.post("/translate_file", data={"source": src, "target": tgt},
                            files={"file": ("note.txt", self.small_doc, "text/plain")})
            if r.status_code == 200:
                url = r.json()["translatedFileUrl"]
                got = client.get(url)
                return got.status_code, {200}
            return r.status_code, {200}
        if op == "doc_too_big":
            src, tgt = rng.choice(self.pairs).split("2", 1)
            r = client.post("/translate_file", data={"source": src, "target": tgt},
                            files={"file": ("big.txt", self.big_doc, "text/plain")})
            return r.status_code, {413}
        # "bad": empty text and an unknown code must be clean 400s.
        if rng.random() < 0.5:
            return client.post("/translate", json={"q": "   ", "source": "en", "target": "es"}).status_code, {400}
        return client.post("/translate", json={"q": text, "source": "xx", "target": "es"}).status_code, {400}


def leases_held(base: str) -> tuple[int, int]:
    """(leases held, resident adapters) from the cache's own counters, through GET /adapters."""
    body = httpx.get(f"{base}/adapters", timeout=10).json()
    resident = body.get("resident") or []
    return sum(int(r.get("leases", 0)) for r in resident), len(resident)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="total duration including warm-up (default 10)")
    p.add_argument("--warmup-minutes", type=float, default=None, help="default: 20%% of the duration, at least 1")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--interval", type=float, default=5.0, help="sampling interval in seconds")
    p.add_argument("--config", default=None)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    warmup_s = 60 * (args.warmup_minutes if args.warmup_minutes is not None else max(1.0, args.minutes * 0.2))
    total_s = 60 * args.minutes
    work = args.out / "tmp" / f"soak-{os.getpid()}"
    tmpdir = work / "server-tmp"
    tmpdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = Server(port, tmpdir, work / "server.log", args.config, args.set)
    result: dict[str, Any] = {"minutes": args.minutes, "warmup_s": warmup_s, "clients": args.clients,
                              "command": "python -m bench.soak " + " ".join(argv if argv is not None else
                                                                             sys.argv[1:]),
                              "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                              "machine": {"cpu_count": os.cpu_count(), "load_avg_at_start": os.getloadavg()}}
    try:
        result["ready_s"] = round(server.wait_ready(300), 1)
        base = server.base
        adapters = httpx.get(f"{base}/adapters", timeout=10).json()
        pairs = [r["pair"] for r in adapters.get("registered") or [] if r.get("usable")]
        languages = httpx.get(f"{base}/languages", timeout=10).json()
        mix = Mix(pairs, languages)
        result["pairs"] = pairs
        result["pivot_routes"] = [f"{s}→{t}" for s, t in mix.pivots]
        result.update(_drive(server, mix, args, warmup_s, total_s, tmpdir))
    finally:
        server.stop()
    result["passed"] = bool(result.get("checks")) and all(result["checks"].values())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(result, indent=2))
    (args.out / "soak.md").write_text(markdown(result))
    print(markdown(result))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if result["passed"] else 1


def _drive(server: Server, mix: Mix, args: argparse.Namespace, warmup_s: float, total_s: float,
           tmpdir: Path) -> dict[str, Any]:
    stop = threading.Event()
    lock = threading.Lock()
    stats: dict[str, dict[str, Any]] = defaultdict(lambda: {"ok": 0, "unexpected": 0, "ms": [], "codes": {}})
    samples: list[dict[str, Any]] = []
    t_start = time.monotonic()

    def client_loop(i: int) -> None:
        rng = random.Random(args.seed * 1000 + i)
        with httpx.Client(base_url=server.base, timeout=120) as client:
            while not stop.is_set():
                op = mix.pick(rng)
                t0 = time.perf_counter()
                try:
                    code, expected = mix.run(op, client, rng)
                except httpx.HTTPError as exc:
                    code, expected = -1, set()
                    with lock:
                        stats[op]["codes"][type(exc).__name__] = stats[op]["codes"].get(type(exc).__name__, 0) + 1
                ms = (time.perf_counter() - t0) * 1000
                with lock:
                    s = stats[op]
                    s["ok" if code in expected else "unexpected"] += 1
                    s["codes"][str(code)] = s["codes"].get(str(code), 0) + 1
                    if time.monotonic() - t_start > warmup_s:
                        s["ms"].append(ms)

    def sampler() -> None:
        while not stop.is_set():
            try:
                held, resident = leases_held(server.base)
            except httpx.HTTPError:
                held, resident = -1, -1
            samples.append({"t_s": round(time.monotonic() - t_start, 1), "rss_mb": round(server.rss_mb(), 1),
                            "tmp_files": len(count_files(tmpdir)), "leases": held, "resident": resident})
            stop.wait(args.interval)

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(args.clients)]
    threads.append(threading.Thread(target=sampler, daemon=True))
    for t in threads:
        t.start()
    stop.wait(warmup_s)
    warm_rss = server.rss_mb()
    warm_files = set(count_files(tmpdir))
    stop.wait(max(0.0, total_s - warmup_s))
    stop.set()
    for t in threads:
        t.join(timeout=150)
    time.sleep(2)  # let the server finish any request it still holds
    end_rss = server.rss_mb()
    held, resident = leases_held(server.base)
    end_files = set(count_files(tmpdir))
    health = httpx.get(f"{server.base}/health", timeout=10).status_code
    after_warm = [s["rss_mb"] for s in samples if s["t_s"] >= warmup_s]
    ops = {}
    for op, s in sorted(stats.items()):
        ops[op] = {"ok": s["ok"], "unexpected": s["unexpected"], "codes": s["codes"],
                   "p50_ms": percentile(s["ms"], 50), "p95_ms": percentile(s["ms"], 95)}
    total_ok = sum(s["ok"] for s in stats.values())
    total_bad = sum(s["unexpected"] for s in stats.values())
    growth = (end_rss - warm_rss) / warm_rss
    leaked = sorted(end_files - warm_files)
    return {
        "requests_ok": total_ok, "requests_unexpected": total_bad,
        "rps": round((total_ok + total_bad) / total_s, 2),
        "rss_mb_end_of_warmup": round(warm_rss, 1), "rss_mb_end": round(end_rss, 1),
        "rss_mb_max_after_warmup": max(after_warm) if after_warm else None,
        "rss_mb_median_after_warmup": statistics.median(after_warm) if after_warm else None,
        "rss_growth": round(growth, 4), "leases_held_after": held, "resident_after": resident,
        "tmp_files_end_of_warmup": len(warm_files), "tmp_files_end": len(end_files), "tmp_files_new": leaked[:20],
        "tmp_files_max_seen": max((s["tmp_files"] for s in samples), default=0),
        "health_after": health, "ops": ops, "samples": samples,
        "checks": {"rss_growth_below_5pct": growth < 0.05, "no_leases_held": held == 0,
                   "no_new_temp_files": not leaked, "no_unexpected_responses": total_bad == 0,
                   "healthy_after": health == 200},
    }


def markdown(r: dict[str, Any]) -> str:
    lines = [f"# Soak: {r['minutes']} min ({r['warmup_s']:.0f} s warm-up), {r['clients']} clients, {r['date_utc']} UTC",
             "", f"Command: `{r['command']}`; load average at start {r['machine']['load_avg_at_start']}.", ""]
    if "checks" not in r:
        return "\n".join(lines + ["Did not run to the end (see soak.json)."]) + "\n"
    lines += [f"Requests: {r['requests_ok']} as expected, {r['requests_unexpected']} unexpected ({r['rps']} req/s); "
              f"pairs {len(r['pairs'])}, pivot routes {len(r['pivot_routes'])}.",
              f"RSS: {r['rss_mb_end_of_warmup']} MB at the end of warm-up → {r['rss_mb_end']} MB at the end "
              f"({r['rss_growth'] * 100:+.2f}%), max after warm-up {r['rss_mb_max_after_warmup']} MB.",
              f"Leases held after the load stopped: {r['leases_held_after']} (resident {r['resident_after']}). "
              f"Temp files: {r['tmp_files_end_of_warmup']} at the end of warm-up, {r['tmp_files_end']} at the end, "
              f"at most {r['tmp_files_max_seen']} seen by the sampler while uploads were in flight"
              f"{', new: ' + ', '.join(r['tmp_files_new']) if r['tmp_files_new'] else ''}. /health after: "
              f"{r['health_after']}.", "",
              "| check | passed |", "|---|---|"]
    lines += [f"| {k} | {'yes' if v else '**no**'} |" for k, v in r["checks"].items()]
    lines += ["", "| operation | as expected | unexpected | status codes | p50 ms | p95 ms |", "|---|---|---|---|---|---|"]
    for op, s in r["ops"].items():
        lines.append(f"| {op} | {s['ok']} | {s['unexpected']} | {s['codes']} | "
                     f"{'–' if s['p50_ms'] is None else round(s['p50_ms'])} | "
                     f"{'–' if s['p95_ms'] is None else round(s['p95_ms'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
