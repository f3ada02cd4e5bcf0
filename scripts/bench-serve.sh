#!/usr/bin/env bash
# The serving throughput table: starts `kvevict serve` on a synthetic SmolLM2-360M-shape Q8_0
# model with a fixed KV pool, drives it with `kvevict bench serve` (K concurrent streaming
# clients over loopback, one row per policy at the same B and the same pool), then stops it
# with SIGTERM. Usage:
#   scripts/bench-serve.sh [OUT_DIR]        (env: KVEVICT, POOL, CLIENTS, REQUESTS, PROMPT, MAX_TOKENS,
#                                            BUDGET, BUFFER, THREADS, POLICIES, PORT)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-serve-out}
KVEVICT=${KVEVICT:-build/kvevict}
POOL=${POOL:-64MiB} CLIENTS=${CLIENTS:-10} REQUESTS=${REQUESTS:-10} PROMPT=${PROMPT:-128}
MAX_TOKENS=${MAX_TOKENS:-256} BUDGET=${BUDGET:-128} BUFFER=${BUFFER:-32} THREADS=${THREADS:-2}
POLICIES=${POLICIES:-full,random,random-shared,h2o,tova,snapkv,triattention} PORT=${PORT:-18089}
mkdir -p "$OUT"
SHAPE=${SHAPE:-smollm2-360m}
MODEL="$OUT/$SHAPE-q8_0.gguf"
[ -f "$MODEL" ] || "$KVEVICT" tools synth-gguf --shape "$SHAPE" --type q8_0 -o "$MODEL"
"$KVEVICT" serve -m "$MODEL" --port "$PORT" --kv-memory "$POOL" --max-seqs 64 -t "$THREADS" \
  --max-tokens "$MAX_TOKENS" >"$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do grep -q "listening on" "$OUT/serve.log" && break; sleep 0.1; done
head -1 "$OUT/serve.log"
uptime
"$KVEVICT" bench serve --port "$PORT" --clients "$CLIENTS" --requests "$REQUESTS" --prompt-tokens "$PROMPT" \
  --max-tokens "$MAX_TOKENS" --budget "$BUDGET" --buffer "$BUFFER" --policies "$POLICIES" --json "$OUT/bench.json"
uptime
kill -TERM $SERVER
wait $SERVER
trap - EXIT
