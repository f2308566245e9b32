"""Route planning over a real registry: identity, direct, pivot, base, unreachable, bad codes."""

from __future__ import annotations

from pathlib import Path

import pytest

import tiny_models
from hunyuan_mt.adapters.registry import AdapterRegistry
from hunyuan_mt.config import RoutingConfig
from hunyuan_mt.errors import UnreachablePair, UnsupportedLanguage
from hunyuan_mt.scheduler.router import Router

PAIRS = ("en2es", "es2en", "en2de", "de2en", "zh2en", "en2fr")


@pytest.fixture(scope="module")
def spec(marian_dir: Path):
    return tiny_models_spec(marian_dir)


def tiny_models_spec(model_dir: Path):
    from hunyuan_mt.runtime.backbone import Backbone
    from hunyuan_mt.config import ModelConfig

    return Backbone.load_uncached(ModelConfig(path=str(model_dir), warmup=False)).spec


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, marian_dir: Path, spec) -> AdapterRegistry:
    root = tmp_path_factory.mktemp("router_adapters")
    tiny_models.make_adapters(marian_dir, root, pairs=PAIRS)
    reg = AdapterRegistry(root, spec)
    reg.scan()
    return reg


def router(registry: AdapterRegistry, **kw) -> Router:
    return Router(registry, RoutingConfig(**{"pivot": "en", **kw}))


def test_identity(registry: AdapterRegistry) -> None:
    plan = router(registry).plan("es", "ES")
    assert (plan.kind, plan.route, plan.adapters, plan.hops) == ("identity", ["es"], [], ())


def test_direct(registry: AdapterRegistry) -> None:
    plan = router(registry).plan("en", "es")
    assert (plan.kind, plan.route, plan.adapters) == ("direct", ["en", "es"], ["en2es"])
    assert plan.label == "en → es (direct)"


def test_pivot_two_hops(registry: AdapterRegistry) -> None:
    plan = router(registry).plan("es", "de")
    assert plan.kind == "pivot"
    assert plan.route == ["es", "en", "de"]
    assert plan.adapters == ["es2en", "en2de"]
    assert [(h.src, h.tgt, h.adapter.key) for h in plan.hops] == [("es", "en", "es2en"), ("en", "de", "en2de")]
    assert plan.label == "es → en → de (pivot)"


def test_direct_wins_over_pivot(registry: AdapterRegistry) -> None:
    assert router(registry).plan("de", "en").kind == "direct"


def test_base_when_allowed(registry: AdapterRegistry) -> None:
    plan = router(registry, allow_base=True).plan("fr", "de")
    assert (plan.kind, plan.route, plan.adapters) == ("base", ["fr", "de"], [])
    assert plan.hops[0].adapter is None


def test_unreachable_lists_reachable_targets(registry: AdapterRegistry) -> None:
    with pytest.raises(UnreachablePair) as info:
        router(registry).plan("fr", "de")
    assert info.value.message == (
        "No route from fr to de: no adapter fr2de, and the pivot route through en lacks fr2en; "
        "the bare backbone is not allowed (routing.allow_base). Reachable from fr: nothing; this model translates "
        "from zh, en, es, de."
    )
    with pytest.raises(UnreachablePair) as info:
        router(registry).plan("zh", "ja")
    assert info.value.reachable == ["en", "fr", "es", "de"]  # zh2en, then en→{es, de, fr}, in table order
    assert "lacks en2ja" in info.value.message and "Reachable from zh: en, fr, es, de." in info.value.message


def test_pivot_language_itself_is_not_a_pivot(registry: AdapterRegistry) -> None:
    with pytest.raises(UnreachablePair, match="^No route from en to ja: no adapter en2ja; the bare"):
        router(registry).plan("en", "ja")


@pytest.mark.parametrize("code,message", [
    ("xx", "Unsupported language code 'xx'"),
    ("../en", "Malformed language code '../en'"),
    ("", "Malformed language code ''"),
    ("english", "Malformed language code 'english'"),
    ("xyz", "Unsupported language code 'xyz'"),
])
def test_unknown_codes_clear_error(registry: AdapterRegistry, code: str, message: str) -> None:
    with pytest.raises(UnsupportedLanguage, match="^" + message.replace(".", r"\.")):
        router(registry).plan(code, "es")
    with pytest.raises(UnsupportedLanguage, match="^" + message.replace(".", r"\.")):
        router(registry).plan("es", code)


def test_case_variants_and_aliases(registry: AdapterRegistry) -> None:
    assert router(registry).plan("EN", "Es").adapters == ["en2es"]
    assert router(registry).plan("zh-CN", "en").route == ["zh", "en"]


def test_reachable_targets(registry: AdapterRegistry) -> None:
    r = router(registry)
    assert r.reachable_targets("en") == ["fr", "es", "de"]
    assert r.reachable_targets("es") == ["en", "fr", "de"]
    assert r.reachable_targets("ja") == []
    assert len(router(registry, allow_base=True).reachable_targets("ja")) == 37


def test_rescan_is_visible(tmp_path: Path, marian_dir: Path, spec) -> None:
    tiny_models.make_adapters(marian_dir, tmp_path, pairs=("en2es",))
    reg = AdapterRegistry(tmp_path, spec)
    reg.scan()
    r = router(reg)
    with pytest.raises(UnreachablePair):
        r.plan("en", "ja")
    tiny_models.make_adapter(marian_dir, tmp_path / "en2ja", seed=5)
    reg.scan()
    assert r.plan("en", "ja").adapters == ["en2ja"]


def test_zh_pivot_for_hunyuan_profile(registry: AdapterRegistry, tmp_path: Path, marian_dir: Path, spec) -> None:
    tiny_models.make_adapters(marian_dir, tmp_path, pairs=("ug2zh", "zh2pt"))
    reg = AdapterRegistry(tmp_path, spec)
    reg.scan()
    plan = Router(reg, RoutingConfig(pivot="zh")).plan("ug", "pt")
    assert plan.label == "ug → zh → pt (pivot)"
