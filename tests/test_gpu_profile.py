"""The Hunyuan-MT-7B profile (configs/hunyuan-mt-7b.yaml: a GPU, or a CPU with int8 weights) and bench/gpu_check.py,
on a machine without CUDA."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hunyuan_mt.config import PROJECT_ROOT, load_config
from hunyuan_mt.errors import ModelUnavailable

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
CUDA_MESSAGE = "requires a CUDA GPU (model.require_cuda: true)"


def _env() -> dict[str, str]:
    # Hide any GPU, so the refusal path runs on every machine.
    return dict(os.environ, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def test_profile_is_the_documented_setup() -> None:
    cfg = load_config("hunyuan-mt-7b")
    # auto: bf16 on a GPU; on a CPU float32 around int8 weights (backbone.resolve_quantization decides at load).
    assert (cfg.model.dtype, cfg.model.device, cfg.model.arch) == ("auto", "auto", "decoder-only")
    assert cfg.model.require_cuda is False and cfg.model.allow_pickle is False and cfg.model.trust_remote_code is False
    assert cfg.model.quantization == "auto"
    assert cfg.cache.pinned == ["zh2en", "en2zh", "zh2ja", "ja2zh", "zh2ko"]
    assert cfg.routing.pivot == "zh" and cfg.routing.allow_base is True
    assert cfg.generation.do_sample is False  # greedy: batch-independent outputs (invariant 5)
    # the 4-bit variant is one override away and validates
    assert load_config("hunyuan-mt-7b", {"model.quantization": "4bit"}).model.quantization == "4bit"


@no_cuda
def test_backbone_refuses_without_cuda_when_the_profile_requires_it() -> None:
    from hunyuan_mt.runtime.backbone import load_backbone

    with pytest.raises(ModelUnavailable) as info:
        load_backbone(load_config("hunyuan-mt-7b", {"model.require_cuda": "true"}).model)
    assert CUDA_MESSAGE in info.value.message
    assert "configs/default.yaml" in info.value.message


MISSING = "was found neither as a folder nor in the local Hugging Face cache"


@no_cuda
@pytest.mark.slow
@pytest.mark.parametrize("profile", ["hunyuan-mt-7b", "hy-mt1.5-1.8b"])
def test_server_and_serve_ray_say_where_the_weights_go_and_print_no_traceback(profile: str) -> None:
    """On a CPU the Hunyuan profiles start (int8); without the weights both entry points stop with the one line
    that says where to put them."""
    app = subprocess.run([sys.executable, "app.py", "--config", profile], cwd=PROJECT_ROOT, env=_env(),
                         capture_output=True, text=True, timeout=240)
    assert app.returncode == 1
    assert MISSING in app.stderr and "Traceback" not in app.stderr + app.stdout
    assert "models/" in app.stderr and "put the model folder there" in app.stderr
    ray = subprocess.run([sys.executable, "-m", "hunyuan_mt", "serve-ray", "--profile", profile],
                         cwd=PROJECT_ROOT, env=_env(), capture_output=True, text=True, timeout=240)
    assert ray.returncode == 2
    assert MISSING in ray.stderr and "Traceback" not in ray.stderr + ray.stdout


@no_cuda
def test_gpu_check_without_cuda_says_so_and_exits_0(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "bench/gpu_check.py", "--out", str(tmp_path)], cwd=PROJECT_ROOT,
                         env=_env(), capture_output=True, text=True, timeout=240)
    assert run.returncode == 0
    assert "no CUDA device visible" in run.stdout
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_gpu_check_tiny_runs_every_section_on_cpu(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "bench/gpu_check.py", "--tiny", "--out", str(tmp_path)],
                         cwd=PROJECT_ROOT, env=_env(), capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    sections = data["sections"]
    assert {k: v["status"] for k, v in sections.items()} == {
        "build": "ok", "adapters": "ok", "load": "ok", "peft_baseline": "ok", "cache": "ok", "attach": "ok",
        "engine": "ok", "step_ratio": "ok", "light_mode": "ok", "exactness_fp32": "ok",
        "four_bit": "skipped" if importlib.util.find_spec("bitsandbytes") is None else "ok"}
    assert sections["adapters"]["adapters"] == 38
    # The server's own path was measured: its slot layers, its static cache, its engine.
    assert sections["load"]["running_batch"] == "CausalBatch"
    assert sections["cache"]["pinned"] == ["en2zh", "ja2zh", "zh2en", "zh2ja", "zh2ko"]
    assert sections["cache"]["slot_layers"]["slots"] == 8
    assert sections["engine"]["rows"] == 8 and sections["engine"]["pairs"] == 8
    assert sections["engine"]["vs_peft_serial"] > 0 and sections["step_ratio"]["mixed_over_bare"] > 0
    # per-row adapters in one batch give each row what it gets alone (greedy; fp32 is the invariant)
    assert sections["exactness_fp32"]["fp32_rows_equal_alone"] == "8/8"
    assert sections["light_mode"]["kv_cache_bytes_after"] < sections["light_mode"]["kv_cache_bytes_before"]
    assert (tmp_path / "gpu_check.md").read_text().startswith("## GPU check")
