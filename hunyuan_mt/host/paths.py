"""Where this project keeps what it builds once per machine and reads back at every start."""

from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    """~/.cache/hunyuan-mt, under XDG_CACHE_HOME where that is set: a folder that survives a reboot, unlike /tmp."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hunyuan-mt"
