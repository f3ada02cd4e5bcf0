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
  libcpp-httplib-dev libpcre2-dev python3-jinja2 python3-regex
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


# Training (--train): tools/train_reasoner.py --init reads the shipped GGUF with the gguf package
# under Debian's /usr/bin/python3 (the one that has python3-torch).
if [ "$TRAIN" = "1" ] && ! /usr/bin/python3 -c "import gguf" 2>/dev/null; then
  /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --break-system-packages gguf >/dev/null 2>&1 ||
    echo "setup: could not pip-install gguf for /usr/bin/python3 (train_reasoner.py --init FILE.gguf needs it)" >&2
fi

# Test-time references for the `python3` on PATH (which may not be Debian's, so Debian's
# python3-* packages above need not be visible to it): llama.cpp's `gguf` reader and quantiser,
# `jinja2` (chat templates), `regex` (pre-tokenizer splits), the official `openai` client (serving
# tests), `math-verify` (the grader's equivalence reference). Tests that need one fail under
# CI=true when it is missing, and skip elsewhere.
for spec in gguf:gguf numpy:numpy jinja2:jinja2 regex:regex openai:openai math_verify:math-verify; do
  mod="${spec%%:*}" pkg="${spec##*:}"
  if ! python3 -c "import $mod" 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check "$pkg" >/dev/null 2>&1 ||
      python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "$pkg" >/dev/null 2>&1 ||
      echo "setup: could not pip-install $pkg (tests that need it fail under CI=true)" >&2
  fi
done
