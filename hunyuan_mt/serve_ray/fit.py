"""Do the replica groups fit the Ray cluster? Checked before deploying, so that a group Ray could never schedule
is named in one line instead of leaving the ingress waiting while Ray warns every 30 s.

Each replica reserves its group's `ray_actor_options` (CPUs, GPUs, memory, custom resources; one CPU when none is
given, as Serve does) on one node. `check_fit` packs the replicas onto the nodes, largest first. When only CPUs
are short, it sizes the CPU reservations down so every replica starts (they then share the cores: on CPU the
replicas are small and mostly wait on each other anyway); anything else that is short (GPUs, memory, a custom
resource) is not shrunk, since a model that needs a GPU or its memory cannot share it by booking less of it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .settings import GroupSpec

#: Serve's reservation for a replica that names no CPUs.
DEFAULT_REPLICA_CPUS = 1.0
#: Ray's resource granularity; sized reservations are rounded down to it.
_STEP = 0.0001
#: Keys of ray.nodes()["Resources"] that are not schedulable resources of their own.
_INTERNAL_PREFIXES = ("node:", "accelerator_type:")


@dataclass(frozen=True)
class Fit:
    """The outcome: whether every replica can be placed, the CPU reservation of each group when it had to be
    sized down (group name → CPUs per replica), and one line for the user when something changed or is short."""

    fits: bool
    sized_cpus: dict[str, float] = field(default_factory=dict)
    message: str = ""


def replica_needs(group: GroupSpec) -> dict[str, float]:
    """What one replica of `group` reserves, in Ray's resource names."""
    options = group.actor_options()
    cpus = options.get("num_cpus")
    needs = {"CPU": DEFAULT_REPLICA_CPUS if cpus is None else float(cpus)}
    if options.get("num_gpus"):
        needs["GPU"] = float(options["num_gpus"])
    if options.get("memory"):
        needs["memory"] = float(options["memory"])
    for name, amount in (options.get("resources") or {}).items():
        needs[str(name)] = float(amount)
    return {k: v for k, v in needs.items() if v > 0}


def node_capacities(nodes: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """Schedulable resources of each alive node, from `ray.nodes()`."""
    out = []
    for node in nodes:
        if not node.get("Alive", True):
            continue
        resources = node.get("Resources") or {}
        out.append({k: float(v) for k, v in resources.items() if not k.startswith(_INTERNAL_PREFIXES)})
    return out


def local_node(groups: Sequence[GroupSpec], num_cpus: float | None, num_gpus: int | None) -> dict[str, float] | None:
    """The resources of the local node `ray.init` would start with these flags, before starting it, or None where
    the groups ask for something only the started node can tell (GPUs without --num-gpus: Ray counts them; memory:
    Ray books a share of what is free then). Custom resources: a local node started here has none."""
    needs = [replica_needs(g) for g in groups]
    if any("memory" in n for n in needs) or (num_gpus is None and any("GPU" in n for n in needs)):
        return None
    node = {"CPU": float(num_cpus if num_cpus is not None else (os.cpu_count() or 1))}
    if num_gpus:
        node["GPU"] = float(num_gpus)
    return node


def unplaced(groups: Sequence[GroupSpec], nodes: Sequence[Mapping[str, float]],
             cpus: Mapping[str, float] | None = None) -> list[str]:
    """Group names of the replicas that find no node, packing the largest replicas first (first fit); `cpus`
    overrides a group's CPUs per replica."""
    free = [dict(n) for n in nodes]
    replicas: list[tuple[str, dict[str, float]]] = []
    for g in groups:
        needs = replica_needs(g)
        if cpus is not None and g.name in cpus:
            needs["CPU"] = cpus[g.name]
        replicas.extend((g.name, needs) for _ in range(g.replicas))
    replicas.sort(key=lambda r: (r[1].get("GPU", 0.0), r[1].get("CPU", 0.0), r[1].get("memory", 0.0)),
                  reverse=True)
    left: list[str] = []
    for name, needs in replicas:
        for node in free:
            if all(node.get(k, 0.0) + 1e-9 >= v for k, v in needs.items()):
                for k, v in needs.items():
                    node[k] = node.get(k, 0.0) - v
                break
        else:
            left.append(name)
    return left


def check_fit(groups: Sequence[GroupSpec], nodes: Sequence[Mapping[str, float]]) -> Fit:
    """See the module docstring. `nodes` as from `node_capacities`."""
    if not unplaced(groups, nodes):
        return Fit(True)
    asked = _describe(groups)
    have_cpus = sum(n.get("CPU", 0.0) for n in nodes)
    need_cpus = sum(g.replicas * replica_needs(g).get("CPU", 0.0) for g in groups)
    # Only CPUs short: everything would fit if CPUs were free of charge.
    if not unplaced(groups, nodes, cpus={g.name: 0.0 for g in groups}) and need_cpus > 0:
        factor = have_cpus / need_cpus
        for _ in range(20):  # whole-node packing may need a little less than the plain ratio
            sized = {g.name: _round_down(replica_needs(g).get("CPU", 0.0) * factor) for g in groups}
            if all(v > 0 for v in sized.values()) and not unplaced(groups, nodes, cpus=sized):
                each = ", ".join(f"{g.name} {_num(sized[g.name])}" for g in groups)
                total = sum(g.replicas for g in groups)
                return Fit(True, sized, (
                    f"the groups ask for {_num(need_cpus)} CPUs ({asked}) and this Ray cluster has "
                    f"{_num(have_cpus)}: each replica reserves less instead ({each} CPU), so all {total} start and "
                    f"share the cores; use fewer --replicas, or a bigger --num-cpus, for whole cores"))
            factor *= 0.9
    return Fit(False, {}, _shortfall(groups, nodes, asked))


def _shortfall(groups: Sequence[GroupSpec], nodes: Sequence[Mapping[str, float]], asked: str) -> str:
    total_need: dict[str, float] = {}
    for g in groups:
        for k, v in replica_needs(g).items():
            total_need[k] = total_need.get(k, 0.0) + g.replicas * v
    short = []
    for k, v in sorted(total_need.items()):
        have = sum(n.get(k, 0.0) for n in nodes)
        if k != "CPU" and v > have + 1e-9:
            short.append(f"{_amount(v, k)} (the cluster has {_num(have)})")
    left = sorted(set(unplaced(groups, nodes)))
    if short:
        return (f"the groups do not fit this Ray cluster: they need {', '.join(short)} for {asked}; "
                f"use fewer --replicas, change the groups' ray_actor_options, or join a bigger cluster with "
                f"--address")
    return (f"no node of this Ray cluster has room for a replica of {', '.join(left)} ({asked}); use fewer "
            f"--replicas, change the groups' ray_actor_options, or add nodes")


def _describe(groups: Sequence[GroupSpec]) -> str:
    parts = []
    for g in groups:
        needs = replica_needs(g)
        what = " + ".join(_amount(v, k) for k, v in needs.items())
        parts.append(f"{g.name} {g.replicas} × {what}")
    return ", ".join(parts)


def _amount(value: float, resource: str) -> str:
    if resource in ("CPU", "GPU"):
        return f"{_num(value)} {resource}{'' if value == 1 else 's'}"
    if resource == "memory":
        return f"{value / 2**30:.3g} GiB of memory"
    return f"{_num(value)} of {resource!r}"


def _num(value: float) -> str:
    return f"{value:g}" if value < 1e6 else f"{value:.3g}"


def _round_down(value: float) -> float:
    # The epsilon keeps 0.5 / 0.0001 = 4999.999… from losing a step.
    return round(math.floor(value / _STEP + 1e-6) * _STEP, 4)


__all__ = ["Fit", "check_fit", "local_node", "node_capacities", "replica_needs", "unplaced"]
