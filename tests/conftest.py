"""Shared fixtures: tiny models and adapters built once per session (see tests/tiny_models.py).

Other test modules may append fixtures here; keep the session builds below as they are.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

import tiny_models  # tests/ is on sys.path (rootdir conftest, no __init__.py)

# Tests run beside other work on small machines; one thread keeps them predictable.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def marian_dir(tiny_root: Path) -> Path:
    """A tiny MarianMTModel (encoder-decoder) folder: config.json, tokenizer.json, model.safetensors."""
    return tiny_models.build_marian(tiny_root / "marian")


@pytest.fixture(scope="session")
def hunyuan_dir(tiny_root: Path) -> Path:
    """A tiny HunYuanDenseV1ForCausalLM (decoder-only) folder with a chat-template tokenizer."""
    return tiny_models.build_hunyuan(tiny_root / "hunyuan")


@pytest.fixture(scope="session")
def marian_adapters(tiny_root: Path, marian_dir: Path) -> Path:
    """Adapters folder for the Marian model: tiny_models.DEFAULT_PAIRS (read-only; copy it to modify)."""
    root = tiny_root / "marian_adapters"
    tiny_models.make_adapters(marian_dir, root)
    return root


@pytest.fixture(scope="session")
def hunyuan_adapters(tiny_root: Path, hunyuan_dir: Path) -> Path:
    """Adapters folder for the HunYuan model: tiny_models.DEFAULT_PAIRS (read-only; copy it to modify)."""
    root = tiny_root / "hunyuan_adapters"
    tiny_models.make_adapters(hunyuan_dir, root)
    return root


@pytest.fixture()
def adapters_copy(tmp_path: Path, marian_adapters: Path) -> Path:
    """A private, modifiable copy of the Marian adapters folder."""
    import shutil

    dest = tmp_path / "adapters"
    shutil.copytree(marian_adapters, dest)
    return dest
