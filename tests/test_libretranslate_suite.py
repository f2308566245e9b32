"""LibreTranslate's own API tests, unchanged, over HTTP against this server.

They are read from LibreTranslate's released wheel (tests/libretranslate.txt pins which; ./start.sh test downloads
it without installing it) and run by pytest in a child process. Their `client` fixture is the only part written
here: LibreTranslate's conftest builds its Flask app in process, ours hands the tests an object with the Flask test
client's interface (`get`, `post`, a response with `status_code`, `data` and `json`) that sends each call to the
live server over HTTP.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path


from web_server import LiveServer

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".venv" / "cache" / "libretranslate"
PINNED = re.search(r"^libretranslate==(\S+)", (ROOT / "tests" / "libretranslate.txt").read_text(), re.M)
SUITE = "libretranslate/tests/test_api/"

CLIENT_CONFTEST = '''
import json
import os

import httpx
import pytest


class Response:
    """What LibreTranslate's tests read from Flask's test response."""

    def __init__(self, response):
        self.status_code = response.status_code
        self.data = response.content
        self.headers = response.headers

    @property
    def json(self):
        return json.loads(self.data) if self.data else None


class HttpClient:
    """Flask's test-client calls, sent over HTTP to the server under test."""

    def __init__(self, url):
        self._http = httpx.Client(base_url=url, timeout=120)

    def get(self, path, **kw):
        return Response(self._http.get(path, **kw))

    def post(self, path, data=None, json=None, **kw):
        return Response(self._http.post(path, data=data, json=json, **kw))


@pytest.fixture()
def client():
    http = HttpClient(os.environ["HMT_SERVER_URL"])
    yield http
    http._http.close()
'''


def _wheel() -> Path:
    assert PINNED, "tests/libretranslate.txt names no libretranslate==<version>"
    found = sorted(WHEELS.glob(f"libretranslate-{PINNED.group(1)}-*.whl"))
    assert found, (f"LibreTranslate {PINNED.group(1)}'s wheel is not in {WHEELS}: run ./start.sh test, which "
                   "downloads it")
    return found[0]


def test_libretranslate_api_tests_pass_against_this_server(live_server: LiveServer, tmp_path: Path) -> None:
    suite = tmp_path / "test_api"
    suite.mkdir()
    with zipfile.ZipFile(_wheel()) as wheel:
        names = [n for n in wheel.namelist() if n.startswith(SUITE) and re.search(r"/test_[^/]+\.py$", n)]
        for name in names:
            (suite / Path(name).name).write_bytes(wheel.read(name))
    assert len(names) >= 6, names  # detect, frontend settings, languages, health, spec, translate
    (suite / "conftest.py").write_text(CLIENT_CONFTEST)
    env = dict(os.environ, HMT_SERVER_URL=live_server.url)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(suite),
                           "-c", os.devnull, str(suite)], env=env, capture_output=True, text=True, timeout=600)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.fullmatch(r"=* ?14 passed in .*", summary), summary
