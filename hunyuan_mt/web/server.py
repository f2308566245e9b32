"""One server process: the REST app with the Gradio UI mounted at /ui, over one service; and how to run it."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import threading
from typing import Any, Iterator, Sequence

import gradio as gr
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..config import Config
from ..errors import TranslationError
from .api import body_caps, create_app, retry_headers
from .auth import AccessPolicy
from .downloads import OwnedPaths
from .requests import BodyLimitMiddleware
from .metrics import WebMetrics
from .ui import UI_CSS, UI_HEAD, build_ui, page_i18n, page_theme

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
    policy = AccessPolicy(cfg.server, cfg.limits)  # one policy for every door: REST, OpenAI, the page
    app = create_app(service, cfg, metrics, policy)
    # One job queue and one set of document helpers for REST and the page.
    blocks = build_ui(service, cfg, metrics, policy, jobs=app.state.api.jobs, parsers=app.state.api.parsers)
    if cfg.model.warmup:
        app.state.api.parsers.warm()  # the first upload finds a helper ready

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(url=UI_PATH + "/")

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> RedirectResponse:
        # Browsers ask the site's root for it whatever the page says; Gradio serves one under the page's path.
        # Without this every page load logged a 404 in the browser's console.
        return RedirectResponse(url=UI_PATH + "/favicon.ico")

    app = gr.mount_gradio_app(
        app, blocks, path=UI_PATH, auth=parse_auth(cfg.server.auth), footer_links=["api"],
        max_file_size=cfg.limits.max_file_bytes, show_error=True, head=UI_HEAD, css=UI_CSS,
        theme=page_theme(), i18n=page_i18n(), server_name=cfg.server.host, server_port=cfg.server.port,
    )
    app.add_middleware(PageGate, policy=policy, owned=blocks.hmt_ui.owned)
    # The page's own routes take no key, so their bodies are capped like the API's: four 200 MB JSON bodies to its
    # queue took the server from 2.3 to 4.4 GB and another client's call from 0.07 to 6.3 s (issue 49). Every
    # page request is small but an upload (Gradio's route and its older alias).
    json_cap, file_cap = body_caps(cfg.limits)
    app.add_middleware(BodyLimitMiddleware, limits={
        UI_PATH: json_cap, UI_PATH + "/gradio_api/upload": file_cap, UI_PATH + "/upload": file_cap})
    app.state.blocks = blocks
    app.state.policy = policy
    return app


class PageGate:
    """The page's routes that Gradio handles itself, under the same policy as everything else: an upload is a
    call, counted per address (429 with Retry-After over the rate limit), and a translated document handed out by
    the page is served only to the address that asked for it (404 to any other, as if it did not exist)."""

    #: Gradio's file route and its older alias (`/file/<path>`), which served the same files ungated (issue 49).
    FILES = (UI_PATH + "/gradio_api/file=", UI_PATH + "/gradio_api/file/")
    UPLOAD = UI_PATH + "/gradio_api/upload"

    def __init__(self, app: ASGIApp, policy: AccessPolicy, owned: OwnedPaths) -> None:
        self.app = app
        self.policy = policy
        self.owned = owned

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]  # already percent-decoded, as Gradio's route reads it
            client = scope["client"][0] if scope.get("client") else "unknown"
            refusal = None
            asked = next((path[len(route):] for route in self.FILES if path.startswith(route)), None)
            if asked is not None and not self.owned.allowed(asked, client):
                refusal = JSONResponse({"error": "File not found or expired."}, status_code=404)
            elif path == self.UPLOAD and scope["method"] == "POST":
                try:
                    self.policy.page_caller(client)
                except TranslationError as exc:
                    # The page shows an upload's refusal as "HTTP <status>: <body>": a sentence, not JSON.
                    refusal = PlainTextResponse(exc.message, status_code=exc.http_status,
                                                headers=retry_headers(exc))
                if refusal is None and self.policy.downloads_owned:
                    send = self._owning_uploads(send, client)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _owning_uploads(self, send: Send, client: str) -> Send:
        """`send` that reads the upload route's answer (the JSON list of the paths Gradio stored the files at) and
        gives those paths to the uploader's address: the original document was served to anyone who had its path."""
        body = bytearray()

        async def reading(message: Message) -> None:
            if message["type"] == "http.response.body":
                body.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    try:
                        paths = json.loads(bytes(body))
                    except ValueError:
                        paths = []
                    for stored in paths if isinstance(paths, list) else []:
                        if isinstance(stored, str):
                            self.owned.add(stored, client)
            await send(message)

        return reading


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


class RedactKeys(logging.Filter):
    """Hides a key given in the query string (`?api_key=…`, as LibreTranslate clients may send it) in uvicorn's
    access lines: the log is read by more people than hold the keys (issue 49)."""

    _KEY = re.compile(r"((?:^|[?&])(?:api_key|key|admin_key|status_key)=)[^&\s]*", re.I)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "=" in args[2]:
            record.args = (*args[:2], self._KEY.sub(r"\1[redacted]", args[2]), *args[3:])
        return True


def quiet_page_polling() -> None:
    """Install `QuietPagePolling` and `RedactKeys` on uvicorn's access logger (app.py does, at start)."""
    access = logging.getLogger("uvicorn.access")
    for kind in (QuietPagePolling, RedactKeys):
        if not any(isinstance(f, kind) for f in access.filters):
            access.addFilter(kind())


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


def uvicorn_config(app: FastAPI, host: str, port: int, trusted_proxies: Sequence[str] = (),
                   **kw: Any) -> uvicorn.Config:
    """uvicorn's settings for this app. X-Forwarded-For is read only from `server.trusted_proxies`: uvicorn would
    otherwise believe it from 127.0.0.1, where any local program, or the share tunnel relaying the internet's
    headers, could then pick the address the per-address limits count."""
    return uvicorn.Config(app, host=host, port=port, proxy_headers=bool(trusted_proxies),
                          forwarded_allow_ips=list(trusted_proxies) or None, **kw)


class Server(uvicorn.Server):
    """uvicorn's server, minus one habit: after its graceful shutdown on SIGINT or SIGTERM it raises the signal
    again, so the process dies of it before `atexit` runs. The language detector's helper process and its queues'
    semaphores then outlive us (Python's resource tracker warns of "leaked semaphore objects"). app.py stops the
    service itself after `run()` returns and exits with 0, which is what systemd and docker expect of a stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()  # read by the base class right after this block, to re-raise them

    def handle_exit(self, sig: int, frame: Any) -> None:
        # uvicorn waits for the requests in progress before it stops; one still reading a document would hold the
        # stop for as long as its parse runs. Stop the document helpers first: those requests then answer 503.
        api = getattr(getattr(self.config.app, "state", None), "api", None)
        if api is not None:
            api.stopping()
        super().handle_exit(sig, frame)


class ServerThread:
    """Runs uvicorn in a background thread (tests, benchmarks); `start()` returns once it accepts connections."""

    def __init__(self, app: FastAPI, host: str, port: int, log_level: str = "warning",
                 trusted_proxies: Sequence[str] = ()) -> None:
        self.server = uvicorn.Server(uvicorn_config(app, host, port, trusted_proxies, log_level=log_level,
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
