"""The README is a newcomer's first screen: short, with a picture, and every command in it works as shown.

Its shell commands are run here as written: `./start.sh` serves (its `./start.sh test` twin is what CI runs), and
each `curl` goes to that server and must print the output the README shows under it. A command of another kind
fails the test until a test runs it. Every test the README and docs/ cite must exist.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

import pytest

from ports import wait_healthy
from web_server import WEB_BACKEND, free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 120
#: How far a number the README shows may be from what the command prints: a confidence's last digits depend on the
#: CPU's kernels (0.6355 with AVX2 alone, 0.6391 with AVX-512 for the pivoted example), so the README rounds it.
NUMBER_TOLERANCE = 0.01


def _same(shown: object, got: object) -> bool:
    """JSON values equal, numbers within NUMBER_TOLERANCE (strings, keys and booleans exactly)."""
    if isinstance(shown, dict) and isinstance(got, dict):
        return shown.keys() == got.keys() and all(_same(shown[k], got[k]) for k in shown)
    if isinstance(shown, list) and isinstance(got, list):
        return len(shown) == len(got) and all(_same(a, b) for a, b in zip(shown, got))
    if isinstance(shown, bool) or isinstance(got, bool):
        return type(shown) is type(got) and shown == got
    if isinstance(shown, (int, float)) and isinstance(got, (int, float)):
        return abs(shown - got) <= NUMBER_TOLERANCE
    return shown == got


def _commands(markdown: str) -> list[tuple[str, str | None]]:
    """(command, the output shown under it or None) for every line of the README's bash blocks; `\\` joins lines,
    a `# ...` line right after a command is its output (text after two spaces of padding is a remark)."""
    out: list[tuple[str, str | None]] = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, re.S):
        pending = ""
        for line in block.splitlines():
            if line.startswith("# ") and out and out[-1][1] is None and not pending:
                out[-1] = (out[-1][0], re.split(r"\s{2,}", line[2:])[0])
                continue
            pending += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
            if not line.endswith("\\") and pending.strip():
                out.append((re.split(r"\s+#\s", pending)[0].strip(), None))
                pending = ""
    return out


def test_readme_is_a_first_screen_with_a_picture() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_LINES
    images = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", text)
    assert images and all((ROOT / image).is_file() for image in images), images
    for link in re.findall(r"\]\(((?:docs/)?[A-Z_a-z]+\.md)\)", text):
        assert (ROOT / link).is_file(), link
    kinds = {command.split()[0] for command, _ in _commands(text)}
    assert kinds <= {"./start.sh", "curl"}, f"a README command no test runs: {kinds - {'./start.sh', 'curl'}}"


def test_shown_numbers_match_within_the_tolerance_and_the_rest_exactly() -> None:
    shown = {"translatedText": "Datei existiert nicht.", "confidence": 0.64, "detectedLanguage": {"confidence": 100.0}}
    assert _same(shown, {**shown, "confidence": 0.6355})
    assert _same(shown, {**shown, "confidence": 0.6391})
    assert not _same(shown, {**shown, "confidence": 0.62})
    assert not _same(shown, {**shown, "translatedText": "Datei existiert nicht"})
    assert not _same(shown, {**shown, "extra": 1})
    assert not _same({"ok": True}, {"ok": 1})


def test_every_test_the_docs_cite_exists() -> None:
    defined = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        defined |= set(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(encoding="utf-8"), re.M))
    docs = [README, ROOT / "ARCHITECTURE.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
    cited = {(doc.name, name) for doc in docs for name in re.findall(r"(?<![\w/])(test_\w+)(?![\w./])",
                                                                    doc.read_text(encoding="utf-8"))}
    missing = sorted(f"{doc}: {name}" for doc, name in cited if name not in defined)
    assert not missing, missing


@pytest.mark.slow
@pytest.mark.skipif(WEB_BACKEND != "demo", reason="the README shows the embedded demo model's outputs")
def test_readme_commands_run_as_shown(tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    commands = _commands(text)
    assert ("./start.sh", None) in [(c, None) for c, _ in commands] and any(c == "./start.sh test" for c, _ in commands)
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log = (tmp_path / "start.log").open("w")
    server = subprocess.Popen(["./start.sh", "--port", str(port)], cwd=ROOT, env=env, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(port, server, (tmp_path / "start.log").read_text, "./start.sh", 300, every=0.3)
        curls = [(c, shown) for c, shown in commands if c.startswith("curl ")]
        assert curls
        for command, shown in curls:
            argv = [arg.replace("localhost:7860", f"127.0.0.1:{port}") for arg in shlex.split(command)]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (command, done.stderr)
            if shown is not None:
                assert _same(json.loads(shown), json.loads(done.stdout)), (command, done.stdout)
        os.killpg(server.pid, signal.SIGTERM)
        assert server.wait(60) == 0
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(30)
        log.close()
