"""Hostile uploads against a running server: each at the size below and at 10×, with
another client's short request beside it, the CPU the server spends after its answer, and SIGTERM during each.

    python -m bench.hostile                       # every attack, 1× and 10×, 3 rounds; SIGTERM runs at 10×
    python -m bench.hostile --rounds 1 --no-sigterm

Everything runs twice: documents read in helper processes (the default) and in the server's own process
(`limits.parse_workers=0`, no parse deadline): the baseline of the same invocation. For each, one
`python app.py` on 127.0.0.1 (demo model, its own TMPDIR) serves the size runs. For each upload to
/translate_file, a second client sends `POST /translate` ("Open the file." en→es) in a loop until the answer
comes; reported are the upload's answer (status, seconds, the error's first words), the slowest of the other
client's requests meanwhile, and the CPU seconds the server and its helper processes used in the 2 s after the
answer (a parse still burning for nobody shows as ~1 CPU-second a second). A slow but legitimate parse (a flat 9.5 MB HTML page: ~6 s
of HTMLParser, then refused for its segment count) is measured the same way. Then, for each attack at 10× and for
the slow parse, a fresh server gets the upload and, 0.5 s after it is sent, SIGTERM: reported are the seconds to exit and the exit code.
Targets: answered ≤ 5 s, the other client ≤ 1 s, no CPU burning after; SIGTERM exits ≤ 5 s with 0.
Results: bench/results/hostile.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import psutil

from .report import write_results
from .soak import Server, free_port

SHORT = {"q": "Open the file.", "source": "en", "target": "es"}


def html_deep(scale: int) -> tuple[str, bytes]:
    """HTML nested 20k deep (260 KB)."""
    depth = 20_000 * scale
    return "deep.html", f"<html><body>{'<div>' * depth}<p>Open the file.</p>{'</div>' * depth}</body></html>".encode()


def yaml_bomb(scale: int) -> tuple[str, bytes]:
    """A YAML alias bomb (393 bytes): each list aliases the one before ten times; 10× the bytes is
    ten times the levels (10^9 paths at 1×, 10^86 at 10×)."""
    lines = ['a: &a ["Open the file", "Save it"]']
    previous = "a"
    while sum(len(line) + 1 for line in lines) < 393 * scale:
        name = f"n{len(lines)}"
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 10) + "]")
        previous = name
    return "bomb.yaml", ("\n".join(lines) + "\n").encode()


def _xliff(source: str) -> bytes:
    return (f'<?xml version="1.0"?>\n<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">'
            f'<file source-language="en" target-language="es" datatype="plaintext" original="f"><body>\n'
            f'<trans-unit id="1"><source>{source}</source></trans-unit></body></file></xliff>').encode()


def xliff_attributes(scale: int) -> tuple[str, bytes]:
    """An XLIFF element with 40k attributes (430 KB)."""
    attrs = " ".join(f'a{i}="v"' for i in range(40_000 * scale))
    return "attrs.xlf", _xliff(f'Open <g id="1" {attrs}>the</g> file.')


def xliff_codes(scale: int) -> tuple[str, bytes]:
    """An XLIFF with 20k inline codes (260 KB)."""
    return "codes.xlf", _xliff("Open the file." + "".join(f'<x id="{i}"/>' for i in range(20_000 * scale)))


def flat_html(_: int) -> tuple[str, bytes]:
    """Not an attack: a large flat page, legitimate markup that HTMLParser needs ~6 s for (then refused for its
    segment count). The SIGTERM run's parse that is surely still running when the signal comes."""
    para = "<p>Open the <b>settings</b> page and change your password, then save the file.</p>\n"
    return "flat.html", ("<html><body>" + para * (9_500_000 // len(para)) + "</body></html>").encode()


ATTACKS: dict[str, Callable[[int], tuple[str, bytes]]] = {
    "HTML nested deep": html_deep, "YAML alias bomb": yaml_bomb, "XLIFF attributes": xliff_attributes,
    "XLIFF inline codes": xliff_codes}


def _cpu_s(server: Server) -> float:
    total = 0.0
    for proc in [server.ps, *server.ps.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def _upload(base: str, filename: str, data: bytes) -> tuple[int, float, str]:
    started = time.monotonic()
    try:
        reply = httpx.post(base + "/translate_file", data={"source": "en", "target": "es"},
                           files={"file": (filename, data)}, timeout=300)
    except httpx.HTTPError as exc:
        return 0, time.monotonic() - started, f"{type(exc).__name__}"
    body = reply.json() if reply.headers.get("content-type", "").startswith("application/json") else {}
    return reply.status_code, time.monotonic() - started, str(body.get("error", ""))[:90]


def one_attack(server: Server, filename: str, data: bytes) -> dict[str, Any]:
    """The upload, the other client's slowest request meanwhile, and the CPU after the answer."""
    done = threading.Event()
    others: list[float] = []

    def other_client() -> None:
        with httpx.Client(base_url=server.base, timeout=60) as client:
            while not done.is_set():
                t0 = time.monotonic()
                client.post("/translate", json=SHORT).raise_for_status()
                others.append(time.monotonic() - t0)
                done.wait(0.05)

    side = threading.Thread(target=other_client, daemon=True)
    side.start()
    status, seconds, error = _upload(server.base, filename, data)
    done.set()
    side.join(60)
    time.sleep(0.5)  # the answer's own last work (closing the request) is not counted
    before = _cpu_s(server)
    time.sleep(2.0)
    after_cpu = (_cpu_s(server) - before) / 2.0
    return {"bytes": len(data), "status": status, "seconds": round(seconds, 2), "error": error,
            "other_max_s": round(max(others), 3) if others else None, "other_requests": len(others),
            "cpu_after": round(after_cpu, 2)}


def sigterm_run(work: Path, index: int, filename: str, data: bytes, sets: list[str]) -> dict[str, Any]:
    tmp = work / f"sig{index}"
    tmp.mkdir()
    server = Server(free_port(), tmp, work / f"sig{index}.log", None, sets)
    try:
        server.wait_ready(600)
        threading.Thread(target=_upload, args=(server.base, filename, data), daemon=True).start()
        time.sleep(0.5)
        t0 = time.monotonic()
        server.proc.terminate()
        try:
            code = server.proc.wait(30)
        except Exception:  # noqa: BLE001 - a server that does not stop is the finding
            server.proc.kill()
            code = server.proc.wait()
            return {"exit_s": None, "code": code, "note": "did not exit in 30 s; killed"}
        return {"exit_s": round(time.monotonic() - t0, 2), "code": code}
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
        server.log.close()


#: The two ways a server may read documents: in helper processes (the default), and in its own process
#: (`limits.parse_workers: 0`, how every server read them before): the baseline of the same invocation.
MODES = {"helpers": [], "in-process": ["limits.parse_workers=0"]}
SLOW = "flat 9.5 MB HTML (not an attack)"


def render(result: dict[str, Any]) -> list[str]:
    lines = [f"`python -m bench.hostile --rounds {result['rounds']}`; CPU: {result['cpu']}; each cell the median of "
             f"{result['rounds']} rounds (the other client's slowest: the largest of all rounds).", "",
             "| attack | size | bytes | read in | answer | seconds | other client's slowest (s) | CPU-s/s after | "
             "what it said |", "|---|---|---|---|---|---|---|---|---|"]
    for row in result["sizes"]:
        lines.append(f"| {row['attack']} | {row['scale']}× | {row['bytes']:,} | {row['mode']} | {row['status']} | "
                     f"{row['seconds']} | {row['other_max_s']} | {row['cpu_after']} | "
                     f"{row['error'] or '(translated)'} |")
    if result.get("sigterm"):
        lines += ["", "| SIGTERM 0.5 s into the upload of | read in | exit after (s) | exit code |", "|---|---|---|---|"]
        for row in result["sigterm"]:
            lines.append(f"| {row['what']} | {row['mode']} | {row['exit_s']} | {row['code']} |")
    return lines


def size_runs(work: Path, mode: str, sets: list[str], rounds: int) -> list[dict[str, Any]]:
    server = Server(free_port(), work, work / f"server-{mode}.log", None, sets)
    rows: list[dict[str, Any]] = []
    cases = [(name, scale, build) for name, build in ATTACKS.items() for scale in (1, 10)]
    cases.append((SLOW, 1, flat_html))
    try:
        server.wait_ready(600)
        for name, scale, build in cases:
            filename, data = build(scale)
            runs = [one_attack(server, filename, data) for _ in range(rounds)]
            rows.append(dict(runs[0], attack=name, scale=scale, mode=mode,
                             seconds=round(statistics.median(r["seconds"] for r in runs), 2),
                             cpu_after=round(statistics.median(r["cpu_after"] for r in runs), 2),
                             other_max_s=max((r["other_max_s"] or 0) for r in runs)))
            print(rows[-1], flush=True)
    finally:
        server.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-sigterm", action="store_true")
    parser.add_argument("--set", action="append", default=[], dest="sets", help="app.py --set KEY=VALUE")
    args = parser.parse_args(argv)
    from .hunyuan_cpu import cpu_line

    work = Path(tempfile.mkdtemp(prefix="hmt-hostile-"))
    rows: list[dict[str, Any]] = []
    for mode, extra in MODES.items():
        rows += size_runs(work, mode, args.sets + extra, args.rounds)
    sigterm: list[dict[str, Any]] = []
    if not args.no_sigterm:
        targets = [("helpers", f"{name} 10×", build(10)) for name, build in ATTACKS.items()]
        targets += [(mode, SLOW, flat_html(1)) for mode in MODES]
        for index, (mode, what, (filename, data)) in enumerate(targets):
            run = sigterm_run(work, index, filename, data, args.sets + MODES[mode])
            sigterm.append(dict(run, what=what, mode=mode))
            print(sigterm[-1], flush=True)
    result = {"rounds": args.rounds, "cpu": cpu_line(), "sizes": rows, "sigterm": sigterm}
    write_results("hostile", result, render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
