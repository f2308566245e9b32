"""The adapter registry and cache a backbone serves with: what a service starts with, and what the background
build compiles the step over (service/prebuild.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .cache import AdapterCache
from .registry import AdapterRegistry

if TYPE_CHECKING:
    from ..config import Config
    from ..runtime.backbone import Backbone
    from ..store import Store


def attach_adapters(cfg: Config, backbone: Backbone, store: Store, start: bool = True
                    ) -> tuple[AdapterRegistry, AdapterCache]:
    """The registry scanned and the cache over `backbone`, its pinned adapters attached (`start`)."""
    # Which version of each pair's adapter serves is the store's record (training/retrain.py promotes).
    registry = AdapterRegistry(cfg.cache.resolved_dir, backbone.spec, store.adapters.current)
    registry.scan()
    cache = AdapterCache(backbone, registry, cfg.cache)
    if start:
        cache.start()
    return registry, cache
