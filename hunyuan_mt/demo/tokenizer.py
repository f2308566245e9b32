"""The demo's shared Unigram tokenizer (all five languages, one vocabulary), trained with `tokenizers`.

Like SentencePiece: a "▁" is prepended, spaces become "▁" and stay attached to the following word, and the decoder
turns "▁" back into spaces and drops the prepended one, so decode is the exact inverse of encode and masked
sentinels keep their surrounding spaces. The sentinels `⟦n⟧` are added tokens: whole tokens, never split.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from ..text.masking import sentinel_tokens

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8000) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFC()
    # prepend_scheme="first": only the segment at the very start of the string gets the "▁", not the segments
    # that follow a sentinel (added tokens cut the string into segments before pre-tokenization).
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=[PAD, EOS, UNK], unk_token=UNK,
                                      max_piece_length=12, shrinking_factor=0.75)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(s, normalized=False, special=False) for s in sentinel_tokens()])
    tok.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, tok.token_to_id(EOS))])
    return wrap(tok)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK,
                                   model_max_length=256, clean_up_tokenization_spaces=False)


def load_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    return wrap(Tokenizer.from_file(str(path)))
