"""Versioned adapters: corrections continued into a candidate (tiny Marian model), scored in shadow and promoted
only when it earns it; promotion as a hot swap while 16 HTTP clients translate (no failure, every answer whole
from one version), for a pinned pair and an LRU pair; rollback in one call; another process's promotion seen by
a running server; /status showing each pair's version and scores."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.errors import InvalidInput
from hunyuan_mt.training.retrain import ShadowReport, _decide, retrain
from hunyuan_mt.store import Store
from hunyuan_mt.training.train import TrainOptions
from test_service import make_service
from tiny_models import make_adapter
from web_server import ADMIN_KEY, LiveServer, serve, with_server

CLIENTS = 16


def _report(corrections: tuple[float, float], standing: tuple[float, float] | None) -> ShadowReport:
    report = ShadowReport("en2es", "v1", "v2", 500, 400, 100, 800, 400)
    report.scores = {"corrections": {"current": corrections[0], "candidate": corrections[1]},
                     "standing": {"current": standing[0] if standing else None,
                                  "candidate": standing[1] if standing else None}}
    return report


def test_a_candidate_is_promoted_only_when_corrections_improve_and_the_standing_set_holds() -> None:
    assert _decide(_report((63.0, 76.0), (57.0, 56.6))) == (
        "promote", "held-out corrections chrF 63.0 → 76.0 (+13.0); standing held-out set 57.0 → 56.6 (change -0.4)")
    assert _decide(_report((63.0, 76.0), (57.0, 56.4))) == (
        "keep", "held-out corrections chrF 63.0 → 76.0, but the standing held-out set fell by 0.6 (57.0 → 56.4; at "
                "most 0.5 is allowed)")
    assert _decide(_report((63.0, 63.0), (57.0, 58.0)))[1] == \
        "the held-out corrections did not improve: chrF 63.0 against 63.0 for v1"
    assert "no standing held-out set" in _decide(_report((63.0, 70.0), None))[1]


# ---------------------------------------------------------------------------------------------------- retraining


@pytest.fixture()
def adapters(tmp_path: Path, marian_adapters: Path) -> Path:
    dest = tmp_path / "adapters"
    shutil.copytree(marian_adapters, dest)
    return dest


@pytest.mark.parametrize("family", ["marian", "hunyuan"])  # encoder-decoder and decoder-only backbones
def test_corrections_become_a_scored_version_recorded_in_the_store(tmp_path: Path, family: str,
                                                                    request: pytest.FixtureRequest) -> None:
    from hunyuan_mt.runtime.backbone import Backbone
    from hunyuan_mt.config import ModelConfig
    from hunyuan_mt.store import Correction, Provenance

    model_dir = request.getfixturevalue(f"{family}_dir")
    adapters = tmp_path / "adapters"
    shutil.copytree(request.getfixturevalue(f"{family}_adapters"), adapters)
    store = Store.open("", tmp_path / "data")
    backbone = Backbone.load_uncached(ModelConfig(path=str(model_dir), warmup=False, quantization="none"))
    with pytest.raises(InvalidInput, match="en2es has 0 corrections; at least 10 are needed"):
        retrain(backbone, store, adapters, "en2es", TrainOptions())
    words = ["file", "folder", "page", "draft", "image", "user", "group", "site", "form", "menu", "link", "tag"]
    for n, word in enumerate(words):
        store.memory.correct(Correction("en2es", f"Delete the {word}", f"Borrar {n}"), Provenance("correction"))
    (adapters / "en2es" / "heldout.tsv").write_text("# standing\nHello world\tHola mundo\nGood day\tBuen día\n",
                                                    encoding="utf-8")
    report = retrain(backbone, store, adapters, "en2es", TrainOptions(epochs=1, batch_size=4, held_out=0.25),
                     progress=False)
    assert (report.version, report.parent, report.corrections, report.trained_on, report.held_out) == (
        "v2", "v1", 12, 9, 3)
    assert report.standing == 2 and report.replay == 0  # no shipped memory for the tiny model: nothing to replay
    assert set(report.scores) == {"corrections", "standing"}
    assert all(isinstance(v, float) for scores in report.scores.values() for v in scores.values())
    folder = adapters / "en2es" / "v2"
    assert {p.name for p in folder.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors",
                                                  "metadata.json", "report.json"}
    [row] = [v for v in store.adapters.all("en2es") if v.version == "v2"]
    assert row.state == ("current" if report.promoted else "candidate") and row.report["reason"] == report.reason
    assert report.promoted == (report.decision == "promote")


# ---------------------------------------------------------------------------------------------------- hot swap


@pytest.fixture()
def versioned(tmp_path: Path, marian_dir: Path, adapters: Path) -> Iterator[LiveServer]:
    """A server on the tiny model whose en2es (pinned) and en2de (LRU) have a second version, v2, as candidates."""
    for seed, pair in ((41, "en2es"), (42, "en2de")):
        make_adapter(marian_dir, adapters / pair / "v2", seed=seed, scale=3.0)
    service = make_service(marian_dir, adapters, **{"tm.enabled": False, "limits.max_batch_items": 64,
                                                    "store.dir": str(tmp_path / "data")})
    for pair in ("en2es", "en2de"):
        service.store.adapters.add_candidate(pair, "v2", "v1", {"scores": {"corrections": {"candidate": 1.0}}})
    with serve(service, with_server(service.cfg, admin_key=ADMIN_KEY)) as server:
        yield server
    service.close()


def _translate(url: str, text: str, tgt: str) -> str:
    answer = requests.post(url + "/translate", json={"q": text, "source": "en", "target": tgt}, timeout=60)
    answer.raise_for_status()
    return answer.json()["translatedText"]


def _admin(url: str, action: str, **fields: str) -> dict[str, Any]:
    answer = requests.post(f"{url}/admin/{action}", data=fields, headers={"X-Admin-Key": ADMIN_KEY}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize("tgt", ["es", "de"])  # en2es is pinned, en2de lives in the LRU slots
def test_promotion_is_a_hot_swap_under_16_clients_and_rollback_is_one_call(versioned: LiveServer, tgt: str) -> None:
    url, pair = versioned.url, f"en2{tgt}"
    text = "Hello world, how are you today?"
    old = _translate(url, text, tgt)
    answers: list[tuple[float, str]] = []
    failures: list[str] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                answers.append((time.monotonic(), _translate(url, text, tgt)))
            except Exception as exc:  # noqa: BLE001 - every failure is counted
                failures.append(repr(exc))

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    while len(answers) < 3 * CLIENTS:
        time.sleep(0.01)
    assert _admin(url, "promote", pair=pair, version="v2") == {"ok": True, "action": "promote", "pair": pair,
                                                               "from": "v1", "to": "v2"}
    promoted_at = time.monotonic()
    while sum(1 for t, _ in answers if t > promoted_at + 0.5) < 3 * CLIENTS:
        time.sleep(0.01)
    stop.set()
    for thread in threads:
        thread.join(60)
    new = _translate(url, text, tgt)
    assert failures == [] and new != old
    # Every answer whole from one version; after the swap (and the rows that started before it) only the new one.
    assert {a for _, a in answers} == {old, new}
    assert {a for t, a in answers if t > promoted_at + 0.5} == {new}
    status = requests.get(url + "/status", timeout=60).json()["adapters"][pair]
    assert status["version"] == "v2"
    assert {v["version"]: v["state"] for v in status["versions"]} == {"v1": "retired", "v2": "current"}
    from hunyuan_mt.web.status_view import adapters_frame  # the Status tab's table of resident adapters

    frame = adapters_frame(versioned.service.status())
    assert frame[frame["adapter"] == pair]["version"].tolist() == ["v2"]
    assert _admin(url, "rollback", pair=pair) == {"ok": True, "action": "rollback", "pair": pair, "from": "v2",
                                                  "to": "v1"}
    assert _translate(url, text, tgt) == old
    refused = requests.post(f"{url}/admin/promote", data={"pair": pair, "version": "v9"},
                            headers={"X-Admin-Key": ADMIN_KEY}, timeout=60)
    assert refused.status_code == 400 and "No version 'v9' of " + pair in refused.json()["error"]


def test_a_promotion_made_by_another_process_reaches_a_running_server(versioned: LiveServer) -> None:
    text = "Hello world, how are you today?"
    old = _translate(versioned.url, text, "de")
    # What the CLI's train-adapter --from-corrections does when it promotes: only the store changes.
    Store.open("", Path(versioned.service.cfg.store.dir)).adapters.promote("en2de", "v2")
    deadline = time.monotonic() + 30
    while _translate(versioned.url, text, "de") == old:
        assert time.monotonic() < deadline, "the running server never swapped to v2"
        time.sleep(0.2)
    assert versioned.service.registry.get(Pair("en", "de")).version == "v2"


def test_the_ray_ingress_promotes_and_rolls_back_in_the_store_the_replicas_watch(tmp_path: Path) -> None:
    """The ingress has no adapters of its own: a promotion there is the store's record, which every replica's
    VersionWatch (tested above) swaps in."""
    pytest.importorskip("ray")
    from hunyuan_mt.config import load_config
    from hunyuan_mt.serve_ray import GroupSpec, ServeSettings
    from hunyuan_mt.serve_ray.ingress import RemoteService

    cfg = load_config(overrides={"store.dir": str(tmp_path / "data")}, env={})
    settings = ServeSettings(profile="default", groups=[GroupSpec(name="tail", long_tail=True)])
    remote = RemoteService({}, settings, cfg, "hmt-test")
    store = Store.open("", tmp_path / "data")
    store.adapters.add_candidate("en2es", "v2", "v1", {})
    assert remote.promote("en2es", "v2") == {"pair": "en2es", "from": "v1", "to": "v2"}
    assert store.adapters.current() == {"en2es": "v2"}
    assert remote.rollback("en2es") == {"pair": "en2es", "from": "v2", "to": "v1"}
    assert store.adapters.current() == {"en2es": "v1"}
    with pytest.raises(InvalidInput, match="en2es has no earlier version"):
        remote.rollback("en2es")
