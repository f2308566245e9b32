"""Live traffic beside documents, over HTTP, as clients meet it: short requests while a long document translates,
a document job's progress reports, and a streamed chat completion.

    python -m bench.live_traffic                      # 3 runs; documents yield, then the same without (the base)
    python -m bench.live_traffic --runs 5 --doc-kb 150

Each variant starts `app.py` on 127.0.0.1 (the demo profile) in a process of its own:

- **beside a document**: the median latency of short /translate requests on the idle server, then of the same
  requests sent one after another while a `--doc-kb` KB text document (unique sentences) translates as a job; the
  ratio is beside ÷ idle. The job is cancelled afterwards. The base variant runs with
  `--set engine.documents_yield=false` (document rows queue like any row), in the same run.
- **a document alone**: a 40 KB text document as a job with no other traffic, in segments per second: what
  yielding costs documents, just after interactive requests (document prefills are kept small for
  `INTERACTIVE_WINDOW_S`) and once none came for that long.
- **document job**: a 100-paragraph .docx posted to /v1/documents: how long the 202 answer took, when the first
  progress (a done count above 0) reached a client that long-polls `?wait=`, and the longest gap between two
  progress reports until it was done.
- **chat stream**: a text whose translation is about 200 tokens, streamed with the openai client: content chunks,
  the time to the first one and for the whole, and their ratio.

Results: bench/results/live_traffic.{json,md}.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from hunyuan_mt.scheduler.admission import INTERACTIVE_WINDOW_S

from .report import write_results
from .soak import Server, free_port

SHORT = [("Open the file.", "en", "es"), ("Save the document.", "en", "es"), ("Close the window.", "en", "es"),
         ("No se pudo abrir el archivo.", "es", "en"), ("The printer is out of paper.", "en", "es")]
#: Requests per measurement (after 3 warm ones on the idle server).
SHORT_N = 30

_SUBJECTS = ["report", "folder", "printer", "window", "backup", "message", "calendar", "account", "picture", "song",
             "network", "password", "device", "server", "screen", "keyboard", "document", "update", "file", "disk"]
_VERBS = ["was copied to", "was moved into", "could not be saved in", "is shown in", "was deleted from",
          "is synchronised with", "was restored from", "is shared with"]
_PLACES = ["the home folder", "the trash", "the cloud", "the desktop", "the archive", "the music library",
           "the downloads folder", "the shared drive"]

#: About 200 generated tokens of Spanish on the demo model (measured with its tokenizer in `stream_chat`).
STREAM_TEXT = (
    "The file manager shows the files in your home folder. You can open, copy and move them, and the trash keeps "
    "what you delete until you empty it. Settings are saved when you close the window, and the next time you open "
    "it the same folder is shown. To search for a file, type its name in the search box at the top of the window. "
    "Files that you open often are listed under Recent, so you can find them again quickly. When a disk is full, "
    "the file manager warns you before it copies anything, and it tells you how much space you need to free.")


def document_text(kb: int) -> str:
    """Unique sentences (a repeated one would be translated once) filling about `kb` kilobytes."""
    lines: list[str] = []
    size = n = 0
    while size < kb * 1024:
        s = _SUBJECTS[n % len(_SUBJECTS)]
        line = (f"The {s} number {n} {_VERBS[(n // 20) % len(_VERBS)]} {_PLACES[(n // 160) % len(_PLACES)]} "
                f"yesterday.")
        lines.append(line)
        size += len(line) + 1
        n += 1
    return "\n\n".join(lines) + "\n"  # one paragraph each: the job counts them as they are done


def _short(client: httpx.Client, k: int) -> float:
    q, src, tgt = SHORT[k % len(SHORT)]
    t0 = time.perf_counter()
    client.post("/translate", json={"q": q, "source": src, "target": tgt}).raise_for_status()
    return (time.perf_counter() - t0) * 1000


def beside_document(client: httpx.Client, kb: int) -> dict[str, Any]:
    for k in range(3):
        _short(client, k)
    idle = [_short(client, k) for k in range(SHORT_N)]
    data = document_text(kb).encode()
    job = client.post("/v1/documents", files={"file": ("long.txt", data)}, data={"source": "en", "target": "es"})
    job.raise_for_status()
    job_id = job.json()["id"]
    state = job.json()
    while state["state"] == "queued" or (state["state"] == "translating" and state["done"] == 0):
        state = client.get(f"/v1/documents/{job_id}", params={"wait": 5}).json()
    beside = [_short(client, k) for k in range(SHORT_N)]
    state = client.get(f"/v1/documents/{job_id}").json()
    still = state["state"] == "translating"
    client.delete(f"/v1/documents/{job_id}")
    return {"idle_ms": round(statistics.median(idle), 1), "beside_ms": round(statistics.median(beside), 1),
            "beside_p95_ms": round(sorted(beside)[int(0.95 * (len(beside) - 1))], 1),
            "ratio": round(statistics.median(beside) / statistics.median(idle), 2),
            "document_segments": state["total"], "document_still_running": still}


def document_alone(client: httpx.Client, kb: int) -> dict[str, Any]:
    """What yielding costs a document: a `kb` KB text job on an otherwise idle server, segments per second."""
    data = document_text(kb).encode()
    t0 = time.perf_counter()
    state = client.post("/v1/documents", files={"file": ("alone.txt", data)},
                        data={"source": "en", "target": "es"}).json()
    while state["state"] in ("queued", "translating"):
        state = client.get(f"/v1/documents/{state['id']}", params={"wait": 10}).json()
    seconds = time.perf_counter() - t0
    return {"segments": state["total"], "seconds": round(seconds, 2),
            "segments_per_s": round(state["total"] / seconds, 1)}


def _docx(paragraphs: list[str]) -> bytes:
    import docx

    d = docx.Document()
    for text in paragraphs:
        d.add_paragraph(text)
    buf = io.BytesIO()
    d.save(buf)
    return buf.getvalue()


def document_job(client: httpx.Client) -> dict[str, Any]:
    data = _docx([f"The {_SUBJECTS[n % 20]} number {n} {_VERBS[n % 8]} {_PLACES[n % 8]}." for n in range(100)])
    t0 = time.perf_counter()
    response = client.post("/v1/documents", files={"file": ("report.docx", data)},
                           data={"source": "en", "target": "es"})
    answered = time.perf_counter() - t0
    response.raise_for_status()
    state = response.json()
    reports = [(answered, state["done"])]
    while state["state"] in ("queued", "translating"):
        state = client.get(f"/v1/documents/{state['id']}", params={"wait": 10}).json()
        reports.append((time.perf_counter() - t0, state["done"]))
    first = next((t for t, done in reports if done > 0), None)
    gaps = [b[0] - a[0] for a, b in zip(reports, reports[1:])]
    return {"answered_s": round(answered, 3), "first_progress_s": round(first, 3) if first is not None else None,
            "max_gap_s": round(max(gaps), 3) if gaps else None, "reports": len(reports),
            "total_s": round(reports[-1][0], 2), "state": state["state"], "segments": state["total"]}


def stream_chat(base: str) -> dict[str, Any]:
    import openai
    from transformers import AutoTokenizer

    from hunyuan_mt.config import PROJECT_ROOT

    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    t0 = time.perf_counter()
    first = None
    pieces: list[str] = []
    for chunk in client.chat.completions.create(model="en2es", stream=True,
                                                messages=[{"role": "user", "content": STREAM_TEXT}]):
        delta = chunk.choices[0].delta.content
        if delta:
            first = first if first is not None else time.perf_counter() - t0
            pieces.append(delta)
    total = time.perf_counter() - t0
    tokenizer = AutoTokenizer.from_pretrained(PROJECT_ROOT / "models" / "demo")
    tokens = len(tokenizer("".join(pieces), add_special_tokens=False)["input_ids"])
    return {"chunks": len(pieces), "first_s": round(first or total, 4), "total_s": round(total, 4),
            "ratio": round((first or total) / total, 3), "output_tokens": tokens}


def one_run(index: int, variant: str, sets: list[str], work: Path, kb: int) -> dict[str, Any]:
    port = free_port()
    tmp = work / f"{variant}{index}"
    tmp.mkdir()
    server = Server(port, tmp, work / f"{variant}{index}.log", None, sets)
    try:
        server.wait_ready(600)
        with httpx.Client(base_url=server.base, timeout=300) as client:
            # Right after the warm-up's requests the engine still keeps document prefills small (interactive
            # traffic was about); after INTERACTIVE_WINDOW_S without any, a document runs at full speed.
            out: dict[str, Any] = {"alone_after_traffic": document_alone(client, 40)}
            time.sleep(INTERACTIVE_WINDOW_S + 1)
            out["alone"] = document_alone(client, 40)
            out["beside"] = beside_document(client, kb)
            if variant == "yield":
                out["job"] = document_job(client)
                out["stream"] = stream_chat(server.base)
        return out
    finally:
        server.stop()


def render(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> list[str]:
    med = statistics.median
    lines = [f"# Live traffic beside documents (`python -m bench.live_traffic --runs {args.runs} --doc-kb "
             f"{args.doc_kb}" + "".join(f" --set {s}" for s in args.set) + "`)", "",
             f"Short /translate requests, median of {SHORT_N} each, idle and while a {args.doc_kb} KB text document "
             "translates as a job; each variant is its own app.py. Medians over runs; every run in the last column.",
             "", "| variant | idle ms | beside a document ms | p95 beside ms | beside ÷ idle | every run |",
             "|---|---:|---:|---:|---:|---|"]
    for variant, label in (("base", "documents queue like any row (`engine.documents_yield=false`)"),
                           ("yield", "**documents yield** (default)")):
        cells = [r["beside"] for r in runs[variant]]
        lines.append(f"| {label} | {med(c['idle_ms'] for c in cells):.0f} | {med(c['beside_ms'] for c in cells):.0f} "
                     f"| {med(c['beside_p95_ms'] for c in cells):.0f} | **{med(c['ratio'] for c in cells):.2f}×** | "
                     f"{' '.join(format(c['ratio'], '.2f') for c in cells)} |")
    lines += ["", "The same server translating a 40 KB text document alone, as a job: just after interactive requests "
              f"(the warm-up's), and after {INTERACTIVE_WINDOW_S:.0f} s without any:", "",
              "| variant | when | segments | seconds | segments/s | every run |", "|---|---|---:|---:|---:|---|"]
    for variant in ("base", "yield"):
        for key, when in (("alone_after_traffic", "just after interactive traffic"), ("alone", "no traffic about")):
            cells = [r[key] for r in runs[variant]]
            lines.append(f"| {variant} | {when} | {cells[0]['segments']} | {med(c['seconds'] for c in cells):.2f} | "
                         f"{med(c['segments_per_s'] for c in cells):.0f} | "
                         f"{' '.join(format(c['segments_per_s'], '.0f') for c in cells)} |")
    jobs = [r["job"] for r in runs["yield"]]
    streams = [r["stream"] for r in runs["yield"]]
    lines += ["", "A 100-paragraph .docx as a job (POST /v1/documents, then GET ?wait=10 until done):", "",
              "| 202 answer s | first progress s | longest gap between reports s | reports | done after s |",
              "|---:|---:|---:|---:|---:|",
              f"| {med(j['answered_s'] for j in jobs):.3f} | {med(j['first_progress_s'] for j in jobs):.3f} | "
              f"{med(j['max_gap_s'] for j in jobs):.3f} | {med(j['reports'] for j in jobs):.0f} | "
              f"{med(j['total_s'] for j in jobs):.2f} |",
              "", f"A streamed chat completion (openai client, en→es, {med(s['output_tokens'] for s in streams):.0f} "
              "output tokens):", "",
              "| content chunks | first chunk s | whole s | first ÷ whole | every run |", "|---:|---:|---:|---:|---|",
              f"| {med(s['chunks'] for s in streams):.0f} | {med(s['first_s'] for s in streams):.3f} | "
              f"{med(s['total_s'] for s in streams):.3f} | **{med(s['ratio'] for s in streams):.3f}** | "
              f"{' '.join(format(s['ratio'], '.3f') for s in streams)} |"]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.live_traffic", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--doc-kb", type=int, default=150)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="app.py --set for both variants (repeatable)")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "yield": []}
    with tempfile.TemporaryDirectory(prefix="hmt-live-") as tmp:
        for i in range(args.runs):
            for variant, sets in (("base", ["engine.documents_yield=false"]), ("yield", [])):
                runs[variant].append(one_run(i, variant, args.set + sets, Path(tmp), args.doc_kb))
                print(variant, json.dumps(runs[variant][-1]), flush=True)
    write_results("live_traffic", {"args": vars(args), "runs": runs}, render(runs, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
