"""Which replica groups have a replica up, from Serve's own status (the controller's view).

The CLI prints groups as they come up; the ingress sends a request for a group with no running replica to one
that has one (any replica serves any pair; pins only decide where a pair is hot), instead of queueing it behind
a group Ray has not started yet.
"""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger(__name__)

#: How long the ingress trusts one reading of Serve's status (a controller call per request would be wasteful).
STATUS_TTL_S = 1.0


def group_replicas_running(app_name: str) -> dict[str, int]:
    """Deployment name → replicas in the RUNNING state, for the application `app_name` ({} if it is not known)."""
    from ray import serve

    app = serve.status().applications.get(app_name)
    if app is None:
        return {}
    return {name: int(d.replica_states.get("RUNNING", 0)) for name, d in app.deployments.items()}


class GroupHealth:
    """A cached reading of `group_replicas_running` for the ingress. Its coroutines run on more than one event loop
    (the replica's and the REST layer's private one), so nothing here is bound to a loop; two callers that find
    the reading stale at once both read it, which is harmless."""

    def __init__(self, app_name: str, ttl_s: float = STATUS_TTL_S) -> None:
        self.app_name = app_name
        self.ttl_s = ttl_s
        self._reading: tuple[float, dict[str, int]] | None = None

    async def running(self) -> dict[str, int] | None:
        """Running replicas per group, or None when Serve's status cannot be read (callers then assume up)."""
        reading = self._reading
        if reading is not None and time.monotonic() - reading[0] <= self.ttl_s:
            return reading[1]
        try:
            running = await asyncio.to_thread(group_replicas_running, self.app_name)
        except Exception as exc:  # noqa: BLE001 - a status hiccup must not fail requests
            log.warning("serve status unreadable (%s); routing as configured", type(exc).__name__)
            return None
        self._reading = (time.monotonic(), running)
        return running
