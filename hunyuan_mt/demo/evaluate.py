"""chrF on the held-out split, five ways per direction, exact match on frequent UI phrases, and repeated phrases
in held-out paragraphs' translations.

Columns: copy (the source unchanged: the floor), base (no adapter), wrong (another direction's adapter: for en→X the
en→Y adapter of another target, for X→en the reverse en→X adapter), right (the direction's own adapter) and pivot
(es→de only: es→en then en→de). Every translation goes through masking.protect/restore, as in serving.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import sacrebleu
import torch
from peft import PeftModel
from transformers import PreTrainedTokenizerFast

from ..text.masking import protect, restore

BASE = "__base__"


def wrong_adapter(direction: str) -> str:
    src, tgt = direction.split("2")
    if src == "en":
        return "en2es" if tgt != "es" else "en2fr"
    return f"en2{src}"


@torch.inference_mode()
def translate(model: PeftModel, tokenizer: PreTrainedTokenizerFast, texts: list[str], adapter: str,
              batch_size: int = 64, max_new_tokens: int = 256) -> list[str]:
    """Greedy translations of `texts` through `adapter` (or BASE), masked spans restored."""
    device = next(model.parameters()).device
    protected = [protect(t) for t in texts]
    outputs: list[str] = [""] * len(texts)
    order = sorted(range(len(texts)), key=lambda i: len(protected[i].text))
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        enc = tokenizer([protected[i].text for i in rows], return_tensors="pt", padding=True, truncation=True,
                        max_length=256).to(device)
        # A bound from the source length keeps a looping row from holding its whole batch to max_new_tokens.
        bound = min(max_new_tokens, 2 * int(enc["attention_mask"].sum(1).max()) + 8)
        generated = model.generate(**enc, adapter_names=[adapter] * len(rows), num_beams=1, do_sample=False,
                                   max_new_tokens=bound)
        for i, text in zip(rows, tokenizer.batch_decode(generated, skip_special_tokens=True)):
            outputs[i] = restore(text.strip(), protected[i])
    return outputs


def _subset(items: list[tuple[str, str]], limit: int | None) -> list[tuple[str, str]]:
    # The held-out files are sorted by English text; a seeded sample avoids evaluating only "--option" strings.
    if not limit or limit >= len(items):
        return items
    return random.Random(0).sample(items, limit)


def chrf(hypotheses: list[str], references: list[str]) -> float:
    return round(sacrebleu.corpus_chrf(hypotheses, [references]).score, 1)


#: A phrase of 1–4 words ("la orden de shell, la orden de shell, la orden de shell") or, in unspaced Chinese, of
#: 1–8 characters, said three times in a row: the shape of a decoding loop. Punctuation and case are ignored.
_MAX_WORDS, _MAX_ZH_CHARS = 4, 8
_ZH_UNITS = r"[\u3400-\u9fff]|[^\W\u3400-\u9fff]+"


def repeats_phrase(text: str, lang: str) -> bool:
    """Whether `text` says a short phrase three times in a row."""
    # Chinese: each Han character is a unit, and so is each run of other letters or digits ("Settter" is a
    # misspelt word, not "t" said three times).
    units = re.findall(_ZH_UNITS if lang == "zh" else r"\w+", text.casefold())
    longest = _MAX_ZH_CHARS if lang == "zh" else _MAX_WORDS
    for n in range(1, longest + 1):
        for i in range(len(units) - 3 * n + 1):
            if units[i:i + n] == units[i + n:i + 2 * n] == units[i + 2 * n:i + 3 * n]:
                return True
    return False


def new_repeats(items: list[tuple[str, str]], hypotheses: list[str], direction: str) -> list[int]:
    """Indexes of the outputs that repeat a phrase where their source does not."""
    src, tgt = direction.split("2")
    return [i for i, ((source, _), hyp) in enumerate(zip(items, hypotheses))
            if repeats_phrase(hyp, tgt) and not repeats_phrase(source, src)]


def translate_route(model: PeftModel, tokenizer: PreTrainedTokenizerFast, sources: list[str],
                    direction: str) -> list[str]:
    """`sources` through the direction's route as served: its own adapter, or, for es→de (no adapter), es→en and
    then en→de."""
    if direction == "es2de":
        return translate(model, tokenizer, translate(model, tokenizer, sources, "es2en"), "en2de")
    return translate(model, tokenizer, sources, direction)


def score_direction(model: PeftModel, tokenizer: PreTrainedTokenizerFast, items: list[tuple[str, str]],
                    direction: str) -> tuple[dict, list[str]]:
    """One row of the table (copy, base, wrong, right, pivot) and the hypotheses of the direction's own route."""
    sources = [s for s, _ in items]
    refs = [r for _, r in items]
    row: dict[str, float | int | None] = {"items": len(items), "copy": chrf(sources, refs)}
    hyps = translate_route(model, tokenizer, sources, direction)
    if direction == "es2de":
        row.update(base=chrf(translate(model, tokenizer, sources, BASE), refs), wrong=None, right=None,
                   pivot=chrf(hyps, refs))
    else:
        row.update(base=chrf(translate(model, tokenizer, sources, BASE), refs),
                   wrong=chrf(translate(model, tokenizer, sources, wrong_adapter(direction)), refs),
                   right=chrf(hyps, refs), pivot=None)
    return row, hyps


def evaluate(model: PeftModel, tokenizer: PreTrainedTokenizerFast, test: dict[str, list[tuple[str, str]]],
             frequent: dict[str, list[tuple[str, str]]], directions: list[str],
             progress: Callable[[str], None] = print, limit: int | None = None,
             help_test: dict[str, list[tuple[str, str]]] | None = None,
             para_test: dict[str, list[tuple[str, str]]] | None = None) -> dict:
    """chrF on the held-out UI strings (and on held-out help sentences and paragraphs when given), exact match on
    the frequent phrases, and the paragraph outputs that repeat a phrase their source does not."""
    scores: dict[str, dict] = {}
    samples: dict[str, list[dict[str, str]]] = {}
    for direction in directions + ["es2de"]:
        items = _subset(test[direction], limit)
        row, hyps = score_direction(model, tokenizer, items, direction)
        scores[direction] = row
        samples[direction] = [{"src": s, "ref": r, "hyp": h} for (s, r), h in zip(items, hyps)]
        progress(f"{direction}: {row}")
    help_scores: dict[str, dict] = {}
    for direction in directions:
        items = _subset((help_test or {}).get(direction, []), limit)
        if items:
            help_scores[direction], hyps = score_direction(model, tokenizer, items, direction)
            samples[f"help:{direction}"] = [{"src": s, "ref": r, "hyp": h} for (s, r), h in zip(items[:40], hyps)]
            progress(f"help {direction}: {help_scores[direction]}")
    para_scores: dict[str, dict] = {}
    for direction in directions:
        items = _subset((para_test or {}).get(direction, []), limit)
        if items:
            para_scores[direction], hyps = score_direction(model, tokenizer, items, direction)
            looping = new_repeats(items, hyps, direction)
            para_scores[direction]["repeats"] = len(looping)
            samples[f"para:{direction}"] = [{"src": s, "ref": r, "hyp": h} for (s, r), h in zip(items, hyps)]
            progress(f"paragraphs {direction}: {para_scores[direction]}")
    exact: dict[str, dict] = {}
    for direction, items in frequent.items():
        if direction not in directions:
            continue
        items = items[:limit] if limit else items
        hyps = translate(model, tokenizer, [s for s, _ in items], direction)
        hits = sum(h == r for h, (_, r) in zip(hyps, items))
        folded = sum(h.casefold().rstrip(".") == r.casefold().rstrip(".") for h, (_, r) in zip(hyps, items))
        exact[direction] = {"items": len(items), "exact": round(100 * hits / max(1, len(items)), 1),
                            "exact_casefold": round(100 * folded / max(1, len(items)), 1),
                            "samples": [{"src": s, "ref": r, "hyp": h} for h, (s, r) in zip(hyps[:40], items[:40])]}
        progress(f"{direction} frequent phrases: exact {exact[direction]['exact']}%")
    return {"chrf": scores, "help_chrf": help_scores, "para_chrf": para_scores, "frequent": exact, "samples": samples}
