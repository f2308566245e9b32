"""`python -m hunyuan_mt serve-ray`: start (or join) a Ray cluster and run the Serve application."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from ..config import PROJECT_ROOT, parse_set_args
from ..errors import ModelUnavailable, TranslationError
from .fit import check_fit, local_node, node_capacities
from .health import group_replicas_running
from .settings import DEFAULT_SERVE_CONFIG, read_serve_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=str(DEFAULT_SERVE_CONFIG),
                        help="Ray Serve config YAML with replica groups (default: configs/serve_ray.yaml)")
    parser.add_argument("--replicas", type=int, default=None, metavar="N", help="replicas per group")
    parser.add_argument("--profile", default=None,
                        help="service profile every replica loads (configs/<name>.yaml), e.g. hunyuan-mt-7b")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override for every replica, e.g. --set engine.max_rows=16 (repeatable)")
    parser.add_argument("--host", default=None, help="HTTP bind address (default from the Serve config)")
    parser.add_argument("--port", type=int, default=None, help="HTTP port (default from the Serve config)")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                        help="join this Ray cluster (default: start a local one)")
    parser.add_argument("--num-cpus", type=float, default=None, help="CPUs of the local Ray node")
    parser.add_argument("--num-gpus", type=int, default=None, help="GPUs of the local Ray node")
    parser.set_defaults(handler=run)


def register(subparsers: argparse._SubParsersAction) -> None:
    add_arguments(subparsers.add_parser(
        "serve-ray", help="serve on Ray Serve: replica groups multiplexed by language pair"))


def run(args: argparse.Namespace) -> int:
    try:
        doc, settings = read_serve_config(args.config)
        if args.replicas is not None:
            if args.replicas < 1:
                raise TranslationError(f"--replicas: expected an integer >= 1, got {args.replicas}")
            for group in settings.groups:
                group.replicas = args.replicas
        if args.profile:
            settings.profile = args.profile
        settings.overrides.update(parse_set_args(args.set))
        profile = settings.profile_config()  # validate here once, not in every replica
        for group in settings.groups:
            settings.replica_config(group)
        if not args.address:
            # Fail here with the service's own message rather than in a replica crash loop.
            if profile.model.require_cuda:
                _require_local_cuda(profile.name)
            _require_local_model(profile.model)
            # Groups that can never fit the node about to start are refused before Ray starts it (15-20 s on 2
            # cores for a refusal); the CPU sizing, and clusters joined with --address, are checked once it is up.
            node = local_node(settings.groups, args.num_cpus, args.num_gpus)
            if node is not None and not (fit := check_fit(settings.groups, [node])).fits:
                raise TranslationError(fit.message)
    except TranslationError as exc:
        print(f"serve-ray: {exc.message}", file=sys.stderr)
        return 2

    import ray
    from ray import serve

    from .app import build_application

    http = dict(doc.get("http_options") or {})
    if args.host:
        http["host"] = args.host
    if args.port:
        http["port"] = args.port
    http.setdefault("host", "127.0.0.1")
    http.setdefault("port", 8000)
    # Workers of a local cluster inherit this environment: they import hunyuan_mt from the project root and
    # never reach a model hub.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(var, "1")
    set_slow_start_defaults(os.environ)
    # "local": a node of its own, as --address's help says. Without an address ray.init joins a cluster that another
    # process on this machine started (a second serve-ray, a test's), and with --num-cpus given it then fails.
    init: dict[str, Any] = {"address": args.address or "local"}
    if not args.address:
        if args.num_cpus is not None:
            init["num_cpus"] = args.num_cpus
        if args.num_gpus is not None:
            init["num_gpus"] = args.num_gpus
    ray.init(**init)
    _stop_on_signals()
    fit = check_fit(settings.groups, node_capacities(ray.nodes()))
    if not fit.fits:
        print(f"serve-ray: {fit.message}", file=sys.stderr, flush=True)
        ray.shutdown()
        return 2
    if fit.sized_cpus:
        print(f"serve-ray: {fit.message}", flush=True)
        for group in settings.groups:
            group.ray_actor_options = {**group.ray_actor_options, "num_cpus": fit.sized_cpus[group.name]}
    serve.start(proxy_location=doc.get("proxy_location") or "HeadOnly",
                http_options={"host": http["host"], "port": int(http["port"])})
    app = build_application(settings)
    print(f"serve-ray: starting {', '.join(f'{g.name} ({g.replicas} x, pinned {g.pinned or []})' for g in settings.groups)}"
          f" with profile {settings.profile or 'default'}; this takes a while (each replica loads the model)",
          flush=True)
    shown = "127.0.0.1" if http["host"] in ("0.0.0.0", "::") else http["host"]
    try:
        _deploy(app, settings, f"http://{shown}:{http['port']}")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("serve-ray: shutting down", flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


#: How long each of Serve's ready checks waits for a starting HTTP proxy (Ray's default: 5 s; three missed in a row
#: and the controller kills the proxy). A proxy that starts with nothing compiled yet (a fresh .venv writes the
#: bytecode of Ray's and uvicorn's modules as it imports them) on a busy 2-core machine missed them, and
#: `serve.start` failed with "The actor is dead because it was killed by `ray.kill`". `serve.start` itself waits
#: 60 s for the proxy, and says so when that passes.
PROXY_READY_CHECK_S = 60


def set_slow_start_defaults(env: MutableMapping[str, str]) -> None:
    """What a local cluster's processes (they inherit the driver's environment) need on a slow first start, put in
    `env` where it does not say otherwise."""
    env.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", str(PROXY_READY_CHECK_S))


def _stop_on_signals() -> None:
    """Ctrl-C (SIGINT) and a service manager's SIGTERM both stop the server the same way: Serve's shutdown, then
    the local cluster's. Set here, after Ray's own start: a process that a script starts in the background inherits
    SIGINT ignored (POSIX shells do that when job control is off) and Python keeps it so, so `kill -INT` did
    nothing; and SIGTERM killed the driver without either shutdown."""
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers belong to the main thread (run() called from elsewhere: tests)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, stop)


def _deploy(app: Any, settings: Any, url: str) -> None:
    """Deploy, and say what is up as it comes up. `ready` is printed once every replica of every group is running
    (a replica runs only once it is warm, see replica.py) and /health answers 200 through the ingress: a load
    balancer or script that starts on that line then never reaches a replica that is still starting."""
    from ray import serve

    from .app import APP_NAME, INGRESS_NAME

    failed: list[BaseException] = []

    def run() -> None:
        try:
            serve.run(app, name=APP_NAME, route_prefix="/")
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failed.append(exc)

    deploying = threading.Thread(target=run, name="serve-run", daemon=True)
    deploying.start()
    shown: dict[str, int] = {}
    t0 = time.monotonic()
    while True:
        if failed:
            raise ModelUnavailable(f"deploying failed: {failed[0]}")
        up = group_replicas_running(APP_NAME)
        for group in settings.groups:
            count = up.get(group.name, 0)
            if count and shown.get(group.name) != count:
                shown[group.name] = count
                print(f"serve-ray: group {group.name} is up ({count}/{group.replicas} replicas, warm)", flush=True)
        complete = all(up.get(g.name, 0) >= g.replicas for g in settings.groups)
        if complete and up.get(INGRESS_NAME) and _healthy(url):
            print(f"serve-ray: ready in {time.monotonic() - t0:.0f} s. REST API {url}/translate "
                  f"(LibreTranslate-compatible), web page {url}/ui; responses name their replica in X-Served-By. "
                  "Ctrl-C stops.", flush=True)
            return
        time.sleep(1.0)


def _healthy(url: str) -> bool:
    """/health answers 200 through the ingress (which says ok only once every replica is up and warm)."""
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def _require_local_cuda(profile: str) -> None:
    """A GPU profile on a local cluster without CUDA: one clear line now, not a replica crash loop later."""
    import torch

    if not torch.cuda.is_available():
        raise ModelUnavailable(
            f"Profile {profile!r} requires a CUDA GPU (model.require_cuda: true), but torch sees none on this "
            "machine. Use a CPU profile (--profile default), install the CUDA build of torch, or join a GPU "
            "cluster with --address."
        )


def _require_local_model(model: Any) -> None:
    """The profile's model folder (or a hub id already in the local cache) exists on this machine."""
    from ..runtime.backbone import _missing_message, _model_source

    source = _model_source(model)
    if Path(source).is_dir():
        return
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(source, local_files_only=True, trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError):
        raise ModelUnavailable(_missing_message(model)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hunyuan_mt.serve_ray", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return args.handler(args)
