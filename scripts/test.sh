#!/usr/bin/env bash
# README's test command: installs what the build needs, builds, and runs the whole GoogleTest
# suite through CTest. Shared models/data are read from $KVEVICT_SHARED (default ../shared).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)"
