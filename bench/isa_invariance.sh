#!/usr/bin/env bash
# Invariant 5 (a row's output does not depend on its batch) under each instruction set the project's CPUs have:
# the batch-invariance, lean-step and kernel tests run once per ISA cap, on this machine's CPU.
#
#   bash bench/isa_invariance.sh            # every cap this CPU can emulate: avx2, avx512, and native (amx here)
#   bash bench/isa_invariance.sh avx2       # one of them
#
# The caps are the libraries' own switches: ATEN_CPU_CAPABILITY picks torch's kernels (and the ISA our C++ kernels
# are built for, hunyuan_mt/kernels), MKL_ENABLE_INSTRUCTIONS MKL's code path, ONEDNN_MAX_CPU_ISA oneDNN's (the
# int8 GEMM of torch._int_mm and the packed float32 linears). Under "avx2" torch._int_mm has no fast kernel, so
# model.int8_kernel: auto picks fbgemm, as on an AVX2-only CPU (AMD Zen 3). HMT_QGEMM_ISA caps our qgemm kernel
# the same way (avx2: its AVX2 path; tests/test_qgemm.py also compares its paths' bits in one run). A cap runs the
# code a CPU of that ISA runs, on this CPU's cores: what it cannot show is a difference in the silicon itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
TESTS=(tests/test_batch_invariance.py tests/test_llama_step.py tests/test_kernels.py tests/test_qgemm.py)
caps=("$@")
if [ ${#caps[@]} -eq 0 ]; then
  caps=(avx2)
  grep -qw avx512f /proc/cpuinfo && caps+=(avx512)
  caps+=(native)
fi
status=0
for cap in "${caps[@]}"; do
  case "$cap" in
    avx2) env_vars=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 HMT_QGEMM_ISA=avx2) ;;
    avx512) env_vars=(ATEN_CPU_CAPABILITY=avx512 MKL_ENABLE_INSTRUCTIONS=AVX512 ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI) ;;
    native) env_vars=() ;;
    *) echo "unknown cap $cap (avx2, avx512, native)"; exit 2 ;;
  esac
  # A kernel cache and a compile cache of its own per cap: packages are keyed by the CPU, not by the caps.
  cache=$(mktemp -d)
  echo "== $cap: ${env_vars[*]:-no cap} =="
  if ! env "${env_vars[@]}" HMT_KERNEL_CACHE="$cache/kernels" TORCHINDUCTOR_CACHE_DIR="$cache/inductor" \
      "$PY" -m pytest -q -p no:cacheprovider "${TESTS[@]}" 2>&1 | tail -3; then
    status=1
  fi
  rm -rf "$cache"
done
exit $status
