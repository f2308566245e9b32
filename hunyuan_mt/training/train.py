"""A LoRA adapter for one language pair from a TSV or JSONL file (`python -m hunyuan_mt train-adapter`,
command.py).

The backbone is the one the server serves (from the config, or `--base`), loaded through `backbone.Backbone`, so the
training inputs are built exactly like serving builds them: plain source text for encoder-decoder models, the
Hunyuan-MT prompt (chat template when the tokenizer has one) for decoder-only models, with do-not-translate spans
masked the same way. Only the target tokens are scored. The result is a standard PEFT folder plus metadata.json,
which the adapter registry picks up on its next scan.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidInput
from ..text.languages import normalize_code

#: LoRA targets for Marian-style encoder-decoders (the demo backbone) and Llama/Hunyuan-style decoders.
_ENC_DEC_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]
_DECODER_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


@dataclass(frozen=True)
class TrainOptions:
    rank: int = 16
    alpha: int | None = None           # default 2 × rank
    epochs: int = 3
    lr: float = 1e-3
    batch_size: int = 16
    max_length: int = 128
    held_out: float = 0.1
    seed: int = 0
    target_modules: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise InvalidInput(f"--rank must be at least 1, got {self.rank}")
        if self.epochs < 1:
            raise InvalidInput(f"--epochs must be at least 1, got {self.epochs}")
        if not 0 <= self.held_out < 1:
            raise InvalidInput(f"--held-out must be a fraction in [0, 1), got {self.held_out}")
        if self.max_length < 4:
            raise InvalidInput(f"--max-length must be at least 4, got {self.max_length}")


# --- data ------------------------------------------------------------------------------------------------------

_HEADERS = {("source", "target"), ("src", "tgt")}


def read_pairs(path: Path) -> list[tuple[str, str]]:
    """(source, target) pairs from TSV (two tab-separated columns, optional header) or JSONL
    ({"src": .., "tgt": ..} or {"source": .., "target": ..}). Bad data raises InvalidInput naming the line."""
    if not path.is_file():
        raise InvalidInput(f"{path}: no such file")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InvalidInput(f"{path}, line {line}: not UTF-8 (byte 0x{raw[exc.start]:02x}); save the file as UTF-8")
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise InvalidInput(f"{path}: the file is empty, expected source/target pairs")
    jsonl = path.suffix.lower() in (".jsonl", ".json") or lines[0].lstrip().startswith("{")
    pairs = _read_jsonl(path, lines) if jsonl else _read_tsv(path, lines)
    if not pairs:
        raise InvalidInput(f"{path}: no source/target pairs found")
    return pairs


def _read_tsv(path: Path, lines: list[str]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        columns = line.split("\t")
        if len(columns) != 2:
            raise InvalidInput(f"{path}, line {number}: expected 2 tab-separated columns (source, target), "
                               f"found {len(columns)}")
        src, tgt = columns[0].strip(), columns[1].strip()
        if number == 1 and (src.lower(), tgt.lower()) in _HEADERS:
            continue
        if not src or not tgt:
            raise InvalidInput(f"{path}, line {number}: empty {'source' if not src else 'target'}")
        pairs.append((src, tgt))
    return pairs


def _read_jsonl(path: Path, lines: list[str]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"{path}, line {number}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise InvalidInput(f"{path}, line {number}: expected a JSON object with 'src' and 'tgt'")
        src = record.get("src", record.get("source"))
        tgt = record.get("tgt", record.get("target"))
        if not isinstance(src, str) or not isinstance(tgt, str):
            raise InvalidInput(f"{path}, line {number}: expected string fields 'src' and 'tgt' "
                               "(or 'source' and 'target')")
        if not src.strip() or not tgt.strip():
            raise InvalidInput(f"{path}, line {number}: empty {'source' if not src.strip() else 'target'}")
        pairs.append((src.strip(), tgt.strip()))
    return pairs


def split_held_out(pairs: list[tuple[str, str]], fraction: float, seed: int
                   ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    if fraction <= 0 or len(pairs) < 5:
        return pairs, []
    shuffled = pairs[:]
    random.Random(seed).shuffle(shuffled)
    count = max(1, round(len(pairs) * fraction))
    return shuffled[count:], shuffled[:count]


# --- training --------------------------------------------------------------------------------------------------

@dataclass
class TrainResult:
    out: Path
    train_size: int
    test_size: int
    steps: int
    seconds: float
    chrf_base: float | None
    chrf_adapter: float | None


def train_adapter(backbone, src: str, tgt: str, pairs: list[tuple[str, str]], out: Path, options: TrainOptions,
                  force: bool = False, progress: bool = True, data_name: str = "") -> TrainResult:
    """Train and save one adapter on `backbone` (a backbone.Backbone). `out` must not exist unless `force`."""
    from peft import LoraConfig, TaskType, get_peft_model

    from ..runtime.backbone import ENCODER_DECODER

    if out.exists() and any(out.iterdir()) and not force:
        raise InvalidInput(f"{out} already exists; pass --force to overwrite it")
    if getattr(backbone, "lora", None) is not None and backbone.lora.layers:
        raise InvalidInput("this backbone serves adapters (slot layers are in); train on a backbone of its own")
    train_pairs, test_pairs = split_held_out(pairs, options.held_out, options.seed)
    enc_dec = backbone.arch == ENCODER_DECODER
    model = backbone.base_model
    targets = list(options.target_modules or _default_targets(model, enc_dec))
    config = LoraConfig(task_type=TaskType.SEQ_2_SEQ_LM if enc_dec else TaskType.CAUSAL_LM, r=options.rank,
                        lora_alpha=options.alpha or 2 * options.rank, lora_dropout=0.0, target_modules=targets)
    peft_model = get_peft_model(model, config)
    step, seconds = fit(backbone, peft_model, src, tgt, train_pairs, options, progress)
    chrf_base = chrf_adapter = None
    if test_pairs:
        # PEFT wrapped the backbone's own modules in place, so the serving path (prompt, decode loop) runs the
        # freshly trained adapter; disable_adapter gives the bare backbone for the comparison.
        sources, refs = [s for s, _ in test_pairs], [t for _, t in test_pairs]
        with peft_model.disable_adapter():
            chrf_base = chrf(translate_with(backbone, src, tgt, sources, options), refs)
        chrf_adapter = chrf(translate_with(backbone, src, tgt, sources, options), refs)

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    peft_model.save_pretrained(str(out))
    metadata = {
        "pair": f"{src}2{tgt}", "source": src, "target": tgt, "base_model": backbone.name, "data": data_name,
        "train_size": len(train_pairs), "test_size": len(test_pairs),
        "scores": {"chrf": {"base": chrf_base, "right": chrf_adapter, "items": len(test_pairs)}},
        "trained_with": {"rank": options.rank, "alpha": options.alpha or 2 * options.rank, "epochs": options.epochs,
                         "lr": options.lr, "batch_size": options.batch_size, "max_length": options.max_length,
                         "target_modules": targets, "steps": step, "seconds": round(seconds, 1)},
    }
    (out / "metadata.json").write_text(json.dumps(metadata, indent=1, ensure_ascii=False), encoding="utf-8")
    # Leave the shared backbone as it was: without the LoRA layers.
    peft_model.unload()
    return TrainResult(out, len(train_pairs), len(test_pairs), step, seconds, chrf_base, chrf_adapter)


def _default_targets(model, enc_dec: bool) -> list[str]:
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    wanted = _ENC_DEC_TARGETS if enc_dec else _DECODER_TARGETS
    found = [t for t in wanted if t in names]
    if not found:
        raise InvalidInput(f"none of the default LoRA targets {wanted} exist in this model; "
                           "name them with --target-modules")
    return found


def _encode_example(backbone, src: str, tgt: str, source: str, target: str, max_length: int):
    from ..runtime.backbone import ENCODER_DECODER, PromptRow
    from ..text.masking import protect_pair

    # Masked like serving masks (the model learns to copy sentinels); pairs whose spans differ stay as they are.
    source, target = protect_pair(source, target) or (source, target)
    tok = backbone.tokenizer
    if backbone.arch == ENCODER_DECODER:
        input_ids = tok(backbone.prompt_text(PromptRow(source, src, tgt)))["input_ids"]
        labels = tok(text_target=target)["input_ids"]
        if len(input_ids) > max_length or len(labels) > max_length:
            return None
        return input_ids, labels
    prompt = backbone.prompt_text(PromptRow(source, src, tgt))
    templated = bool(getattr(tok, "chat_template", None))
    prompt_ids = tok(prompt, add_special_tokens=not templated)["input_ids"]
    target_ids = tok(target, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    if len(prompt_ids) + len(target_ids) > max_length:
        return None
    return prompt_ids + target_ids, [-100] * len(prompt_ids) + target_ids


def _collate(batch, pad_id: int, enc_dec: bool, device: str):
    import torch

    if enc_dec:
        # Same batch layout as the demo build's trainer: source right-padded, labels -100 past each target.
        from ..demo.trainer import collate

        return collate(batch, pad_id, torch.device(device))
    width = max(len(i) for i, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for row, (ids, label) in enumerate(batch):   # right padding for training; serving pads left for generation
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        labels[row, : len(label)] = torch.tensor(label)
    return {"input_ids": input_ids.to(device), "attention_mask": attention.to(device), "labels": labels.to(device)}


def fit(backbone, peft_model, src: str, tgt: str, pairs: list[tuple[str, str]], options: TrainOptions,
        progress: bool = True) -> tuple[int, float]:
    """Train `peft_model` (the backbone's model with trainable LoRA layers) on `pairs`; (steps, seconds)."""
    import torch
    from tqdm.auto import tqdm

    from ..runtime.backbone import ENCODER_DECODER

    examples = [_encode_example(backbone, src, tgt, s, t, options.max_length) for s, t in pairs]
    examples = [e for e in examples if e is not None]
    if not examples:
        raise InvalidInput(f"no training pair fits --max-length {options.max_length}")
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=options.lr,
                                  weight_decay=0.0)
    rng = random.Random(options.seed)
    steps_per_epoch = (len(examples) + options.batch_size - 1) // options.batch_size
    total = steps_per_epoch * options.epochs
    started = time.monotonic()
    peft_model.train()
    bar = tqdm(total=total, desc=f"train {src}2{tgt}", unit="step", disable=not progress)
    step = 0
    for _ in range(options.epochs):
        rng.shuffle(examples)
        for start in range(0, len(examples), options.batch_size):
            batch = _collate(examples[start:start + options.batch_size], backbone.tokenizer.pad_token_id,
                             backbone.arch == ENCODER_DECODER, backbone.device)
            for group in optimizer.param_groups:   # short linear warm-up, then constant
                group["lr"] = options.lr * min(1.0, (step + 1) / 20)
            loss = peft_model(**batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    peft_model.eval()
    return step, time.monotonic() - started


def translate_with(backbone, src: str, tgt: str, sources: list[str], options: TrainOptions) -> list[str]:
    """`sources` translated greedily by the backbone's model as it is now (with whatever adapter PEFT has active),
    masked and restored as serving does: what a held-out score is computed on."""
    from ..runtime.backbone import PromptRow
    from ..config import GenerationConfig
    from ..lora import BASE_SLOT
    from ..text.masking import protect, restore

    protected = [protect(s) for s in sources]
    rows = [PromptRow(p.text, src, tgt) for p in protected]
    # Small backbones have short position tables; held-out targets are single segments anyway.
    positions = getattr(backbone.base_model.config, "max_position_embeddings", None) or 4096
    max_new = max(4, min(options.max_length, positions // 2))
    hyps: list[str] = []
    for i in range(0, len(rows), options.batch_size):
        chunk = rows[i:i + options.batch_size]
        # transformers' own generate (any extra argument asks for it): the lean decode step reads the projections'
        # weights directly and would never see the LoRA layers PEFT put around them.
        hyps += backbone.generate(chunk, [BASE_SLOT] * len(chunk), GenerationConfig(), max_new_tokens=max_new,
                                  use_cache=True)
    return [restore(h, p) for h, p in zip(hyps, protected)]


def chrf(hypotheses: list[str], references: list[str]) -> float:
    import sacrebleu

    return round(sacrebleu.corpus_chrf(hypotheses, [references]).score, 1)


__all__ = ["TrainOptions", "read_pairs", "split_held_out", "train_adapter", "normalize_code"]
