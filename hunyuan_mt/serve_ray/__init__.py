"""Ray Serve deployment: replica groups, each replica one TranslationService multiplexed by language pair.

    python -m hunyuan_mt serve-ray --replicas 2 [--config configs/serve_ray.yaml]
    serve run configs/serve_ray.yaml

- `settings`:  replica groups (pins, slots, resources) from the Serve config's `args`
- `replica`:   the replica deployment (one service per process, `serve.multiplexed` by pair over our leases)
- `ingress`:   the REST API of web.api over the groups (routing, retries, typed errors, X-Served-By)
- `app`:       builds the Serve application; `cli`: the `serve-ray` subcommand
"""

from .app import APP_NAME, build_app, build_application
from .cli import register
from .settings import GroupSpec, ServeSettings, read_serve_config, settings_from_args

__all__ = ["APP_NAME", "GroupSpec", "ServeSettings", "build_app", "build_application", "read_serve_config",
           "register", "settings_from_args"]
