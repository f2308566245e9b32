"""Build the Serve application: one deployment per replica group, and the ingress in front of them."""

from __future__ import annotations

from typing import Any

from .ingress import Ingress
from .replica import TranslatorReplica
from .settings import ServeSettings, settings_from_args

#: The application's name in Serve (serve status, serve.get_deployment_handle).
APP_NAME = "hunyuan-mt"
INGRESS_NAME = "ingress"


def build_application(settings: ServeSettings, replica_cls: type = TranslatorReplica) -> Any:
    """The bound application. `replica_cls` lets tests wrap the replica (e.g. hold a generate open)."""
    from ray import serve

    args = settings.to_args()
    groups: dict[str, Any] = {}
    for group in settings.groups:
        deployment = serve.deployment(
            replica_cls, name=group.name, num_replicas=group.replicas, ray_actor_options=group.actor_options(),
            max_ongoing_requests=group.max_ongoing_requests,
        )
        groups[group.name] = deployment.bind(args, group.name)
    # The ingress only forwards: it needs no CPU of its own and no model.
    ingress = serve.deployment(serve.ingress()(Ingress), name=INGRESS_NAME, ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=256)
    return ingress.bind(groups, args)


def build_app(args: dict[str, Any]) -> Any:
    """Application builder for Serve config files: `import_path: hunyuan_mt.serve_ray:build_app` + `args`."""
    return build_application(settings_from_args(args))
