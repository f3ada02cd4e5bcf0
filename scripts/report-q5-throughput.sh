#!/usr/bin/env bash
# Report Q5 "where does random's throughput gain come from?" (docs/reports/q5-throughput.md),
# measured: `kvevict bench throughput --tables interleaved` times every policy inside each
# repetition (in a seeded random order), so each repetition gives random's gain over each policy side by side,
# split into the eviction rounds' part (timed by the selectors' own counters in the same steps) and
# the rest; medians with sign-test intervals over the repetitions. Two models:
#   trace reasoner (models/trace-reasoner, the model whose accuracy Q2 and Q4 measured at the same
#     B and r = 32): sweeps over B (Q2's budgets), r, batch and context around B = 384, r = 32,
#     batch 16, 1,024 generated tokens; accuracy at each B from Q2's and Q4's committed data.
#   SmolLM2-135M shape, synthetic Q8_0 weights (a real model's proportions of weights, KV and
#     scoring work, no accuracy): B = 512 / 1024 / 2048, r = 64, batch 4, 4,096 tokens; at B = 1024
#     also the probability kernel's cost (paired blocks) and admission at equal KV memory.
# Usage: scripts/report-q5-throughput.sh [--from-data]   (env MAX_LOAD: wait for this 1-minute
#   load average before each bench, default 2.5: the previous bench's own threads count in it;
#   MAX_WAIT seconds, default 300; REPS, default 9).
# --from-data re-makes the tables and plot from docs/reports/q5-throughput/data/ without measuring.
# Cost: about 15 minutes on a quiet 2-core machine (SmolLM2's center point, with R-KV's 2 s rounds,
# is most of it).
# shellcheck disable=SC2153  # MODEL, STATS come from report-common.sh; DATE, COMMIT, ... from run.env
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/report-common.sh
source scripts/report-common.sh   # KV, MODEL (the trace reasoner), STATS and grid_stats
DOC=docs/reports/q5-throughput
DATA=$DOC/data
OUT=out/q5-throughput
MAX_LOAD=${MAX_LOAD:-2.5} MAX_WAIT=${MAX_WAIT:-300} REPS=${REPS:-9}
SMOL=$OUT/smollm2-135m-q8_0.gguf
SMOL_STATS=$OUT/smollm2-135m.stats.json
T_POLICIES=full,random,random-shared,random-beacon,recency+prompt,h2o+prompt,tova+prompt,snapkv+prompt,rkv+prompt,vase+prompt,triattention
S_POLICIES=full,random,random-shared,random-beacon,h2o+prompt,tova+prompt,snapkv+prompt,rkv+prompt,vase+prompt,triattention
S_SWEEP_POLICIES=full,random,h2o+prompt,snapkv+prompt,rkv+prompt,triattention
# name|model|policies|B|r|batch|start length|extra tables
RUNS=(
  "t-b128|T|$T_POLICIES|128|32|16|1024|"
  "t-b192|T|$T_POLICIES|192|32|16|1024|"
  "t-b256|T|$T_POLICIES|256|32|16|1024|"
  "t-b384|T|$T_POLICIES|384|32|16|1024|"
  "t-b512|T|$T_POLICIES|512|32|16|1024|"
  "t-b768|T|$T_POLICIES|768|32|16|1024|"
  "t-r16|T|$T_POLICIES|384|16|16|1024|"
  "t-r64|T|$T_POLICIES|384|64|16|1024|"
  "t-batch1|T|$T_POLICIES|384|32|1|1024|"
  "t-batch4|T|$T_POLICIES|384|32|4|1024|"
  "t-batch64|T|$T_POLICIES|384|32|64|1024|"
  "t-ctx512|T|$T_POLICIES|384|32|16|512|"
  "t-ctx2048|T|$T_POLICIES|384|32|16|2048|"
  "s-b1024|S|$S_POLICIES|1024|64|4|4096|probs"
  "s-b512|S|$S_SWEEP_POLICIES|512|64|4|4096|"
  "s-b2048|S|$S_SWEEP_POLICIES|2048|64|4|4096|"
  "s-memory|S|full,random,h2o+prompt,snapkv+prompt,triattention|1024|64|4|4096|memory"
)
FROM_DATA=0
[ "${1:-}" = --from-data ] && FROM_DATA=1
[ $# -le 1 ] || { echo "usage: scripts/report-q5-throughput.sh [--from-data]" >&2; exit 2; }
[ "$#" = 0 ] || [ "$FROM_DATA" = 1 ] || { echo "usage: scripts/report-q5-throughput.sh [--from-data]" >&2; exit 2; }

bench_args() {  # bench_args RUN-SPEC -> the bench throughput arguments (no --json)
  local name model pols b r batch ctx extra m stats threads
  IFS='|' read -r name model pols b r batch ctx extra <<< "$1"
  if [ "$model" = T ]; then m=$MODEL stats=$STATS threads=1; else m=$SMOL stats=$SMOL_STATS threads=2; fi
  local tables=interleaved steps=64 more=()
  # The interleaved table holds every policy's batch at once: SmolLM2's 10 batches of 4 take ~3 GiB.
  [ "$model" = S ] && more=(--pool-mib 8192)
  [ "$extra" = probs ] && more+=(--probs-kernel random)
  [ "$extra" = memory ] && tables=iso-memory more=(--pool-mib 256)
  echo "-m $m --tables $tables --policies $pols -B $b -r $r --batch $batch --start-length $ctx --steps $steps" \
    "--reps $REPS --param triattention:stats=$stats -t $threads --max-load $MAX_LOAD --max-wait $MAX_WAIT ${more[*]}"
}

if [ "$FROM_DATA" = 0 ]; then
  rm -rf "$DATA"   # a fresh run replaces the data; cells are not mixed across runs
  mkdir -p "$OUT" "$DATA"
  grid_stats
  [ -f "$SMOL" ] || $KV tools synth-gguf --shape smollm2-135m --type q8_0 --seed 0 -o "$SMOL" > /dev/null
  [ -f "$SMOL_STATS" ] || $KV calibrate -m "$SMOL" -f "${KVEVICT_SHARED:-../shared}/data/tinystories/tinystories_sample.txt" \
    --tokens 512 -c 512 -o "$SMOL_STATS" -t 2 > /dev/null 2>&1
  start=$(date +%s)
  : > "$DATA/runs.txt"
  for spec in "${RUNS[@]}"; do
    name=${spec%%|*}
    # shellcheck disable=SC2046  # bench_args is a word list
    $KV bench throughput $(bench_args "$spec") --json "$DATA/$name.json" > "$OUT/$name.md" 2> "$OUT/$name.log" ||
      { echo "bench failed: $name (see $OUT/$name.log)" >&2; exit 1; }
    echo "$name $(date -u +%H:%M:%S)" >> "$DATA/runs.txt"
    echo "ran $name"
  done
  {
    echo "WALL=$(( $(date +%s) - start ))"
    echo "DATE=$(date -u +%Y-%m-%dT%H:%MZ)"
    echo "COMMIT=$(git rev-parse --short HEAD)"
    echo "MAX_LOAD=$MAX_LOAD"
    echo "REPS=$REPS"
    echo "CPU=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores\""
  } > "$DATA/run.env"
fi
[ -f "$DATA/run.env" ] || { echo "$DATA/run.env: no committed data to re-make the tables from" >&2; exit 1; }
# shellcheck source=/dev/null
source "$DATA/run.env"
/usr/bin/python3 scripts/report-q5.py "$DATA" "$DOC/gain-vs-budget.png" > "$DOC/tables.md"
{
  echo "# Q5: where does random's throughput gain come from?"
  echo
  echo "Made by \`scripts/report-q5-throughput.sh\` at commit $COMMIT on $DATE ($CPU; benches' wall"
  echo "time $WALL s; each bench waited for a 1-minute load average below $MAX_LOAD, the load before and after each is in"
  echo "its table). Measured, not modelled: every policy is timed in each of the $REPS repetitions (64 batched decode"
  echo "steps each, in a seeded random order), so each repetition gives random's gain over it side by side; the part of that"
  echo "gain the eviction rounds account for is timed by the selectors' counters in the same steps, the rest is what"
  echo "remains. Medians over repetitions with sign-test intervals of at least 95% coverage (\`bench/bench.h\` median_ci;"
  echo "each table gives the exact coverage). \`full\` never evicts, so its context grows by 64 tokens per"
  echo "repetition (from the start length to + $((REPS * 64))): its row is a median over that range. Data: \`$DATA/\`"
  echo "(one JSON per bench, with every repetition); \`--from-data\` re-makes this file from it."
  echo
  echo "Commands (\`kvevict bench throughput\`; T = \`$MODEL\`, S = the SmolLM2-135M shape with synthetic Q8_0"
  echo "weights, \`kvevict tools synth-gguf --shape smollm2-135m --type q8_0 --seed 0\`; TriAttention statistics from"
  echo "\`kvevict calibrate\`: T on seed-7 tasks of every family (scripts/report-common.sh), S on the TinyStories sample):"
  echo
  echo '```'
  for spec in "${RUNS[@]}"; do
    echo "$(bench_args "$spec" | sed "s|$MODEL|T|; s|$SMOL|S|; s|$STATS|T-stats.json|; s|$SMOL_STATS|S-stats.json|") --json ${spec%%|*}.json"
  done
  echo '```'
  echo
  cat "$DOC/tables.md"
  echo
  REPORT=q5-throughput report_reading "run of $DATE"
} > docs/reports/q5-throughput.md
echo "wrote docs/reports/q5-throughput.md"
