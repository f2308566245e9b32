"""The first request after `/health` says ok, against the same request at steady state, as a newcomer meets it.

    python -m bench.first_request                 # 3 starts of app.py, default profile
    python -m bench.first_request --runs 5 --set model.compile=false

Each run starts `app.py` on 127.0.0.1 in a process of its own (its own TMPDIR), polls /health until 200, then sends
each kind of request once, in this order, and then 5 more times each: an auto-detected short Spanish text to en,
an auto-detected sentence, each pinned pair, a pivot route, and one more registered pair that is not pinned
(its adapter has to be attached: the only kind the warm-up leaves cold on purpose). A kind's ratio is its first
latency over the median of the 5 that follow. Then 6 streamed chat completions: the first one's first piece of
translation as a share of its whole stream, against the later ones'. Reported: every run's ratios and their
medians, and the server's own warm-up line. Results: bench/results/first_request.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx


from .report import write_results
from .soak import Server, free_port

REPEATS = 5

#: (kind, body) in the order they are sent; the demo's pinned pairs are en2es and es2en, its pivot en.
KINDS: list[tuple[str, dict[str, Any]]] = [
    ("auto, short (es→en)", {"q": "¿Dónde está la estación?", "source": "auto", "target": "en"}),
    ("auto, sentence (en→es)", {"q": "The printer on the second floor is out of paper.", "source": "auto",
                                "target": "es"}),
    ("pinned en→es", {"q": "Open the settings to change the folder.", "source": "en", "target": "es"}),
    ("pinned es→en", {"q": "No se pudo abrir el archivo.", "source": "es", "target": "en"}),
    ("pivot es→en→de", {"q": "La impresora no tiene papel.", "source": "es", "target": "de"}),
    ("unpinned en→fr (adapter attach)", {"q": "The file could not be saved.", "source": "en", "target": "fr"}),
]


def _post(client: httpx.Client, body: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    response = client.post("/translate", json=body)
    elapsed = (time.perf_counter() - t0) * 1000
    response.raise_for_status()
    return elapsed


#: The chat stream sent after the kinds above: a text long enough to take several steps (its first piece comes at
#: the first step's end), by the page's and the OpenAI clients' streaming path.
STREAM_BODY = {"model": "en2es", "stream": True, "messages": [{"role": "user", "content":
               "The printer on the second floor is out of paper, so print the report on the third floor."}]}


def _stream(client: httpx.Client) -> tuple[float, float]:
    """(ms to the first piece of the translation, ms to the end) of one streamed chat completion."""
    t0 = time.perf_counter()
    first = None
    with client.stream("POST", "/v1/chat/completions", json=STREAM_BODY) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if first is None and line.startswith("data: {"):
                delta = json.loads(line[len("data: "):])["choices"][0]["delta"]
                if delta.get("content"):
                    first = (time.perf_counter() - t0) * 1000
    whole = (time.perf_counter() - t0) * 1000
    return (first if first is not None else whole), whole


def one_run(index: int, config: str | None, sets: list[str], work: Path) -> dict[str, Any]:
    port = free_port()
    tmp = work / f"run{index}"
    tmp.mkdir()
    server = Server(port, tmp, work / f"server{index}.log", config, sets)
    try:
        ready_s = server.wait_ready(600)
        with httpx.Client(base_url=server.base, timeout=120) as client:
            firsts = {kind: _post(client, body) for kind, body in KINDS}
            steady = {kind: statistics.median(_post(client, body) for _ in range(REPEATS)) for kind, body in KINDS}
            # The first stream comes after the requests above, as a newcomer's chat client would meet it: a
            # streamed request is its own path (the listener, the text growing, server-sent events).
            streams = [_stream(client) for _ in range(REPEATS + 1)]
    finally:
        server.stop()
    log = (work / f"server{index}.log").read_text(errors="replace")
    warm = next((line.split("warm-up: ", 1)[1] for line in log.splitlines() if "warm-up: " in line), "")
    later = [first / whole for first, whole in streams[1:]]
    return {"ready_s": round(ready_s, 1), "warmup": warm,
            "stream": {"first_chunk_ms": round(streams[0][0], 1), "whole_ms": round(streams[0][1], 1),
                       "first_share": round(streams[0][0] / streams[0][1], 3),
                       "later_share": round(statistics.median(later), 3),
                       "whole_ratio": round(streams[0][1] / statistics.median(w for _, w in streams[1:]), 2)},
            "kinds": {kind: {"first_ms": round(firsts[kind], 1), "steady_ms": round(steady[kind], 1),
                             "ratio": round(firsts[kind] / steady[kind], 2)} for kind, _ in KINDS}}


def render(runs: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    lines = [f"# First request after ready ÷ steady (`python -m bench.first_request --runs {args.runs}"
             + "".join(f" --set {s}" for s in args.set) + "`)", "",
             f"{len(runs)} starts of app.py; ready after {', '.join(str(r['ready_s']) for r in runs)} s.", "",
             "| kind | first ms (median) | steady ms (median) | ratio, median | ratio, every run |",
             "|---|---:|---:|---:|---|"]
    for kind, _ in KINDS:
        cells = [r["kinds"][kind] for r in runs]
        lines.append(f"| {kind} | {statistics.median(c['first_ms'] for c in cells):.0f} | "
                     f"{statistics.median(c['steady_ms'] for c in cells):.0f} | "
                     f"**{statistics.median(c['ratio'] for c in cells):.2f}×** | "
                     f"{' '.join(format(c['ratio'], '.2f') for c in cells)} |")
    streams = [r["stream"] for r in runs]
    lines += ["", "The first streamed chat completion after those requests (`/v1/chat/completions`, stream=true, "
              "en→es, 18 words): when its first piece of translation arrives, as a share of the whole stream, "
              f"against the median of the {REPEATS} streams after it.", "",
              "| measure | median | every run |", "|---|---:|---|"]
    for key, label in (("first_share", "first stream: first piece ÷ whole"),
                       ("later_share", "later streams: first piece ÷ whole"),
                       ("whole_ratio", "first stream's whole ÷ later streams'")):
        lines.append(f"| {label} | **{statistics.median(s[key] for s in streams):.2f}** | "
                     f"{' '.join(format(s[key], '.2f') for s in streams)} |")
    lines += ["", f"The server's warm-up line (run 1): {runs[0]['warmup'] or '(none)'}"]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.first_request", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--config", default=None, help="profile for app.py (default: the demo)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="app.py --set (repeatable)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hmt-first-") as tmp:
        runs = []
        for i in range(args.runs):
            runs.append(one_run(i, args.config, args.set, Path(tmp)))
            print(json.dumps(runs[-1]), flush=True)
    write_results("first_request", {"args": vars(args), "runs": runs}, render(runs, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
