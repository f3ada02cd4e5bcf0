#!/usr/bin/env bash
# README's main command: installs what the build needs, builds kvevict, and runs the main job —
# generation and perplexity with eviction active on a real model.
# Shared models/data come from $KVEVICT_SHARED (default ../shared).
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED="${KVEVICT_SHARED:-../shared}"
bash scripts/setup.sh
bash scripts/build.sh
MODEL="$SHARED/models/stories260K/stories260K.gguf"
BOOK="$SHARED/data/gutenberg-pg19-test-books/10146.txt"
echo "== generate: Random Attention, B = 128, 1000 tokens"
./build/kvevict generate -m "$MODEL" -p "Once upon a time" -n 1000 --ignore-eos --policy random --budget 128 --seed 1
echo "== perplexity: first 4096 tokens of a PG-19 test book, B = 128"
./build/kvevict perplexity -m "$MODEL" -f "$BOOK" --gutenberg-body --tokens 4096 \
  --policies full,recency,streaming,random --budget 128 --report-every 0
