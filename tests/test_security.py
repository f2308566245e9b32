"""Security defaults and access control of the web server: binding, share, CORS, API keys, rate and character
limits, admin key, UI auth, path traversal in pair names, no stack traces."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import httpx
import psutil
import pytest

import app as entry
from hunyuan_mt.config import Config, load_config
from web_server import ADMIN_KEY, WEB_BACKEND, LiveServer, free_port, serve, with_server

ROOT = Path(__file__).resolve().parent.parent


def _post(server: LiveServer, path: str, **kw: Any) -> httpx.Response:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        return c.post(path, **kw)


# ---------------------------------------------------------------------------------------------------- defaults


def test_defaults_are_local_private_and_closed() -> None:
    cfg = entry.build_config(entry.parse_args([]))
    assert cfg.server.host == "127.0.0.1"
    assert cfg.server.share is False
    assert cfg.server.cors_origins == []
    assert cfg.server.admin_key is None and cfg.server.auth is None
    assert cfg.model.allow_pickle is False and cfg.model.trust_remote_code is False


def test_cli_flags_become_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HMT_AUTH", "ann:pw")
    args = entry.parse_args(["--host", "0.0.0.0", "--port", "9000", "--share", "--api-keys", "k1,k2",
                             "--admin-key", "adm", "--set", "cache.slots=4", "--rate-limit", "30",
                             "--chars-per-min", "9000", "--status-key", "sk"])
    cfg = entry.build_config(args)
    assert (cfg.server.rate_limit_per_min, cfg.server.chars_per_min, cfg.server.status_key) == (30, 9000, "sk")
    assert (cfg.server.host, cfg.server.port, cfg.server.share) == ("0.0.0.0", 9000, True)
    assert cfg.server.auth == "ann:pw" and cfg.server.api_keys == ["k1", "k2"] and cfg.server.admin_key == "adm"
    assert cfg.cache.slots == 4


def test_every_entry_point_keeps_the_compile_cache_where_start_sh_does(tmp_path: Path) -> None:
    """Without ./start.sh (`python app.py`, the CLI, serve-ray's replicas): the compiled packages, the kernels and
    inductor's own cache go under ~/.cache (or $XDG_CACHE_HOME), as ./start.sh keeps them, not under inductor's
    /tmp default; a folder the caller names wins."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME", "HMT_AOT_CACHE")}
    show = [sys.executable, "-c", "from hunyuan_mt.decode.aot import cache_dir; print(cache_dir()); "
            "from torch._inductor.runtime.cache_dir_utils import cache_dir; print(cache_dir())"]
    for extra, expected in (({"HOME": str(tmp_path)}, tmp_path / ".cache/hunyuan-mt/torchinductor"),
                            ({"XDG_CACHE_HOME": str(tmp_path / "xdg")}, tmp_path / "xdg/hunyuan-mt/torchinductor"),
                            ({"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "mine")}, tmp_path / "mine")):
        done = subprocess.run(show, cwd=ROOT, env={**base, **extra}, capture_output=True, text=True, timeout=120)
        assert done.stdout.split() == [str(expected / "hunyuan-mt-aot"), str(expected)], done.stderr[-400:]


def _app_args(web_cfg: Config) -> list[str]:
    if WEB_BACKEND == "demo":
        return []
    return ["--set", f"model.path={web_cfg.model.path}", "--set", f"cache.adapters_dir={web_cfg.cache.adapters_dir}",
            "--set", "cache.pinned=[en2es, es2en]", "--set", "routing.pivot=en", "--set", "model.warmup=false"]


@pytest.fixture()
def app_process(web_cfg: Config) -> Iterator[tuple[subprocess.Popen[str], int, list[str]]]:
    """`python app.py --share` as an operator runs it; the share link cannot be made and must fail clearly."""
    port = free_port()
    # A share server that refuses connections: the link fails the same way with or without internet (CI may
    # have it), and nothing is ever exposed publicly by a test.
    env = dict(os.environ, HMT_AUTH="", PYTHONUNBUFFERED="1", GRADIO_SHARE_SERVER_ADDRESS="127.0.0.1:9")
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--share", *_app_args(web_cfg)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        yield proc, port, lines
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_app_binds_localhost_logs_urls_and_survives_share_failure(app_process: Any) -> None:
    proc, port, lines = app_process
    event = threading.Event()
    for _ in range(240):  # the share attempt gives up on its own (DNS failure or timeout)
        if any("--share:" in line for line in lines) or proc.poll() is not None:
            break
        event.wait(0.5)
    log = "".join(lines)
    assert proc.poll() is None, log
    assert f"web UI:   http://127.0.0.1:{port}/ui/" in log
    assert re.search(r"model \S+ \((encoder-decoder|decoder-only)\) on cpu", log), log
    assert "3 adapter slots, pinned ['en2es', 'es2en']" in log
    assert "could not create a share link: it needs internet access" in log and "keeps running locally" in log
    listening = [c.laddr for c in psutil.Process(proc.pid).net_connections("tcp") if c.status == "LISTEN"]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
    # /health is 503 "starting" until the language detector's helper process has loaded, then 200 "ok".
    for _ in range(240):
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30)
        if health.status_code == 200:
            break
        assert health.status_code == 503 and health.json()["status"] == "starting"
        event.wait(0.25)
    assert health.json() == {"status": "ok"}
    assert httpx.get(f"http://127.0.0.1:{port}/status", timeout=30).json()["ready"] is True


# ---------------------------------------------------------------------------------------------------- API keys, limits


@pytest.fixture(scope="module")
def keyed_server(web_service: Any, web_cfg: Config) -> Iterator[LiveServer]:
    cfg = with_server(web_cfg, api_keys=["key-a", "key-b", "key-c"], rate_limit_per_min=2, char_limit=40)
    with serve(web_service, cfg) as server:
        yield server


def test_api_keys_are_required_when_configured(keyed_server: LiveServer) -> None:
    body = {"q": "Open the file.", "source": "en", "target": "es"}
    missing = _post(keyed_server, "/translate", json=body)
    assert missing.status_code == 403 and "Missing API key" in missing.json()["error"]
    wrong = _post(keyed_server, "/translate", json={**body, "api_key": "nope"})
    assert wrong.status_code == 403 and wrong.json() == {"error": "Invalid API key."}
    ok = _post(keyed_server, "/translate", data={**body, "api_key": "key-a"})
    assert ok.json()["translatedText"] == keyed_server.reference("Open the file.", "en", "es")
    bearer = _post(keyed_server, "/v1/chat/completions", headers={"Authorization": "Bearer key-c"},
                   json={"model": "en2es", "messages": [{"role": "user", "content": "Open the file."}]})
    assert bearer.status_code == 200, bearer.text


def test_rate_limit_answers_429_with_retry_after(keyed_server: LiveServer) -> None:
    body = {"q": "Open the file.", "source": "en", "target": "es", "api_key": "key-b"}
    assert [_post(keyed_server, "/translate", json=body).status_code for _ in range(2)] == [200, 200]
    limited = _post(keyed_server, "/translate", json=body)
    assert limited.status_code == 429
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    assert "2 per minute" in limited.json()["error"]
    assert _post(keyed_server, "/detect", json={"q": "Open the file.", "api_key": "key-b"}).status_code == 429
    # Other keys and the unmetered routes are unaffected.
    other = _post(keyed_server, "/detect", json={"q": "Open the file.", "api_key": "key-c"})
    assert other.status_code == 200
    assert httpx.get(keyed_server.url + "/health").status_code == 200


def test_character_limit_per_request(keyed_server: LiveServer) -> None:
    response = _post(keyed_server, "/translate", json={"q": ["a" * 30, "b" * 11], "source": "en", "target": "es",
                                                       "api_key": "key-a"})
    assert response.status_code == 400
    assert response.json() == {"error": "Invalid request: request (41 characters) exceeds text limit (40 characters)"}


# ---------------------------------------------------------------------------------------------------- CORS


def test_cors_is_off_by_default(live_server: LiveServer) -> None:
    response = httpx.options(live_server.url + "/translate", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in response.headers
    response = httpx.get(live_server.url + "/languages", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in response.headers


def test_cors_allows_only_configured_origins(web_service: Any, web_cfg: Config) -> None:
    with serve(web_service, with_server(web_cfg, cors_origins=["https://ok.example"])) as server:
        allowed = httpx.get(server.url + "/languages", headers={"Origin": "https://ok.example"})
        assert allowed.headers["access-control-allow-origin"] == "https://ok.example"
        denied = httpx.get(server.url + "/languages", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in denied.headers


# ---------------------------------------------------------------------------------------------------- admin


def test_admin_routes_are_off_without_an_admin_key(web_service: Any, web_cfg: Config) -> None:
    with serve(web_service, with_server(web_cfg, admin_key=None)) as server:
        response = _post(server, "/admin/rescan", headers={"X-Admin-Key": ""})
        assert response.status_code == 403
        assert "Admin routes are disabled" in response.json()["error"]


_FS_EVENTS = ("open", "os.listdir", "os.scandir", "os.mkdir", "os.remove", "os.rename", "shutil.rmtree",
              "shutil.copytree", "os.chdir")
_watch: dict[str, Any] = {"needle": None, "hits": []}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    needle = _watch["needle"]
    if needle is not None and event in _FS_EVENTS and any(needle in str(a) for a in args):
        _watch["hits"].append((event, args))


sys.addaudithook(_audit)  # audit hooks cannot be removed; this one only records while a needle is set


@pytest.mark.parametrize("name", [
    "../../{s}/en2es", "{s}/en2es", "..%2F..%2F{s}%2Fen2es", "en2es/../../{s}", "..\\..\\{s}\\en2es",
    "%2e%2e%2f{s}", "en2es\x00{s}", "file://{s}/en2es",
])
def test_path_traversal_in_pair_names_never_reaches_the_filesystem(live_server: LiveServer, tmp_path: Path,
                                                                  name: str) -> None:
    sentinel = tmp_path / "sentinel_adapters"
    (sentinel / "en2es").mkdir(parents=True)
    (sentinel / "en2es" / "adapter_config.json").write_text("{}")
    pair = name.format(s=str(sentinel).lstrip("/"))
    _watch.update(needle="sentinel_adapters", hits=[])
    try:
        for action in ("pin", "unpin", "unload"):
            as_json = _post(live_server, f"/admin/{action}", headers={"X-Admin-Key": ADMIN_KEY}, json={"pair": pair})
            as_form = _post(live_server, f"/admin/{action}", headers={"X-Admin-Key": ADMIN_KEY}, data={"pair": pair})
            for response in (as_json, as_form):
                assert response.status_code in (400, 404), response.text
                assert "Malformed pair name" in response.json()["error"] or "Unsupported" in response.json()["error"]
        translated = _post(live_server, "/translate", json={"q": "hi", "source": pair, "target": "es"})
        assert translated.status_code == 400
    finally:
        _watch["needle"] = None
    assert _watch["hits"] == []
    assert (sentinel / "en2es" / "adapter_config.json").exists()


# ---------------------------------------------------------------------------------------------------- errors


def test_unexpected_errors_hide_details(live_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("secret detail at /srv/private/path.py")

    monkeypatch.setattr(live_server.service, "status", boom)
    monkeypatch.setattr(live_server.service, "languages", boom)
    health = httpx.get(live_server.url + "/health")
    assert health.status_code == 500 and health.json() == {"error": "Internal server error."}
    models = httpx.get(live_server.url + "/v1/models")
    assert models.status_code == 500
    assert models.json() == {"error": {"message": "Internal server error.", "type": "server_error", "code": 500}}
    for response in (health, models):
        assert "secret" not in response.text and "Traceback" not in response.text


# ---------------------------------------------------------------------------------------------------- UI auth


def test_ui_auth_protects_the_page_not_the_rest_api(web_service: Any, web_cfg: Config) -> None:
    from gradio_client import Client

    with serve(web_service, with_server(web_cfg, auth="ann:s3cret")) as server:
        with pytest.raises(Exception):
            Client(server.url + "/ui/", verbose=False).predict("Open the file.", "en", "es", api_name="/translate")
        client = Client(server.url + "/ui/", auth=("ann", "s3cret"), verbose=False)
        text, _ = client.predict("Open the file.", "en", "es", api_name="/translate")
        assert text == server.reference("Open the file.", "en", "es")
        assert _post(server, "/translate", json={"q": "Open the file.", "source": "en", "target": "es"}).status_code \
            == 200
