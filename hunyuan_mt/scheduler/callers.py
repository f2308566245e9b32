"""Who a call comes from, low in the tree: the access policy makes one per request, document jobs keep their
uploader's in the store."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Caller:
    """Who is charged for a call: `identity` ("key:…" or "addr:…") and the address it came from."""

    identity: str
    address: str


#: How a key identity is kept in the store: its SHA-256, never the key ("key:…" becomes "keyhash:…").
KEY_HASH = "keyhash:"


def key_hash(api_key: str) -> str:
    return KEY_HASH + hashlib.sha256(api_key.encode("utf-8")).hexdigest()


def encode_owner(owner: Any) -> str | None:
    """An owner as the store keeps it: a Caller (a key identity as its hash: the database never holds a key), a
    plain identity (tests, the CLI), or None (anyone)."""
    if owner is None:
        return None
    if isinstance(owner, Caller):
        identity = owner.identity
        if identity.startswith("key:"):
            identity = key_hash(identity[len("key:"):])
        return json.dumps({"identity": identity, "address": owner.address})
    return json.dumps({"plain": str(owner)})


def decode_owner(stored: str | None) -> Any:
    if stored is None:
        return None
    value = json.loads(stored)
    return Caller(value["identity"], value["address"]) if "identity" in value else value["plain"]
