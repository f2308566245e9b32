"""The HTTP ingress: the same REST API (and Gradio page at /ui) as the single-process server, over replica groups.

`RemoteService` looks like a TranslationService to `web.api.create_app` (so no route is written twice): each
call picks a group (the one pinning the pair, or its first pivot hop, else the long tail), sends it with the pair
as multiplexed model id so Ray routes it to the replica that already holds the adapter, retries when a replica
dies, and rebuilds typed errors. Responses carry `X-Served-By: <group>#<replica>`.

Pivot routes run both hops on one replica (of the group holding the first hop): the intermediate text never
crosses the network and the hops share that replica's batches; the price is that the second adapter is loaded
there too.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from typing import Any, Callable, Sequence

from ..adapters.request import Pair
from ..config import Config
from ..text.detect import Detection
from ..errors import Cancelled, InputTooLarge, InvalidInput, ReplicaUnavailable
from ..text.languages import normalize_code
from .health import GroupHealth
from .settings import ServeSettings, group_for, settings_from_args
from .transport import rebuild_error

log = logging.getLogger(__name__)

AUTO = "auto"
#: Segments per remote call for documents (progress is reported between calls).
DOC_CHUNK = 64
#: How long the ingress waits for the first model replica before it builds the page (`wait_for_a_replica`): a
#: first start on 2 cores warms its replicas for minutes.
FIRST_REPLICA_WAIT_S = 900.0
#: The replicas that served the current HTTP request (set per request by ServedByMiddleware).
SERVED_BY: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("hmt_served_by", default=None)


def _retryable_ray_errors() -> tuple[type[BaseException], ...]:
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError

    return RayActorError, ReplicaUnavailableError, DeploymentUnavailableError, BackPressureError


class RemoteService:
    """A TranslationService look-alike whose work runs on the replica groups.

    The async methods (`a*`) run on the caller's event loop. The sync ones are what the REST layer calls (from its
    thread pool, and once from the replica's own loop when the metrics collector registers); they run the work on
    a private loop thread, so a sync call never waits on the loop it is blocking.
    """

    def __init__(self, handles: dict[str, Any], settings: ServeSettings, cfg: Config, app_name: str) -> None:
        self.handles = handles
        self.settings = settings
        self.cfg = cfg
        self.pivot = normalize_code(cfg.routing.pivot)
        self.health = GroupHealth(app_name)
        self._retry_on = _retryable_ray_errors()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()
        #: The store, opened on the first promotion or rollback (the replicas keep everything else in it).
        self._opened: Any = None

    # ------------------------------------------------------------------ one remote call

    async def acall(self, group: str, method: str, *args: Any, model_id: str | None = None) -> dict[str, Any]:
        """Call `method` on a replica of `group`; retry on a dead/unreachable replica; typed errors re-raised."""
        attempts = self.settings.retries
        last: BaseException | None = None
        for attempt in range(attempts):
            group = await self._up(group)
            handle = self.handles[group]
            if model_id:
                handle = handle.options(multiplexed_model_id=model_id)
            try:
                reply = await getattr(handle, method).remote(*args)
            except self._retry_on as exc:
                # The request is idempotent, so sending it again (to a live replica) cannot double any effect.
                last = exc
                log.warning("group %s: %s failed on attempt %d/%d (%s); retrying", group, method, attempt + 1,
                            attempts, type(exc).__name__)
                await asyncio.sleep(self.settings.retry_backoff_s * (attempt + 1))
                continue
            if "error" in reply:
                raise rebuild_error(reply["error"])
            return reply
        raise ReplicaUnavailable(
            f"No replica of group {group!r} answered after {attempts} attempts ({type(last).__name__}); "
            "it is being restarted. Retry shortly."
        )

    async def _up(self, group: str) -> str:
        """`group` if it has a replica running, else the long tail or another group that has one (every replica
        serves every pair; a pair pinned elsewhere is then loaded into a slot here). Serve would otherwise hold the
        request until the group's first replica starts, which never happens when Ray cannot place it."""
        running = await self.health.running()
        if not running or running.get(group, 0) > 0:  # no reading (or not this app's): route as configured
            return group
        order = [self.settings.long_tail.name] + [g.name for g in self.settings.groups]
        for name in order:
            if running.get(name, 0) > 0:
                log.info("group %s has no replica running; sending its request to %s", group, name)
                return name
        raise ReplicaUnavailable(
            f"No replica is up yet (starting: {', '.join(g.name for g in self.settings.groups)}); retry shortly.")

    def wait_for_a_replica(self, timeout_s: float = FIRST_REPLICA_WAIT_S, poll_s: float = 1.0) -> bool:
        """Block until some group has a replica running (Serve's status; True at once when it cannot be read), at
        most `timeout_s`: whether one is. The page asks a replica for its language list while it is built, and the
        ingress starts beside the model replicas, which warm up for seconds to minutes: asked at once, the build
        failed with "No replica is up yet" and Serve gave the whole application up (seen under load on 2 cores)."""
        deadline = time.monotonic() + timeout_s
        said = False
        while True:
            running = self._run(self.health.running())
            if running is None or any(n > 0 for n in running.values()):
                return True
            if time.monotonic() >= deadline:
                log.warning("no model replica running after %.0f s; building the page anyway", timeout_s)
                return False
            if not said:
                log.info("waiting for the first model replica before building the page (at most %.0f s)", timeout_s)
                said = True
            time.sleep(poll_s)

    async def aup_groups(self) -> list[str]:
        """Names of the groups with a replica running (all of them when Serve's status cannot be read)."""
        running = await self.health.running()
        return [g.name for g in self.settings.groups if not running or running.get(g.name, 0) > 0]

    def route(self, src: str, tgt: str) -> tuple[str, str | None]:
        """(group name, multiplexed model id) for normalized codes."""
        if src == tgt:
            return self.settings.long_tail.name, None
        return group_for(self.settings, src, tgt, self.pivot).name, Pair(src, tgt).key

    # ------------------------------------------------------------------ async API (handles, tests)

    async def atranslate(self, texts: Sequence[str], src: str, tgt: str, alternatives: int = 0,
                         glossary: Any = None, context: str | None = None) -> list[dict[str, Any]]:
        """One dict per text: the TranslationResult fields plus `replica` and `group`."""
        texts = list(texts)
        limit = self.cfg.limits.max_batch_items
        if len(texts) > limit:
            # Checked here too: an `auto` batch is split per detected language before any replica sees it whole.
            raise InputTooLarge(f"Batch has {len(texts)} texts, over the limit of {limit} (limits.max_batch_items).")
        target = normalize_code(tgt) if isinstance(tgt, str) and tgt.strip() else tgt
        if not (isinstance(src, str) and src.strip().lower() == AUTO):
            source = normalize_code(src) if isinstance(src, str) and src.strip() else src
            return await self._translate_routed(texts, source, target, alternatives, glossary, context)
        if not texts:
            # The replica says why it is invalid.
            return await self._translate_routed(texts, AUTO, target, alternatives, glossary, context)
        # Detect first (on any replica), then send each source language to its own group.
        reply = await self.acall(self.settings.long_tail.name, "detect", texts, 1)
        found = reply["detections"]
        by_source: dict[str, list[int]] = {}
        for i, ds in enumerate(found):
            if not ds:
                raise InvalidInput("Could not detect the language of the text; give the source language.")
            by_source.setdefault(ds[0]["code"], []).append(i)
        out: list[dict[str, Any] | None] = [None] * len(texts)
        parts = await asyncio.gather(*(self._translate_routed([texts[i] for i in idx], code, target, alternatives,
                                                              glossary, context)
                                       for code, idx in by_source.items()))
        for idx, results in zip(by_source.values(), parts):
            for i, result in zip(idx, results):
                result["detected"] = dict(found[i][0])
                out[i] = result
        return [r for r in out if r is not None]

    async def _translate_routed(self, texts: list[str], src: str, tgt: str, alternatives: int = 0,
                                glossary: Any = None, context: str | None = None) -> list[dict[str, Any]]:
        group, model_id = self.route(src, tgt) if src != AUTO else (self.settings.long_tail.name, None)
        reply = await self.acall(group, "translate", texts, src, tgt, alternatives, glossary, context,
                                 model_id=model_id)
        for result in reply["results"]:
            result["replica"], result["group"] = reply["replica"], reply["group"]
        return reply["results"]

    async def atranslate_segments(self, segments: Sequence[str], src: str, tgt: str,
                                  progress: Callable[[int, int], None] | None = None,
                                  glossary: Any = None, context: str | None = None,
                                  finished: Callable[[list[int], list[str]], None] | None = None,
                                  chunk: int = DOC_CHUNK,
                                  origins: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
        segments = list(segments)
        target = normalize_code(tgt)
        if isinstance(src, str) and src.strip().lower() == AUTO:
            sample = "\n".join(s for s in segments if isinstance(s, str) and s.strip())[:2000]
            if sample.strip():
                reply = await self.acall(self.settings.long_tail.name, "detect", [sample], 1)
                if not reply["detections"][0]:
                    raise InvalidInput("Could not detect the language of the text; give the source language.")
                source = reply["detections"][0][0]["code"]
            else:
                source = target
        else:
            source = normalize_code(src)
        group, model_id = self.route(source, target)
        out: list[str] = []
        replicas: list[str] = []
        total = len(segments)
        if progress:
            progress(0, total)
        for start in range(0, total, chunk):
            reply = await self.acall(group, "translate_segments", segments[start:start + chunk], source, target,
                                     glossary, context, model_id=model_id)
            out.extend(reply["texts"])
            replicas.append(reply["replica"])
            if origins is not None:
                origins.update(reply.get("origins") or {})
            if finished is not None:
                finished(list(range(start, start + len(reply["texts"]))), reply["texts"])
            if progress:
                progress(len(out), total)
        return out, replicas

    async def aall_groups(self, method: str, *args: Any) -> dict[str, dict[str, Any]]:
        """`method` on one replica of every group that is up (a group still starting is left out)."""
        names = await self.aup_groups()
        if not names:
            raise ReplicaUnavailable("No replica is up yet; retry shortly.")
        replies = await asyncio.gather(*(self.acall(name, method, *args) for name in names))
        return dict(zip(names, replies))

    # ------------------------------------------------------------------ sync API (what web.api calls)

    def _run(self, coro: Any) -> Any:
        with self._loop_lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="hmt-ingress-calls", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @staticmethod
    def _served(*replicas: str) -> None:
        served = SERVED_BY.get()
        if served is not None:
            served.extend(replicas)

    def translate_batch(self, texts: list[str], src: str, tgt: str, *, alternatives: int = 0,
                        glossary: Any = None, ticket: Any = None, context: str | None = None) -> list[Any]:
        # `ticket` is not sent to the replica (an event does not cross processes): a text's rows decode to the
        # end there even when its client has gone away.
        from ..service.translation import TranslationResult

        dicts = self._run(self.atranslate(texts, src, tgt, alternatives, glossary, context))
        self._served(*(d["replica"] for d in dicts))
        return [_result(TranslationResult, d) for d in dicts]

    def translate(self, text: str, src: str, tgt: str) -> Any:
        return self.translate_batch([text], src, tgt)[0]

    def translate_stream(self, text: str, src: str, tgt: str, *, glossary: Any = None,
                         ticket: Any = None, context: str | None = None) -> Any:
        """The whole translation as one piece: replicas do not stream their tokens back through Serve yet."""
        yield self.translate_batch([text], src, tgt, glossary=glossary, context=context)[0]

    def translate_segments(self, segments: list[str], src: str, tgt: str, progress: Any = None,
                           glossary: Any = None, ticket: Any = None, context: str | None = None,
                           origins: dict[str, str] | None = None,
                           finished: Callable[[list[int], list[str]], None] | None = None,
                           chunk: int = DOC_CHUNK) -> list[str]:
        """A document, one chunk per replica call; a cancelled `ticket` stops it between two chunks; `finished`
        is told each chunk as it comes back, and `origins` gets each segment's origin as its replica saw it
        (memory, exact or near; the model's, confident or not: see TranslationService.translate_segments)."""
        def report(done: int, total: int) -> None:
            if ticket is not None and ticket.cancelled:
                raise Cancelled(f"Cancelled: {ticket.reason}.")
            if progress is not None:
                progress(done, total)

        texts, replicas = self._run(self.atranslate_segments(segments, src, tgt, report, glossary, context,
                                                             finished, chunk, origins))
        self._served(*replicas)
        return texts

    def detect(self, text: str, top: int = 3) -> list[Detection]:
        reply = self._run(self.acall(self.settings.long_tail.name, "detect", [text], top))
        self._served(reply["replica"])
        return [Detection(**d) for d in reply["detections"][0]]

    def languages(self) -> list[Any]:
        from ..service.translation import LanguageInfo

        reply = self._run(self.acall(self.settings.long_tail.name, "languages"))
        self._served(reply["replica"])
        return [LanguageInfo(**d) for d in reply["languages"]]

    def status(self) -> dict[str, Any]:
        """The long-tail replica's status (same shape as the single-process server; another group's while the
        long tail is not up) plus every group's view: `up` false for a group with no replica running yet, and
        `running`, how many of its replicas are."""
        replies = self._run(self.aall_groups("status"))
        reading = self._run(self.health.running())  # None: Serve's status unreadable, judge by the replies
        running = reading or {}
        tail = self.settings.long_tail.name
        status = dict((replies.get(tail) or next(iter(replies.values())))["status"])
        # Ready once every replica of every group is up (a replica is RUNNING only when warm, see replica.py) and
        # the ones that answered say so: /health then cannot reach a replica that is still starting.
        every_replica = reading is None or all(running.get(g.name, 0) >= g.replicas for g in self.settings.groups)
        status["ready"] = every_replica and all(
            bool(r["status"].get("ready", True)) for r in replies.values())
        status["ray"] = {"groups": [
            {"name": g.name, "replicas": g.replicas, "running": running.get(g.name, 0), "pinned": g.pinned,
             "long_tail": g.long_tail, "up": g.name in replies, "answered_by": replies.get(g.name, {}).get("replica"),
             "resident": (replies.get(g.name) or {}).get("status", {}).get("cache", {}).get("resident", [])}
            for g in self.settings.groups]}
        self._served(*(r["replica"] for r in replies.values()))
        return status

    def rescan(self) -> None:
        # Serve handles reach one replica per call; the other replicas of a group rescan on their next restart.
        self._run(self.aall_groups("admin", "rescan"))

    def _admin_pair(self, action: str, pair: Pair | str) -> bool:
        p = pair if isinstance(pair, Pair) else Pair.parse(pair)
        group, _ = self.route(p.src, p.tgt)
        reply = self._run(self.acall(group, "admin", action, p.key, model_id=p.key))
        self._served(reply["replica"])
        return bool(reply["changed"])

    def import_memory(self, data: bytes, filename: str, pair: Pair | str) -> dict[str, Any]:
        # One replica of the pair's group takes it into the store the replicas share; the others read the new rows
        # at their next look-up of the pair.
        p = pair if isinstance(pair, Pair) else Pair.parse(pair)
        group, _ = self.route(p.src, p.tgt)
        reply = self._run(self.acall(group, "admin", "import_memory", p.key, data, filename, model_id=p.key))
        self._served(reply["replica"])
        return reply["result"]

    def correct(self, text: Any, source: Any, target: Any, translation: Any, context: Any = None,
                machine: Any = None, who: str | None = None) -> dict[str, Any]:
        """A correction, taken in by one replica of the pair's group into the store every replica shares (SQLite
        on one machine, PostgreSQL across machines): all of them answer it from their next look-up."""
        src, tgt = normalize_code(source), normalize_code(target)
        group, model_id = self.route(src, tgt)
        reply = self._run(self.acall(group, "correct", text, src, tgt, translation, context, machine, who,
                                     model_id=model_id))
        self._served(reply["replica"])
        return reply["result"]

    def promote(self, pair: Pair | str, version: str) -> dict[str, str]:
        """The store's record changed here; every replica swaps the version in within VersionWatch's 2 s."""
        p = pair if isinstance(pair, Pair) else Pair.parse(pair)
        return {"pair": p.key, "from": self._store().adapters.promote(p.key, version), "to": version}

    def rollback(self, pair: Pair | str) -> dict[str, str]:
        p = pair if isinstance(pair, Pair) else Pair.parse(pair)
        left, back = self._store().adapters.rollback(p.key)
        return {"pair": p.key, "from": left, "to": back}

    def _store(self) -> Any:
        from ..store import Store

        with self._loop_lock:
            if self._opened is None:
                self._opened = Store.open(self.cfg.store.url, self.cfg.store.dir)
        return self._opened

    def export_memory(self, pair: Pair | str) -> bytes:
        # The replica of the pair's group that answers reads the store's entries.
        p = pair if isinstance(pair, Pair) else Pair.parse(pair)
        group, _ = self.route(p.src, p.tgt)
        reply = self._run(self.acall(group, "admin", "export_memory", p.key, model_id=p.key))
        self._served(reply["replica"])
        return reply["result"]

    def pin(self, pair: Pair | str) -> bool:
        return self._admin_pair("pin", pair)

    def unpin(self, pair: Pair | str) -> bool:
        return self._admin_pair("unpin", pair)

    def unload(self, pair: Pair | str) -> bool:
        return self._admin_pair("unload", pair)


def _result(cls: type, d: dict[str, Any]) -> Any:
    fields = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
    if isinstance(fields.get("detected"), dict):
        fields["detected"] = Detection(**fields["detected"])
    result = cls(**fields)
    result.replica = d.get("replica")  # not a field: informational, for callers that want it
    return result


class ServedByMiddleware:
    """Pure ASGI middleware: `X-Served-By` lists the replicas that answered this request (in order)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        served: list[str] = []
        token = SERVED_BY.set(served)

        async def send_with_header(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and served:
                value = ",".join(dict.fromkeys(served)).encode()
                message = dict(message, headers=list(message.get("headers", [])) + [(b"x-served-by", value)])
            await send(message)

        try:
            await self.app(scope, receive, send_with_header)
        finally:
            SERVED_BY.reset(token)


class Ingress:
    """The ingress deployment: REST routes over `RemoteService`, plus handle methods for Python callers."""

    def __init__(self, handles: dict[str, Any], settings: dict[str, Any]) -> None:
        from ray import serve

        self.settings = settings_from_args(settings)
        self.cfg = self.settings.profile_config()
        self.remote = RemoteService(handles, self.settings, self.cfg, serve.get_replica_context().app_name)

    def __serve_build_asgi_app__(self) -> Any:
        if self.settings.ui:
            # The same app as the single-process server: REST at the root, the Gradio page at /ui. Its build asks a
            # replica for the languages: wait for the first one.
            from ..web.server import build_app

            self.remote.wait_for_a_replica()
            app = build_app(self.remote, self.cfg)
        else:
            from ..web.api import create_app

            app = create_app(self.remote, self.cfg)
        app.add_middleware(ServedByMiddleware)
        return app

    async def translate(self, texts: list[str], src: str, tgt: str, alternatives: int = 0,
                        glossary: Any = None) -> list[dict[str, Any]]:
        return await self.remote.atranslate(texts, src, tgt, alternatives, glossary)

    async def translate_segments(self, segments: list[str], src: str, tgt: str,
                                 glossary: Any = None, context: str | None = None) -> dict[str, Any]:
        texts, replicas = await self.remote.atranslate_segments(segments, src, tgt, None, glossary, context)
        return {"texts": texts, "replicas": replicas}

    async def replicas_info(self) -> dict[str, Any]:
        return await self.remote.aall_groups("info")
