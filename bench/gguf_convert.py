"""The bench's random HunYuanDenseV1 as a GGUF for llama.cpp, through llama.cpp's own converter (its `conversion`
package, from the source tree `HMT_LLAMA_CPP_SRC` names: the sdist of llama-cpp-python has it under
vendor/llama.cpp). Run in a process of its own (it puts that tree on sys.path):

    python -m bench.gguf_convert SRC MODEL_DIR OUT.gguf [bf16|f16|q8_0]

The converter's HunYuanDenseV1 class writes the weights, shapes and RoPE as for a published checkpoint; only its
vocabulary step is replaced: it refuses a tokenizer whose pre-tokenizer hash it does not know, and the bench model's
word-level tokenizer is no real one. The engines here are given token ids, so a GGUF vocabulary of placeholder
tokens (one per id, and one merge, which llama.cpp requires) serves: nothing is ever tokenized or detokenized.
Nothing of llama.cpp's is copied into this repository.
"""

from __future__ import annotations

import sys
from pathlib import Path


def convert(src: Path, model_dir: Path, out: Path, outtype: str = "bf16") -> None:
    sys.path.insert(0, str(src))
    sys.path.insert(1, str(src / "gguf-py"))
    import gguf  # noqa: E402 - from the converter's own tree
    import torch
    from conversion import get_model_class  # type: ignore[import-not-found]

    base = get_model_class("HunYuanDenseV1ForCausalLM")

    class BenchHunYuan(base):  # type: ignore[misc, valid-type]
        model_arch = base.model_arch

        def set_vocab(self) -> None:
            vocab = int(self.hparams["vocab_size"])
            self.gguf_writer.add_tokenizer_model("gpt2")
            self.gguf_writer.add_tokenizer_pre("default")
            # llama.cpp refuses a BPE vocabulary without merges: three tokens and one merge of them.
            tokens = [f"<t{i}>" for i in range(vocab)]
            tokens[3:6] = ["a", "b", "ab"]
            self.gguf_writer.add_token_list(tokens)
            self.gguf_writer.add_token_types([gguf.TokenType.NORMAL] * vocab)
            self.gguf_writer.add_token_merges(["a b"])
            self.gguf_writer.add_bos_token_id(int(self.hparams.get("bos_token_id", 1)))
            self.gguf_writer.add_eos_token_id(int(self.hparams.get("eos_token_id", 2)))

    ftype = {"bf16": gguf.LlamaFileType.MOSTLY_BF16, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype]
    with torch.inference_mode():
        BenchHunYuan(model_dir, ftype, out).write()


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    convert(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), *(sys.argv[4:5] or ["bf16"]))
