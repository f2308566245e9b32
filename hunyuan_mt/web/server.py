"""One server process: the REST app with the Gradio UI mounted at /ui, over one service; and how to run it."""

from __future__ import annotations

import logging
import secrets
import threading
from typing import Any

import gradio as gr
import uvicorn
from fastapi import FastAPI
from fastapi.responses import RedirectResponse

from ..config import Config
from .api import create_app
from .metrics import WebMetrics
from .ui import UI_CSS, UI_HEAD, build_ui

log = logging.getLogger(__name__)
UI_PATH = "/ui"


def parse_auth(value: str | None) -> tuple[str, str] | None:
    if not value:
        return None
    user, _, password = value.partition(":")
    return user, password


def build_app(service: Any, cfg: Config) -> FastAPI:
    """REST routes at the root, the Gradio page at /ui, `/` redirecting to it."""
    metrics = WebMetrics(service)
    app = create_app(service, cfg, metrics)
    blocks = build_ui(service, cfg, metrics)

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(url=UI_PATH + "/")

    app = gr.mount_gradio_app(
        app, blocks, path=UI_PATH, auth=parse_auth(cfg.server.auth), footer_links=["api"],
        max_file_size=cfg.limits.max_file_bytes, show_error=True, head=UI_HEAD, css=UI_CSS,
        theme=gr.themes.Soft(), server_name=cfg.server.host, server_port=cfg.server.port,
    )
    app.state.blocks = blocks
    return app


class QuietPagePolling(logging.Filter):
    """Drops uvicorn's access lines for the web page's own successful requests (its assets, and the queue polling
    the Status tab does every 2 s), which would otherwise scroll the console continuously; REST calls and every
    failed request are still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 5:
            path, status = args[2], args[4]
            if isinstance(path, str) and path.startswith(UI_PATH + "/") and isinstance(status, int) and status < 400:
                return False
        return True


def quiet_page_polling() -> None:
    """Install `QuietPagePolling` on uvicorn's access logger (app.py does, at start)."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, QuietPagePolling) for f in access.filters):
        access.addFilter(QuietPagePolling())


def open_share_tunnel(host: str, port: int) -> str:
    """A public gradio.live link to the local server. Needs internet; raises with a readable reason otherwise."""
    from gradio import networking

    local = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    try:
        url = networking.setup_tunnel(local_host=local, local_port=port, share_token=secrets.token_urlsafe(32),
                                      share_server_address=None, share_server_tls_certificate=None)
    except Exception as exc:  # any failure here (DNS, download of frpc, TLS) means the same thing to the user
        raise RuntimeError(
            f"could not create a share link: it needs internet access to gradio.live ({type(exc).__name__}: "
            f"{str(exc)[:160]}). The server keeps running locally."
        ) from None
    return url.replace("http://", "https://", 1) + UI_PATH + "/"


class ServerThread:
    """Runs uvicorn in a background thread (tests, benchmarks); `start()` returns once it accepts connections."""

    def __init__(self, app: FastAPI, host: str, port: int, log_level: str = "warning") -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                                    lifespan="on", timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, name="hmt-server", daemon=True)
        self.url = f"http://{host}:{port}"

    def start(self, timeout_s: float = 60.0) -> "ServerThread":
        self.thread.start()
        deadline = threading.Event()
        for _ in range(int(timeout_s * 20)):
            if self.server.started:
                return self
            if not self.thread.is_alive():
                raise RuntimeError(f"server on {self.url} exited during start")
            deadline.wait(0.05)
        raise RuntimeError(f"server on {self.url} did not start within {timeout_s} s")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
