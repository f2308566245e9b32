"""Workloads: which pairs are registered, how traffic is spread over them, and the request stream.

W1 (the seed workload): 38 registered pairs, 90% of the traffic on 5 hot pairs, the rest spread uniformly over the
other 33. W2: uniform over 12 pairs. The request stream is drawn once from a fixed seed, so every variant sees the
same sequence of (pair, text) in the same order.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from hunyuan_mt.text.languages import LANGUAGES

#: Short single-sentence inputs: one row each, so the engine's sentence splitter does not give ours more rows
#: (or fewer) than the baselines. No digits or URLs, which the masking layer would treat specially.
TEXTS: tuple[str, ...] = (
    "Open the file and save the document.",
    "The window could not be closed.",
    "Do you want to delete this folder?",
    "Select a language for the keyboard.",
    "The connection to the server was lost.",
    "Print the current page.",
    "Show hidden files in the list.",
    "The password is too short.",
    "Copy the selected text to the clipboard.",
    "Settings have been saved.",
    "Cancel the download and try again later.",
    "Search for files by name.",
    "The printer is out of paper.",
    "Restart the computer to finish the update.",
    "Add a new user account.",
    "Where is the nearest train station?",
)


@dataclass(frozen=True)
class Request:
    pair: str
    src: str
    tgt: str
    text: str


@dataclass(frozen=True)
class Workload:
    name: str
    #: Pairs that receive traffic, hot ones first.
    pairs: tuple[str, ...]
    #: Relative traffic weight of each pair in `pairs`.
    weights: tuple[float, ...]
    #: Pairs registered in the adapters folder while it runs (a superset of `pairs`).
    registered: int
    description: str

    def to_dict(self) -> dict:
        return asdict(self)


def split_pair(key: str) -> tuple[str, str]:
    """"zh-Hant2en" → ("zh-Hant", "en"). Codes contain no digit, so the first "2" separates them."""
    src, tgt = key.split("2", 1)
    return src, tgt


def all_pairs(first: list[str]) -> list[str]:
    """`first` in order, then every other direction of the language table in a fixed, English-centric order."""
    codes = list(LANGUAGES)
    rest: list[str] = []
    for code in codes:  # x→en and en→x before the rest, as a real deployment would add them
        if code != "en":
            rest += [f"en2{code}", f"{code}2en"]
    for a in codes:
        for b in codes:
            if a != b and "en" not in (a, b):
                rest.append(f"{a}2{b}")
    out = list(dict.fromkeys(first))
    out += [p for p in rest if p not in out]
    return out


def w1(pairs: list[str], hot: int = 5, hot_share: float = 0.9, registered: int = 38) -> Workload:
    """90% of requests on `pairs[:hot]`, 10% spread uniformly over `pairs[hot:registered]`."""
    cold = registered - hot
    weights = [hot_share / hot] * hot + [(1 - hot_share) / cold] * cold
    return Workload("W1", tuple(pairs[:registered]), tuple(weights), registered,
                    f"{registered} registered pairs, {hot_share:.0%} of traffic on {hot} hot pairs, "
                    f"the rest uniform over the other {cold}")


def w2(pairs: list[str], n: int = 12, registered: int = 38) -> Workload:
    """Uniform over `pairs[:n]` (the adapters folder still holds `registered` pairs)."""
    return Workload("W2", tuple(pairs[:n]), tuple([1.0 / n] * n), registered, f"uniform over {n} pairs")


def uniform(pairs: list[str], name: str) -> Workload:
    return Workload(name, tuple(pairs), tuple([1.0 / len(pairs)] * len(pairs)), len(pairs),
                    f"uniform over {len(pairs)} pairs")


def requests(workload: Workload, n: int, seed: int = 0) -> list[Request]:
    """`n` requests drawn from the workload's distribution with a fixed seed (same stream for every variant)."""
    rng = random.Random(f"{workload.name}:{seed}")
    keys = rng.choices(workload.pairs, weights=workload.weights, k=n)
    out = []
    for key in keys:
        src, tgt = split_pair(key)
        out.append(Request(key, src, tgt, rng.choice(TEXTS)))
    return out
