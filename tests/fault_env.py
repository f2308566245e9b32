"""A private service and REST server for the fault, bad-input and churn tests (tests/test_faults.py, test_churn.py).

Each test module gets its own `TranslationService` on a private backbone (so the adapters it damages or churns never
touch the session-wide web service) behind the real REST app (`web.api.create_app`) under uvicorn on 127.0.0.1.
The Gradio UI is left out here: these tests drive the REST edge; the UI handlers are driven in test_bad_input.py.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx

from hunyuan_mt.config import Config, load_config
from tiny_models import UNGUARDED
from web_server import ADMIN_KEY, free_port


def tiny_config(model_dir: Path, adapters_dir: Path, **overrides: Any) -> Config:
    """The tiny Marian model over `adapters_dir`, pivot en, short outputs, no warm-up, no memory polling."""
    values: dict[str, Any] = {
        "model.path": str(model_dir), "model.warmup": False, "cache.adapters_dir": str(adapters_dir),
        "routing.pivot": "en", "limits.max_new_tokens": 12, "memory.enabled": False,
        "server.host": "127.0.0.1", "server.port": 0, "server.admin_key": ADMIN_KEY,
        # Each adapter must give its own output: the random model's loops are left uncut.
        **{f"limits.{key}": value for key, value in UNGUARDED.items()},
    }
    values.update(overrides)
    return load_config(None, values, env={})


@dataclass
class RestEnv:
    """A running REST server over a private service."""

    service: Any
    cfg: Config
    url: str
    client: httpx.Client

    def translate(self, text: str | list[str], src: str, tgt: str) -> httpx.Response:
        return self.client.post("/translate", json={"q": text, "source": src, "target": tgt})

    def admin(self, action: str, **fields: str) -> httpx.Response:
        return self.client.post(f"/admin/{action}", headers={"X-Admin-Key": ADMIN_KEY}, json=fields or None)


@contextlib.contextmanager
def rest_env(cfg: Config) -> Iterator[RestEnv]:
    """Service on a private backbone + REST app under uvicorn on a free 127.0.0.1 port; closed afterwards."""
    from hunyuan_mt.runtime.backbone import Backbone
    from hunyuan_mt.service.translation import TranslationService
    from hunyuan_mt.web.api import create_app
    from hunyuan_mt.web.server import ServerThread

    service = TranslationService(cfg, backbone=Backbone.load_uncached(cfg.model))
    port = free_port()
    thread = ServerThread(create_app(service, cfg), "127.0.0.1", port).start()
    try:
        with httpx.Client(base_url=thread.url, timeout=120) as client:
            yield RestEnv(service, cfg, thread.url, client)
    finally:
        thread.stop()
        service.close()
