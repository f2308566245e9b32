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

from python_multipart.exceptions import MultipartParseError

from ..config import Config, ServerConfig
from ..errors import RateLimited, TranslationError
from .api import body_caps, create_app, paced, retry_headers
from .auth import AccessPolicy
from .connections import ConnectionGuard, connection_cap, guarded_protocol
from .downloads import OwnedPaths
from .pagequeue import PageQueueShare
from .requests import BodyLimitMiddleware
from .metrics import WebMetrics
from .ui import UI_CSS, UI_HEAD, UPLOAD_TYPES, build_ui, page_i18n, page_theme
from .uploads import PageUploads, PartNames

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
    policy = AccessPolicy(cfg.server, cfg.limits, cfg.shares)  # one policy for every door: REST, OpenAI, the page
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
    shares = cfg.shares
    uploads = PageUploads(UPLOAD_TYPES, shares.upload_bytes, shares.upload_total_bytes, shares.upload_ttl_s)
    app.add_middleware(PageGate, policy=policy, owned=blocks.hmt_ui.owned,
                       queue=PageQueueShare(blocks, shares.page_calls), uploads=uploads)
    # The page's own routes take no key, so their bodies are capped like the API's: four 200 MB JSON bodies to its
    # queue took the server from 2.3 to 4.4 GB and another client's call from 0.07 to 6.3 s (bench/flood.py). Every
    # page request is small but an upload (Gradio's route and its older alias).
    json_cap, file_cap = body_caps(cfg.limits)
    app.add_middleware(BodyLimitMiddleware, limits={
        UI_PATH: json_cap, UI_PATH + "/gradio_api/upload": file_cap, UI_PATH + "/upload": file_cap})
    app.state.blocks = blocks
    app.state.policy = policy
    app.state.uploads = uploads
    app.state.server_config = cfg.server  # uvicorn_config reads its connection settings from here
    return app


class PageGate:
    """The page's routes that Gradio handles itself, under the same policy as everything else.

    - An upload is a call, counted per address (429 with Retry-After over the rate limit); it must be a file one of
      the page's file fields takes (415 otherwise, seen on the part's headers before Gradio stores it), within the
      address's bytes on disk (`PageUploads`: 429 until its oldest upload is deleted).
    - A queue join (an event of the page: a translation, a document...) counts against the address's share of the
      queue (`PageQueueShare`: 429 with the likely wait).
    - A translated document handed out by the page is served only to the address that asked for it (404 to any
      other, as if it did not exist)."""

    #: Gradio's file route and its older alias (`/file/<path>`), which served the same files ungated.
    FILES = (UI_PATH + "/gradio_api/file=", UI_PATH + "/gradio_api/file/")
    UPLOAD = UI_PATH + "/gradio_api/upload"
    #: Where the page's events enter Gradio's queue: its own page's route and the REST-like one of its API.
    JOIN = UI_PATH + "/gradio_api/queue/join"
    CALL = UI_PATH + "/gradio_api/call/"

    def __init__(self, app: ASGIApp, policy: AccessPolicy, owned: OwnedPaths, queue: PageQueueShare,
                 uploads: PageUploads) -> None:
        self.app = app
        self.policy = policy
        self.owned = owned
        self.queue = queue
        self.uploads = uploads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(UI_PATH + "/"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]  # already percent-decoded, as Gradio's route reads it
        client = scope["client"][0] if scope.get("client") else "unknown"
        post = scope["method"] == "POST"
        self.uploads.sweep()  # at most every few seconds: page traffic keeps the uploads' deadlines
        asked = next((path[len(route):] for route in self.FILES if path.startswith(route)), None)
        if asked is not None and not self.owned.allowed(asked, client):
            await JSONResponse({"error": "File not found or expired."}, status_code=404)(scope, receive, send)
        elif path == self.UPLOAD and post:
            await self._upload(scope, receive, send, client)
        elif post and (path == self.JOIN or path.startswith(self.CALL)):
            await self._join(scope, receive, send, client)
        else:
            await self.app(scope, receive, send)

    async def _join(self, scope: Scope, receive: Receive, send: Send, client: str) -> None:
        try:
            self.queue.enter(client)
        except RateLimited as exc:
            exc = await paced(self.policy, f"addr:{client}", exc)
            # Gradio's clients read a refused join's `detail`, as from Gradio's own refusals (its full queue).
            await JSONResponse({"detail": exc.message, "error": exc.message}, status_code=exc.http_status,
                               headers=retry_headers(exc))(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.queue.leave(client)

    async def _upload(self, scope: Scope, receive: Receive, send: Send, client: str) -> None:
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"")
        incoming = int(declared) if declared.isdigit() else 0
        try:
            self.policy.page_caller(client)
            self.uploads.check(client, incoming)
        except TranslationError as exc:
            if isinstance(exc, RateLimited):
                exc = await paced(self.policy, f"addr:{client}", exc)
            await _plain_refusal(exc)(scope, receive, send)
            return
        try:
            await self._stream_upload(scope, receive, send, client, headers)
        finally:
            self.uploads.done(client, incoming)

    async def _stream_upload(self, scope: Scope, receive: Receive, send: Send, client: str,
                             headers: dict[bytes, bytes]) -> None:
        names = PartNames(headers.get(b"content-type", b"").decode("latin-1"), self.uploads.extensions)
        seen = 0
        refusal: TranslationError | None = None

        async def checked() -> Message:
            nonlocal seen, refusal
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                seen += len(chunk)
                try:
                    names.feed(chunk)
                except TranslationError as exc:
                    refusal = exc
                    # Gradio's parser stops on this error and deletes the parts it has written; the answer below
                    # replaces its own.
                    raise MultipartParseError(exc.message) from None
            return message

        body = bytearray()
        status = {"code": 0}

        async def answering(message: Message) -> None:
            if refusal is not None:
                return  # Gradio's answer to the stopped parse: ours is sent instead, below
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            elif message["type"] == "http.response.body":
                body.extend(message.get("body", b""))
                if not message.get("more_body", False) and status["code"] == 200:
                    self._stored(bytes(body), client, seen)
            await send(message)

        await self.app(scope, checked, answering)
        if refusal is not None:
            await _plain_refusal(refusal)(scope, receive, send)

    def _stored(self, answer: bytes, client: str, size: int) -> None:
        """The upload route's answer (the JSON list of the paths Gradio stored the files at): kept against the
        address's budget, and, when downloads are owned, given to the uploader's address alone (the original
        document was served to anyone who had its path)."""
        try:
            paths = json.loads(answer)
        except ValueError:
            paths = []
        stored = [p for p in paths if isinstance(p, str)] if isinstance(paths, list) else []
        self.uploads.record(client, stored, size)
        if self.policy.downloads_owned:
            for path in stored:
                self.owned.add(path, client)


def _plain_refusal(exc: TranslationError) -> PlainTextResponse:
    # The page shows an upload's refusal as "HTTP <status>: <body>": a sentence, not JSON.
    return PlainTextResponse(exc.message, status_code=exc.http_status, headers=retry_headers(exc))


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
    access lines: the log is read by more people than hold the keys (tests/test_api.py)."""

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
    headers, could then pick the address the per-address limits count.

    Connections (`web/connections.py`, from the app's `server` settings): at most `connections_per_address` from
    one address (trusted proxies excepted) and `max_connections` in all, below the open-file limit; a request's
    headers within `header_timeout_s`. uvicorn's own `limit_concurrency` bounds the requests in progress at the
    same total (503 past it; it counts the connection asking too, hence one more)."""
    server: ServerConfig = getattr(getattr(app, "state", None), "server_config", None) or ServerConfig()
    cap = connection_cap(server.max_connections)
    guard = ConnectionGuard(server.connections_per_address, cap, trusted_proxies, server.header_timeout_s)
    if hasattr(app, "state"):
        app.state.connections = guard
    return uvicorn.Config(app, host=host, port=port, proxy_headers=bool(trusted_proxies),
                          forwarded_allow_ips=list(trusted_proxies) or None, http=guarded_protocol(guard),
                          limit_concurrency=cap + 1, **kw)


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
