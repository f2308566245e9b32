"""Joint training of the demo backbone and one LoRA adapter per direction.

The backbone never sees a target-language tag: every batch holds one direction and runs through that direction's
LoRA adapter, so the shared weights learn what the directions have in common and only the adapter knows where the
output should go. Directions take turns (round robin) so each gets the same number of updates; batches are length
bucketed; the run is bounded by wall-clock minutes, with the learning rate decayed over the last 30 % of them.

With copy data, every `copy_every`-th batch trains the bare backbone (adapters off) to reproduce its input. Without
it the bare backbone drifts towards English, the language half the directions write, and the X→en adapters have
little left to add; with it, the direction lives in the adapter, and the bare backbone is an honest "no adapter".
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel, TaskType, get_peft_model
from transformers import MarianConfig, MarianMTModel, PreTrainedTokenizerFast

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]


@dataclass(frozen=True)
class ModelSize:
    d_model: int
    layers: int
    heads: int
    ffn: int
    vocab: int
    lora_rank: int
    max_len: int = 64
    max_tokens: int = 2048         # tokens (source + target, padded) per batch
    lr: float = 1e-3


PRESETS: dict[str, ModelSize] = {
    # 2 shared CPU cores: small and shallow, so that each direction gets many updates in an hour.
    "cpu": ModelSize(d_model=192, layers=2, heads=4, ffn=768, vocab=6000, lora_rank=16, max_tokens=1536),
    # One GPU for minutes: wider and deeper, still under the 60 MB backbone / 3 MB adapter budgets in fp32.
    "cuda": ModelSize(d_model=384, layers=3, heads=6, ffn=1024, vocab=8000, lora_rank=16, max_tokens=12288),
    # About twice the parameters of "cuda" (29M), for a longer GPU run: the backbone is stored in fp16 (about
    # 58 MB), and rank 8 keeps each adapter under 3 MB in fp32. Not trained yet (no GPU lent since it was added).
    "cuda-large": ModelSize(d_model=512, layers=4, heads=8, ffn=1536, vocab=8000, lora_rank=8, max_tokens=12288),
}


def build_config(size: ModelSize, vocab_size: int, pad_id: int, eos_id: int) -> MarianConfig:
    return MarianConfig(
        vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=size.d_model,
        encoder_layers=size.layers, decoder_layers=size.layers,
        encoder_attention_heads=size.heads, decoder_attention_heads=size.heads,
        encoder_ffn_dim=size.ffn, decoder_ffn_dim=size.ffn, max_position_embeddings=256,
        pad_token_id=pad_id, eos_token_id=eos_id, decoder_start_token_id=pad_id, forced_eos_token_id=eos_id,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True, scale_embedding=True,
        activation_function="gelu", dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
    )


def lora_config(rank: int) -> LoraConfig:
    return LoraConfig(task_type=TaskType.SEQ_2_SEQ_LM, r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                      target_modules=list(LORA_TARGETS), bias="none")


def multi_lora_model(base: MarianMTModel, directions: list[str], rank: int) -> PeftModel:
    """The backbone with one adapter per direction; the backbone's own weights stay trainable too."""
    model = get_peft_model(base, lora_config(rank), adapter_name=directions[0])
    for direction in directions[1:]:
        model.add_adapter(direction, lora_config(rank))
    for name, param in model.named_parameters():
        # Sinusoidal positions are fixed tables, not weights to learn.
        if "lora_" not in name and "embed_positions" not in name:
            param.requires_grad_(True)
    return model


def adapter_of(name: str) -> str | None:
    """The adapter a parameter belongs to (PEFT names LoRA weights `...q_proj.lora_A.<adapter>.weight`), or None
    for the backbone's own."""
    return name.split(".")[-2] if "lora_" in name else None


def freeze_all_but(model: PeftModel, directions: list[str]) -> int:
    """Leave only `directions`' LoRA weights trainable: the backbone and every other adapter stay exactly as they
    are, so a run that spends its time on one lagging direction cannot move any other direction's scores.
    Returns the number of trainable parameters."""
    unknown = set(directions) - set(model.peft_config)
    if unknown:
        raise ValueError(f"no adapter named {sorted(unknown)} in the model (it has {sorted(model.peft_config)})")
    trainable = 0
    for name, param in model.named_parameters():
        keep = adapter_of(name) in directions
        param.requires_grad_(keep)
        trainable += param.numel() if keep else 0
    return trainable


# --- data ------------------------------------------------------------------------------------------------------

Example = tuple[list[int], list[int]]


def encode_pairs(tokenizer: PreTrainedTokenizerFast, pairs: list[tuple[str, str]], max_len: int) -> list[Example]:
    fast = tokenizer.backend_tokenizer
    sources = fast.encode_batch([s for s, _ in pairs])
    targets = fast.encode_batch([t for _, t in pairs])
    return [(s.ids, t.ids) for s, t in zip(sources, targets) if len(s.ids) <= max_len and len(t.ids) <= max_len]


def batches(examples: list[Example], max_tokens: int, rng: random.Random) -> Iterator[list[Example]]:
    """Endless length-bucketed batches: shuffle, sort within pools of ~100 batches, cut by padded token count."""
    while True:
        order = examples[:]
        rng.shuffle(order)
        pool_size = max(1, max_tokens // 16) * 100
        cut: list[list[Example]] = []
        for start in range(0, len(order), pool_size):
            pool = sorted(order[start:start + pool_size], key=lambda e: (len(e[0]), len(e[1])))
            batch: list[Example] = []
            longest = 0
            for example in pool:
                longest_next = max(longest, len(example[0]) + len(example[1]))
                if batch and longest_next * (len(batch) + 1) > max_tokens:
                    cut.append(batch)
                    batch, longest_next = [], len(example[0]) + len(example[1])
                batch.append(example)
                longest = longest_next
            if batch:
                cut.append(batch)
        rng.shuffle(cut)
        yield from cut


def collate(batch: list[Example], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    src_len = max(len(s) for s, _ in batch)
    tgt_len = max(len(t) for _, t in batch)
    input_ids = torch.full((len(batch), src_len), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), tgt_len), -100, dtype=torch.long)
    for row, (s, t) in enumerate(batch):
        input_ids[row, : len(s)] = torch.tensor(s)
        labels[row, : len(t)] = torch.tensor(t)
    return {"input_ids": input_ids.to(device), "attention_mask": (input_ids != pad_id).to(device),
            "labels": labels.to(device)}


# --- training --------------------------------------------------------------------------------------------------

@dataclass
class TrainLog:
    steps: int = 0
    seconds: float = 0.0
    tokens: int = 0
    steps_per_direction: dict[str, int] = field(default_factory=dict)
    loss_curve: list[tuple[int, float]] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def copy_examples(data: dict[str, list[Example]], per_direction: int, seed: int = 0) -> list[Example]:
    """(text, text) examples from the source side of every direction: each language the backbone reads."""
    rng = random.Random(seed)
    texts = {tuple(src) for examples in data.values() for src, _ in rng.sample(examples, min(per_direction, len(examples)))}
    return [(list(t), list(t)) for t in sorted(texts)]


def train_joint(model: PeftModel, data: dict[str, list[Example]], size: ModelSize, minutes: float, pad_id: int,
                device: torch.device, seed: int = 0, log_every: int = 100, max_steps: int | None = None,
                warmup: int = 400, copy_data: list[Example] | None = None, copy_every: int = 9,
                weights: dict[str, int] | None = None) -> TrainLog:
    """`weights`: a direction's turns per round (default 1), to spend more of a run on a direction that lags."""
    rng = random.Random(seed)
    streams = {d: batches(examples, size.max_tokens, rng) for d, examples in data.items() if examples}
    copy_stream = batches(copy_data, size.max_tokens, rng) if copy_data else None
    unknown = set(weights or {}) - set(streams)
    if unknown:
        raise ValueError(f"weights name directions without training data: {sorted(unknown)}")
    directions = [d for d in sorted(streams) for _ in range((weights or {}).get(d, 1))]
    # An adapter's weights are trainable while it is the active one (PEFT's set_adapter); a frozen backbone
    # (`freeze_all_but`) leaves the shared group empty, and AdamW takes no empty group.
    lora = [p for n, p in model.named_parameters() if adapter_of(n) in streams]
    shared = [p for n, p in model.named_parameters() if adapter_of(n) is None and p.requires_grad]
    groups = [{"params": shared, "lr": size.lr}, {"params": lora, "lr": 2 * size.lr}]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], betas=(0.9, 0.98), weight_decay=0.01,
                                  eps=1e-8)
    trained = shared + lora
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    log = TrainLog(steps_per_direction={d: 0 for d in sorted(streams) + (["copy"] if copy_stream else [])})
    use_bf16 = device.type == "cuda"
    budget = minutes * 60.0
    start = time.monotonic()
    running = 0.0
    turn = 0
    model.train()
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= budget or (max_steps is not None and log.steps >= max_steps):
            break
        fraction = elapsed / budget
        scale = min(1.0, (log.steps + 1) / warmup) * (1.0 if fraction < 0.7 else max(0.05, (1 - fraction) / 0.3))
        for group, base_lr in zip(optimizer.param_groups, base_lrs):
            group["lr"] = base_lr * scale
        if copy_stream is not None and log.steps % copy_every == copy_every - 1:
            direction, batch = "copy", collate(next(copy_stream), pad_id, device)
            adapters = model.disable_adapter()
        else:
            if turn % len(directions) == 0:
                rng.shuffle(directions)
            direction = directions[turn % len(directions)]
            turn += 1
            batch = collate(next(streams[direction]), pad_id, device)
            model.set_adapter(direction)
            adapters = nullcontext()
        with adapters, torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           labels=batch["labels"]).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), batch["labels"].view(-1),
                               ignore_index=-100, label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        log.steps += 1
        log.steps_per_direction[direction] += 1
        log.tokens += int(batch["attention_mask"].sum()) + int((batch["labels"] != -100).sum())
        running = loss.item() if log.steps == 1 else 0.98 * running + 0.02 * loss.item()
        if log.steps % log_every == 0:
            log.loss_curve.append((log.steps, round(running, 4)))
            took = time.monotonic() - start
            print(f"step {log.steps:6d}  loss {running:.3f}  {log.tokens / took:8.0f} tok/s  "
                  f"{took / 60:5.1f}/{minutes:.1f} min  lr×{scale:.2f}", flush=True)
    log.seconds = time.monotonic() - start
    model.eval()
    return log


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def approx_adapter_bytes(size: ModelSize) -> int:
    d, f, r, n = size.d_model, size.ffn, size.lora_rank, size.layers
    attention = 4 * r * 2 * d
    ffn = r * (d + f) * 2
    return 4 * n * ((attention + ffn) + (2 * attention + ffn))


__all__ = ["ModelSize", "PRESETS", "build_config", "lora_config", "multi_lora_model", "encode_pairs", "train_joint",
           "copy_examples", "freeze_all_but",
           "TrainLog", "count_parameters", "approx_adapter_bytes", "LORA_TARGETS"]
