"""Concurrency over HTTP, as a user meets it: the same requests one at a time, then from many clients at once.

    python -m bench.httpload                      # 3 runs, 96 requests over 20 routes, 16 clients
    python -m bench.httpload --runs 5 --clients 32
    python -m bench.httpload --client threads     # the clients as 16 threads of httpx.Client

It starts `app.py` on 127.0.0.1 (the real server: FastAPI, the LibreTranslate route, the service) and builds 20
routes from the server's own language table: every direct pair of the registered adapters, then two-hop pivot
routes. Source texts in each language are made once by the server itself (English phrases translated into that
language), so every route gets inputs in its own source language. Then, per run:

1. the request list (fixed seed) sent sequentially by one client (keep-alive);
2. the same list sent by `--clients` closed-loop clients at once.

Reported: requests per second of both passes and their ratio, latency percentiles, whether every concurrent
answer equals the sequential answer to the same request (a row's output must not depend on its batch), and the CPU
the load generator and the server spent per request in each pass. Medians over the runs. Results:
bench/results/httpload.json and httpload.md.

The load generator shares the machine with the server, so its own CPU is taken from the server. The clients are
asyncio tasks on one aiohttp session (`--client aiohttp`, the default; the sequential pass is one such task): on the
2-core box they cost 0.4-0.7 ms of CPU a request in either pass, 0.03-0.06 cores. As 16 threads each with an httpx.Client
(`--client threads`, this bench's client until 2026-12-05) they cost 4.6-7.0 ms a request in the concurrent pass
against 1.0-1.2 sequentially, 0.41-0.47 of the box's 2 cores, which the server then lacked: its concurrent pass got
1.30-1.37 cores against 1.64-1.73 under aiohttp (BENCHMARKS.md, 2026-12-05).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import psutil

from hunyuan_mt.config import PROJECT_ROOT

from .loadgen import percentile
from .soak import Server, free_port
from .workload import TEXTS

RESULTS = PROJECT_ROOT / "bench" / "results"


def routes_from(languages: list[dict[str, Any]], direct: list[str], want: int) -> list[tuple[str, str]]:
    """Direct pairs first, then pivot routes (reachable targets that have no adapter of their own)."""
    targets = {lang["code"]: lang.get("targets") or [] for lang in languages}
    routes = [tuple(p.split("2", 1)) for p in direct]
    codes = sorted({c for p in direct for c in p.split("2", 1)})
    for src in codes:
        for tgt in targets.get(src, []):
            if (src, tgt) not in routes and src != tgt:
                routes.append((src, tgt))
    return routes[:want]  # type: ignore[return-value]


def translate(client: httpx.Client, base: str, text: str, src: str, tgt: str) -> tuple[str, float]:
    t0 = time.perf_counter()
    response = client.post(f"{base}/translate", json=_body(text, src, tgt))
    elapsed = time.perf_counter() - t0
    response.raise_for_status()
    return response.json()["translatedText"], elapsed


def _body(text: str, src: str, tgt: str) -> dict[str, str]:
    return {"q": text, "source": src, "target": tgt, "format": "text"}


#: What a pass returns: each request's answer (None where it failed), the latencies, the wall time, the errors.
Pass = tuple[list[str | None], list[float], float, list[str]]


def sequential(base: str, requests: list[tuple[str, str, str]]) -> tuple[list[str], list[float], float]:
    outs, lat = [], []
    with httpx.Client(timeout=120) as client:
        t0 = time.perf_counter()
        for text, src, tgt in requests:
            out, dt = translate(client, base, text, src, tgt)
            outs.append(out)
            lat.append(dt)
        return outs, lat, time.perf_counter() - t0


def threaded(base: str, requests: list[tuple[str, str, str]], clients: int) -> Pass:
    """`clients` closed-loop threads, each with its own httpx.Client (one request at a time: `sequential`)."""
    if clients == 1:
        outs, lat, seconds = sequential(base, requests)
        return list(outs), lat, seconds, []
    outs: list[str | None] = [None] * len(requests)
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    todo = iter(range(len(requests)))
    start = threading.Barrier(clients + 1)

    def client_loop() -> None:
        with httpx.Client(timeout=120) as client:
            start.wait()
            while True:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                try:
                    out, dt = translate(client, base, *requests[i])
                except httpx.HTTPError as exc:
                    with lock:
                        errors.append(f"{requests[i][1]}>{requests[i][2]}: {exc}")
                    continue
                with lock:
                    outs[i] = out
                    lat.append(dt)

    threads = [threading.Thread(target=client_loop, name=f"client-{n}") for n in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return outs, lat, time.perf_counter() - t0, errors


def aiohttp_pass(base: str, requests: list[tuple[str, str, str]], clients: int) -> Pass:
    """`clients` closed-loop asyncio tasks on one aiohttp session (keep-alive, a connection each)."""
    return asyncio.run(_aio_pass(base, requests, clients))


async def _aio_pass(base: str, requests: list[tuple[str, str, str]], clients: int) -> Pass:
    outs: list[str | None] = [None] * len(requests)
    lat: list[float] = []
    errors: list[str] = []
    todo = iter(range(len(requests)))  # one event loop: no lock needed
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients), timeout=timeout) as session:

        async def client_loop() -> None:
            for i in todo:
                text, src, tgt = requests[i]
                t0 = time.perf_counter()
                try:
                    async with session.post(f"{base}/translate", json=_body(text, src, tgt)) as response:
                        response.raise_for_status()
                        outs[i] = (await response.json())["translatedText"]
                except aiohttp.ClientError as exc:
                    errors.append(f"{src}>{tgt}: {exc}")
                    continue
                lat.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(client_loop() for _ in range(clients)))
        return outs, lat, time.perf_counter() - t0, errors


CLIENTS = {"aiohttp": aiohttp_pass, "threads": threaded}


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def measured(run_pass: Any, server: Server, base: str, requests: list[tuple[str, str, str]], clients: int
             ) -> tuple[Pass, dict[str, float]]:
    """One pass, with the CPU seconds the load generator (this process) and the server spent on it."""
    me = psutil.Process()
    mine, theirs = _cpu(me), _cpu(server.ps)
    result = run_pass(base, requests, clients)
    seconds = result[2]
    mine, theirs = _cpu(me) - mine, _cpu(server.ps) - theirs
    n = len(requests)
    return result, {"client_ms_per_request": round(mine * 1000 / n, 2), "client_cores": round(mine / seconds, 2),
                    "server_ms_per_request": round(theirs * 1000 / n, 2), "server_cores": round(theirs / seconds, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.httpload", description=__doc__.split("\n")[0])
    p.add_argument("--config", default=None, help="config profile or YAML path (default: configs/default.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override, repeatable")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--routes", type=int, default=20)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--client", choices=sorted(CLIENTS), default="aiohttp",
                   help="the load generator: asyncio tasks on one aiohttp session (default), or threads each with "
                        "an httpx.Client")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="hmt-httpload-"))
    # The engine is what is measured: the translation memory would answer some of the texts without it.
    server = Server(free_port(), work, work / "server.log", args.config, ["tm.enabled=false", *args.set])
    try:
        ready_s = server.wait_ready(300)
        base = server.base
        with httpx.Client(timeout=120) as client:
            languages = client.get(f"{base}/languages").json()
            direct = [a["pair"] for a in client.get(f"{base}/adapters").json()["registered"] if a["usable"]]
            routes = routes_from(languages, direct, args.routes)
            # Source texts per language, made by the server itself from the English phrases.
            sources: dict[str, list[str]] = {"en": list(TEXTS)}
            for code in sorted({src for src, _ in routes} - {"en"}):
                sources[code] = [translate(client, base, t, "en", code)[0] for t in TEXTS[:8]]
        rng = random.Random(0)
        requests = []
        for i in range(args.requests):
            src, tgt = routes[i % len(routes)]
            requests.append((rng.choice(sources[src]), src, tgt))
        rng.shuffle(requests)
        run_pass = CLIENTS[args.client]
        run_pass(base, requests[:20], 1)  # warm-up: every route's adapters attached once
        runs = []
        for r in range(args.runs):
            (seq_out, seq_lat, seq_s, seq_errors), seq_cpu = measured(run_pass, server, base, requests, 1)
            (con_out, con_lat, con_s, errors), con_cpu = measured(run_pass, server, base, requests, args.clients)
            errors = seq_errors + errors
            identical = sum(1 for a, b in zip(seq_out, con_out) if a is not None and a == b)
            run = {"run": r, "sequential_s": round(seq_s, 3), "concurrent_s": round(con_s, 3),
                   "sequential_rps": round(len(requests) / seq_s, 2), "concurrent_rps": round(len(requests) / con_s, 2),
                   "speedup": round(seq_s / con_s, 2), "identical": identical, "errors": errors,
                   "sequential_p50_ms": round(percentile(seq_lat, 50) * 1000, 1),
                   "concurrent_p50_ms": round(percentile(con_lat, 50) * 1000, 1),
                   "concurrent_p95_ms": round(percentile(con_lat, 95) * 1000, 1),
                   "sequential_cpu": seq_cpu, "concurrent_cpu": con_cpu}
            runs.append(run)
            print(f"[httpload] run {r}: sequential {run['sequential_rps']} req/s, {args.clients} clients "
                  f"{run['concurrent_rps']} req/s = {run['speedup']}x; identical {identical}/{len(requests)}; "
                  f"errors {len(errors)}; load generator {con_cpu['client_cores']} cores, server "
                  f"{seq_cpu['server_cores']} → {con_cpu['server_cores']} cores", flush=True)
        with httpx.Client(timeout=30) as client:
            engine = [line for line in client.get(f"{base}/metrics").text.splitlines()
                      if line.startswith("hmt_engine_")]
    finally:
        server.stop()
    med = {k: statistics.median(run[k] for run in runs) for k in
           ("sequential_rps", "concurrent_rps", "speedup", "sequential_p50_ms", "concurrent_p50_ms",
            "concurrent_p95_ms")}
    for which in ("sequential_cpu", "concurrent_cpu"):
        med[which] = {k: statistics.median(run[which][k] for run in runs) for k in runs[0][which]}
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "ready_s": round(ready_s, 1),
              "routes": [f"{s}>{t}" for s, t in routes], "runs": runs, "median": med,
              "all_identical": all(run["identical"] == len(requests) and not run["errors"] for run in runs),
              "engine": engine}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "httpload.json").write_text(json.dumps(result, indent=2))
    (args.out / "httpload.md").write_text(markdown(result, len(requests), args.clients, args.client))
    print(markdown(result, len(requests), args.clients, args.client))
    return 0 if result["all_identical"] else 1


def markdown(result: dict[str, Any], n: int, clients: int, client: str) -> str:
    med = result["median"]
    generator = ("asyncio tasks on one aiohttp session" if client == "aiohttp"
                 else "threads, each with an httpx.Client")
    lines = [f"# HTTP: {n} requests over {len(result['routes'])} routes, sequential vs {clients} clients", "",
             f"Routes: {', '.join(result['routes'])}.", "", f"Load generator: {generator} (`--client {client}`).",
             "", "| run | sequential req/s | concurrent req/s | speed-up | identical | sequential p50 ms | "
             "concurrent p50 ms | concurrent p95 ms | generator CPU ms/request (seq, conc) | server cores "
             "(seq, conc) |", "|---|---|---|---|---|---|---|---|---|---|"]

    def cpu(row: dict[str, Any]) -> str:
        seq, con = row["sequential_cpu"], row["concurrent_cpu"]
        return (f"{seq['client_ms_per_request']}, {con['client_ms_per_request']} | "
                f"{seq['server_cores']}, {con['server_cores']}")

    for run in result["runs"]:
        lines.append(f"| {run['run']} | {run['sequential_rps']} | {run['concurrent_rps']} | {run['speedup']}x | "
                     f"{run['identical']}/{n} | {run['sequential_p50_ms']} | {run['concurrent_p50_ms']} | "
                     f"{run['concurrent_p95_ms']} | {cpu(run)} |")
    lines.append(f"| median | {med['sequential_rps']} | {med['concurrent_rps']} | **{med['speedup']}x** | | "
                 f"{med['sequential_p50_ms']} | {med['concurrent_p50_ms']} | {med['concurrent_p95_ms']} | {cpu(med)} |")
    lines += ["", f"Every concurrent answer equal to the sequential one: {result['all_identical']}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
