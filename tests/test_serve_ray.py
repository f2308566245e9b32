"""Ray Serve: replica groups multiplexed by pair, on a simulated two-node local cluster.

One module-scoped cluster (two nodes of 1 CPU each) runs the app: group "hot" (1 replica, pins en2es/es2en,
1 slot, Ray capacity 1) and group "tail" (2 replicas, 0.6 CPU each, so one per node; 3 slots). Each replica
loads the embedded demo model and adapters when they are built, else the tiny Marian model and its adapters
from tests/tiny_models.py. A `HoldingReplica` holds the engine's first forward over rows that start with HOLD
until the test releases a signal actor, so races are reproducible.

Order matters inside the module (the kill test runs last); the whole module takes about a minute.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from ports import free_port

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from hunyuan_mt.config import PROJECT_ROOT, load_config  # noqa: E402
from hunyuan_mt.serve_ray import APP_NAME, GroupSpec, ServeSettings, build_application  # noqa: E402
from hunyuan_mt.serve_ray.cli import set_slow_start_defaults  # noqa: E402
from hunyuan_mt.serve_ray.replica import TranslatorReplica  # noqa: E402
from hunyuan_mt.serve_ray.settings import group_for  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HOLD = "HOLD"
SIGNAL = "hmt-test-hold"
NAMESPACE = "hmt-test"
HELD_TEXT = f"{HOLD} the door, the quick brown fox jumps over the lazy dog."
PAIRS = ("en2es", "es2en", "en2de", "de2en", "en2fr", "fr2en")


# ---------------------------------------------------------------------------------------------- test seams


@ray.remote(num_cpus=0)
class Signal:
    """Holds generates open: `wait` blocks until `send`; `arrived` lists the pids of the holds that started."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.pids: list[int] = []

    async def arrive(self, pid: int) -> None:
        self.pids.append(pid)

    async def arrived(self) -> list[int]:
        return list(self.pids)

    async def wait(self) -> None:
        await self.event.wait()

    async def send(self) -> None:
        self.event.set()

    async def reset(self) -> None:
        self.event.clear()
        self.pids = []


class HoldingReplica(TranslatorReplica):
    """The real replica, with the engine's first forward over a row that starts with HOLD held open."""

    def _build_service(self, cfg: Any) -> Any:
        _no_detector_warmup()
        service = super()._build_service(cfg)
        held: set[int] = set()

        def hold(rows: Any) -> None:
            fresh = [r for r in rows if getattr(r, "text", "").startswith(HOLD) and id(r) not in held]
            if fresh:
                held.update(id(r) for r in fresh)
                signal = ray.get_actor(SIGNAL, namespace=NAMESPACE)
                ray.get(signal.arrive.remote(os.getpid()))
                ray.get(signal.wait.remote())

        service.engine.before_generate = hold
        return service


def _no_detector_warmup() -> Callable[[], None]:
    """Skip the service's background lingua warm-up (seconds of CPU per process on a 2-core machine): the one
    `auto` test loads it on first use instead. Detection results are the same either way. Returns the original."""
    import hunyuan_mt.service.translation as service_module

    original = service_module.start_detector
    service_module.start_detector = lambda: None
    return original


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 60.0, every: float = 0.1) -> Any:
    """Poll until `predicate()` is truthy (a bound on waiting, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(every)


# ---------------------------------------------------------------------------------------------- fixtures


def _demo_ready() -> bool:
    return (PROJECT_ROOT / "models/demo/config.json").is_file() and all(
        (PROJECT_ROOT / "adapters" / pair / "adapter_config.json").is_file() for pair in PAIRS)


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """A service profile for the embedded demo model and adapters when they are built, else the tiny Marian model
    and its adapters (pivot en either way)."""
    if _demo_ready():
        model_dir, adapters_dir = PROJECT_ROOT / "models/demo", PROJECT_ROOT / "adapters"
    else:
        model_dir, adapters_dir = request.getfixturevalue("marian_dir"), request.getfixturevalue("marian_adapters")
    path = tmp_path_factory.mktemp("serve_ray") / "replicas.yaml"
    path.write_text(yaml.safe_dump({
        "name": "ray-test",
        "model": {"path": str(model_dir), "device": "cpu", "warmup": False},
        "cache": {"adapters_dir": str(adapters_dir), "slots": 2, "pinned": [], "lease_timeout_s": 60},
        "routing": {"pivot": "en", "allow_base": False},
        "engine": {"max_wait_ms": 2},
        "memory": {"enabled": False},
        "limits": {"max_new_tokens": 24},
    }))
    return path


@pytest.fixture(scope="module")
def settings(profile: Path) -> ServeSettings:
    return ServeSettings(
        profile=str(profile),
        groups=[
            GroupSpec(name="hot", replicas=1, pinned=["en2es", "es2en"], slots=1, max_models_per_replica=1,
                      ray_actor_options={"num_cpus": 0.3}),
            GroupSpec(name="tail", replicas=2, long_tail=True, slots=3, ray_actor_options={"num_cpus": 0.6}),
        ],
        retries=8, retry_backoff_s=0.5,
    )


@pytest.fixture(scope="module")
def reference(settings: ServeSettings) -> Any:
    """The single-process service on the same profile: what every replica's answer must equal."""
    from hunyuan_mt.service.translation import TranslationService

    import hunyuan_mt.service.translation as service_module

    original = _no_detector_warmup()
    try:
        service = TranslationService(load_config(settings.profile))
    finally:
        service_module.start_detector = original  # only this construction skips it; later tests are untouched
    yield service
    service.close()


@pytest.fixture(scope="module")
def cluster(settings: ServeSettings) -> Any:
    from ray.cluster_utils import Cluster

    # Workers inherit this environment: they import hunyuan_mt (and this module, for HoldingReplica) from here.
    tests_dir = str(Path(__file__).resolve().parent)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), tests_dir, saved) if p)
    set_slow_start_defaults(os.environ)  # as serve-ray starts its local cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
    # Ship the test-only replica subclass by value (the workers may import this file under another name).
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    signal = Signal.options(name=SIGNAL, namespace=NAMESPACE).remote()
    port = free_port()
    try:
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        ingress = serve.run(build_application(settings, replica_cls=HoldingReplica), name=APP_NAME,
                            route_prefix="/")
    except BaseException:
        # A cluster left running would make the next Ray test in this process connect to it instead of its own.
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
        raise
    yield {"ingress": ingress, "signal": signal, "port": port, "cluster": cluster}
    serve.shutdown()
    ray.shutdown()
    cluster.shutdown()
    if saved is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = saved


def infos(cluster: Any) -> dict[str, dict[str, Any]]:
    """Every live replica's info, keyed by replica id (asks each group until all its replicas answered)."""
    out: dict[str, dict[str, Any]] = {}
    for name, want in (("hot", 1), ("tail", 2)):
        handle = serve.get_deployment_handle(name, app_name=APP_NAME)
        seen: dict[str, dict[str, Any]] = {}
        for _ in range(40):
            info = handle.info.remote().result()
            seen[info["replica"]] = info
            if len(seen) >= want:
                break
        out.update(seen)
    return out


def translate(cluster: Any, texts: list[str], src: str, tgt: str) -> list[dict[str, Any]]:
    return cluster["ingress"].translate.remote(texts, src, tgt).result()


# ---------------------------------------------------------------------------------------------- tests


def test_settings_are_validated_with_messages_naming_the_key() -> None:
    from hunyuan_mt.errors import ConfigError, UnsupportedLanguage
    from hunyuan_mt.serve_ray.settings import settings_from_args

    with pytest.raises(ConfigError, match="pair en2es is pinned by both a and b"):
        ServeSettings(groups=[{"name": "a", "pinned": ["en2es"]}, {"name": "b", "pinned": ["EN2es"]}])
    with pytest.raises(ConfigError, match=r"exactly one long_tail group allowed, got \['a', 'b'\]"):
        ServeSettings(groups=[{"name": "a", "long_tail": True}, {"name": "b", "long_tail": True}])
    with pytest.raises(ConfigError, match=r"serve group a.replica: unknown key"):
        ServeSettings(groups=[{"name": "a", "replica": 2}])
    with pytest.raises(ConfigError, match=r"serve group a.replicas: expected an integer >= 1, got 0"):
        ServeSettings(groups=[{"name": "a", "replicas": 0}])
    with pytest.raises(ConfigError, match="serve args.groups: missing"):
        settings_from_args({"profile": "default"})
    with pytest.raises(UnsupportedLanguage):
        ServeSettings(groups=[{"name": "a", "pinned": ["../../etc2en"]}])
    unmarked = ServeSettings(groups=[{"name": "a", "pinned": ["zh-hant2en"]}, {"name": "b"}])
    assert unmarked.long_tail.name == "b" and unmarked.groups[0].pinned == ["zh-Hant2en"]


def test_group_resources_become_ray_actor_options() -> None:
    gpu = GroupSpec(name="zh-hot", gpu_ids=[1, 2], ray_actor_options={"num_cpus": 4})
    assert gpu.actor_options() == {"num_cpus": 4, "runtime_env": {"env_vars": {"CUDA_VISIBLE_DEVICES": "1,2"}}}
    assert GroupSpec(name="t", ray_actor_options={"num_gpus": 1}).actor_options() == {"num_gpus": 1}
    from hunyuan_mt.errors import ConfigError

    with pytest.raises(ConfigError, match="give gpu_ids or ray_actor_options.num_gpus, not both"):
        GroupSpec(name="x", gpu_ids=[0], ray_actor_options={"num_gpus": 1})
    overrides = GroupSpec(name="h", pinned=["en2es"], slots=5, overrides={"engine.max_rows": 8}).config_overrides(
        {"engine.max_rows": 4, "routing.pivot": "en"})
    assert overrides == {"engine.max_rows": 8, "routing.pivot": "en", "cache.pinned": ["en2es"], "cache.slots": 5,
                         "routing.detect": False}
    # The long tail detects for the ingress whatever the overrides say; another group only where they ask.
    assert GroupSpec(name="t", long_tail=True).config_overrides({"routing.detect": False})["routing.detect"] is True
    assert GroupSpec(name="h", overrides={"routing.detect": True}).config_overrides({})["routing.detect"] is True
    assert GroupSpec(name="h").config_overrides({"routing.detect": True})["routing.detect"] is True


def test_groups_that_ask_for_more_cpus_than_the_cluster_has_are_sized_to_fit() -> None:
    """`serve-ray --replicas 2` on 2 cores: 4 replicas x 1 CPU cannot all be placed; each then reserves 0.5."""
    from hunyuan_mt.serve_ray.fit import check_fit, node_capacities, unplaced

    groups = [GroupSpec(name="hot", replicas=2, pinned=["en2es"], ray_actor_options={"num_cpus": 1}),
              GroupSpec(name="tail", replicas=2, long_tail=True)]  # no num_cpus: Serve's default, 1
    nodes = node_capacities([{"Alive": True, "Resources": {"CPU": 2.0, "memory": 8e9, "node:10.0.0.1": 1.0}},
                             {"Alive": False, "Resources": {"CPU": 64.0}}])
    assert nodes == [{"CPU": 2.0, "memory": 8e9}]
    assert len(unplaced(groups, nodes)) == 2  # two of the four replicas would never be placed
    fit = check_fit(groups, nodes)
    assert fit.fits and fit.sized_cpus == {"hot": 0.5, "tail": 0.5}
    assert fit.message == (
        "the groups ask for 4 CPUs (hot 2 × 1 CPU, tail 2 × 1 CPU) and this Ray cluster has 2: each replica "
        "reserves less instead (hot 0.5, tail 0.5 CPU), so all 4 start and share the cores; use fewer --replicas, "
        "or a bigger --num-cpus, for whole cores")
    assert unplaced(groups, nodes, cpus=fit.sized_cpus) == []
    assert check_fit(groups, [{"CPU": 4.0}]) == check_fit(groups, [{"CPU": 2.0}, {"CPU": 2.0}])  # fits as asked
    assert check_fit(groups, [{"CPU": 4.0}]).sized_cpus == {} and check_fit(groups, [{"CPU": 4.0}]).message == ""


def test_groups_short_of_gpus_or_a_custom_resource_are_refused_in_one_line() -> None:
    from hunyuan_mt.serve_ray.fit import check_fit

    gpus = [GroupSpec(name="hot", ray_actor_options={"num_cpus": 1, "num_gpus": 1}),
            GroupSpec(name="tail", replicas=2, long_tail=True, ray_actor_options={"num_cpus": 1, "num_gpus": 1})]
    fit = check_fit(gpus, [{"CPU": 16.0, "GPU": 1.0}])
    assert not fit.fits and "\n" not in fit.message
    assert fit.message.startswith("the groups do not fit this Ray cluster: they need 3 GPUs (the cluster has 1) "
                                  "for hot 1 × 1 CPU + 1 GPU, tail 2 × 1 CPU + 1 GPU")
    bound = [GroupSpec(name="zh-hot", ray_actor_options={"resources": {"zh_hot": 1}}),
             GroupSpec(name="tail", long_tail=True, ray_actor_options={"num_cpus": 0.5})]
    fit = check_fit(bound, [{"CPU": 8.0}])
    assert not fit.fits and "1 of 'zh_hot' (the cluster has 0)" in fit.message
    # Enough in total but not on any one node: named as such.
    big = [GroupSpec(name="big", long_tail=True, ray_actor_options={"num_cpus": 1, "num_gpus": 2})]
    fit = check_fit(big, [{"CPU": 4.0, "GPU": 1.0}, {"CPU": 4.0, "GPU": 1.0}])
    assert not fit.fits and fit.message.startswith("no node of this Ray cluster has room for a replica of big")


def test_the_local_node_is_known_before_ray_starts_it_where_the_flags_tell() -> None:
    from hunyuan_mt.serve_ray.fit import local_node

    cpu = [GroupSpec(name="tail", long_tail=True, ray_actor_options={"num_cpus": 0.5})]
    gpu = [GroupSpec(name="hot", ray_actor_options={"num_cpus": 1, "num_gpus": 1})]
    assert local_node(cpu, 2, None) == {"CPU": 2.0}
    assert local_node(cpu, None, None) == {"CPU": float(os.cpu_count() or 1)}
    assert local_node(gpu, 4, 0) == {"CPU": 4.0} and local_node(gpu, 4, 2) == {"CPU": 4.0, "GPU": 2.0}
    assert local_node(gpu, 4, None) is None  # Ray counts the GPUs when it starts
    booked = [GroupSpec(name="big", long_tail=True, ray_actor_options={"memory": 2**30})]
    assert local_node(booked, 4, 0) is None  # Ray books a share of the memory free then


def test_typed_errors_cross_the_ray_boundary_with_their_attributes() -> None:
    from hunyuan_mt.errors import Busy, RateLimited, UnreachablePair, http_status
    from hunyuan_mt.serve_ray.transport import error_payload, rebuild_error

    back = rebuild_error(error_payload(UnreachablePair("No route from xh to bo.", reachable=["en", "zh"])))
    assert type(back) is UnreachablePair and back.message == "No route from xh to bo."
    assert back.reachable == ["en", "zh"] and http_status(back) == 400
    limited = rebuild_error(error_payload(RateLimited("Slow down.", retry_after_s=7)))
    assert type(limited) is RateLimited and limited.retry_after_s == 7 and limited.retryable
    assert type(rebuild_error(error_payload(Busy("All slots leased.")))) is Busy
    assert type(rebuild_error({"type": "SystemExit", "message": "x"})).__name__ == "TranslationError"


def test_replica_unavailable_is_a_domain_error_that_crosses_the_boundary() -> None:
    from hunyuan_mt import errors
    from hunyuan_mt.serve_ray import transport

    assert transport.ReplicaUnavailable is errors.ReplicaUnavailable  # the old import path keeps working
    exc = errors.ReplicaUnavailable("No replica of group 'tail' answered after 3 attempts.")
    assert isinstance(exc, errors.TranslationError) and exc.retryable and errors.http_status(exc) == 503
    # A nested ingress (or any hop) that forwards it as data gets the same class back, not a bare TranslationError.
    back = transport.rebuild_error(transport.error_payload(exc))
    assert type(back) is errors.ReplicaUnavailable and back.message == exc.message and back.retryable


def test_the_ingress_waits_for_a_first_replica_before_it_builds_the_page(tmp_path: Path) -> None:
    """The page's build asks a replica for its languages, and the ingress starts beside replicas that warm up for
    minutes: it waits (bounded) for one to run instead of failing the application at once."""
    from hunyuan_mt.serve_ray.ingress import RemoteService

    class Readings:
        def __init__(self, values: list[Any]) -> None:
            self.values, self.asked = values, 0

        async def running(self) -> Any:
            self.asked += 1
            return self.values[min(self.asked, len(self.values)) - 1]

    cfg = load_config(overrides={"store.dir": str(tmp_path / "data")}, env={})
    remote = RemoteService({}, ServeSettings(profile="default", groups=[GroupSpec(name="tail", long_tail=True)]),
                           cfg, "hmt-test")
    remote.health = Readings([{"tail": 0}, {}, {"tail": 0}, {"tail": 1}])
    assert remote.wait_for_a_replica(timeout_s=30, poll_s=0.01) and remote.health.asked == 4
    remote.health = Readings([{"tail": 0}])
    started = time.monotonic()
    assert not remote.wait_for_a_replica(timeout_s=0.2, poll_s=0.01)
    assert 0.2 <= time.monotonic() - started < 5
    remote.health = Readings([None])   # Serve's status unreadable: routed as configured, no wait
    assert remote.wait_for_a_replica(timeout_s=30, poll_s=0.01) and remote.health.asked == 1


def test_settings_route_pairs_to_the_group_that_pins_them(settings: ServeSettings) -> None:
    assert group_for(settings, "en", "es", "en").name == "hot"
    assert group_for(settings, "es", "en", "en").name == "hot"
    assert group_for(settings, "en", "de", "en").name == "tail"
    # pivot es → en → de: the first hop es2en is pinned by hot, so both hops run there
    assert group_for(settings, "es", "de", "en").name == "hot"
    assert settings.long_tail.name == "tail"


def test_each_replica_loads_the_backbone_once_and_groups_hold_their_pins(cluster: Any) -> None:
    found = infos(cluster)
    assert sorted(i["group"] for i in found.values()) == ["hot", "tail", "tail"]
    for info in found.values():
        assert info["backbone_loads"] == 1
        expected = ["en2es", "es2en"] if info["group"] == "hot" else []
        assert sorted(info["cache"]["pinned"]) == expected
        # The ingress asks the long tail for every detection: only its replicas have a detector (loaded on the
        # first detection here, warm-up being off).
        assert info["detector"] == ("off" if info["group"] == "hot" else "not loaded"), info
    # the two tail replicas run on the two simulated nodes (0.6 CPU each cannot share a 1-CPU node)
    assert len({i["node_id"] for i in found.values() if i["group"] == "tail"}) == 2


def test_output_identical_to_single_process_service(cluster: Any, reference: Any) -> None:
    cases = [
        (["Hello world, how are you today?", "Open the file and save the document."], "en", "es"),
        (["Hola mundo, ¿cómo estás hoy?"], "es", "en"),
        (["The quick brown fox jumps over the lazy dog."], "en", "de"),
        (["Datei öffnen, Dokument speichern und Fenster schließen."], "de", "en"),
        (["Abrir el archivo, guardar el documento y cerrar la ventana."], "es", "de"),  # pivot through en
        (["Hello world."], "en", "en"),  # identity
        (["Hello world, how are you today? The quick brown fox jumps over the lazy dog."], "auto", "fr"),
    ]
    for texts, src, tgt in cases:
        got = translate(cluster, texts, src, tgt)
        want = reference.translate_batch(texts, src, tgt)
        assert [g["text"] for g in got] == [w.text for w in want], (src, tgt)
        assert [g["route"] for g in got] == [w.route for w in want]
        assert [g["adapters"] for g in got] == [w.adapters for w in want]
        assert [(g["detected"] or {}).get("code") for g in got] == [w.detected and w.detected.code for w in want]


def test_two_groups_route_as_configured(cluster: Any) -> None:
    hot = translate(cluster, ["Hello world."], "en", "es")[0]
    assert hot["group"] == "hot" and hot["replica"].startswith("hot#")
    pivot = translate(cluster, ["Hola mundo."], "es", "de")[0]
    assert pivot["group"] == "hot" and pivot["route"] == ["es", "en", "de"]
    tail = translate(cluster, ["Hello world."], "en", "de")[0]
    assert tail["group"] == "tail"


def test_affinity_repeated_requests_land_on_the_replica_that_holds_the_pair(cluster: Any) -> None:
    served: dict[str, set[str]] = {}
    for _round in range(4):
        for pair, text in (("en2fr", "Open the file."), ("fr2en", "Ouvrir le fichier."), ("de2en", "Hallo Welt.")):
            src, tgt = pair.split("2")
            result = translate(cluster, [text], src, tgt)[0]
            assert result["group"] == "tail"
            served.setdefault(pair, set()).add(result["replica"])
    for pair, replicas in served.items():
        assert len(replicas) == 1, f"{pair} served by {replicas}"
        holder = infos(cluster)[next(iter(replicas))]
        assert pair in holder["ray_models"]
        assert pair in [r["key"] for r in holder["cache"]["resident"]]


def test_http_ingress_is_the_libretranslate_api_and_names_the_replica(cluster: Any, reference: Any) -> None:
    import httpx

    url = f"http://127.0.0.1:{cluster['port']}"
    r = httpx.post(f"{url}/translate", json={"q": "Hello world, how are you today?", "source": "en",
                                             "target": "es"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["translatedText"] == reference.translate("Hello world, how are you today?", "en", "es").text
    assert r.headers["x-served-by"].startswith("hot#")
    r = httpx.post(f"{url}/translate", json={"q": "Hello", "source": "en", "target": "xx"}, timeout=60)
    assert r.status_code == 400 and "xx" in r.text
    # alternatives cross the Ray boundary (query-string fields, as deep-translator sends them).
    r = httpx.post(f"{url}/translate", params={"q": "Hello world, how are you today?", "source": "en",
                                               "target": "es", "alternatives": "2"}, timeout=60)
    want = reference.translate_batch(["Hello world, how are you today?"], "en", "es", alternatives=2)[0]
    assert _without_matches(r.json()) == {"translatedText": want.text, "alternatives": want.alternatives,
                                          "confidence": want.confidence}
    assert want.alternatives
    # A glossary crosses it too, for texts and documents: the replica enforces the same terms.
    from hunyuan_mt.text.glossary import parse_terms

    terms = {"world": "planeta"}
    r = httpx.post(f"{url}/translate", json={"q": "Hello world, how are you today?", "source": "en", "target": "es",
                                             "glossary": terms}, timeout=60)
    glossary = parse_terms(terms, 10)
    wanted = reference.translate("Hello world, how are you today?", "en", "es", glossary=glossary)
    want_text = wanted.text
    # The replica's confidence crosses too: the same tokens, the same log-probabilities.
    assert _without_matches(r.json()) == {"translatedText": want_text, "confidence": wanted.confidence}
    assert "planeta" in want_text and wanted.confidence is not None
    # A document's context crosses it as well (this Marian demo has no prompt to hold it: the output is the same).
    r = httpx.post(f"{url}/translate_file", files={"file": ("a.txt", b"Hello world.\n")}, timeout=60,
                   data={"source": "en", "target": "es", "glossary": "world = planeta", "context": "A greeting."})
    assert "planeta" in httpx.get(r.json()["translatedFileUrl"], timeout=60).text
    # Where each segment came from crosses it too: the XLIFF marks are the single-process service's, byte for byte
    # (a memory entry "leveraged-tm", the model's by its confidence). The replicas sent none before.
    from hunyuan_mt.web.doctranslate import translate_upload

    xliff = (b'<?xml version="1.0" encoding="UTF-8"?>\n<xliff version="1.2" '
             b'xmlns="urn:oasis:names:tc:xliff:document:1.2"><file source-language="en" target-language="es" '
             b'datatype="plaintext" original="ui"><body><trans-unit id="1"><source>Save As</source></trans-unit>'
             b'<trans-unit id="2"><source>Hello world, how are you today?</source></trans-unit></body></file></xliff>')
    r = httpx.post(f"{url}/translate_file", files={"file": ("ui.xlf", xliff)}, timeout=60,
                   data={"source": "en", "target": "es"})
    served = httpx.get(r.json()["translatedFileUrl"], timeout=60).content
    want, _ = translate_upload(reference, xliff, "ui.xlf", "en", "es", reference.cfg.limits)
    assert served == want.data and b'state-qualifier="leveraged-tm"' in served
    r = httpx.get(f"{url}/languages", timeout=60)
    assert r.status_code == 200 and any(lang["code"] == "en" for lang in r.json())


def test_gradio_page_is_served_by_the_ingress_too(cluster: Any, reference: Any) -> None:
    from gradio_client import Client

    url = f"http://127.0.0.1:{cluster['port']}"
    ui = Client(url + "/ui/", verbose=False)
    text, info = ui.predict("Hello world, how are you today?", "en", "de", api_name="/translate")
    assert text == reference.translate("Hello world, how are you today?", "en", "de").text
    assert "en → de" in info


def test_ray_evicts_a_pair_mid_generate_and_the_lease_keeps_its_adapter(cluster: Any, reference: Any) -> None:
    """Ray's multiplexer (capacity 1 on "hot") drops en2de's handle while en2de's generate is held; our cache
    keeps the adapter attached under its lease, the held request completes with the right text, and the slot goes
    to de2en only after the lease ends."""
    signal = cluster["signal"]
    ray.get(signal.reset.remote())
    hot = serve.get_deployment_handle("hot", app_name=APP_NAME)
    held = hot.options(multiplexed_model_id="en2de").translate.remote([HELD_TEXT], "en", "de")
    wait_until(lambda: ray.get(signal.arrived.remote()), "the en2de generate to start")
    before = hot.info.remote().result()
    assert before["ray_models"] == ["en2de"]
    assert {"key": "en2de", "leases": 1} in [{"key": r["key"], "leases": r["leases"]}
                                             for r in before["cache"]["resident"]]

    other = hot.options(multiplexed_model_id="de2en").translate.remote(["Hallo Welt, wie geht es dir heute?"],
                                                                      "de", "en")
    info = wait_until(lambda: (lambda i: i if any(e["pair"] == "en2de" for e in i["ray_evictions"]) else None)(
        hot.info.remote().result()), "Ray to evict en2de")
    eviction = [e for e in info["ray_evictions"] if e["pair"] == "en2de"][-1]
    # At Ray's eviction the adapter was still attached and leased: nothing was detached under the request.
    assert eviction["cache"] is not None and eviction["cache"]["leases"] == 1
    assert "en2de" in [r["key"] for r in info["cache"]["resident"]]
    assert info["ray_models"] == ["de2en"] or info["ray_models"] == []  # de2en is loading (waits for the slot)

    ray.get(signal.send.remote())
    held_reply = held.result()
    other_reply = other.result()
    assert held_reply["results"][0]["text"] == reference.translate(HELD_TEXT, "en", "de").text
    assert other_reply["results"][0]["text"] == reference.translate("Hallo Welt, wie geht es dir heute?",
                                                                    "de", "en").text
    after = hot.info.remote().result()
    non_pinned = [r for r in after["cache"]["resident"] if not r["pinned"]]
    assert [r["key"] for r in non_pinned] == ["de2en"]  # 1 slot: en2de went only after its lease ended
    assert all(r["leases"] == 0 for r in after["cache"]["resident"])
    assert sorted(after["cache"]["pinned"]) == ["en2es", "es2en"]
    assert after["ray_models"] == ["de2en"]


def test_ingress_serves_the_groups_that_are_up(cluster: Any, settings: ServeSettings, reference: Any) -> None:
    """A second app whose "never" group asks for a resource no node has: Ray cannot place it, yet the ingress
    answers its pinned pair from the group that is up, with the single-process service's output, and its status
    says which group is up."""
    import httpx

    from hunyuan_mt.serve_ray.health import group_replicas_running

    partial = ServeSettings(profile=settings.profile, groups=[
        GroupSpec(name="never", pinned=["en2es"], ray_actor_options={"num_cpus": 0, "resources": {"hmt_none": 1}}),
        GroupSpec(name="tail", long_tail=True, slots=2, ray_actor_options={"num_cpus": 0.1}),
    ], retries=2, retry_backoff_s=0.2, ui=False)
    name = "hmt-partial"
    ingress = serve._run(build_application(partial), _blocking=False, name=name, route_prefix="/partial")
    try:
        # Once a second, one reading a time: each serve.status() builds Serve's whole status in pydantic models,
        # ~0.3 s of CPU on 2 cores (ten readings a second took 45 s of CPU while the replicas started).
        def tail_and_ingress_up() -> bool:
            up = group_replicas_running(name)
            return bool(up.get("tail") and up.get("ingress"))

        wait_until(tail_and_ingress_up, "the partial app's tail group and ingress", timeout=180, every=1.0)
        assert group_replicas_running(name).get("never", 0) == 0
        text = "Hello world, how are you today?"
        result = ingress.translate.remote([text], "en", "es").result()[0]
        assert result["group"] == "tail" and result["text"] == reference.translate(text, "en", "es").text
        url = f"http://127.0.0.1:{cluster['port']}/partial"
        r = httpx.post(f"{url}/translate", json={"q": text, "source": "en", "target": "es"}, timeout=60)
        assert r.status_code == 200 and r.headers["x-served-by"].startswith("tail#")
        # Not ready while a group has no replica (a script waiting for 200 must not start on half a cluster);
        # /status says which group is missing.
        health = httpx.get(f"{url}/health", timeout=60)
        assert health.status_code == 503 and health.json() == {"status": "starting"}
        groups = {g["name"]: g for g in httpx.get(f"{url}/status", timeout=60).json()["ray"]["groups"]}
        assert (groups["never"]["running"], groups["never"]["up"]) == (0, False)
        assert (groups["tail"]["running"], groups["tail"]["up"]) == (1, True)
    finally:
        serve.delete(name)


def test_a_correction_sent_to_one_replica_answers_on_every_replica(cluster: Any) -> None:
    """POST /v1/corrections through the ingress reaches one replica of the pair's group; every replica of that
    group (two, one per node) answers the text with it at once, from the store they share."""
    import httpx

    text, fixed = "The nightly copy of the archive is finished.", "Die nächtliche Kopie des Archivs ist fertig."
    url = f"http://127.0.0.1:{cluster['port']}"
    posted = httpx.post(f"{url}/v1/corrections", json={"q": text, "source": "en", "target": "de",
                                                       "translation": fixed}, timeout=60)
    assert posted.status_code == 201, posted.text
    assert posted.headers["x-served-by"].startswith("tail#")
    tail = serve.get_deployment_handle("tail", app_name=APP_NAME)
    answers: dict[str, str] = {}
    for _ in range(60):  # without a multiplexed id, Serve spreads the calls over the group's replicas
        reply = tail.translate.remote([text], "en", "de").result()
        answers[reply["replica"]] = reply["results"][0]["text"]
        if len(answers) == 2:
            break
    assert len(answers) == 2 and set(answers.values()) == {fixed}, answers


def test_killing_a_replica_mid_load_loses_no_accepted_request(cluster: Any, reference: Any) -> None:
    from hunyuan_mt.errors import ReplicaUnavailable

    signal = cluster["signal"]
    ray.get(signal.reset.remote())
    victim_id = translate(cluster, ["Open the file."], "en", "fr")[0]["replica"]
    victim = infos(cluster)[victim_id]
    texts = [f"{HELD_TEXT} {i}" for i in range(3)]
    pending = [cluster["ingress"].translate.remote([t], "en", "fr") for t in texts]
    wait_until(lambda: victim["pid"] in ray.get(signal.arrived.remote()), "requests to be held on the victim")
    ray.kill(ray.get_actor(victim["actor_name"], namespace="serve"), no_restart=True)
    ray.get(signal.send.remote())

    served, retryable = 0, 0
    for text, response in zip(texts, pending):
        try:
            result = response.result()[0]
        except Exception as exc:  # a clear retryable error is acceptable, anything else is a lost request
            cause = getattr(exc, "cause", exc)
            assert isinstance(cause, ReplicaUnavailable) and cause.retryable, repr(exc)
            retryable += 1
            continue
        assert result["replica"] != victim_id
        assert result["text"] == reference.translate(text, "en", "fr").text
        served += 1
    assert served + retryable == len(texts)
    # With 8 attempts the router has long learnt of the death: every held request is served again elsewhere.
    assert served == len(texts)
    # afterwards: served (by the survivor or the replacement replica), same output as before
    after = translate(cluster, ["Open the file and save the document."], "en", "fr")[0]
    assert after["replica"] != victim_id
    assert after["text"] == reference.translate("Open the file and save the document.", "en", "fr").text


def _without_matches(body: dict[str, Any]) -> dict[str, Any]:
    """A /translate body without the memory's suggestions (they come from the demo memory the replicas share)."""
    return {k: v for k, v in body.items() if k != "memoryMatches"}
