#!/usr/bin/env bash
# README's test command: installs what the build and the tests need (setup.sh --test), builds, and runs the whole GoogleTest
# suite through CTest; then builds again with AddressSanitizer + UndefinedBehaviorSanitizer into
# ./build-asan and runs the suite there (any report fails it); then a short libFuzzer run of each
# harness in fuzz/ (fuzz/run.sh smoke; FUZZ_SECONDS per harness, default 20; 0 skips).
# Shared models/data are read from $KVEVICT_SHARED (default ../shared).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
bash scripts/build.sh -DKVEVICT_BUILD_TESTS=ON
# The Python package (pyproject.toml, docs/python.md) into the python3 on PATH, for ctest's
# PythonPackage test; its build tools came with setup.sh --test, so no build isolation.
# With ccache the package's objects (position-independent, so not the build above) hit on reruns.
pip_args=(--quiet --disable-pip-version-check --no-build-isolation)
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd .. && pwd)}"
  pip_args+=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
python3 -m pip install "${pip_args[@]}" . 2>/dev/null ||
  python3 -m pip install "${pip_args[@]}" --break-system-packages .
(cd build && ctest --output-on-failure -j"$(nproc)")

start=$(date +%s)
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd .. && pwd)}"
  # With -g, ccache hashes the build folder's absolute path by default, so every fresh clone missed
  # for the whole ASan build; without it the only cost is that a cached object's debug info may
  # name another clone's folder (source paths are relative to CCACHE_BASEDIR either way).
  export CCACHE_NOHASHDIR=1
fi
# -O1 -g1: about half the compile time of -O2 -g, still fast enough for the suite.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DKVEVICT_SANITIZE=ON "${launcher[@]}" >/dev/null
cmake --build build-asan -j"$(nproc)"
(
  cd build-asan
  # ReadmeExamples, InstallTree and PythonPackage check the docs, the installed tree and the
  # Python package, not memory safety:
  # the plain build above runs them.
  ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --output-on-failure -j"$(nproc)" -E '^(ReadmeExamples|InstallTree|PythonPackage)$'

)
echo "test.sh: sanitizer build and suite took $(( $(date +%s) - start )) s"

fuzz_seconds="${FUZZ_SECONDS:-20}"
if [ "$fuzz_seconds" != 0 ]; then
  start=$(date +%s)
  bash fuzz/run.sh smoke "$fuzz_seconds"
  echo "test.sh: fuzz smoke runs took $(( $(date +%s) - start )) s"
fi
