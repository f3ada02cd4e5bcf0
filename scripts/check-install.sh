#!/usr/bin/env bash
# Installs the build into a temporary prefix and checks what a user of the installed tree gets:
# the binary runs outside the source tree and finds the installed plot script
# (PREFIX/share/kvevict), and find_package(kvevict) gives a linkable kvevict::kvevict_core.
# Usage: scripts/check-install.sh [BUILD_DIR]   (default ./build; needs ../shared for the model)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
shared="$(realpath "${KVEVICT_SHARED:-../shared}")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
test -x "$tmp/prefix/bin/kvevict"
test -f "$tmp/prefix/share/kvevict/plot_kvevict.py"
test -f "$tmp/prefix/lib/cmake/kvevict/kvevictConfig.cmake"
# The installed binary, run from elsewhere, draws a plot with the installed script.
(cd "$tmp" && "$tmp/prefix/bin/kvevict" perplexity -m "$shared/models/stories260K/stories260K.gguf" \
   -f "$shared/data/tinystories/tinystories_sample.txt" --tokens 200 --policies full,random \
   --budget 128 --plot "$tmp/p.png" --report-every 0 >/dev/null 2>"$tmp/err") || { cat "$tmp/err" >&2; exit 1; }
grep -q "plot: wrote" "$tmp/err" || { echo "check-install: no plot from the installed binary:" >&2; cat "$tmp/err" >&2; exit 1; }
# A consumer project links the exported library.
mkdir -p "$tmp/consumer"
cat > "$tmp/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.22)
project(consumer CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(kvevict REQUIRED)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE kvevict::kvevict_core)
CM
printf '#include <cstdio>\n#include "eviction/registry.h"\nint main() { std::puts(kvevict::policy_names().c_str()); }\n' \
  > "$tmp/consumer/main.cpp"
cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer/build" >/dev/null
"$tmp/consumer/build/consumer" | grep -q "random"
echo "check-install: ok (binary, plot script, package config, consumer build)"
