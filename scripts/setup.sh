#!/usr/bin/env bash
# Installs every Debian package kvevict's build, tests and tools need. Idempotent; run as root
# (or with sudo). Used by README's set-up commands and by .ci/run.
set -euo pipefail
# Options: --train also installs what tools/train_reasoner.py needs (Debian's PyTorch, run with
# /usr/bin/python3, and the threaded OpenBLAS it needs to be fast); CI does not train.
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
TRAIN=0
for arg in "$@"; do
  case "$arg" in
    --train) TRAIN=1 ;;
    *) echo "setup: unknown option '$arg' (valid: --train)" >&2; exit 2 ;;
  esac
done
PKGS=(
  build-essential cmake git pkg-config ccache
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libopenblas0-pthread libopenblas-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev
  python3-matplotlib
)
if [ "$TRAIN" = "1" ]; then PKGS+=(python3-torch libopenblas0-pthread); fi
PKGS+=(clang libclang-rt-14-dev)  # libFuzzer harnesses (fuzz/run.sh)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all Debian packages present" >&2
fi

# Optional: llama.cpp's own Python GGUF reader, used by one test as an independent cross-check of
# kvevict's GGUF parser (the test skips itself when it is missing, e.g. offline).
if ! python3 -c "import gguf, numpy" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check gguf numpy >/dev/null 2>&1 ||
    echo "setup: could not pip-install gguf (the GGUF cross-check test will be skipped)" >&2
fi

# Optional: math-verify (HuggingFace), the reference the grader's equivalence rules are checked
# against (tests/eval_grader_reference_test.cpp skips itself when it is missing).
if ! python3 -c "import math_verify" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check math-verify >/dev/null 2>&1 ||
    echo "setup: could not pip-install math-verify (the grader reference test will be skipped)" >&2
fi
