"""Typed errors across the Ray boundary.

A replica answers a TranslationError as plain data (its class name, message and attributes) instead of raising
it: Ray would wrap it in a RayTaskError and lose attributes such as `reachable` or `retry_after_s`. The ingress
rebuilds the same class, so the REST layer maps it to the same HTTP status as the single-process server.
"""

from __future__ import annotations

from typing import Any

from .. import errors
from ..errors import ReplicaUnavailable, TranslationError

# ReplicaUnavailable lives in errors.py with the other domain errors (so rebuild_error finds it); the name stays
# importable from here for existing callers.
__all__ = ["ReplicaUnavailable", "error_payload", "rebuild_error"]


def error_payload(exc: TranslationError) -> dict[str, Any]:
    attrs = {k: v for k, v in vars(exc).items() if k != "message" and _plain(v)}
    return {"type": type(exc).__name__, "message": exc.message, "attrs": attrs}


def rebuild_error(payload: dict[str, Any]) -> TranslationError:
    cls = getattr(errors, str(payload.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, TranslationError)):
        cls = TranslationError
    exc = cls.__new__(cls)
    TranslationError.__init__(exc, str(payload.get("message", "")))
    for key, value in (payload.get("attrs") or {}).items():
        setattr(exc, key, value)
    return exc


def _plain(value: Any) -> bool:
    if isinstance(value, (str, int, float, bool, type(None))):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False
