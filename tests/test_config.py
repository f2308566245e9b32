"""Config: file < env < overrides, and one clear message naming the bad key."""

from pathlib import Path

import pytest

from hunyuan_mt.config import load_config, parse_set_args
from hunyuan_mt.errors import ConfigError


def test_default_profile_loads_the_demo_model() -> None:
    cfg = load_config(env={})
    assert cfg.model.path == "models/demo"
    assert cfg.cache.slots == 3
    assert cfg.cache.pinned == ["en2es", "es2en"]
    assert cfg.server.host == "127.0.0.1" and cfg.server.share is False


def test_env_overrides_file_and_cli_overrides_env() -> None:
    cfg = load_config(env={"HMT_CACHE__SLOTS": "5", "HMT_ROUTING__PIVOT": "zh"})
    assert cfg.cache.slots == 5 and cfg.routing.pivot == "zh"
    cfg = load_config(env={"HMT_CACHE__SLOTS": "5"}, overrides=parse_set_args(["cache.slots=2", "cache.pinned=[]"]))
    assert cfg.cache.slots == 2 and cfg.cache.pinned == []


def test_list_from_env_is_comma_separated() -> None:
    cfg = load_config(env={"HMT_CACHE__PINNED": "en2de, de2en"})
    assert cfg.cache.pinned == ["en2de", "de2en"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"cache.slots": 0}, "cache.slots: expected an integer >= 1, got 0"),
        ({"tm.fuzzy_threshold": 1.5}, "tm.fuzzy_threshold: expected a number from 0 to 1, got 1.5"),
        ({"glossary.mode": "loud"}, "glossary.mode: expected one of visible, sentinel, prompt, got 'loud'"),
        ({"cache.slots": "three"}, "cache.slots: expected an integer, got 'three'"),
        ({"model.device": "gpu"}, "model.device: expected auto, cpu, cuda or cuda:N, got 'gpu'"),
        ({"model.quantization": "3bit"}, "model.quantization: expected one of none, auto, int8, int4, 8bit, 4bit, got '3bit'"),
        ({"cache.colour": 1}, "cache.colour: unknown key"),
        ({"server.share": "maybe"}, "server.share: expected true or false, got 'maybe'"),
        ({"engine.prefill_chunk_tokens": 8}, "engine.prefill_chunk_tokens: expected auto, off or an integer >= 16, got '8'"),
    ],
)
def test_invalid_values_name_the_key(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides, env={})
    assert message in str(info.value)


def test_missing_profile_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found.*default"):
        load_config("no-such-profile", env={})


def test_set_args_need_key_value() -> None:
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_set_args(["cache.slots"])


@pytest.mark.parametrize(("env", "override", "chunk"), [
    (None, None, "auto"), ("off", None, None), ("100", None, 112), (None, "64", 64), (None, "off", None)])
def test_prefill_chunk_tokens_from_env_and_yaml(env: str | None, override: str | None, chunk) -> None:
    """`engine.prefill_chunk_tokens`: auto, off (YAML's false too) or whole blocks of 16 tokens."""
    overrides = parse_set_args([f"engine.prefill_chunk_tokens={override}"]) if override else None
    cfg = load_config(env={"HMT_ENGINE__PREFILL_CHUNK_TOKENS": env} if env else {}, overrides=overrides)
    assert cfg.engine.prefill_chunk == chunk
