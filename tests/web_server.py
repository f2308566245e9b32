"""A real server for the web tests: the app (REST + Gradio UI) on 127.0.0.1, a free port, in a background thread.

The service behind it is the real `TranslationService` on the embedded demo model (models/demo + adapters/) when
it is built, otherwise on the tiny Marian model and adapters of tests/tiny_models.py. `WEB_BACKEND` says which,
so the tests can tell what translations to expect.

Fixtures (imported into conftest.py): `web_service`, `live_server`; `serve(service, cfg)` starts further servers
with other server settings (API keys, rate limits, CORS) over the same service.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from hunyuan_mt.config import PROJECT_ROOT, Config, load_config

DEMO_MODEL = PROJECT_ROOT / "models" / "demo"
DEMO_ADAPTERS = PROJECT_ROOT / "adapters"
#: "demo" when the embedded model is present, else "tiny" (random weights: outputs are compared, not read).
WEB_BACKEND = "demo" if (DEMO_MODEL / "config.json").exists() and any(DEMO_ADAPTERS.glob("*2*")) else "tiny"
ADMIN_KEY = "test-admin-key"
#: Exact outputs of the shipped demo build for a few catalogue strings (tests/test_demo_model.py pins the same
#: build). With the tiny random model only "equals the service's own answer" can be checked.
DEMO_EXPECTED = {
    ("File not found", "en", "de"): "Datei nicht gefunden",
    ("Unknown error", "en", "es"): "Error desconocido",
    ("Unknown error", "en", "fr"): "Erreur inconnue",
    ("Archivo no encontrado", "es", "de"): "Datei nicht gefunden",  # es → en → de through the pivot
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def web_config(tiny_model: Path | None = None, tiny_adapters: Path | None = None, **server: Any) -> Config:
    """The server config of the tests: demo profile, or the tiny model with en2es/es2en pinned."""
    overrides: dict[str, Any] = {"server.host": "127.0.0.1", "server.port": 0, "server.admin_key": ADMIN_KEY,
                                 "model.warmup": False, "memory.enabled": False}
    if WEB_BACKEND == "tiny":
        assert tiny_model is not None and tiny_adapters is not None
        overrides.update({"model.path": str(tiny_model), "cache.adapters_dir": str(tiny_adapters),
                          "cache.pinned": ["en2es", "es2en"], "routing.pivot": "en",
                          "limits.max_new_tokens": 16})
    overrides.update({f"server.{k}": v for k, v in server.items()})
    return load_config(None, overrides, env={})


def with_server(cfg: Config, **server: Any) -> Config:
    """A copy of `cfg` with other server settings (the service part stays identical)."""
    import dataclasses

    return dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, **server))


@dataclass
class LiveServer:
    url: str
    service: Any
    cfg: Config
    app: Any

    def reference(self, text: str, src: str, tgt: str) -> str:
        """What the service itself answers, in process: the expected output of every front."""
        return self.service.translate_batch([text], src, tgt)[0].text

    def expected(self, text: str, src: str, tgt: str) -> str:
        """The reference, and on the demo model also the known-good translation it must equal."""
        out = self.reference(text, src, tgt)
        if WEB_BACKEND == "demo":
            assert out == DEMO_EXPECTED[(text, src, tgt)], (text, src, tgt, out)
        return out


@contextlib.contextmanager
def serve(service: Any, cfg: Config) -> Iterator[LiveServer]:
    from hunyuan_mt.web.server import ServerThread, build_app

    port = free_port()
    app = build_app(service, with_server(cfg, port=port))
    thread = ServerThread(app, "127.0.0.1", port, trusted_proxies=cfg.server.trusted_proxies).start()
    try:
        yield LiveServer(thread.url, service, cfg, app)
    finally:
        thread.stop()
        api = getattr(app.state, "api", None)
        if api is not None:
            api.close()  # as app.py does: its workers and heartbeat stop, its helpers are killed
            api.jobs.store.close()


@pytest.fixture(scope="session")
def web_cfg(request: pytest.FixtureRequest) -> Config:
    if WEB_BACKEND == "tiny":
        return web_config(request.getfixturevalue("marian_dir"), request.getfixturevalue("marian_adapters"))
    return web_config()


@pytest.fixture(scope="session")
def web_service(web_cfg: Config) -> Any:
    from hunyuan_mt.service.translation import TranslationService

    return TranslationService(web_cfg)


#: Download links the shared server lets one caller hold. Every test on a worker calls it from 127.0.0.1, and each
#: /translate_file whose link the test does not download holds a share for 15 minutes: with the default 16, the
#: 17th such upload of a run answered 429, so a test's result depended on the tests before it on its worker. The
#: quota itself is tested on a server of its own (test_hostile_input.py) and on the store (test_downloads.py).
SHARED_DOWNLOADS_PER_CALLER = 100_000


@pytest.fixture(scope="session")
def live_server(web_service: Any, web_cfg: Config) -> Iterator[LiveServer]:
    with serve(web_service, web_cfg) as server:
        server.app.state.api.downloads.per_caller = SHARED_DOWNLOADS_PER_CALLER
        yield server
