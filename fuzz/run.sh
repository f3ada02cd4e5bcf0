#!/usr/bin/env bash
# Builds and runs the libFuzzer harnesses (fuzz/README.md).
#   fuzz/run.sh smoke [SECONDS]   build, then run each harness SECONDS (default 20) from the
#                                 committed seeds; fails on any crash, leak, timeout or sanitizer report
#   fuzz/run.sh long [SECONDS]    the same with SECONDS (default 3600) per harness and a kept
#                                 corpus under fuzz/work/ (not committed)
# Prints each harness's exec count. Crash inputs are written to fuzz/work/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-smoke}"
case "$mode" in
  smoke) secs="${2:-20}" ;;
  long) secs="${2:-3600}" ;;
  *) echo "fuzz/run.sh: unknown mode '$mode' (smoke, long)" >&2; exit 2 ;;
esac
if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz/run.sh: clang++ not found (scripts/setup.sh installs it)" >&2
  exit 2
fi
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd .. && pwd)}"
fi
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DCMAKE_CXX_COMPILER=clang++ -DKVEVICT_FUZZ=ON \
  -DKVEVICT_BUILD_TESTS=OFF "${launcher[@]}" >/dev/null
harnesses=(gguf safetensors tokenizer tasks grader request http)
cmake --build build-fuzz -j"$(nproc)" --target "${harnesses[@]/#/fuzz_}"
mkdir -p fuzz/work/artifacts
export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
status=0
for h in "${harnesses[@]}"; do
  if [ "$mode" = long ]; then
    corpus="fuzz/work/corpus-$h"
  else
    corpus="$(mktemp -d)"
  fi
  mkdir -p "$corpus"
  max_len=65536
  [ "$h" = grader ] && max_len=1048576
  log="fuzz/work/$h.log"
  dict=()
  [ -f "fuzz/$h.dict" ] && dict=(-dict="fuzz/$h.dict")
  if ! ./build-fuzz/fuzz/fuzz_"$h" "$corpus" "fuzz/corpus/$h" -max_total_time="$secs" -timeout=10 \
       -rss_limit_mb=2048 -max_len="$max_len" -artifact_prefix="fuzz/work/artifacts/$h-" -print_final_stats=1 \
       "${dict[@]}" >"$log" 2>&1; then
    echo "fuzz_$h: FAILED (see $log and fuzz/work/artifacts/)" >&2
    tail -40 "$log" >&2
    status=1
  fi
  runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)"
  echo "fuzz_$h: ${runs:-?} execs in ${secs} s"
  [ "$mode" = long ] || rm -rf "$corpus"
done
exit "$status"
