"""Invariant 5 to the bit: a row's logits do not depend on the rows beside it (hunyuan_mt/quant/invariant.py).

The GEMMs and reductions whose shapes follow the batch (LoRA's A and B sides, the attention's scores and softmax)
are checked one by one against the row computed alone, then the whole step on the shipped demo model, where MKL's
tile sizes matter (the tiny test models are too small to reach them): rows on mixed adapters and the bare
backbone, joining at different steps, with two threads as the CPU profile runs.
"""

from __future__ import annotations

import random

import pytest
import torch

from hunyuan_mt.quant import invariant
from hunyuan_mt.adapters.registry import AdapterRegistry
from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.runtime.backbone import PromptRow
from hunyuan_mt.config import PROJECT_ROOT, CacheConfig, ModelConfig
from hunyuan_mt.decode.kvcache import _NEG, _attend, _blocked
from hunyuan_mt.decode.marian import _encoder_attention
from row_logits import assert_rows_as_alone  # tests/ is on sys.path

DEMO = PROJECT_ROOT / "models" / "demo"
ADAPTERS = PROJECT_ROOT / "adapters"
NEG = _NEG[torch.float32]


def _cases(seed: int, n: int):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    for _ in range(n):
        yield rng


def test_lora_gemms_give_a_row_what_it_gets_alone(two_threads) -> None:
    """x @ A over every slot in use (a row's own columns somewhere among them), and h @ B with h zero outside the
    row's slot, for batches of 1 to 64 tokens: the row's result is its result alone, bit for bit."""
    for rng in _cases(0, 120):
        width = rng.choice([16, 48])            # P·r: one projection or Q/K/V of a rank-16 adapter
        slots = rng.randint(1, 8)
        at = rng.randrange(slots)
        rows = rng.choice([1, 2, 3, 7, 9, 33, 64, rng.randint(1, 64)])
        row = rng.randrange(rows)
        x = torch.randn(rows, 384)
        a = invariant.padded(torch.randn(384, slots * width) * 0.05, -1, invariant.COLUMNS)
        own = a[:, at * width:(at + 1) * width]
        alone = invariant.mm(x[row:row + 1], invariant.padded(own, -1, invariant.COLUMNS))[0, :width]
        assert torch.equal(invariant.mm(x, a)[row, at * width:(at + 1) * width], alone)

        h = torch.zeros(rows, slots * 16)
        h[row, at * 16:(at + 1) * 16] = torch.randn(16)
        b = torch.randn(slots * 16, 384) * 0.05
        mine = invariant.mm(h[row:row + 1, at * 16:(at + 1) * 16], b[at * 16:(at + 1) * 16])[0]
        assert torch.equal(invariant.mm(h, b)[row], mine)
        together = invariant.bmm(h.expand(3, -1, -1), b.expand(3, -1, -1))
        assert torch.equal(together[1, row], mine)


def test_decoder_attention_gives_a_row_what_it_gets_alone(two_threads) -> None:
    """One query row over its own cache columns, alone and right-aligned at any offset in a wider cache (the
    decoder's layout when rows joined with longer histories), over whole blocks as the eager step reads them."""
    for rng in _cases(1, 150):
        own = rng.randint(1, 60)
        wide = own + rng.randint(1, 50)
        offset = rng.randint(0, wide - own)
        rows = rng.choice([1, 3, 17, 64])
        row = rng.randrange(rows)
        q, k, v = torch.randn(1, 6, 1, 64), torch.randn(1, 6, own, 64), torch.randn(1, 6, own, 64)
        mask = torch.zeros(1, 1, 1, own)
        alone = _attend(q, _blocked(k, -2), _blocked(v, -2), _blocked(mask, -1, NEG), 0.125)

        Q, K, V = torch.randn(rows, 6, 1, 64), torch.randn(rows, 6, wide, 64), torch.randn(rows, 6, wide, 64)
        M = torch.zeros(rows, 1, 1, wide)
        Q[row], K[row, :, offset:offset + own], V[row, :, offset:offset + own] = q[0], k[0], v[0]
        M[row] = NEG
        M[row, ..., offset:offset + own] = 0.0
        together = _attend(Q, _blocked(K, -2), _blocked(V, -2), _blocked(M, -1, NEG), 0.125)
        assert torch.equal(together[row], alone[0])


def test_encoder_attention_gives_a_row_what_it_gets_alone(two_threads) -> None:
    """A source's self-attention, alone and right-padded beside longer sources."""
    for rng in _cases(2, 60):
        own = rng.randint(1, 40)
        wide = own + rng.randint(1, 40)
        rows = rng.choice([2, 5, 16])
        row = rng.randrange(rows)
        q, k, v = (torch.randn(1, 6, own, 64) for _ in range(3))
        alone = _encoder_attention(q, k, v, torch.zeros(1, 1, 1, own), 0.125)
        Q, K, V = (torch.randn(rows, 6, wide, 64) for _ in range(3))
        M = torch.zeros(rows, 1, 1, wide)
        Q[row, :, :own], K[row, :, :own], V[row, :, :own] = q[0], k[0], v[0]
        M[row, ..., own:] = NEG
        together = _encoder_attention(Q, K, V, M, 0.125)
        assert torch.equal(together[row, :, :own], alone[0])


# ---------------------------------------------------------------------------------------------------- end to end

TEXTS = {
    "en2es": ["Could not open the file.", "Save the document before closing the window?", "Unknown error"],
    "en2de": ["The printer is out of paper.", "Password"],
    "fr2en": ["Impossible d'ouvrir le fichier demandé.", "Erreur inconnue"],
    None: ["Open the file and print it twice, then close it."],   # the bare backbone
}


@pytest.mark.parametrize("quantization", ["auto", "none"])
def test_demo_rows_beside_others_have_the_logits_they_have_alone(quantization: str, two_threads) -> None:
    """The shipped model as the CPU profile runs it (int8 where this CPU has a fast kernel, and float32): eight
    rows on three adapters and the bare backbone, five joining mid-way, give at every step the logits each gives
    alone, to the bit. Before the padding in `invariant` every row differed at its first step (int8: by up to
    0.15 in a logit) and 1 of 48 held-out sentences changed."""
    from hunyuan_mt.adapters.cache import AdapterCache
    from hunyuan_mt.runtime.backbone import Backbone

    backbone = Backbone.load_uncached(ModelConfig(path=str(DEMO), warmup=False, quantization=quantization,
                                                  compile="false", cpu_threads=2))
    registry = AdapterRegistry(ADAPTERS, backbone.spec)
    registry.scan()
    cache = AdapterCache(backbone, registry, CacheConfig(adapters_dir=str(ADAPTERS), slots=3, pinned=[]))
    cache.start()
    pairs = [p for p in TEXTS if p is not None]
    with cache.lease([Pair.parse(p) for p in pairs]) as lease:
        slot = dict(zip(pairs, lease.slots))
        items = [(PromptRow(text, *(pair or "en2es").split("2")), slot.get(pair, 0))
                 for pair, texts in TEXTS.items() for text in texts]
        assert_rows_as_alone(backbone, items, joins=[0, 3, 0, 5, 1, 0, 8, 2])
