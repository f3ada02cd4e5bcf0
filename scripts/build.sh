#!/usr/bin/env bash
# Configures and builds kvevict (Release) into ./build. Usage: scripts/build.sh [extra cmake args]
# Uses ccache when it is installed (rebuilds after small edits take seconds on a 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/.."
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # Paths under the parent folder are hashed relative to it, so clones side by side share hits.
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd .. && pwd)}"
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" >/dev/null
cmake --build build -j"$(nproc)"
