#!/usr/bin/env bash
# Reproduces the README's Performance tables: builds the synthetic models, then runs every
# `kvevict bench` mode, waiting (up to MAX_WAIT seconds each) for a 1-minute load below
# MAX_LOAD first. Usage: bench/run_all.sh BUILD_DIR OUT_DIR
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-bench-results}
MAX_LOAD=${MAX_LOAD:-0.5}
MAX_WAIT=${MAX_WAIT:-600}
K="$BUILD/kvevict"
M="$OUT/models"
mkdir -p "$M"
for s in smollm2-135m smollm2-360m tinyllama-1.1b; do
  [ -f "$M/$s-q8_0.gguf" ] || "$K" tools synth-gguf --shape "$s" --type q8_0 --seed 0 -o "$M/$s-q8_0.gguf"
done
[ -f "$M/smollm2-135m-q8_0.stats.json" ] || "$K" calibrate -m "$M/smollm2-135m-q8_0.gguf" \
  -f ../shared/data/tinystories/tinystories_sample.txt -o "$M/smollm2-135m-q8_0.stats.json" --tokens 2048 --ctx 512
W="--max-load $MAX_LOAD --max-wait $MAX_WAIT"
"$K" bench decode -m "$M/smollm2-360m-q8_0.gguf" --reps 5 $W --json "$OUT/decode-smollm2-360m.json" | tee "$OUT/decode-smollm2-360m.md"
"$K" bench decode -m "$M/tinyllama-1.1b-q8_0.gguf" --reps 5 --max-length 1024 $W --json "$OUT/decode-tinyllama.json" | tee "$OUT/decode-tinyllama.md"
"$K" bench evict-round -m "$M/smollm2-135m-q8_0.gguf" --reps 3 --max-cell-seconds 30 $W \
  --param triattention:stats="$M/smollm2-135m-q8_0.stats.json" --json "$OUT/evict-round.json" | tee "$OUT/evict-round.md"
"$K" bench throughput -m "$M/smollm2-135m-q8_0.gguf" --reps 2 --steps 64 --batch 16 --tables iso-batch \
  --param triattention:stats="$M/smollm2-135m-q8_0.stats.json" $W --json "$OUT/throughput-all.json" | tee "$OUT/throughput-all.md"
"$K" bench throughput -m "$M/smollm2-135m-q8_0.gguf" --reps 1 --steps 64 --batch 16 --pool-mib 1024 --max-batch 32 \
  --policies random,h2o,triattention,snapkv \
  --param triattention:stats="$M/smollm2-135m-q8_0.stats.json" $W --json "$OUT/throughput.json" | tee "$OUT/throughput.md"
