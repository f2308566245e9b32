#!/usr/bin/env bash
# ./start.sh [app flags]   set up .venv on first run, install, serve the web app (embedded demo model by default)
# ./start.sh test [args]   install the test extras too and run the whole test suite (args go to pytest)
set -euo pipefail
cd "$(dirname "$0")"

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VPY=.venv/bin/python
if [ ! -x "$VPY" ]; then
  echo "[start.sh] creating .venv with $($PY --version 2>&1)"
  "$PY" -m venv .venv
  "$VPY" -m pip install -q --disable-pip-version-check --upgrade pip
fi

# The checksum of the files' contents together: a stamp holds it, so that work is redone only when they change.
checksum() { cat "$@" | sha256sum | cut -d' ' -f1; }

# Reinstall only when a requirements file changed: the stamp holds their checksum. The files go to one pip run (one
# resolve over all of them). --no-compile: pip would byte-compile every module of every wheel (torch, ray, gradio:
# tens of thousands of files, minutes of CPU on 2 cores), where Python compiles the modules a process imports, once,
# on first import.
install() {
  local stamp=".venv/.installed-$1" files=("${@:2}") sum args=()
  sum=$(checksum "${files[@]}")
  if [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
    echo "[start.sh] installing ${files[*]} (first run takes a few minutes)"
    for f in "${files[@]}"; do args+=(-r "$f"); done
    "$VPY" -m pip install -q --disable-pip-version-check --no-compile "${args[@]}"
    echo "$sum" > "$stamp"
  fi
}

# Debian packages the tests need, installed when this user can (root, or sudo without a password), else one line
# says what to run, before pytest starts: Chromium (the browser tests; Playwright cannot download browsers here)
# and PostgreSQL (the store's tests on the database replicas share; the tests start a server of their own).
ensure_package() {
  local package=$1 present=$2
  if eval "$present"; then return 0; fi
  local run=""
  if [ "$(id -u)" = 0 ]; then run="env"; elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    run="sudo -n env"; fi
  if [ -n "$run" ] && command -v apt-get >/dev/null 2>&1; then
    echo "[start.sh] installing $package for the tests (apt-get install $package)"
    if $run DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
        && $run DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null \
        && eval "$present"; then
      return 0
    fi
  fi
  echo "[start.sh] the tests need $package, which is not installed and could not be installed here:" \
       "run 'sudo apt-get install -y $package', then ./start.sh test again"
}

# LibreTranslate's own API tests are read from its wheel (tests/libretranslate.txt says which release): downloaded,
# never installed, again only when that file changes.
fetch_libretranslate_tests() {
  local dir=.venv/cache/libretranslate stamp=.venv/.downloaded-libretranslate sum
  sum=$(checksum tests/libretranslate.txt)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
    rm -rf "$dir"
    "$VPY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      -r tests/libretranslate.txt -d "$dir"
    echo "$sum" > "$stamp"
  fi
}

if [ "${1:-}" = "test" ]; then
  # Beside pip (CPU and disk), the Debian packages and LibreTranslate's wheel are fetched (mostly network); the two
  # apt-get runs one after the other (dpkg's lock). requirements.txt and the test extras go in one pip run.
  (
    fetch_libretranslate_tests
    ensure_package chromium 'command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]'
    ensure_package postgresql 'ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1'
  ) &
  beside=$!
  install test requirements.txt requirements-test.txt
  # What `./start.sh` alone needs is installed now too: its stamp says so, so it installs nothing more.
  checksum requirements.txt > .venv/.installed-runtime
  wait "$beside"
else
  install runtime requirements.txt
fi
# The install skips byte-compiling (--no-compile above) because Python writes the bytecode of what a process imports
# on first import. Where PYTHONDONTWRITEBYTECODE is set (some images and CI runners set it) nothing is ever written,
# and every process compiled torch's, transformers' and Gradio's modules again: importing the server's modules took
# 19-20 s of CPU in a fresh .venv against 15-16 s with the bytecode there, for each of the ~200 processes the suite
# and Ray start. The .venv is ours, so its bytecode is written.
unset PYTHONDONTWRITEBYTECODE
# torch's own OpenMP (libgomp) makes every parallel region of the engine's decode thread expensive; Intel's runtime
# (the intel-openmp wheel in requirements.txt) does not, and only a preload replaces it (hunyuan_mt/host/cpu.py).
IOMP="$PWD/.venv/lib/libiomp5.so"
if [ -f "$IOMP" ] && [[ ":${LD_PRELOAD:-}:" != *":$IOMP:"* ]]; then
  export LD_PRELOAD="$IOMP${LD_PRELOAD:+:$LD_PRELOAD}" KMP_BLOCKTIME="${KMP_BLOCKTIME:-1}"
fi
# The compiled decode step (model.compile) is built once per machine and read back on later starts (~135 s the first
# time on 2 cores, ~1 s after): keep it (beside torch's compile cache) somewhere that survives a reboot, unlike /tmp.
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hunyuan-mt/torchinductor}"
# Nothing may be fetched from a model hub at run time: fail fast and clearly instead of hanging on the network.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 GRADIO_ANALYTICS_ENABLED=False

if [ "${1:-}" = "test" ]; then
  shift
  exec "$VPY" -m pytest "$@"
fi
exec "$VPY" app.py "$@"
