"""The decode loop's parts against transformers: token rules row by row, and the recorded (graph) decode step.

Every rule the picker applies must give, for one row, what transformers' `generate` gives for that row alone:
repetition penalty, n-gram blocking, multi-token bad words, suppressed tokens, a minimum length and a forced last
token. The static cache's recorded steps (CUDA graphs on a GPU) are driven here through `EagerReplay`, which
replays by re-running the recorded step on the same static buffers: padding rows, buckets and slot buffers are
what is tested.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.runtime.backbone import PromptRow
from hunyuan_mt.config import GenerationConfig
from hunyuan_mt.decode import CausalBatch, Sequence
from hunyuan_mt.decode.static import EagerReplay, StaticCausalBatch
from hunyuan_mt.lora import BASE_SLOT

TEXTS = ["Hello world, how are you today?", "Open the file, save the document and close the window.",
         "Hola mundo", "The quick brown fox.", "Datei öffnen", "Bonjour le monde."]


def _hf_alone(bb, row: PromptRow, gen: GenerationConfig, max_new: int) -> str:
    return bb._hf_generate([bb.encode(row)], [BASE_SLOT], gen, max_new)[0]


def _generated(bb, row: PromptRow, gen: GenerationConfig, max_new: int) -> list[int]:
    """The token ids the decode loop generates for `row` alone."""
    batch = bb.new_batch(gen)
    e = bb.encode(row)
    with torch.inference_mode():
        batch.add([Sequence(0, e.input_ids, BASE_SLOT, max_new, e.decoder_prefix)])
        done = batch.pop_finished()
        while not done:
            batch.step()
            done = batch.pop_finished()
    return done[0].generated


@pytest.mark.parametrize("model", ["marian", "hunyuan"])
@pytest.mark.parametrize("rule", ["repetition_penalty", "no_repeat_ngram", "bad_words", "suppress", "min_new",
                                  "forced_eos"])
def test_each_token_rule_gives_what_transformers_gives_the_row_alone(model: str, rule: str, request,
                                                                     fresh_backbone) -> None:
    bb = fresh_backbone(request.getfixturevalue(f"{model}_dir"))
    gc = bb.model.generation_config
    gen = GenerationConfig()
    rows = [PromptRow(t, "en", "es") for t in TEXTS[:4]]
    if rule == "repetition_penalty":
        gen = GenerationConfig(repetition_penalty=1.3)
    elif rule == "no_repeat_ngram":
        gc.no_repeat_ngram_size = 2
    elif rule == "bad_words":
        # Ban the second token two rows would produce after their first one: two-token bad words.
        gc.bad_words_ids = [_generated(bb, r, gen, 3)[:2] for r in rows[:2]]
    elif rule == "suppress":
        gc.suppress_tokens = _generated(bb, rows[0], gen, 3)[:2]
    elif rule == "min_new":
        gc.min_new_tokens = 6
    elif rule == "forced_eos":
        gc.forced_eos_token_id = bb.tokenizer.eos_token_id
    max_new = 8
    ours = bb.generate(rows, [BASE_SLOT] * len(rows), gen, max_new)
    refs = [_hf_alone(bb, r, gen, max_new) for r in rows]
    assert ours == refs


def _static(bb, rows: int = 8, max_len: int = 160, graphs: bool = True) -> StaticCausalBatch:
    return StaticCausalBatch(bb.model, bb.lora.mapping, bb.picker(GenerationConfig()), torch.device("cpu"),
                             bb.tokenizer.pad_token_id, capacity=rows, max_len=max_len, dtype=bb.dtype,
                             graphs=graphs, graph_backend=EagerReplay() if graphs else None)


def _drain(batch, seqs: list[Sequence], join_at: dict[int, list[Sequence]] | None = None) -> dict[int, list[int]]:
    """Run `seqs`, letting `join_at[k]` join before step k; the generated tokens per tag."""
    out: dict[int, list[int]] = {}
    with torch.inference_mode():
        batch.add(seqs)
        step = 0
        while True:
            for live in batch.pop_finished():
                out[live.seq.tag] = live.generated
            if join_at and step in join_at:
                batch.add(join_at.pop(step))
                continue
            if not len(batch) and not join_at:
                return out
            step += 1
            batch.step()


def test_recorded_steps_give_the_dynamic_caches_output(hunyuan_dir: Path, hunyuan_adapters: Path, fresh_backbone,
                                                       make_cache) -> None:
    """Buckets with padding rows (5 rows run in the 8-row recording), mixed slots, rows joining mid-flight and
    leaving (compaction moves storage rows): every row gets what the dynamic cache gives it."""
    bb = fresh_backbone(hunyuan_dir)
    cache = make_cache(bb, hunyuan_adapters, slots=3)
    lease = cache.try_acquire([Pair.parse(k) for k in ("en2es", "es2en", "en2de")])
    slots = lease.slots + [BASE_SLOT]

    def seqs(start: int, n: int, max_new: int) -> list[Sequence]:
        out = []
        for i in range(start, start + n):
            e = bb.encode(PromptRow(TEXTS[i % len(TEXTS)] * (1 + i % 3), "en", "es"))
            out.append(Sequence(i, e.input_ids, slots[i % len(slots)], max_new + i % 4, e.decoder_prefix))
        return out

    bb.model.generation_config.eos_token_id = []  # the tiny random model: rows end at their token limit
    first, later = seqs(0, 5, 6), seqs(5, 2, 4)
    dynamic = CausalBatch(bb.model, bb.lora.mapping, bb.picker(GenerationConfig()), torch.device("cpu"),
                          bb.tokenizer.pad_token_id)
    ref = _drain(dynamic, first, {3: later})
    recorded = _static(bb)
    assert recorded.steps.warm([1, 2, 5, 7]) == [1, 2, 8]  # buckets: 5 and 7 rows share the 8-row recording
    got = _drain(recorded, seqs(0, 5, 6), {3: seqs(5, 2, 4)})
    assert got == ref
    assert sorted(recorded.steps.graphs) == [1, 2, 8] and not recorded.steps.failed
    eager = _drain(_static(bb, graphs=False), seqs(0, 5, 6), {3: seqs(5, 2, 4)})
    assert eager == ref
    lease.release()


def test_recorded_steps_follow_slot_writes_and_layer_growth(hunyuan_dir: Path, hunyuan_adapters: Path,
                                                            fresh_backbone, make_cache) -> None:
    """A recording reads the slot buffers at every replay: a slot overwritten after capture is seen at once; when
    the slot layers grow (new buffers), recordings are made again."""
    bb = fresh_backbone(hunyuan_dir)
    cache = make_cache(bb, hunyuan_adapters, slots=1)
    batch = _static(bb, rows=2)
    bb.model.generation_config.eos_token_id = []
    e = bb.encode(PromptRow(TEXTS[0], "en", "es"))

    def run(slot: int) -> list[int]:
        return _drain(batch, [Sequence(0, e.input_ids, slot, 6, ())])[0]

    with cache.lease([Pair.parse("en2de")]) as lease:
        de = run(lease.slots[0])
    with cache.lease([Pair.parse("en2fr")]) as lease:  # same slot, new weights copied in
        fr = run(lease.slots[0])
    assert de != fr and len(batch.steps.graphs) == 1
    dynamic = CausalBatch(bb.model, bb.lora.mapping, bb.picker(GenerationConfig()), torch.device("cpu"),
                          bb.tokenizer.pad_token_id)
    with cache.lease([Pair.parse("en2fr")]) as lease:
        assert _drain(dynamic, [Sequence(0, e.input_ids, lease.slots[0], 6, ())])[0] == fr
    signature = batch.signature()
    assert batch.signature() == signature
    cache.lora.ensure(cache.lora.layers.keys(), 12, cache.lora.capacity)  # the layers' buffers are replaced
    assert batch.signature() != signature
    with cache.lease([Pair.parse("en2fr")]) as lease:
        assert run(lease.slots[0]) == fr  # captured again against the new buffers


def test_greedy_choice_is_torchs_argmax_on_ties_infinities_and_nan() -> None:
    # The picker takes a CPU float32 argmax through numpy (faster); its indices must be torch's: the first maximum
    # on a tie, -inf never chosen over a number, a NaN counting as the maximum.
    from hunyuan_mt.decode.picker import _argmax

    scores = torch.tensor([[1.0, 3.0, 3.0, 2.0],
                           [-float("inf"), -1.0, -float("inf"), -1.0],
                           [0.0, float("nan"), 5.0, float("nan")],
                           [float("inf"), float("inf"), 0.0, 0.0]])
    assert _argmax(scores) == scores.argmax(dim=-1).tolist() == [1, 1, 1, 0]
    noisy = torch.randn(64, 8012, generator=torch.Generator().manual_seed(3))
    assert _argmax(noisy) == noisy.argmax(dim=-1).tolist()
    assert _argmax(noisy[::2]) == noisy[::2].argmax(dim=-1).tolist()
