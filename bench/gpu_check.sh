#!/usr/bin/env bash
# GPU check for the Hunyuan-MT-7B path (no download): builds a random HunYuanDenseV1 7B, 38 LoRA adapters, and
# measures load, memory, attach times, mixed-pair throughput, 4-bit and light mode. < 8 min on one H200.
#   bench/gpu_check.sh            (on a CUDA machine; without CUDA it says so and exits 0)
#   bench/gpu_check.sh --tiny     (CPU dry run of the whole path with tiny shapes, < 1 min)
# Results: $OUT/gpu_check.{json,md} when $OUT is set, else bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
# The GPU machine's own python3 holds torch/transformers/peft; locally fall back to the project venv.
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if python3 -c "import torch, transformers, peft" >/dev/null 2>&1; then PY=python3; else PY=.venv/bin/python; fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
exec "$PY" bench/gpu_check.py "$@"
