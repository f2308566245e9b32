"""Who a call comes from, low in the tree: the access policy makes one per request, document jobs keep their
uploader's in the store."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Caller:
    """Who is charged for a call: `identity` ("key:…" or "addr:…") and the address it came from."""

    identity: str
    address: str


def encode_owner(owner: Any) -> str | None:
    """An owner as the store keeps it: a Caller, a plain identity (tests, the CLI), or None (anyone)."""
    if owner is None:
        return None
    if isinstance(owner, Caller):
        return json.dumps({"identity": owner.identity, "address": owner.address})
    return json.dumps({"plain": str(owner)})


def decode_owner(stored: str | None) -> Any:
    if stored is None:
        return None
    value = json.loads(stored)
    return Caller(value["identity"], value["address"]) if "identity" in value else value["plain"]
