"""train-adapter: data validation, end to end on tiny backbones, and the registry picking the result up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hunyuan_mt import cli
from hunyuan_mt.adapters.registry import AdapterRegistry
from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.errors import InvalidInput
from hunyuan_mt.training.train import TrainOptions, _encode_example, read_pairs, train_adapter

PAIRS = [("Save as", "Guardar como"), ("Delete file", "Eliminar archivo"), ("Settings", "Configuración"),
         ("Open", "Abrir"), ("Close", "Cerrar"), ("New folder", "Nueva carpeta"), ("Print", "Imprimir"),
         ("Copy %s", "Copiar %s"), ("Help", "Ayuda"), ("Quit", "Salir")]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def write_tsv(path: Path, pairs=PAIRS, header: bool = False) -> Path:
    lines = (["source\ttarget"] if header else []) + [f"{s}\t{t}" for s, t in pairs]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- data -------------------------------------------------------------------------------------------------------

def test_tsv_with_header_and_jsonl(tmp_path: Path) -> None:
    assert read_pairs(write_tsv(tmp_path / "a.tsv", header=True)) == PAIRS
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text("\n".join(json.dumps({"source": s, "target": t}) for s, t in PAIRS[:2]) + "\n\n",
                     encoding="utf-8")
    assert read_pairs(jsonl) == PAIRS[:2]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.tsv", b"", "empty.tsv: the file is empty, expected source/target pairs"),
        ("blank.tsv", b"\n  \n", "blank.tsv: the file is empty, expected source/target pairs"),
        ("cols.tsv", b"Open\tAbrir\nClose\tCerrar\textra\n",
         "cols.tsv, line 2: expected 2 tab-separated columns (source, target), found 3"),
        ("one.tsv", b"just one column\n", "one.tsv, line 1: expected 2 tab-separated columns (source, target), found 1"),
        ("latin1.tsv", "Open\tAbrir\nMen\u00fa\tMen\u00fa\n".encode("latin-1"),
         "latin1.tsv, line 2: not UTF-8 (byte 0xfa); save the file as UTF-8"),
        ("keys.jsonl", b'{"src": "Open", "translation": "Abrir"}\n',
         "keys.jsonl, line 1: expected string fields 'src' and 'tgt' (or 'source' and 'target')"),
        ("broken.jsonl", b'{"src": "Open", "tgt": "Abrir"}\n{"src": \n',
         "broken.jsonl, line 2: not valid JSON (Expecting value)"),
        ("emptytgt.tsv", b"Open\t\n", "emptytgt.tsv, line 1: empty target"),
    ],
)
def test_bad_data_gives_a_clear_error(tmp_path: Path, name: str, content: bytes, message: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InvalidInput) as info:
        read_pairs(path)
    assert info.value.message == f"{path.parent}/{message}"


def test_options_are_validated() -> None:
    with pytest.raises(InvalidInput, match="--held-out must be a fraction"):
        TrainOptions(held_out=1.5)
    with pytest.raises(InvalidInput, match="--rank must be at least 1"):
        TrainOptions(rank=0)


# --- end to end -------------------------------------------------------------------------------------------------

def test_cli_end_to_end_on_tiny_marian(tmp_path: Path, marian_dir: Path, fresh_backbone, capsys) -> None:
    data = write_tsv(tmp_path / "pairs.tsv")
    root = tmp_path / "adapters"
    out = root / "en2es"
    argv = ["train-adapter", "--pair", "en2es", "--data", str(data), "--out", str(out), "--base", str(marian_dir),
            "--device", "cpu", "--epochs", "2", "--rank", "4", "--batch-size", "4", "--held-out", "0.2"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "adapter en2es written to" in printed and "held-out chrF on 2 pairs:" in printed
    assert {"adapter_config.json", "adapter_model.safetensors", "metadata.json"} <= {p.name for p in out.iterdir()}
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["peft_type"] == "LORA"
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["pair"] == "en2es" and metadata["train_size"] == 8 and metadata["test_size"] == 2
    assert metadata["scores"]["chrf"]["right"] is not None

    registry = AdapterRegistry(root, fresh_backbone(marian_dir).spec)
    registry.scan()
    assert registry.usable_pairs() == {Pair("en", "es")}
    assert registry.get(Pair("en", "es")).rank == 4

    # A second run refuses to overwrite, and --force does.
    before = (out / "adapter_model.safetensors").stat().st_mtime_ns
    assert cli.main(argv) != 0
    assert f"{out} already exists; pass --force to overwrite it" in capsys.readouterr().err
    assert (out / "adapter_model.safetensors").stat().st_mtime_ns == before
    assert cli.main(argv + ["--force", "--held-out", "0"]) == 0


def test_decoder_only_uses_the_serving_prompt(tmp_path: Path, hunyuan_dir: Path, fresh_backbone) -> None:
    backbone = fresh_backbone(hunyuan_dir, device="cpu")
    input_ids, labels = _encode_example(backbone, "en", "es", "Copy %s", "Copiar %s", max_length=512)
    from hunyuan_mt.runtime.backbone import PromptRow

    prompt = backbone.prompt_text(PromptRow("Copy ⟦0⟧", "en", "es"))
    prompt_ids = backbone.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    # The prompt is the serving prompt, masked like serving masks, and it is not scored.
    assert input_ids[: len(prompt_ids)] == prompt_ids
    assert labels[: len(prompt_ids)] == [-100] * len(prompt_ids)
    target = backbone.tokenizer("Copiar ⟦0⟧", add_special_tokens=False)["input_ids"]
    assert labels[len(prompt_ids):] == target + [backbone.tokenizer.eos_token_id]

    out = tmp_path / "adapters" / "en2es"
    result = train_adapter(backbone, "en", "es", PAIRS, out, TrainOptions(rank=4, epochs=1, batch_size=4,
                                                                            held_out=0.2), progress=False)
    assert result.test_size == 2 and result.chrf_adapter is not None
    registry = AdapterRegistry(tmp_path / "adapters", backbone.spec)
    registry.scan()
    info = registry.get(Pair("en", "es"))
    assert info.usable and set(info.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    # The shared backbone is left without LoRA layers.
    assert not any("lora_" in name for name, _ in backbone.base_model.named_parameters())
