"""The Hunyuan family on a CPU: our lean int8 step against transformers (eager `generate`, and PEFT one request at
a time) and against llama.cpp, on a random HunYuanDenseV1 of published shapes.

    python -m bench.hunyuan_cpu --preset mid                 # hidden 512, 8 layers: every row, in minutes
    python -m bench.hunyuan_cpu --preset hy-mt1.5-1.8b       # HY-MT1.5-1.8B's shapes (see PRESETS)
    python -m bench.hunyuan_cpu --preset mid --runs 1 --new 8 --requests 4   # smoke

Random weights are fine for speed: every engine gets the same prompt of `--prompt` token ids and generates exactly
`--new` tokens (EOS ignored). Each engine runs in a process of its own on the same threads (`--threads`, default
2) and answers, medians over `--runs`:
- one stream: the first token's latency (prefill + one token) and the decode rate after it (tokens/s), ours with
  an adapter attached to the row;
- `--requests` concurrent requests (default 16) spread over 8 random LoRA adapters (r=16 on q/k/v/o): total
  tokens/s. Ours admits them as one running batch, each row on its own adapter's slot (8 slots); transformers +
  PEFT answers them one at a time with `set_adapter` (what a server without mixed batches does);
- the resident memory after loading (ours: with the 8 adapters attached), against the int8 weights' bytes.
llama.cpp (`llama-cpp-python`, a bench extra built from source, never a serving dependency) runs the same
weights converted to GGUF at Q8_0 and Q4_K_M where it and its converter are installed; the report says so where
they are not. Ratios are ours ÷ the peer, from one invocation.

OpenMP runtimes (`bench/openmp.py`): ours on Intel's, as `./start.sh` serves; llama-cpp-python's build links GNU
OpenMP (ggml's default), and llama.cpp runs on that and again on Intel's (rows marked `-iomp`); transformers on
torch's own libgomp, from the process's first thread, as a script calling it does. Each row names the runtime its
process had mapped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hunyuan_mt.config import PROJECT_ROOT
from hunyuan_mt.host.cpu import openmp_runtime

from . import openmp
from .openmp import IOMP_SUFFIX
from .report import write_results

WORK = PROJECT_ROOT / "bench" / "results" / "tmp" / "hunyuan_cpu"

_ROPE = {"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0}
#: Shapes. "hy-mt1.5-1.8b": HY-MT1.5-1.8B as its weights print (hidden 2048, 32 layers, FFN 6144, 16 query and 4
#: key/value heads of 128, vocabulary 120818, tied embeddings, QK-norm, RoPE base 10000 with NTK alpha 1000, RMSNorm
#: eps 1e-5; docs/HUNYUAN_CPU.md cites where each comes from); "mid": a mid-size model (hidden
#: 512, 8 layers, GQA 8/2).
PRESETS: dict[str, dict[str, Any]] = {
    "hy-mt1.5-1.8b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=32, num_attention_heads=16,
                          num_key_value_heads=4, head_dim=128, vocab_size=120818, tie_word_embeddings=True,
                          rms_norm_eps=1e-5, max_position_embeddings=262144, rope_parameters=_ROPE),
    "mid": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                num_key_value_heads=2, head_dim=64, vocab_size=32000, tie_word_embeddings=True, rms_norm_eps=1e-5,
                max_position_embeddings=32768, rope_parameters=_ROPE),
    # The bench's own smoke test (tests/test_bench_smoke.py): seconds, not a measurement.
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=512, tie_word_embeddings=True, rms_norm_eps=1e-5,
                 max_position_embeddings=32768, rope_parameters=_ROPE),
}
#: Ours as each preset's profile runs it, where the command line does not say: the 1.8B as
#: configs/hy-mt1.5-1.8b.yaml (eager step, bfloat16 slots), the smaller ones as the default profile (compiled).
PROFILE: dict[str, dict[str, Any]] = {"hy-mt1.5-1.8b": {"compile": False, "slot_dtype": "bfloat16"},
                                      "default": {"compile": True, "slot_dtype": "auto"}}
PAIRS = ("en2es", "en2de", "en2fr", "en2zh", "es2en", "de2en", "fr2en", "zh2en")
RANK = 16
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


# ---------------------------------------------------------------------------------------------------- the model

def build(preset: str, folder: Path) -> Path:
    """A random HunYuanDenseV1 of `preset`'s shapes (bfloat16 safetensors, as the published checkpoints), a
    word-level tokenizer for the loader, and 8 random adapters; kept in `folder` and reused."""
    import torch
    from transformers import HunYuanDenseV1Config, HunYuanDenseV1ForCausalLM

    from .adapters import random_adapter

    model_dir, adapters = folder / "model", folder / "adapters"
    if not (model_dir / "config.json").exists():
        model_dir.mkdir(parents=True, exist_ok=True)
        cfg = HunYuanDenseV1Config(**PRESETS[preset], use_qk_norm=True, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2, eod_token_id=2)
        with torch.device("meta"):
            model = HunYuanDenseV1ForCausalLM(cfg)
        # Random weights without transformers' initialisers (minutes for 1.8B on 2 cores): N(0, 0.02), norms 1.
        model = model.to_empty(device="cpu").to(torch.bfloat16)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        model.tie_weights()
        model.save_pretrained(model_dir, safe_serialization=True)
        _tokenizer(model_dir)
        del model
    for i, pair in enumerate(PAIRS):
        if not (adapters / pair).exists():
            adapters.mkdir(parents=True, exist_ok=True)
            random_adapter(model_dir, adapters / pair, pair, seed=100 + i, r=RANK, targets=TARGETS)
    return model_dir


def _tokenizer(model_dir: Path) -> None:
    """A word-level tokenizer (the engines here take token ids; the backbone's loader wants a tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>", "hello", "world"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    fast.save_pretrained(model_dir)


def prompt(length: int, vocab: int, seed: int = 0) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(10, vocab) for _ in range(length)]


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


# ---------------------------------------------------------------------------------------------------- engines

def run_ours(model_dir: Path, adapters: Path, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from hunyuan_mt.host import heap
    from hunyuan_mt.adapters.cache import AdapterCache
    from hunyuan_mt.adapters.registry import AdapterRegistry
    from hunyuan_mt.adapters.request import Pair
    from hunyuan_mt.runtime.backbone import Backbone
    from hunyuan_mt.config import CacheConfig, GenerationConfig, ModelConfig
    from hunyuan_mt.decode import Sequence, TokenPicker

    t0 = time.perf_counter()
    backbone = Backbone.load_uncached(ModelConfig(path=str(model_dir), warmup=False, quantization=args.quantization,
                                                  int8_kernel=args.int8_kernel, cpu_threads=args.threads,
                                                  compile="false"))
    load_s = time.perf_counter() - t0
    registry = AdapterRegistry(adapters, backbone.spec)
    registry.scan()
    cache = AdapterCache(backbone, registry, CacheConfig(adapters_dir=str(adapters), slots=len(PAIRS), pinned=[],
                                                         slot_dtype=getattr(args, "slot_dtype", "auto")))
    cache.start()
    compile_s = None
    if args.compile:
        # As the service runs it (model.compile: auto): the decode step compiled ahead of time, kept on disk.
        t1 = time.perf_counter()
        backbone.compile_step()
        compile_s = time.perf_counter() - t1
    pairs = [Pair.parse(p) for p in PAIRS]
    held = cache.lease(pairs)
    slots = list(held.__enter__().slots)
    memory = {"rss_mb": rss_mb(), "int8_weight_mb": _int8_bytes(backbone.model) / 2**20,
              "weight_mb": _weight_bytes(backbone.model) / 2**20}
    ids = tuple(prompt(args.prompt, backbone.model.config.vocab_size))
    picker = TokenPicker.for_model(backbone.model, GenerationConfig(), None, encoder_decoder=False)

    def generate(rows: list[tuple[tuple[int, ...], int]], new: int) -> float:
        batch = backbone.new_batch(GenerationConfig())
        batch.picker = picker  # no end token: every row generates exactly `new` tokens
        t = time.perf_counter()
        with backbone.model_lock, torch.inference_mode():
            batch.add([Sequence(i, r, slot, new) for i, (r, slot) in enumerate(rows)])
            while True:
                batch.pop_finished()
                if not len(batch):
                    break
                batch.step()
        wall = time.perf_counter() - t
        batch.release_idle()   # as the service's decode loop does when its batch has drained
        heap.trim_if_grown()
        return wall

    generate([(ids, slots[0])], 2)  # warm-up: kernels built, first shapes seen
    result = _one_stream(lambda n: generate([(ids, slots[0])], n), args)
    concurrent = [(tuple(prompt(args.prompt, backbone.model.config.vocab_size, seed=i)), slots[i % len(slots)])
                  for i in range(args.requests)]
    walls = [generate(concurrent, args.new) for _ in range(args.runs)]
    result["concurrent_tok_s"] = args.requests * args.new / statistics.median(walls)
    result["concurrent_walls"] = walls
    memory["rss_after_mb"] = rss_mb()
    held.__exit__(None, None, None)
    step = backbone.compiled[0] if backbone.compiled else None
    return {**result, **memory, "load_s": load_s, "batch": backbone.batch_class.__name__,
            "int8_kernel": backbone.int8_kernel, "compile_s": compile_s,
            "compiled": bool(step is not None and step.active)}


def _int8_bytes(model: Any) -> int:
    """Bytes of the model's int8 weights as one copy: each int8 linear's weight (one byte a weight; fbgemm keeps
    its packed copy outside torch's tensors, so shapes count, not buffers) and its scales."""
    from hunyuan_mt.quant.layer import Int8Layer

    return sum(m.in_features * m.out_features + 4 * m.out_features for m in model.modules()
               if isinstance(m, Int8Layer))


def _weight_bytes(model: Any) -> int:
    """Bytes of the model's quantized linear weights as they are held: `_int8_bytes` for 8-bit layers; a 4-bit
    layer's half byte a weight and its scale per column and group (a fused part counts its own columns)."""
    from hunyuan_mt.quant.layer import Int8Layer, Int8Part

    total = 0
    for m in model.modules():
        if not isinstance(m, Int8Layer):
            continue
        layer = m.whole if isinstance(m, Int8Part) else m
        bits, group = getattr(layer, "bits", 8), getattr(layer, "group", m.in_features)
        total += m.in_features * m.out_features * bits // 8 + 4 * m.out_features * (m.in_features // group)
    return total


def _one_stream(generate: Any, args: argparse.Namespace) -> dict[str, Any]:
    """First-token latency and decode tokens/s of one stream, medians over args.runs: `generate(n)` returns the
    wall time of a request generating n tokens."""
    firsts, fulls = [], []
    for _ in range(args.runs):
        firsts.append(generate(1))
        fulls.append(generate(args.new))
    first, full = statistics.median(firsts), statistics.median(fulls)
    return {"first_token_s": first, "decode_tok_s": (args.new - 1) / max(full - first, 1e-9),
            "stream_tok_s": args.new / full, "first_runs": firsts, "full_runs": fulls}


def run_transformers(model_dir: Path, adapters: Path, args: argparse.Namespace) -> dict[str, Any]:
    """transformers' eager generate in float32, one stream without adapters; then, with PEFT, the concurrent
    requests one at a time, each with its adapter set."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    memory = {"rss_mb": rss_mb()}
    vocab = model.config.vocab_size
    ids = torch.tensor([prompt(args.prompt, vocab)])

    def generate(m: Any, x: torch.Tensor, n: int) -> float:
        t = time.perf_counter()
        with torch.inference_mode():
            m.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, eos_token_id=None, pad_token_id=0)
        return time.perf_counter() - t

    generate(model, ids, 2)
    result = _one_stream(lambda n: generate(model, ids, n), args)
    if args.peft:
        from peft import PeftModel

        peft_model = PeftModel.from_pretrained(model, adapters / PAIRS[0], adapter_name=PAIRS[0])
        for pair in PAIRS[1:]:
            peft_model.load_adapter(str(adapters / pair), adapter_name=pair)
        walls = []
        for _ in range(args.runs):
            t = time.perf_counter()
            for i in range(args.requests):
                peft_model.set_adapter(PAIRS[i % len(PAIRS)])
                generate(peft_model, torch.tensor([prompt(args.prompt, vocab, seed=i)]), args.new)
            walls.append(time.perf_counter() - t)
        result["peft_sequential_tok_s"] = args.requests * args.new / statistics.median(walls)
        result["peft_walls"] = walls
    return {**result, **memory, "load_s": load_s}


def run_llama_cpp(gguf: Path, args: argparse.Namespace) -> dict[str, Any]:
    """llama.cpp on the same prompt ids: first token (prefill + one sampled token) and the decode rate."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_threads=args.threads, n_threads_batch=args.threads, n_ctx=512,
                n_batch=512, verbose=False, logits_all=False)
    memory = {"rss_mb": rss_mb()}
    vocab = llm.n_vocab()
    ids = prompt(args.prompt, vocab)

    def generate(n: int) -> float:
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids)
        for _ in range(n):
            token = llm.sample(top_k=1)
            llm.eval([token])
        return time.perf_counter() - t

    generate(2)
    return {**_one_stream(generate, args), **memory}


# ---------------------------------------------------------------------------------------------------- driver

def _worker(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    folder = WORK / args.preset
    model_dir, adapters = folder / "model", folder / "adapters"
    if engine == "ours":
        return run_ours(model_dir, adapters, args)
    if engine == "transformers":
        return run_transformers(model_dir, adapters, args)
    kind = engine.split(":", 1)[1].removesuffix(IOMP_SUFFIX)
    return run_llama_cpp(folder / f"{kind}.gguf", args)


def worker_env(engine: str, threads: int) -> dict[str, str]:
    """A worker's environment (`bench.openmp`): Intel's OpenMP for ours and for the llama.cpp rows marked `-iomp`."""
    env = openmp.worker_env(os.environ, intel=engine == "ours" or engine.endswith(IOMP_SUFFIX))
    env["OMP_NUM_THREADS"] = str(threads)
    return env


def _spawn(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.hunyuan_cpu", "--worker", engine, "--preset", args.preset, "--runs",
           str(args.runs), "--prompt", str(args.prompt), "--new", str(args.new), "--requests", str(args.requests),
           "--threads", str(args.threads), "--quantization", args.quantization, "--int8-kernel", args.int8_kernel,
           "--slot-dtype", args.slot_dtype] + \
        (["--peft"] if args.peft else []) + (["--compile"] if args.compile else ["--no-compile"])
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=worker_env(engine, args.threads), capture_output=True,
                          text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:300]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def gguf_files(folder: Path, model_dir: Path) -> tuple[dict[str, Path], str]:
    """The GGUF conversions llama.cpp runs ({"q8_0": path, "q4_k_m": path}) and a note where it cannot:
    llama-cpp-python must be installed and HMT_LLAMA_CPP_SRC name llama.cpp's source tree (the converter;
    bench/gguf_convert.py). Made once from a bf16 GGUF of the same weights, kept in the work folder."""
    try:
        import llama_cpp
    except ImportError:
        return {}, "llama-cpp-python is not installed (pip install -r requirements-bench.txt builds it from source)"
    out: dict[str, Path] = {}
    base = folder / "bf16.gguf"
    src = os.environ.get("HMT_LLAMA_CPP_SRC")
    for kind, ftype in (("q8_0", llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0), ("q4_k_m", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M)):
        path = folder / f"{kind}.gguf"
        if not path.exists():
            if not base.exists():
                if not src or not (Path(src) / "conversion").is_dir():
                    return out, ("no GGUF yet: set HMT_LLAMA_CPP_SRC to llama.cpp's source (the llama-cpp-python "
                                 "sdist's vendor/llama.cpp) to convert the bench model")
                done = subprocess.run([sys.executable, "-m", "bench.gguf_convert", src, str(model_dir), str(base),
                                       "bf16"], cwd=PROJECT_ROOT, capture_output=True, text=True)
                if done.returncode != 0:
                    return out, "llama.cpp's converter failed: " + (done.stderr.strip().splitlines() or ["?"])[-1]
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = ftype
            params.nthread = 2
            if llama_cpp.llama_model_quantize(str(base).encode(), str(path).encode(), params) != 0:
                return out, f"llama.cpp could not quantize the GGUF to {kind}"
        out[kind] = path
    return out, ""


#: The libraries' own instruction-set caps (bench/isa_invariance.sh): set, they make this CPU run the code a CPU of
#: that ISA runs, and the report says so.
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "HMT_QGEMM_ISA")


def isa_caps() -> dict[str, str]:
    """The caps set in this environment (the workers inherit them)."""
    return {name: os.environ[name] for name in ISA_CAPS if os.environ.get(name)}


def cpu_line() -> str:
    """The CPU's model name and the ISA flags the kernels choose by, read from /proc/cpuinfo (Linux)."""
    model, flags = platform.processor() or "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16") if f in flags]
    return f"{model} ({', '.join(isa) or 'no AVX2'}), {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hunyuan_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="mid")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=60)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quantization", default="int8", choices=("int8", "int4", "none"),
                        help="ours: the weights (with --ours, for each variant that names none)")
    parser.add_argument("--int8-kernel", default="auto", choices=("auto", "int_mm", "fbgemm", "qgemm"))
    parser.add_argument("--slot-dtype", default=None, choices=("auto", "float32", "bfloat16"),
                        help="ours: what the adapter slots keep (cache.slot_dtype; default: as the preset's profile "
                        "runs, bfloat16 for hy-mt1.5-1.8b)")
    parser.add_argument("--ours", default="",
                        help="several of ours in one invocation, comma-separated QUANTIZATION[:KERNEL]: "
                        "int8:fbgemm,int8:qgemm,int4")
    parser.add_argument("--compile", dest="compile", action="store_true", default=None,
                        help="our decode step compiled ahead of time (default: as the preset's profile runs: "
                        "eager for hy-mt1.5-1.8b, whose configs/hy-mt1.5-1.8b.yaml sets model.compile: false)")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="our decode step eager")
    parser.add_argument("--peft", action="store_true", help="also transformers + PEFT one request at a time "
                        "(default for --preset mid)")
    parser.add_argument("--tag", default="", help="results as bench/results/hunyuan_cpu-PRESET-TAG.{md,json} (e.g. "
                        "avx2 for a run under bench/isa_invariance.sh's caps), not over the untagged run's")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for key, value in PROFILE.get(args.preset, PROFILE["default"]).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.worker:
        result = _worker(args.worker, args)
        print(json.dumps({**result, "openmp": openmp_runtime()}))
        return 0
    args.peft = args.peft or args.preset == "mid"
    folder = WORK / args.preset
    model_dir = build(args.preset, folder)
    results: dict[str, Any] = {"preset": args.preset, "shapes": PRESETS[args.preset], "cpu": cpu_line(),
                               "isa_caps": isa_caps(),
                               "command": " ".join(["python -m bench.hunyuan_cpu", *(sys.argv[1:] if argv is None
                                                                                      else argv)]),
                               "args": {k: v for k, v in vars(args).items() if k != "worker"}}
    variants = [v for v in args.ours.split(",") if v] or [f"{args.quantization}:{args.int8_kernel}"]
    for variant in variants:
        quantization, _, kernel = variant.partition(":")
        own = argparse.Namespace(**{**vars(args), "quantization": quantization, "int8_kernel": kernel or "auto"})
        results[f"ours {variant}"] = _spawn("ours", own)
    results["transformers"] = _spawn("transformers", args)
    ggufs, note = gguf_files(folder, model_dir)
    results["llama_cpp_note"] = note
    for kind, _ in ggufs.items():
        for runtime in openmp.peer_runtimes():
            results[f"llama.cpp {kind}{runtime}"] = _spawn(f"llama:{kind}{runtime}", args)
    write_results(f"hunyuan_cpu-{args.preset}" + (f"-{args.tag}" if args.tag else ""), results,
                  report(results, args))
    return 0


#: How the report names each worker's OpenMP runtime (`openmp_runtime`).
RUNTIME_NAMES = {"intel": "Intel's OpenMP", "gnu": "GNU OpenMP", "none": "no OpenMP"}


def _runtime(d: dict[str, Any], lead: str = "; ") -> str:
    """The runtime a worker ran on, for a row's label ("" for results from before it was recorded)."""
    name = RUNTIME_NAMES.get(d.get("openmp", ""), "")
    return f"{lead}{name}" if name else ""


def _command(args: argparse.Namespace) -> str:
    """The command, for results from before the run recorded its own."""
    return f"python -m bench.hunyuan_cpu --preset {args.preset}" + (f" --ours {args.ours}" if args.ours else "")


def _caps_note(caps: dict[str, str] | None) -> str:
    if not caps:
        return ""
    return (" under instruction-set caps (" + ", ".join(f"{k}={v}" for k, v in caps.items()) + "; llama.cpp: the ISA "
            "its build was configured for)")


def _peer_name(key: str, d: dict[str, Any]) -> str:
    runtime = _runtime(d, lead="")
    return f"{key} ({runtime})" if runtime else key


def report(r: dict[str, Any], args: argparse.Namespace) -> list[str]:
    hf = r["transformers"]
    lines = [f"# Hunyuan family on the CPU: {args.preset}", "",
             f"CPU: {r['cpu']}{_caps_note(r.get('isa_caps'))}; {args.threads} threads; prompt {args.prompt} "
             f"tokens, {args.new} new tokens (EOS "
             f"ignored); medians of {args.runs} runs; ours {'compiled' if args.compile else 'eager'}, "
             f"{args.slot_dtype} slots. Command: `{r.get('command') or _command(args)}`",
             "", "| engine | first token (s) | decode tok/s | one stream tok/s | "
             f"{args.requests} requests over 8 adapters tok/s | RSS MB |", "|---|---|---|---|---|---|"]

    def row(name: str, d: dict[str, Any], concurrent: Any = None) -> str:
        if "error" in d:
            return f"| {name} | failed: {d['error']} | | | | |"
        c = f"{concurrent:.1f}" if isinstance(concurrent, float) else "–"
        return (f"| {name} | {d['first_token_s']:.3f} | {d['decode_tok_s']:.1f} | {d['stream_tok_s']:.1f} | {c} | "
                f"{d['rss_mb']:.0f} |")

    variants = [k for k in r if k.startswith("ours ")] or ["ours"]
    for key in variants:
        d = r[key]
        how = "compiled" if d.get("compiled") else "eager"
        lines.append(row(f"ours {key[5:] or args.quantization} ({d.get('int8_kernel') or 'float32'}, "
                         f"{d.get('batch', '?')} {how}, adapter attached{_runtime(d)})", d,
                         d.get("concurrent_tok_s")))
    lines.append(row(f"transformers eager (float32; + PEFT one at a time{_runtime(hf)})", hf,
                     hf.get("peft_sequential_tok_s")))
    for key in [k for k in r if k.startswith("llama.cpp ")]:
        lines.append(row(_peer_name(key, r[key]), r[key]))
    for key in variants:
        ours = r[key]
        if "error" in ours:
            continue
        lines += ["", f"{key}:"]
        lines.append(f"- ÷ transformers eager, decode: **{ours['decode_tok_s'] / hf['decode_tok_s']:.2f}×**"
                     if "error" not in hf else "- transformers failed")
        lines.append(f"- {args.requests} concurrent ÷ one stream: "
                     f"**{ours['concurrent_tok_s'] / ours['stream_tok_s']:.2f}×**")
        if "peft_sequential_tok_s" in hf:
            lines.append(f"- {args.requests} concurrent ÷ transformers + PEFT one at a time: "
                         f"**{ours['concurrent_tok_s'] / hf['peft_sequential_tok_s']:.2f}×**")
        for peer in [k for k in r if k.startswith("llama.cpp ") and "error" not in r[k]]:
            lines.append(f"- ÷ {_peer_name(peer, r[peer])}, decode: "
                         f"**{ours['decode_tok_s'] / r[peer]['decode_tok_s']:.2f}×**")
        int8_mb, own_mb = max(ours["int8_weight_mb"], 1), max(ours.get("weight_mb", ours["int8_weight_mb"]), 1)
        lines.append(f"- resident {ours['rss_mb']:.0f} MB with 8 adapters attached; the int8 weights {int8_mb:.0f} "
                     f"MB: **{ours['rss_mb'] / int8_mb:.2f}×**" + ("" if abs(own_mb - int8_mb) < 1 else
                     f"; its own weights {own_mb:.0f} MB: {ours['rss_mb'] / own_mb:.2f}×"))
        if "rss_after_mb" in ours:
            lines.append(f"- resident after the {args.requests} concurrent requests (batch drained): "
                         f"{ours['rss_after_mb']:.0f} MB: {ours['rss_after_mb'] / int8_mb:.2f}× the int8 weights")
    if r.get("llama_cpp_note"):
        lines.append(f"- llama.cpp: {r['llama_cpp_note']}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
