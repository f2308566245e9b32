"""Fair shares under abuse, at full size: each abuse of what every caller shares replayed against `python app.py`
(keys keyA..keyE, an admin key, default limits), while another key's one-sentence /translate (10 in a row) and a
page user on another address are timed.

    python -m bench.fair_shares                   # every case; one server for 1-3 and 5-8, one for 4 and 4b
    python -m bench.fair_shares --cases 1,4b      # those cases' rows replace theirs in the last results

The cases, at the sizes they were found at (main at ed54458):
1. from one keyless address, 1,000 page translations of ~5,000 characters through /ui/gradio_api/call/translate
   (~42 a second, as found: 1,000 in 23.7 s);
2. a keyless page visitor's Save correction while keys are on;
3. 80 long polls GET /v1/documents/<queued job>?wait=30 from keyA (two large documents of keyC and keyD keep both
   job workers busy, so keyA's job stays queued);
4. 20,000 connections trickling header bytes (four client processes of 5,000, a byte every 5 s), from four
   addresses, then from 160 (125 each: under the per-address cap, so the total cap is what holds);
5. two loops of keyA posting a ~200 KB PDF whose content stream inflates to 70 MB (each read runs to the deadline),
   with keyC's small .txt job beside them;
6. keys A, C, D and E sending 16 tiny jobs each at once, then keyB's one;
7. 100 keyless uploads of ~10 MiB to /ui/gradio_api/upload, and one .exe;
8. the small ones: a PDF encrypted with a handler pypdf does not know, a 5,000-digit JSON number on /translate and
   /v1/chat/completions, a 5,000-page PDF, a PDF of 100,000 nested dictionaries (the log lines it costs).

Targets: the other key's median ≤ 1 s and worst ≤ 2 s, the page user ≤ 5 s, the abuser refused with 429/413/408
and a Retry-After after which it is let in again (checked where the case allows), no 500 in case 8, no descriptor
exhaustion in case 4. Results: bench/results/fair_shares.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import tempfile
import threading
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import httpx
import psutil

from .flood import Flood
from .report import write_results
from .soak import Server, free_port

KEYS = ["keyA", "keyB", "keyC", "keyD", "keyE"]
SENTENCE = {"q": "Open the file.", "source": "en", "target": "es"}
ABUSER, PAGE_USER = "127.0.0.2", "127.0.0.3"
LONG_TEXT = " ".join(f"Sentence number {i} asks you to open the file and save it." for i in range(80))[:4990]


def _from(address: str, base: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), base_url=base, timeout=120)


def key_b(base: str, count: int = 10) -> list[float]:
    """keyB's one-sentence /translate, `count` in a row: each one's seconds (an error counts as 60 s)."""
    out = []
    with httpx.Client(base_url=base, timeout=60, headers={"Authorization": "Bearer keyB"}) as client:
        for _ in range(count):
            started = time.monotonic()
            try:
                ok = client.post("/translate", json=SENTENCE).status_code == 200
            except httpx.HTTPError:
                ok = False
            out.append(time.monotonic() - started if ok else 60.0)
    return out


def page_user(base: str) -> float | None:
    """A page translation from another address, joined and read to its end: seconds (None: it failed)."""
    started = time.monotonic()
    try:
        with _from(PAGE_USER, base) as client:
            joined = client.post("/ui/gradio_api/call/translate", json={"data": ["Open the file.", "en", "es", "",
                                                                                  ""]})
            if joined.status_code != 200:
                return None
            event = joined.json()["event_id"]
            outcome = ""
            with client.stream("GET", f"/ui/gradio_api/call/translate/{event}") as stream:
                for line in stream.iter_lines():
                    if line.startswith("event: "):
                        outcome = line[7:]
                        if outcome in ("complete", "error"):
                            break
            return time.monotonic() - started if outcome == "complete" else None
    except httpx.HTTPError:
        return None


def others(base: str) -> dict[str, Any]:
    seconds = key_b(base)
    return {"keyB_median_s": round(statistics.median(seconds), 3), "keyB_worst_s": round(max(seconds), 3),
            "page_user_s": None if (p := page_user(base)) is None else round(p, 2)}


def tally(codes: list[int]) -> str:
    return ", ".join(f"{code}×{n}" for code, n in sorted(Counter(codes).items()))


def retried(refusal: dict[str, Any] | None, again: Callable[[], int]) -> str:
    """Whether the abuser is let in once the Retry-After it was given has passed: "Retry-After N → <status>"."""
    if refusal is None or refusal.get("retry_after") is None:
        return "no Retry-After seen"
    wait = int(refusal["retry_after"])
    time.sleep(wait + 0.5)
    return f"Retry-After {wait} → {again()}"


# ---------------------------------------------------------------------------------------------- the cases


def page_queue(server: Server) -> dict[str, Any]:
    call = {"data": [LONG_TEXT, "en", "es", "", ""]}
    with Flood(url=server.base, path="/ui/gradio_api/call/translate", address=ABUSER, workers=8, pace_s=0.19,
               seconds=24, json=call) as flood:
        time.sleep(4)
        measured = others(server.base)
        time.sleep(max(0.0, 24 - 4 - 10))
    with _from(ABUSER, server.base) as client:
        again = retried(flood.refusals[-1] if flood.refusals else None,
                        lambda: client.post("/ui/gradio_api/call/translate", json=call).status_code)
    return {"abuser": tally(flood.codes), "retry": again, **measured}


def corrections(server: Server) -> dict[str, Any]:
    text = "Save the report before you close it."

    def key_b_says() -> str:
        return httpx.post(server.base + "/translate", json={**SENTENCE, "q": text}, timeout=60,
                          headers={"Authorization": "Bearer keyB"}).json()["translatedText"]

    before = key_b_says()
    with _from(ABUSER, server.base) as client:
        joined = client.post("/ui/gradio_api/call/save_correction",
                             json={"data": [text, "en", "es", "Texto falso.", "en", ""]})
        outcome = ""
        if joined.status_code == 200:
            with client.stream("GET", f"/ui/gradio_api/call/save_correction/{joined.json()['event_id']}") as s:
                for line in s.iter_lines():
                    if line.startswith("event: "):
                        outcome = line[7:]
                    elif line.startswith("data: ") and outcome in ("complete", "error"):
                        outcome += f": {line[6:][:100]}"
                        break
    return {"abuser": f"join {joined.status_code}, {outcome}", "retry": "—",
            "keyB_unchanged": key_b_says() == before, **others(server.base)}


def _document(lines: int, tag: str) -> bytes:
    return "\n\n".join(f"{tag} paragraph {i} asks you to open the file and save it." for i in range(lines)).encode()


def long_polls(server: Server) -> dict[str, Any]:
    busy = []
    with httpx.Client(base_url=server.base, timeout=120) as client:
        for key in ("keyC", "keyD"):  # the two job workers, kept busy with large documents
            busy.append((key, client.post("/v1/documents", data={"source": "en", "target": "es"},
                                          files={"file": ("big.txt", _document(3000, key), "text/plain")},
                                          headers={"Authorization": f"Bearer {key}"}).json()["id"]))
        queued = client.post("/v1/documents", data={"source": "en", "target": "es"},
                             files={"file": ("small.txt", b"Open the file.\n", "text/plain")},
                             headers={"Authorization": "Bearer keyA"}).json()
        codes: list[int] = []
        refusals: list[httpx.Response] = []

        def poll() -> None:
            try:
                reply = httpx.get(f"{server.base}/v1/documents/{queued['id']}", params={"wait": 30}, timeout=60,
                                  headers={"Authorization": "Bearer keyA"})
            except httpx.HTTPError:
                codes.append(0)
                return
            codes.append(reply.status_code)
            if reply.status_code == 429:
                refusals.append(reply)

        polls = [threading.Thread(target=poll, daemon=True) for _ in range(80)]
        for thread in polls:
            thread.start()
        time.sleep(2)
        measured = others(server.base)
        for thread in polls:
            thread.join(60)
        state = client.get(f"/v1/documents/{queued['id']}", headers={"Authorization": "Bearer keyA"}).json()["state"]
        again = "no Retry-After seen"
        if refusals:
            wait = int(refusals[0].headers["Retry-After"])
            again = f"Retry-After {wait} (the open polls' end); keyA's job was {state} throughout"
        for key, job_id in busy + [("keyA", queued["id"])]:
            client.delete(f"/v1/documents/{job_id}", headers={"Authorization": f"Bearer {key}"})
    return {"abuser": tally(codes), "retry": again, **measured}


def _trickler(addresses: list[str], port: int, count: int, seconds: float, out: Any) -> None:
    """One client process: `count` connections from `addresses` in turn, each sending a request line and then a
    header byte every 5 s, for `seconds`; what each got back (a status line, "closed", or nothing)."""
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (count + 512, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    socks: list[socket.socket] = []
    answers: Counter[str] = Counter()
    failed = 0
    for n in range(count):
        address = addresses[n % len(addresses)]
        try:
            sock = socket.create_connection(("127.0.0.1", port), source_address=(address, 0), timeout=5)
            sock.setblocking(False)
            sock.send(b"POST /translate HTTP/1.1\r\nHost: x\r\n")
            socks.append(sock)
        except OSError:
            failed += 1
    ends = time.monotonic() + seconds
    open_now = set(range(len(socks)))
    while time.monotonic() < ends and open_now:
        for i in list(open_now):
            try:
                data = socks[i].recv(256)
            except BlockingIOError:
                try:
                    socks[i].send(b"X")
                except OSError:
                    answers["closed"] += 1
                    open_now.discard(i)
                continue
            except OSError:
                answers["closed"] += 1
                open_now.discard(i)
                continue
            answers[data.split(b"\r\n", 1)[0].decode("latin-1")[:40] or "closed"] += 1
            open_now.discard(i)
        time.sleep(5)
    answers["still open at the end"] = len(open_now)
    for sock in socks:
        sock.close()
    out.put({"connect_failed": failed, "answers": dict(answers)})


def slow_headers(server: Server, spread: int = 1) -> dict[str, Any]:
    """20,000 trickling connections from four client processes, each from `spread` addresses of its own."""
    port = int(server.base.rsplit(":", 1)[1])
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    clients = [context.Process(target=_trickler, args=(
        [f"127.0.{1 + n}.{1 + a}" for a in range(spread)], port, 5000, 60, out)) for n in range(4)]
    fds, stop = [], threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            try:
                fds.append(server.ps.num_fds())
            except psutil.Error:
                pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for client in clients:
        client.start()
    time.sleep(15)
    measured = others(server.base)
    results = [out.get(timeout=180) for _ in clients]
    for client in clients:
        client.join(30)
    stop.set()
    answers: Counter[str] = Counter()
    for result in results:
        answers.update(result["answers"])
    log = Path(server.log.name).read_text(errors="replace")
    return {"abuser": "; ".join(f"{k}: {v}" for k, v in answers.most_common()), "retry": "—",
            "connect_failed": sum(r["connect_failed"] for r in results), "server_fds_max": max(fds or [0]),
            "emfile_in_log": log.count("Too many open files"), **measured}


def bomb_pdf(raw_mb: int = 70) -> bytes:
    """One page whose content stream inflates to `raw_mb` MB of text operators (~200 KB on disk)."""
    op = b"(Open the file.) Tj 0 -1 Td "
    content = zlib.compress(b"BT /F1 12 Tf 72 720 Td " + op * (raw_mb * 2**20 // len(op)) + b" ET", 9)
    return _pdf([b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
                 b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >> "
                 b"/Contents 5 0 R >>", b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
                 b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(content) + content + b"\nendstream"])


def _pdf(objects: list[bytes], trailer: bytes = b"") -> bytes:
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R %s>>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, trailer, xref)
    return bytes(out)


def many_pages(pages: int) -> bytes:
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % (5 + 2 * i) for i in range(pages)) +
               b"] /Count %d >>" % pages, b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>", b"<< >>"]
    for i in range(pages):
        text = b"BT /F1 12 Tf 72 720 Td (Page %d asks you to open the file.) Tj ET" % i
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> "
                       b">> /Contents %d 0 R >>" % (6 + 2 * i))
        objects.append(b"<< /Length %d >>\nstream\n" % len(text) + text + b"\nendstream")
    return _pdf(objects)


def parse_flood(server: Server) -> dict[str, Any]:
    bomb = bomb_pdf()
    path = Path(server.log.name).parent / "bomb.pdf"
    path.write_bytes(bomb)
    spec = {"url": server.base, "path": "/v1/documents", "address": "127.0.0.1", "workers": 2, "pace_s": 0.0,
            "seconds": 75, "data": {"source": "en", "target": "es"}, "headers": {"Authorization": "Bearer keyA"},
            "files": {"file": ["bomb.pdf", f"@{path}", "application/pdf"]}}
    with Flood(**spec) as flood:
        time.sleep(20)
        started = time.monotonic()
        small = httpx.post(server.base + "/v1/documents", data={"source": "en", "target": "es"}, timeout=120,
                           files={"file": ("notes.txt", b"Open the file.\n", "text/plain")},
                           headers={"Authorization": "Bearer keyC"})
        small_s = time.monotonic() - started
        measured = others(server.base)
        time.sleep(20)
    last = flood.refusals[-1] if flood.refusals else None
    said = "" if last is None else json.loads(last["body"]).get("error", "")[:60] if last["body"].startswith("{") \
        else last["body"][:60]
    return {"abuser": tally(flood.codes), "retry": f"Retry-After {last['retry_after']} ({said})" if last else "—",
            "bytes": len(bomb),
            "keyC_small_job": f"{small.status_code} in {small_s:.2f} s", **measured}


def job_slots(server: Server) -> dict[str, Any]:
    files = {"file": ("tiny.txt", b"Open the file.\n", "text/plain")}
    codes: dict[str, list[int]] = {key: [] for key in ("keyA", "keyC", "keyD", "keyE")}

    def send(key: str) -> None:
        with httpx.Client(base_url=server.base, timeout=120, headers={"Authorization": f"Bearer {key}"}) as c:
            for _ in range(16):
                codes[key].append(c.post("/v1/documents", data={"source": "en", "target": "es"},
                                         files=files).status_code)

    senders = [threading.Thread(target=send, args=(key,)) for key in codes]
    started = time.monotonic()
    for thread in senders:
        thread.start()
    for thread in senders:
        thread.join(120)
    sent_s = time.monotonic() - started
    time.sleep(3)
    mine = httpx.post(server.base + "/v1/documents", data={"source": "en", "target": "es"}, files=files,
                      headers={"Authorization": "Bearer keyB"}, timeout=60)
    return {"abuser": "; ".join(f"{key}: {tally(c)}" for key, c in codes.items()) + f" (in {sent_s:.1f} s)",
            "retry": "—", "keyB_submit": mine.status_code, **others(server.base)}


def page_uploads(server: Server) -> dict[str, Any]:
    folder = Path(server.log.name).parent / "gradio"
    before = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0
    payload = Path(server.log.name).parent / "big.txt"
    payload.write_bytes((b"Open the file and save it.\n" * 400_000)[:10 * 2**20 - 70_000])  # ~10 MiB, under the cap
    with _from(ABUSER, server.base) as client:
        exe = client.post("/ui/gradio_api/upload",
                          files={"files": ("setup.exe", b"MZ" + b"\0" * 100_000, "application/octet-stream")})
    with Flood(url=server.base, path="/ui/gradio_api/upload", address=ABUSER, workers=8, pace_s=0.0, seconds=60,
               files={"files": ["big.txt", f"@{payload}", "text/plain"]}, unique=True) as flood:
        time.sleep(3)
        measured = others(server.base)
        with _from(PAGE_USER, server.base) as other:
            other_upload = other.post("/ui/gradio_api/upload",
                                      files={"files": ("mine.txt", b"Open the file.\n", "text/plain")}).status_code
    after = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0
    codes = flood.codes[:100]
    return {"abuser": f"{tally(codes)} (first 100); .exe: {exe.status_code}", "retry":
            f"Retry-After {flood.refusals[-1]['retry_after']}" if flood.refusals else "—",
            "upload_folder_mb": f"{before / 2**20:.0f} → {after / 2**20:.0f}", "page_user_upload": other_upload,
            **measured}


def small_ones(server: Server) -> dict[str, Any]:
    found: dict[str, Any] = {}
    encrypted = many_pages(1).replace(b"/Root 1 0 R ", b"/Root 1 0 R /Encrypt << /Filter /FooBar /V 1 >> /ID "
                                      b"[<00112233445566778899aabbccddeeff> <00112233445566778899aabbccddeeff>] ")
    with httpx.Client(base_url=server.base, timeout=300, headers={"Authorization": "Bearer keyA"}) as client:
        reply = client.post("/translate_file", data={"source": "en", "target": "es"},
                            files={"file": ("locked.pdf", encrypted, "application/pdf")})
        found["unknown encryption"] = f"{reply.status_code} {reply.json().get('error', '')[:70]}"
        body = b'{"q": "Open the file.", "source": "en", "target": "es", "model": "en2es", "alternatives": ' + \
            b"9" * 5000 + b"}"
        for path in ("/translate", "/v1/chat/completions"):
            reply = client.post(path, content=body, headers={"Content-Type": "application/json"})
            found[f"5,000 digits on {path}"] = f"{reply.status_code} {reply.text[:40]}"
        started = time.monotonic()
        reply = client.post("/translate_file", data={"source": "en", "target": "es"},
                            files={"file": ("pages.pdf", many_pages(5000), "application/pdf")})
        found["5,000-page PDF"] = f"{reply.status_code} in {time.monotonic() - started:.1f} s " \
                                  f"{reply.json().get('error', '')[:60]}"
        nested = b"<< /A " * 100_000 + b"<< >>" + b" >>" * 100_000
        log = Path(server.log.name)
        lines_before = log.read_text(errors="replace").count("\n")
        reply = client.post("/translate_file", data={"source": "en", "target": "es"}, files={"file": (
            "nested.pdf", _pdf([b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
                                b"<< /Type /Page /Parent 2 0 R /Resources " + nested + b" >>"]), "application/pdf")})
        time.sleep(1)
        found["nested dictionaries"] = f"{reply.status_code}, " \
            f"{log.read_text(errors='replace').count(chr(10)) - lines_before} log lines"
    return {"abuser": "; ".join(f"{k}: {v}" for k, v in found.items()), "retry": "—",
            "no_500": not any(v.startswith("500") or ", 500" in v for v in found.values()), **others(server.base)}


CASES: dict[str, tuple[str, Callable[[Server], dict[str, Any]]]] = {
    "1": ("page queue flood", page_queue), "2": ("page corrections", corrections), "3": ("long polls", long_polls),
    "4": ("20,000 slow-header connections from 4 addresses", slow_headers),
    "4b": ("20,000 slow-header connections from 160 addresses", lambda server: slow_headers(server, spread=40)),
    "5": ("parse flood", parse_flood),
    "6": ("job slots", job_slots), "7": ("page uploads", page_uploads), "8": ("small ones", small_ones)}


def render(result: dict[str, Any]) -> list[str]:
    lines = [f"`python -m bench.fair_shares`; CPU: {result['cpu']}; server `python app.py --api-keys "
             f"{','.join(KEYS)} --admin-key ADMINKEY`, default limits. keyB: 10 one-sentence /translate in a row; "
             "page user: one page translation from another address. Targets: ≤ 1 s, ≤ 2 s, ≤ 5 s.", "",
             "| case | abuser got | its wait | keyB median (s) | keyB worst (s) | page user (s) | more |",
             "|---|---|---|---|---|---|---|"]
    for row in result["cases"]:
        more = {k: v for k, v in row.items() if k not in ("case", "abuser", "retry", "keyB_median_s", "keyB_worst_s",
                                                           "page_user_s")}
        lines.append(f"| {row['case']} | {row['abuser']} | {row['retry']} | {row['keyB_median_s']} | "
                     f"{row['keyB_worst_s']} | {row['page_user_s']} | {json.dumps(more, ensure_ascii=False)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--set", action="append", default=[], dest="sets", help="app.py --set KEY=VALUE")
    args = parser.parse_args(argv)
    from .hunyuan_cpu import cpu_line

    chosen = [c.strip() for c in args.cases.split(",") if c.strip()]
    work = Path(tempfile.mkdtemp(prefix="hmt-fair-"))
    # The servers' database and job files go with the rest of the run, not into the project's data/.
    os.environ["HMT_DATA"] = str(work / "data")
    sets = [f"server.api_keys=[{','.join(KEYS)}]", "server.admin_key=ADMINKEY", *args.sets]
    rows: list[dict[str, Any]] = []
    groups = [[c for c in chosen if not c.startswith("4")], [c for c in chosen if c.startswith("4")]]
    for index, group in enumerate(g for g in groups if g):
        folder = work / f"server{index}"
        folder.mkdir()
        server = Server(free_port(), folder, folder / "server.log", None, sets)
        try:
            server.wait_ready(900)
            key_b(server.base, 2)  # the first calls after the start's warm-up
            page_user(server.base)
            for case in group:
                name, run = CASES[case]
                print(f"case {case}: {name}", flush=True)
                rows.append({"case": f"{case}. {name}", **run(server)})
                print(rows[-1], flush=True)
                time.sleep(5)  # what the case left running drains
        finally:
            server.stop()
    result = {"cpu": cpu_line(), "cases": _merged(rows)}
    write_results("fair_shares", result, render(result))
    return 0


def _merged(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """This run's rows in place of the same cases' in the last results (a run of some cases keeps the others'),
    in the cases' order."""
    from hunyuan_mt.config import PROJECT_ROOT

    kept: dict[str, dict[str, Any]] = {}
    previous = PROJECT_ROOT / "bench" / "results" / "fair_shares.json"
    if previous.is_file():
        kept = {row["case"].split(".", 1)[0]: row for row in json.loads(previous.read_text())["cases"]}
    kept.update({row["case"].split(".", 1)[0]: row for row in rows})
    return [kept[case] for case in CASES if case in kept]


if __name__ == "__main__":
    raise SystemExit(main())
