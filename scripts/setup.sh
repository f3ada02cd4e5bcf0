#!/usr/bin/env bash
# Installs the Debian packages kvevict needs, and no more than the job at hand uses. Idempotent;
# run as root (or with sudo).
#   setup.sh           what the build and the main job need (compiler, CMake, OpenBLAS, the
#                      header libraries, PCRE2, utf8proc, the HTTP server and client libraries,
#                      matplotlib for the plots)
#   setup.sh --test    also what the test suite needs: GoogleTest, Google Benchmark, nginx-light
#                      (the replicas test), clang and its
#                      fuzzing runtime (libFuzzer harnesses), and the Python references the tests
#                      compare against (pip: gguf, numpy, jinja2, regex, openai, math-verify,
#                      safetensors, tokenizers), and the Python package's build tools and
#                      test runner (pip: nanobind, scikit-build-core, pytest)
#   setup.sh --train   also Debian's PyTorch for tools/train_reasoner.py
#   setup.sh --list    print the packages the given profile needs and install nothing (for a
#                      machine where you are not root: install them by other means)
# Used by README's two set-up commands and by .ci/run.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
TEST=0 TRAIN=0 LIST=0
for arg in "$@"; do
  case "$arg" in
    --test) TEST=1 ;;
    --train) TRAIN=1 ;;
    --list) LIST=1 ;;
    *) echo "setup: unknown option '$arg' (valid: --test, --train, --list)" >&2; exit 2 ;;
  esac
done
PKGS=(
  build-essential cmake pkg-config ccache
  libopenblas0-pthread libopenblas-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev libpcre2-dev libutf8proc-dev
  libmicrohttpd-dev libcpp-httplib-dev  # HTTP server (kvevict serve) and client (bench serve)
  python3-matplotlib
)
if [ "$TEST" = "1" ]; then
  PKGS+=(git libgtest-dev libgmock-dev googletest libbenchmark-dev python3-jinja2 python3-regex)
  PKGS+=(clang libclang-rt-14-dev)  # libFuzzer harnesses (fuzz/run.sh)
  PKGS+=(nginx-light)  # tests/nginx_replicas.sh: nginx in front of two replicas (docs/serving.md)
fi
if [ "$TRAIN" = "1" ]; then PKGS+=(python3-torch); fi
PIP=()
if [ "$TEST" = "1" ]; then
  PIP=(gguf:gguf numpy:numpy jinja2:jinja2 regex:regex openai:openai math_verify:math-verify)
  PIP+=(safetensors:safetensors tokenizers:tokenizers)
  # The Python package's build (nanobind, scikit-build-core: docs/python.md) and its tests.
  PIP+=(nanobind:nanobind scikit_build_core:scikit-build-core pytest:pytest)
fi

if [ "$LIST" = "1" ]; then
  echo "Debian packages: ${PKGS[*]}"
  [ "${#PIP[@]}" -eq 0 ] || echo "pip packages (for python3 on PATH): ${PIP[*]##*:}"
  exit 0
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ -n "$SUDO" ] && ! command -v sudo >/dev/null 2>&1; then
    echo "setup: missing packages ${missing[*]}; not root and no sudo: install them by other means (README, 'Set up')" >&2
    exit 2
  fi
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all Debian packages present" >&2
fi

# Training (--train): tools/train_reasoner.py --init reads a GGUF with the gguf package under
# Debian's /usr/bin/python3 (the one that has python3-torch).
if [ "$TRAIN" = "1" ] && ! /usr/bin/python3 -c "import gguf" 2>/dev/null; then
  /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --break-system-packages gguf >/dev/null 2>&1 ||
    echo "setup: could not pip-install gguf for /usr/bin/python3 (train_reasoner.py --init FILE.gguf needs it)" >&2
fi

# Test-time references for the `python3` on PATH (which may not be Debian's, so Debian's
# python3-* packages above need not be visible to it): llama.cpp's `gguf` reader and quantiser,
# `jinja2` (chat templates), `regex` (pre-tokenizer splits), the official `openai` client (serving
# tests), `math-verify` (the grader's equivalence reference), Hugging Face's `safetensors` (the
# format's reference reader/writer) and `tokenizers` (the tokenizer.json reference). Tests that
# need one fail under CI=true when it is missing, and skip elsewhere.
for spec in "${PIP[@]}"; do
  mod="${spec%%:*}" pkg="${spec##*:}"
  if ! python3 -c "import $mod" 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check "$pkg" >/dev/null 2>&1 ||
      python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "$pkg" >/dev/null 2>&1 ||
      echo "setup: could not pip-install $pkg (tests that need it fail under CI=true)" >&2
  fi
done
