"""Every row's logits at every step of a running batch whose rows join at different steps (invariant 5 tests)."""

from __future__ import annotations

import torch

from hunyuan_mt.runtime.backbone import PromptRow
from hunyuan_mt.config import GenerationConfig
from hunyuan_mt.decode import Sequence


def row_logits(backbone, items: list[tuple[PromptRow, int]], joins: list[int], compiled: bool = False,
               max_new: int = 24) -> dict[int, list[torch.Tensor]]:
    """{item index: its logits at each of its steps}; item i = (row, adapter slot) enters at step joins[i]. The
    eager step unless `compiled` (then the backbone's compiled step must be active)."""
    batch = backbone.new_batch(GenerationConfig())
    if not compiled:
        batch.compiled = None
    assert (batch.compiled is not None) == compiled
    seen: dict[int, list[torch.Tensor]] = {}
    choose = batch._choose

    def record(logits, live):
        for i, row in enumerate(live):
            seen.setdefault(row.seq.tag, []).append(logits[i].clone())
        return choose(logits, live)

    batch._choose = record
    waiting = sorted(range(len(items)), key=lambda i: joins[i])
    step = 0
    with backbone.model_lock, torch.inference_mode():
        while waiting or len(batch):
            batch.pop_finished()  # before `add`, which drops finished rows
            entering = [i for i in waiting if joins[i] <= step]
            waiting = [i for i in waiting if joins[i] > step]
            if entering:
                sequences = []
                for i in entering:
                    enc = backbone.encode(items[i][0])
                    sequences.append(Sequence(i, enc.input_ids, items[i][1], max_new, enc.decoder_prefix))
                batch.add(sequences)
            batch.pop_finished()
            if len(batch):
                batch.step()
            step += 1
    return seen


def assert_rows_as_alone(backbone, items: list[tuple[PromptRow, int]], joins: list[int],
                         compiled: bool = False) -> None:
    """Each row's logits beside the others equal its logits alone, to the bit, at every step."""
    together = row_logits(backbone, items, joins, compiled)
    for i, item in enumerate(items):
        alone = row_logits(backbone, [item], [0], compiled)[0]
        assert len(alone) == len(together[i]), item[0].text
        for step, (a, b) in enumerate(zip(alone, together[i])):
            assert torch.equal(a, b), (item[0].text, step, float((a - b).abs().max()))
