"""Fault containment end to end (invariant 6).

A broken adapter (corrupt or truncated safetensors, trained for another base model, deleted or replaced while
cached, unreadable) fails only its own pair, through the service and over HTTP (status + `{"error": message}`),
while every other pair keeps serving its exact reference output. A failure is remembered (the disk is not read
again on every request: reads are counted) and a rescan clears it.

One private service (tiny Marian, DEFAULT_PAIRS, en2es pinned, 3 slots) behind the real REST app on 127.0.0.1;
every test starts from intact adapters, nothing resident but the pin, nothing remembered.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import gradio as gr
import pytest

import tiny_models
from fault_env import RestEnv, rest_env, tiny_config
from hunyuan_mt.adapters import cache as cache_mod
from hunyuan_mt.errors import AdapterUnusable
from hunyuan_mt.web.ui import TranslatorUI

TEXT = "Open the file, save the document and close the window."
#: Pairs whose output the "others keep serving" check compares; en2es is pinned, the rest use slots.
PAIRS = tiny_models.DEFAULT_PAIRS
WEIGHTS = "adapter_model.safetensors"


def codes(pair: str) -> tuple[str, str]:
    src, tgt = pair.split("2")
    return src, tgt


@dataclass
class FaultEnv:
    rest: RestEnv
    root: Path  # the service's adapters folder (a private copy)
    pristine: Path  # the session's intact adapters
    refs: dict[str, str]  # pair (or "de>fr" pivot) → output for TEXT, computed before any fault
    ui: Any  # the UI's handlers (web/ui.py TranslatorUI) over the same service

    @property
    def service(self) -> Any:
        return self.rest.service


@pytest.fixture(scope="module")
def module_env(tmp_path_factory: pytest.TempPathFactory, marian_dir: Path, marian_adapters: Path
               ) -> Iterator[FaultEnv]:
    root = tmp_path_factory.mktemp("faults") / "adapters"
    shutil.copytree(marian_adapters, root)
    cfg = tiny_config(marian_dir, root, **{"cache.pinned": ["en2es"], "cache.slots": 3,
                                           "cache.failure_ttl_s": 3600})
    with rest_env(cfg) as rest:
        refs = {p: rest.service.translate(TEXT, *codes(p)).text for p in PAIRS}
        refs["de>fr"] = rest.service.translate(TEXT, "de", "fr").text  # pivot de → en → fr
        assert len(set(refs.values())) == len(refs), "each adapter must give its own output"
        ui = TranslatorUI(rest.service, cfg)
        yield FaultEnv(rest, root, marian_adapters, refs, ui)
        ui.close()


def restore(env: FaultEnv) -> None:
    """Put back every folder that differs from the pristine copy, drop extra ones, rescan, empty the slots."""
    for folder in env.root.iterdir():
        if not (env.pristine / folder.name).exists():
            shutil.rmtree(folder)
    for good in env.pristine.iterdir():
        mine = env.root / good.name
        same = mine.is_dir() and all((mine / f.name).is_file() and (mine / f.name).read_bytes() == f.read_bytes()
                                     for f in good.iterdir())
        if not same:
            shutil.rmtree(mine, ignore_errors=True)
            shutil.copytree(good, mine)
    env.service.rescan()
    env.service.cache.evict_idle(keep_ram=False)


@pytest.fixture()
def env(module_env: FaultEnv) -> FaultEnv:
    restore(module_env)
    assert module_env.service.cache.lru_order() == [] and module_env.service.cache.stats().failed == {}
    return module_env


@pytest.fixture()
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every disk read the cache attempts (its one read path), by pair key."""
    calls: list[str] = []
    real = cache_mod.read_adapter

    def counted(info: Any) -> Any:
        calls.append(info.key)
        return real(info)

    monkeypatch.setattr(cache_mod, "read_adapter", counted)
    return calls


# -------------------------------------------------------------------------------------------------- assertions


def refused(env: FaultEnv, pair: str, status: int, message: str) -> str:
    """The pair fails with `message` (a prefix) through the service, over HTTP and in the UI, identically, without
    paths."""
    with pytest.raises(AdapterUnusable if status == 503 else Exception) as err:
        env.service.translate(TEXT, *codes(pair))
    said = err.value.message
    assert said.startswith(message), said
    response = env.rest.translate(TEXT, *codes(pair))
    assert response.status_code == status, response.text
    # Where LibreTranslate has its own sentence for the error, that is the `error` and ours the `detail`.
    short, reachable = err.value.short, getattr(err.value, "reachable", None)
    expected = {"error": short, "detail": said} if short else {"error": said}
    assert response.json() == ({**expected, "reachable": reachable} if reachable else expected)
    assert str(env.root) not in said and "Traceback" not in response.text and "slot" not in said
    with pytest.raises(gr.Error) as shown:
        env.ui.translate_text(TEXT, *codes(pair))
    assert shown.value.message == said
    return said


def others_serve(env: FaultEnv, *broken: str) -> None:
    """Every other pair (and a pivot route through intact adapters) gives its exact reference; /health is ok."""
    for pair in PAIRS:
        if pair in broken:
            continue
        response = env.rest.translate(TEXT, *codes(pair))
        assert response.status_code == 200, (pair, response.text)
        assert response.json()["translatedText"] == env.refs[pair], pair
    if not {"de2en", "en2fr"} & set(broken):
        assert env.rest.translate(TEXT, "de", "fr").json()["translatedText"] == env.refs["de>fr"]
    assert env.rest.client.get("/health").json()["status"] == "ok"


def rescan(env: FaultEnv) -> None:
    response = env.rest.admin("rescan")
    assert response.status_code == 200 and response.json() == {"ok": True, "action": "rescan"}


def serves(env: FaultEnv, pair: str) -> None:
    response = env.rest.translate(TEXT, *codes(pair))
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"] == env.refs[pair]


def damage_in_place(path: Path, data: bytes) -> None:
    """Overwrite a file keeping its size and mtime: the scan's fingerprint cannot see it, only reading does."""
    stat = path.stat()
    assert len(data) == stat.st_size
    path.write_bytes(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


# -------------------------------------------------------------------------------------------------- corrupt


def test_corrupt_safetensors_fails_only_its_pair_is_remembered_and_rescan_clears_it(env: FaultEnv,
                                                                                     reads: list[str]) -> None:
    weights = env.root / "en2de" / WEIGHTS
    good = weights.read_bytes()
    damage_in_place(weights, good[:8] + b"\xff" * (len(good) - 8))  # garbage header, same size and mtime
    message = refused(env, "en2de", 503, "Adapter en2de could not be read: ")
    for _ in range(2):  # remembered: answered at once, the disk is not read again
        assert env.rest.translate(TEXT, "en", "de").json() == {"error": message}
    assert reads == ["en2de"]
    assert env.service.cache.stats().failed == {"en2de": message}
    assert env.rest.client.get("/adapters").json()["failed"] == {"en2de": message}
    others_serve(env, "en2de")
    damage_in_place(weights, good)
    rescan(env)  # forgets the failure: the next request reads the (repaired) file again
    serves(env, "en2de")
    assert reads.count("en2de") == 2 and env.service.cache.stats().failed == {}


def test_truncated_safetensors_copied_in_half_finished(env: FaultEnv, reads: list[str]) -> None:
    tiny_models.corrupt_adapter(env.root / "en2de", "truncate")  # after the scan: the fingerprint changed
    refused(env, "en2de", 503, "Adapter en2de changed on disk since the last scan; rescan adapters to use it.")
    assert reads == ["en2de"]
    others_serve(env, "en2de")
    rescan(env)  # now the scan itself sees the damage, and says so
    said = refused(env, "en2de", 503, "Adapter en2de is unusable: adapter_model.safetensors is corrupt or truncated")
    assert "No other route from en to de" in said
    assert reads.count("en2de") == 1  # refused by the registry's verdict: nothing read
    registered = {e["pair"]: e for e in env.rest.client.get("/adapters").json()["registered"]}
    assert registered["en2de"]["usable"] is False and "corrupt or truncated" in registered["en2de"]["reason"]
    others_serve(env, "en2de")
    shutil.copy2(env.pristine / "en2de" / WEIGHTS, env.root / "en2de" / WEIGHTS)  # the copy finished
    rescan(env)
    serves(env, "en2de")


def test_broken_pivot_hop_names_the_broken_adapter(env: FaultEnv) -> None:
    tiny_models.corrupt_adapter(env.root / "en2fr", "garbage")
    rescan(env)
    response = env.rest.translate(TEXT, "de", "fr")  # de → en → fr needs en2fr
    assert response.status_code == 400
    assert response.json()["error"] == "French (fr) is not available as a target language from German (de)"
    assert response.json()["detail"].startswith(
        "No route from de to fr: no adapter de2fr, and the pivot route through en lacks en2fr (unusable: "
        "adapter_model.safetensors is corrupt or truncated")
    with pytest.raises(gr.Error) as shown:
        env.ui.translate_text(TEXT, "de", "fr")
    assert shown.value.message == response.json()["detail"]
    serves(env, "de2en")


# -------------------------------------------------------------------------------------------------- other base


def test_adapter_for_another_base_model_is_refused_at_scan(env: FaultEnv, reads: list[str]) -> None:
    tiny_models.make_incompatible_adapter(env.service.cfg.model.resolved_path, env.root / "en2it")
    rescan(env)
    said = refused(env, "en2it", 503, "Adapter en2it is unusable: shape mismatch at ")
    assert "(trained for another base model?)" in said
    assert reads == []  # validated from the safetensors header at scan time; never loaded
    others_serve(env)


def test_adapter_replaced_by_one_for_another_base_model_while_cached(env: FaultEnv, reads: list[str]) -> None:
    for pair in ("en2de", "en2fr", "fr2en", "zh2en"):  # en2de ends up in the RAM tier, evicted by the LRU
        serves(env, pair)
    assert env.service.cache.ram_tier() == ["en2de"] and env.service.cache.lru_order() == ["en2fr", "fr2en", "zh2en"]
    shutil.rmtree(env.root / "en2de")
    tiny_models.make_incompatible_adapter(env.service.cfg.model.resolved_path, env.root / "en2de")
    refused(env, "en2de", 503, "Adapter en2de changed on disk since the last scan; rescan adapters.")
    others_serve(env, "en2de")
    rescan(env)
    refused(env, "en2de", 503, "Adapter en2de is unusable: shape mismatch at ")
    assert "en2de" not in env.service.cache.ram_tier() + env.service.cache.lru_order()
    others_serve(env, "en2de")


@pytest.mark.parametrize("edit, says", [
    (lambda c: c.update(r=8), "lora_A [4, 32] has rank 4, the config says r=8"),
    (lambda c: c.update(target_modules=["q_proj", "v_proj", "k_proj"]), "lacks lora_A/lora_B weights for "),
], ids=["rank-disagrees", "target-modules-without-weights"])
def test_config_that_disagrees_with_its_weights_is_refused_at_scan(env: FaultEnv, reads: list[str], edit: Any,
                                                                   says: str) -> None:
    """Validate before loading: such an adapter would only fail inside PEFT, with a page of internal names."""
    config_file = env.root / "en2de" / "adapter_config.json"
    config = json.loads(config_file.read_text())
    edit(config)
    config_file.write_text(json.dumps(config))
    rescan(env)
    said = refused(env, "en2de", 503, "Adapter en2de is unusable: ")
    assert says in said and "\n" not in said and len(said) < 400
    assert reads == []
    others_serve(env, "en2de")


# -------------------------------------------------------------------------------------------------- deleted


def test_adapter_folders_deleted_while_cached(env: FaultEnv, reads: list[str]) -> None:
    for pair in ("en2fr", "en2de", "fr2en", "zh2en"):
        serves(env, pair)
    assert env.service.cache.lru_order() == ["en2de", "fr2en", "zh2en"] and env.service.cache.ram_tier() == ["en2fr"]
    for pair in ("en2de", "en2fr", "de2en"):  # resident in a slot / in the RAM tier / never loaded
        shutil.rmtree(env.root / pair)
    reads.clear()
    serves(env, "en2de")  # the resident copy needs no disk: it keeps serving until a rescan
    refused(env, "en2fr", 503, "Adapter en2fr was deleted or is incomplete since the last scan; rescan adapters.")
    refused(env, "de2en", 503, "Adapter de2en was deleted or is incomplete since the last scan; rescan adapters.")
    assert reads == ["de2en"]  # the RAM-tier copy was checked with a stat, not a read
    others_serve(env, "en2de", "en2fr", "de2en")
    rescan(env)
    assert "en2de" not in env.service.cache.lru_order()  # the stale slot copy is dropped
    for pair in ("en2de", "en2fr", "de2en"):
        src, tgt = codes(pair)
        response = env.rest.translate(TEXT, src, tgt)
        assert response.status_code == 400 and response.json()["detail"].startswith(
            f"No route from {src} to {tgt}: no adapter {pair}")
    others_serve(env, "en2de", "en2fr", "de2en")


def test_adapter_replaced_while_cached_serves_the_new_weights_after_a_rescan(env: FaultEnv,
                                                                            reads: list[str]) -> None:
    serves(env, "en2de")
    tiny_models.make_adapter(env.service.cfg.model.resolved_path, env.root / "en2de", seed=4242)
    serves(env, "en2de")  # the resident copy keeps serving (rows in flight never see a half-written folder)
    rescan(env)
    response = env.rest.translate(TEXT, "en", "de")
    assert response.status_code == 200
    new = response.json()["translatedText"]
    assert new != env.refs["en2de"]  # the new adapter's output, not the stale copy's
    assert reads == ["en2de", "en2de"]
    assert env.rest.translate(TEXT, "en", "de").json()["translatedText"] == new
    others_serve(env, "en2de")


# -------------------------------------------------------------------------------------------------- read error


def test_read_error_fails_only_its_pair_and_is_not_retried_until_rescan(env: FaultEnv, reads: list[str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import safetensors.torch

    real = safetensors.torch.load_file
    attempts: list[str] = []

    def flaky_disk(filename: Any, device: Any = "cpu") -> Any:
        if f"{os.sep}en2de{os.sep}" in str(filename):
            attempts.append("en2de")
            raise PermissionError(13, "Permission denied", str(filename))
        return real(filename, device=device)

    monkeypatch.setattr(safetensors.torch, "load_file", flaky_disk)
    said = refused(env, "en2de", 503, "Adapter en2de could not be read: [Errno 13] Permission denied")
    assert "<path>" in said  # the OS message's path is not shown to callers
    for _ in range(3):
        assert env.rest.translate(TEXT, "en", "de").status_code == 503
    assert attempts == ["en2de"]
    others_serve(env, "en2de")
    rescan(env)
    assert env.rest.translate(TEXT, "en", "de").status_code == 503  # tried again once after the rescan
    assert attempts == ["en2de", "en2de"]
    monkeypatch.setattr(safetensors.torch, "load_file", real)
    rescan(env)
    serves(env, "en2de")


# -------------------------------------------------------------------------------------------------- shared batch


def test_broken_adapter_in_a_shared_batch_fails_only_its_rows(env: FaultEnv, reads: list[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests for a broken pair and three good ones are queued into ONE engine batch (the engine is held by
    a first request's generate until all are queued): only the broken pair's requests fail."""
    weights = env.root / "en2de" / WEIGHTS
    damage_in_place(weights, b"\x00" * weights.stat().st_size)
    engine = env.service.engine
    held, release = threading.Event(), threading.Event()

    def hold_first(rows: list[Any]) -> None:
        if not held.is_set():
            held.set()
            assert release.wait(60)

    monkeypatch.setattr(engine, "before_generate", hold_first)
    tried: list[str] = []
    real_acquire = env.service.cache.try_acquire

    def spy_acquire(pairs: Any) -> Any:
        tried.extend(p.key for p in pairs if p is not None)
        return real_acquire(pairs)

    monkeypatch.setattr(env.service.cache, "try_acquire", spy_acquire)
    first = threading.Thread(target=env.rest.translate, args=("Close the window.", "en", "es"))
    first.start()
    assert held.wait(60)
    wanted = ["en2de", "en2fr", "de2en", "en2es"] * 3
    results: dict[int, Any] = {}

    def call(i: int, pair: str) -> None:
        results[i] = env.rest.translate(TEXT, *codes(pair))

    threads = [threading.Thread(target=call, args=(i, p)) for i, p in enumerate(wanted)]
    for t in threads:
        t.start()
    deadline = threading.Event()
    while engine.queued() < len(wanted):  # every request is queued behind the held forward (no timing involved)
        assert all(t.is_alive() for t in threads), "a request returned before the engine ran"
        deadline.wait(0.01)
    start = len(engine.history)
    release.set()
    for t in threads + [first]:
        t.join(120)
    assert set(tried) >= {"de2en", "en2de", "en2es", "en2fr"}
    # After the held first request's own prefill, the good pairs' rows entered together, in one prefill, while
    # en2de's leases failed in that same admission round.
    prefills = [h for h in list(engine.history)[start:] if h.kind == "prefill"]
    assert prefills[0].rows == 1
    assert sorted(set(prefills[1].pairs)) == ["de2en", "en2es", "en2fr"] and prefills[1].rows == 9
    messages = set()
    for i, pair in enumerate(wanted):
        response = results[i]
        if pair == "en2de":
            assert response.status_code == 503
            messages.add(response.json()["error"])
        else:
            assert response.status_code == 200 and response.json()["translatedText"] == env.refs[pair], pair
    assert len(messages) == 1 and messages.pop().startswith("Adapter en2de could not be read")
    assert reads.count("en2de") == 1


# -------------------------------------------------------------------------------------------------- out of memory


def test_out_of_memory_fails_only_the_row_that_cannot_fit(env: FaultEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's OOM seam (tested in test_engine.py) seen from HTTP: the batch is split, the row that still does
    not fit gets 507 with a readable message, the requests sharing its batch get their exact references."""
    import torch

    huge = "Save the document and close the window."
    engine = env.service.engine
    held, release = threading.Event(), threading.Event()

    def seam(rows: list[Any]) -> None:
        if not held.is_set():
            held.set()
            assert release.wait(60)
        if any(r.text == huge for r in rows):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(engine, "before_generate", seam)
    first = threading.Thread(target=env.rest.translate, args=("Close the window.", "en", "es"))
    first.start()
    assert held.wait(60)
    results: dict[str, Any] = {}
    calls = {"huge": (huge, "en", "de"), "en2de": (TEXT, "en", "de"), "en2es": (TEXT, "en", "es"),
             "fr2en": (TEXT, "fr", "en")}
    threads = [threading.Thread(target=lambda k=k, a=a: results.__setitem__(k, env.rest.translate(*a)))
               for k, a in calls.items()]
    for t in threads:
        t.start()
    while engine.queued() < len(calls):  # all four rows wait behind the held batch, then share one batch
        threading.Event().wait(0.01)
    splits = engine.stats.oom_splits
    release.set()
    for t in threads + [first]:
        t.join(120)
    oom = results.pop("huge")
    assert oom.status_code == 507
    assert oom.json()["error"].startswith("Out of memory translating one segment of ")
    assert oom.json()["error"].endswith("tokens (en→de), even alone; shorten the text or try again later.")
    assert "GiB" not in oom.text and "CUDA" not in oom.text
    for key, response in results.items():
        assert response.status_code == 200 and response.json()["translatedText"] == env.refs[key], key
    assert engine.stats.oom_splits > splits
    with pytest.raises(gr.Error) as shown:  # the UI shows the same message
        env.ui.translate_text(huge, "en", "de")
    assert shown.value.message == oom.json()["error"]
    assert env.rest.client.get("/health").json()["status"] == "ok"
