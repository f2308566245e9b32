"""Registry: scan-time validation without the model; bad folders are listed or ignored, never loaded."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import tiny_models
from hunyuan_mt.adapters import registry as registry_mod
from hunyuan_mt.adapters.registry import AdapterRegistry, read_adapter
from hunyuan_mt.lora.peft_format import BackboneSpec
from hunyuan_mt.adapters.request import AdapterRequest, Pair
from hunyuan_mt.errors import AdapterNotFound, AdapterUnusable, UnsupportedLanguage


@pytest.fixture(scope="module")
def marian_spec(marian_dir: Path) -> BackboneSpec:
    """The spec from a meta-device model: validation needs shapes only."""
    return BackboneSpec(model_type="marian", shapes=tiny_models.linear_shapes(marian_dir))


def scan(root: Path, spec: BackboneSpec) -> tuple[AdapterRegistry, dict[str, registry_mod.AdapterInfo]]:
    reg = AdapterRegistry(root, spec)
    return reg, {i.key: i for i in reg.scan()}


def test_scan_lists_valid_adapters_with_details(marian_adapters: Path, marian_spec: BackboneSpec) -> None:
    reg, infos = scan(marian_adapters, marian_spec)
    assert sorted(infos) == sorted(tiny_models.DEFAULT_PAIRS)
    info = infos["en2es"]
    assert info.usable and info.reason is None
    assert (info.rank, info.alpha, info.target_modules) == (4, 16.0, ["q_proj", "v_proj"])
    assert info.size_bytes > 0 and info.fingerprint is not None and info.metadata["pair"] == "en2es"
    assert reg.usable_pairs() == {Pair.parse(k) for k in tiny_models.DEFAULT_PAIRS}
    assert reg.request(Pair("en", "es")) == AdapterRequest(Pair("en", "es"), marian_adapters / "en2es")


def test_scan_reads_headers_not_weights(marian_adapters: Path, marian_spec: BackboneSpec, monkeypatch) -> None:
    import safetensors.torch

    def forbidden(*a, **k):
        raise AssertionError("scan must not read adapter weights")

    monkeypatch.setattr(safetensors.torch, "load_file", forbidden)
    _, infos = scan(marian_adapters, marian_spec)
    assert all(i.usable for i in infos.values())


def test_incompatible_adapter_rejected_at_scan(adapters_copy: Path, marian_dir: Path, marian_spec) -> None:
    tiny_models.make_incompatible_adapter(marian_dir, adapters_copy / "de2fr")
    reg, infos = scan(adapters_copy, marian_spec)
    bad = infos["de2fr"]
    assert not bad.usable
    assert bad.reason.startswith("shape mismatch at model.")
    assert "lora_A [4, 64]" in bad.reason and "trained for another base model?" in bad.reason
    with pytest.raises(AdapterUnusable, match=r"^Adapter de2fr is unusable: shape mismatch"):
        reg.get(Pair("de", "fr"))
    assert infos["en2es"].usable  # the others are unaffected


@pytest.mark.parametrize("damage, reason", [
    ("truncate", "adapter_model.safetensors is corrupt or truncated"),
    ("garbage", "adapter_model.safetensors is corrupt or truncated"),
    ("delete", "adapter_model.safetensors is missing"),
])
def test_damaged_weights_rejected_at_scan(adapters_copy: Path, marian_spec, damage: str, reason: str) -> None:
    tiny_models.corrupt_adapter(adapters_copy / "en2de", damage)
    _, infos = scan(adapters_copy, marian_spec)
    assert not infos["en2de"].usable and infos["en2de"].reason.startswith(reason)
    assert str(adapters_copy) not in infos["en2de"].reason  # reasons are shown to callers: no paths
    assert sum(i.usable for i in infos.values()) == len(tiny_models.DEFAULT_PAIRS) - 1


def write_config(folder: Path, **changes) -> None:
    path = folder / "adapter_config.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_config_problems_have_reasons(adapters_copy: Path, marian_spec) -> None:
    write_config(adapters_copy / "en2de", target_modules=["no_such_proj"])
    write_config(adapters_copy / "de2en", peft_type="PREFIX_TUNING")
    write_config(adapters_copy / "es2en", r=8)
    (adapters_copy / "en2fr" / "adapter_config.json").write_text("{not json")
    (adapters_copy / "fr2en" / "adapter_config.json").unlink()
    pickled = adapters_copy / "en2zh"
    (pickled / "adapter_model.safetensors").rename(pickled / "adapter_model.bin")
    _, infos = scan(adapters_copy, marian_spec)
    assert infos["en2de"].reason == "target_modules ['no_such_proj'] match no layer of this backbone (marian)"
    assert infos["de2en"].reason == "not a LoRA adapter (peft_type='PREFIX_TUNING')"
    assert infos["en2fr"].reason == "adapter_config.json is unreadable (JSONDecodeError)"
    assert infos["fr2en"].reason == "adapter_config.json is missing"
    assert infos["en2zh"].reason.startswith("only adapter_model.bin (pickle) found; only safetensors")
    assert infos["es2en"].reason == ("rank mismatch at model.decoder.layers.0.encoder_attn.q_proj: lora_A [4, 32] "
                                     "has rank 4, the config says r=8")
    assert {k for k, i in infos.items() if i.usable} == {"en2es", "zh2en"}


def test_bad_folder_names_and_escaping_symlinks_are_ignored(adapters_copy: Path, marian_spec, tmp_path) -> None:
    for name in ("english2spanish", "en2xx", "EN2es", "en-es", ".hidden2en"):
        shutil.copytree(adapters_copy / "en2es", adapters_copy / name)
    outside = tmp_path / "outside" / "it2en"
    shutil.copytree(adapters_copy / "en2es", outside)
    os.symlink(outside, adapters_copy / "it2en")
    os.symlink(adapters_copy / "en2de", adapters_copy / "pt2en")  # a symlink inside the root is fine
    reg, infos = scan(adapters_copy, marian_spec)
    ignored = dict(reg.ignored())
    assert set(ignored) == {"english2spanish", "en2xx", "EN2es", "en-es", "it2en"}
    assert ignored["it2en"] == "symlink leading outside the adapters folder"
    assert ignored["EN2es"] == "not the canonical name, rename it to en2es"
    assert "it2en" not in infos and infos["pt2en"].usable
    with pytest.raises(AdapterNotFound, match="No adapter for it2en"):
        reg.get(Pair("it", "en"))


def test_rescan_picks_up_new_adapters(adapters_copy: Path, marian_dir: Path, marian_spec) -> None:
    reg, infos = scan(adapters_copy, marian_spec)
    assert "it2en" not in infos
    tiny_models.make_adapter(marian_dir, adapters_copy / "it2en", seed=42)
    reg.scan()
    assert reg.get(Pair("it", "en")).usable


def test_read_adapter_checks_the_fingerprint(adapters_copy: Path, marian_dir: Path, marian_spec) -> None:
    reg, _ = scan(adapters_copy, marian_spec)
    weights = read_adapter(reg.get(Pair("en", "es")))
    assert weights.config.r == 4 and len(weights.state_dict) > 0
    info = reg.get(Pair("en", "de"))
    tiny_models.make_adapter(marian_dir, adapters_copy / "en2de", seed=77)  # replaced after the scan
    with pytest.raises(AdapterUnusable, match="^Adapter en2de changed on disk since the last scan; rescan"):
        read_adapter(info)
    info = reg.get(Pair("es", "en"))
    shutil.rmtree(adapters_copy / "es2en")
    with pytest.raises(AdapterUnusable, match="^Adapter es2en was deleted or is incomplete since the last scan"):
        read_adapter(info)


@pytest.mark.parametrize("name", ["../etc2en", "/abs2en", "en2..%2Fes", "en2es/..", "en\x002es", "en2es2de", ""])
def test_hostile_pair_names_never_parse(name: str) -> None:
    with pytest.raises(UnsupportedLanguage):
        Pair.parse(name)


def test_pair_parse_normalises_case() -> None:
    assert Pair.parse("zh-hant2EN") == Pair("zh-Hant", "en")
    assert Pair.parse("zh-Hant2en").key == "zh-Hant2en"


def test_a_config_value_of_the_wrong_type_fails_only_that_adapter(adapters_copy: Path, marian_spec) -> None:
    write_config(adapters_copy / "en2de", lora_alpha="x")
    _, infos = scan(adapters_copy, marian_spec)
    assert infos["en2de"].usable is False
    assert infos["en2de"].reason.startswith("adapter_config.json has an invalid value (")
    assert infos["en2es"].usable is True
