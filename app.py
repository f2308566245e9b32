"""Entry point: configuration + CLI flags → translation service → one web server (REST API + Gradio UI at /ui).

    ./start.sh                                  embedded demo model on 127.0.0.1:7860
    ./start.sh --config hunyuan-mt-7b           the GPU profile
    ./start.sh --host 0.0.0.0 --auth me:secret --api-keys k1,k2 --admin-key adm --set cache.slots=4
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from typing import Any, Sequence

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from hunyuan_mt.config import Config, load_config, parse_set_args  # noqa: E402
from hunyuan_mt.errors import TranslationError  # noqa: E402

log = logging.getLogger("hunyuan_mt.app")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Hunyuan-MT translation server (REST API + web UI).")
    parser.add_argument("--config", default=os.environ.get("HMT_CONFIG"),
                        help="profile name in configs/ (e.g. hunyuan-mt-7b) or a YAML path; default: default.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override any setting, e.g. --set cache.slots=4 (repeatable)")
    parser.add_argument("--host", help="bind address (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, help="port (default 7860)")
    parser.add_argument("--share", action="store_true", default=None,
                        help="also open a public gradio.live link (needs internet; off by default)")
    parser.add_argument("--auth", default=os.environ.get("HMT_AUTH"), metavar="USER:PASS",
                        help="password-protect the web UI (or env HMT_AUTH)")
    parser.add_argument("--api-keys", metavar="K1,K2", help="require one of these keys on the REST API")
    parser.add_argument("--admin-key", help="key for the admin routes and the UI's admin actions")
    parser.add_argument("--rate-limit", type=int, metavar="N",
                        help="requests per minute per caller (API key, or address; the page per address)")
    parser.add_argument("--chars-per-min", type=int, metavar="N",
                        help="characters per minute per caller, texts and documents together")
    parser.add_argument("--status-key", help="make /metrics, /adapters and the Status tab need this key")
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace) -> Config:
    overrides: dict[str, Any] = parse_set_args(args.set)
    flags = {"server.host": args.host, "server.port": args.port, "server.share": args.share,
             "server.auth": args.auth, "server.api_keys": args.api_keys, "server.admin_key": args.admin_key,
             "server.rate_limit_per_min": args.rate_limit, "server.chars_per_min": args.chars_per_min,
             "server.status_key": args.status_key}
    overrides.update({key: value for key, value in flags.items() if value is not None})
    return load_config(args.config, overrides)


def startup_lines(cfg: Config, status: dict[str, Any]) -> list[str]:
    """What the operator needs to see once the server is up."""
    host = cfg.server.host
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    base = f"http://{shown}:{cfg.server.port}"
    backbone = status.get("backbone", {}) or {}
    cache = status.get("cache", {}) or {}
    pinned = [r.get("key") for r in cache.get("resident", []) or [] if r.get("pinned")] or list(cfg.cache.pinned)
    lines = [
        f"web UI:   {base}/ui/" + ("  (password-protected)" if cfg.server.auth else ""),
        f"REST API: {base}/translate, /languages, /detect, /translate_file, /v1/chat/completions; docs {base}/docs",
        f"model {backbone.get('name', cfg.model.path)} ({backbone.get('arch', '?')}) on "
        f"{backbone.get('device', '?')} {backbone.get('dtype', '')}; {cfg.cache.slots} adapter slots, "
        f"pinned {pinned or 'none'}",
        "REST API keys: " + ("required" if cfg.server.api_keys else "off (open API)")
        + "; admin routes: " + ("on (X-Admin-Key)" if cfg.server.admin_key else "off (no admin key)"),
    ]
    lines.append(access_line(cfg))
    if host not in ("127.0.0.1", "localhost", "::1"):
        lines.append(f"listening on {host}: reachable from other machines")
    return lines


def access_line(cfg: Config) -> str:
    """One line on who can reach what; it says so plainly when API keys are on but the page is open to all."""
    server = cfg.server
    limits = [f"{server.rate_limit_per_min} requests/min" if server.rate_limit_per_min else "",
              f"{server.chars_per_min} characters/min" if server.chars_per_min else ""]
    budget = " and ".join(x for x in limits if x) or "no rate or character limit"
    status = "private (status key)" if server.status_key else "public"
    if server.api_keys and not server.auth:
        return (f"access: API keys are required, but the web page is open without a login: its calls are counted "
                f"per address under the same limits ({budget}); --auth USER:PASS closes it. Status: {status}.")
    page = "behind --auth" if server.auth else "open"
    return f"access: page {page}; limits per caller: {budget}; status {status}."


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        cfg = build_config(args)
    except TranslationError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2

    from hunyuan_mt.service.translation import get_service
    from hunyuan_mt.web.connections import raise_open_files_limit
    from hunyuan_mt.web.server import Server, build_app, open_share_tunnel, quiet_page_polling, uvicorn_config

    # Every connection is a descriptor: with the soft limit at the hard one, the connection caps
    # (server.max_connections, kept below it) refuse a flood of connections before the process runs out of them.
    raise_open_files_limit()

    try:
        service = get_service(cfg)
    except TranslationError as exc:
        print(f"error: cannot start the translation service: {exc.message}", file=sys.stderr)
        return 1
    app = build_app(service, cfg)
    server = Server(uvicorn_config(app, cfg.server.host, cfg.server.port, cfg.server.trusted_proxies,
                                           log_level="info"))
    quiet_page_polling()  # after uvicorn.Config, which sets up its loggers

    def announce() -> None:
        while not server.started and not server.should_exit:
            threading.Event().wait(0.1)
        if not server.started:
            return
        page_open_to_keyless = bool(cfg.server.api_keys) and not cfg.server.auth
        for line in startup_lines(cfg, service.status()):
            # Keys on but the page open is a choice the operator should see stand out.
            log.log(logging.WARNING if page_open_to_keyless and line.startswith("access:") else logging.INFO, line)
        if cfg.server.share:
            try:
                log.info("public share link: %s", open_share_tunnel(cfg.server.host, cfg.server.port))
            except RuntimeError as exc:
                log.error("--share: %s", exc)

    threading.Thread(target=announce, name="hmt-announce", daemon=True).start()
    try:
        server.run()
    finally:
        app.state.api.close()  # running document jobs are left for the next start (store); rows leave the engine
        stop(service)
    exit_when_stuck(STOP_WAIT_S)
    return 0


#: Seconds a stopping server waits for request threads still at work (a long parse) before it exits without them.
STOP_WAIT_S = 3.0


def exit_when_stuck(wait_s: float, exit: Any = os._exit, threads: Any = threading.enumerate) -> None:
    """Python waits for every non-daemon thread before it exits, and the threads that run requests (anyio's) are
    such threads: a SIGTERM during a slow parse waited in `threading._shutdown` until the server was killed.
    Give them `wait_s` seconds in all, then leave without them (`exit(0)`, after the logs are flushed)."""
    deadline = time.monotonic() + wait_s
    for thread in threads():
        if thread is threading.current_thread() or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threads() if t is not threading.current_thread() and not t.daemon and t.is_alive()]
    if stuck:
        log.warning("stopped; %d request thread(s) still at work after %.0f s are left behind (%s)", len(stuck),
                    wait_s, ", ".join(sorted(set(stuck))))
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        exit(0)


def stop(service: Any) -> None:
    """After the server has stopped (Ctrl-C, SIGTERM): stop the engine and the memory monitor, and the language
    detector's helper process, waiting for it so that nothing it holds outlives us."""
    from hunyuan_mt.text import detect

    service.close()
    detect.shutdown()
    log.info("stopped")


if __name__ == "__main__":
    sys.exit(main())
