"""Settings of the Ray Serve application: replica groups, their pins and resources, and the retry policy.

They are the `args` of the application in `configs/serve_ray.yaml` (a genuine Serve config file, so
`serve run configs/serve_ray.yaml` works as well as `python -m hunyuan_mt serve-ray`). Every replica loads the
same service profile (`profile`, e.g. `default` or `hunyuan-mt-7b`) plus its group's pins and overrides.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..adapters.request import Pair
from ..config import PROJECT_ROOT, Config, load_config
from ..errors import ConfigError

#: The Serve config shipped with the project.
DEFAULT_SERVE_CONFIG = PROJECT_ROOT / "configs" / "serve_ray.yaml"


@dataclass
class GroupSpec:
    """One group of identical replicas (one Serve deployment)."""

    #: Deployment name; also shown in responses (`group`).
    name: str
    replicas: int = 1
    #: Pairs pinned on every replica of the group; the ingress sends these pairs here.
    pinned: list[str] = field(default_factory=list)
    #: Adapter slots per replica (cache.slots); None keeps the profile's value.
    slots: int | None = None
    #: Ray's multiplexed models per replica; None = slots + pinned (Ray's view then mirrors our cache).
    max_models_per_replica: int | None = None
    #: The group that takes every pair no group pins. Exactly one group is the long tail.
    long_tail: bool = False
    #: Passed to Ray as is: num_cpus, num_gpus, memory, resources (custom labels bind a group to nodes/GPUs).
    ray_actor_options: dict[str, Any] = field(default_factory=dict)
    #: Physical GPU ids the group's replicas see (CUDA_VISIBLE_DEVICES); a replica uses the first one, or all of
    #: them with model.device_map: auto. For one Ray-assigned GPU per replica use ray_actor_options.num_gpus: 1.
    gpu_ids: list[int] | None = None
    #: Dotted config overrides for this group's replicas only, e.g. {"engine.max_rows": 64}.
    overrides: dict[str, Any] = field(default_factory=dict)
    max_ongoing_requests: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"serve group name {self.name!r}: use letters, digits, '-' or '_'")
        if not isinstance(self.replicas, int) or self.replicas < 1:
            raise ConfigError(f"serve group {self.name}.replicas: expected an integer >= 1, got {self.replicas!r}")
        if self.slots is not None and (not isinstance(self.slots, int) or self.slots < 1):
            raise ConfigError(f"serve group {self.name}.slots: expected an integer >= 1, got {self.slots!r}")
        if self.max_models_per_replica is not None and (
                not isinstance(self.max_models_per_replica, int) or self.max_models_per_replica < 1):
            raise ConfigError(f"serve group {self.name}.max_models_per_replica: expected an integer >= 1, "
                              f"got {self.max_models_per_replica!r}")
        # Canonical keys ("zh-hant2en" → "zh-Hant2en"); UnsupportedLanguage names a bad one.
        self.pinned = [Pair.parse(p).key for p in self.pinned]
        if self.gpu_ids is not None and self.ray_actor_options.get("num_gpus"):
            raise ConfigError(f"serve group {self.name}: give gpu_ids or ray_actor_options.num_gpus, not both "
                              "(Ray would override CUDA_VISIBLE_DEVICES)")

    def actor_options(self) -> dict[str, Any]:
        """ray_actor_options for the deployment, with gpu_ids turned into the replica's visible devices."""
        options = dict(self.ray_actor_options)
        if self.gpu_ids is not None:
            runtime_env = dict(options.get("runtime_env") or {})
            env_vars = dict(runtime_env.get("env_vars") or {})
            env_vars["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in self.gpu_ids)
            runtime_env["env_vars"] = env_vars
            options["runtime_env"] = runtime_env
        return options

    def config_overrides(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """The dotted overrides a replica of this group loads its profile with."""
        out = dict(base)
        out.update(self.overrides)
        out["cache.pinned"] = list(self.pinned)
        # The ingress asks the long tail for every detection: the other groups' replicas need no detector (its
        # helper process holds ~420 MB and takes ~5 s of a core to load), unless the overrides ask for one (the
        # config then checks the value, as any other).
        if self.long_tail:
            out["routing.detect"] = True
        else:
            out.setdefault("routing.detect", False)
        if self.slots is not None:
            out["cache.slots"] = self.slots
        return out


@dataclass
class ServeSettings:
    groups: list[GroupSpec]
    #: The service profile every replica loads (configs/<name>.yaml or a path); None = default.yaml.
    profile: str | None = None
    #: Dotted overrides for every replica (before the group's own).
    overrides: dict[str, Any] = field(default_factory=dict)
    #: Attempts per request when a replica dies or is unreachable, and the pause between them.
    retries: int = 4
    retry_backoff_s: float = 0.5
    #: Serve the Gradio page at /ui beside the REST API (as app.py does); false for a REST-only ingress.
    ui: bool = True

    def __post_init__(self) -> None:
        self.groups = [g if isinstance(g, GroupSpec) else _group(g) for g in self.groups]
        if not self.groups:
            raise ConfigError("serve groups: at least one group is needed")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ConfigError(f"serve groups: names must be distinct, got {names}")
        tails = [g.name for g in self.groups if g.long_tail]
        if len(tails) > 1:
            raise ConfigError(f"serve groups: exactly one long_tail group allowed, got {tails}")
        if not tails:
            # Unmarked: the last group takes the long tail.
            self.groups[-1].long_tail = True
        owner: dict[str, str] = {}
        for g in self.groups:
            for key in g.pinned:
                if key in owner:
                    raise ConfigError(f"serve groups: pair {key} is pinned by both {owner[key]} and {g.name}; "
                                      "the ingress could not tell where to send it")
                owner[key] = g.name
        if not isinstance(self.retries, int) or self.retries < 1:
            raise ConfigError(f"serve retries: expected an integer >= 1, got {self.retries!r}")

    @property
    def long_tail(self) -> GroupSpec:
        return next(g for g in self.groups if g.long_tail)

    def group(self, name: str) -> GroupSpec:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def profile_config(self) -> Config:
        """The profile as the ingress sees it (routing.pivot, limits, server keys); no model is loaded."""
        return load_config(self.profile, self.overrides)

    def replica_config(self, group: GroupSpec) -> Config:
        return load_config(self.profile, group.config_overrides(self.overrides))

    def to_args(self) -> dict[str, Any]:
        """Plain data for Ray to ship to the replicas (and for a Serve config's `args`)."""
        return asdict(self)


def _group(data: Any) -> GroupSpec:
    if not isinstance(data, Mapping):
        raise ConfigError(f"serve groups: each group must be a mapping, got {data!r}")
    known = set(GroupSpec.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"serve group {data.get('name', '?')}.{unknown[0]}: unknown key "
                          f"(known: {', '.join(sorted(known))})")
    return GroupSpec(**data)


def settings_from_args(args: Mapping[str, Any]) -> ServeSettings:
    known = set(ServeSettings.__dataclass_fields__)
    unknown = sorted(set(args) - known)
    if unknown:
        raise ConfigError(f"serve args.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
    if "groups" not in args:
        raise ConfigError("serve args.groups: missing (a list of replica groups)")
    return ServeSettings(**dict(args))


def read_serve_config(path: str | Path | None = None) -> tuple[dict[str, Any], ServeSettings]:
    """Read a Serve config YAML: (the whole document, the settings of its first application's args)."""
    p = Path(path) if path else DEFAULT_SERVE_CONFIG
    if not p.is_file():
        raise ConfigError(f"serve config: file {p} not found")
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"serve config: {p.name} is not valid YAML: {exc}") from None
    apps = doc.get("applications") if isinstance(doc, dict) else None
    if not apps or not isinstance(apps, list) or not isinstance(apps[0], dict):
        raise ConfigError(f"serve config: {p.name} needs an `applications:` list (Ray Serve config format)")
    return doc, settings_from_args(apps[0].get("args") or {})


def group_for(settings: ServeSettings, src: str, tgt: str, pivot: str) -> GroupSpec:
    """The group that serves src → tgt: the one pinning the pair, else the one pinning the first pivot hop (both
    hops then run on that replica), else the long tail."""
    owner = {key: g for g in settings.groups for key in g.pinned}
    direct = owner.get(f"{src}2{tgt}")
    if direct is not None:
        return direct
    if pivot not in (src, tgt):
        first = owner.get(f"{src}2{pivot}")
        if first is not None:
            return first
    return settings.long_tail
