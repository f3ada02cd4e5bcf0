#!/usr/bin/env bash
# Report Q5 "where the throughput gain comes from" (docs/reports/q5-throughput.md): random's
# decode-throughput gain over each scored selector, split into scoring cost (eviction rounds),
# attention-kernel compatibility (producing / observing what the selector reads: probabilities,
# queries) and memory (sequences admitted at equal KV memory), next to each policy's accuracy at
# the same budget from the committed Q1 / Q4 reports (so the split is read at equal accuracy).
# Fresh runs, in this order:
#   1. bench evict-round    SmolLM2-135M shape (synthetic Q8_0, seed 0), B = 1024, r = 64
#   2. bench throughput     same model, iso-batch 4, B = 1024, r = 64, from 4096 generated tokens,
#                           plus `random` re-run with the probability kernel forced (--probs-kernel)
#   3. bench throughput     same model, iso-memory: 256 MiB KV pool
#   4. bench evict-round and throughput on the default reasoner at the accuracy setting (B = 128,
#                           r = 32; iso-batch 16 from 600 tokens), same policies and forced row
#   5. scripts/bench-serve.sh  SmolLM2-135M shape, 16 MiB pool, 4 clients x 4 requests, prompt 64,
#                           192 generated tokens, B = 64, r = 16 (env SERVE=0 skips it)
# Usage: scripts/report-q5-throughput.sh   (env MAX_LOAD = wait for this 1-minute load average,
#        default 3; MAX_WAIT = give up waiting after this many seconds, default 30; THREADS = 2;
#        REPORT_ONLY=1 re-writes the report from the data of the last run without measuring).
# A bench whose JSON is already in out/q5-throughput/ is not run again (delete the folder for an
# all-fresh run; loads.txt keeps the clock time and load of every bench that ran).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/report-common-reasoner.sh   # KV, MODEL (the reasoner), grid_stats (TriAttention statistics)
OUT=out/q5-throughput
DOC=docs/reports/q5-throughput
MAX_LOAD=${MAX_LOAD:-3} MAX_WAIT=${MAX_WAIT:-30} THREADS=${THREADS:-2} SERVE=${SERVE:-1}
mkdir -p "$OUT" "$DOC"
start=$(date +%s)
mark() { echo "$1 $(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/loads.txt"; }
POLICIES=full,random,random-shared,random-beacon,h2o+prompt,tova+prompt,snapkv+prompt,rkv+prompt,vase+prompt,triattention
EVICTING=${POLICIES#full,}
SMOL="$OUT/smollm2-135m-q8_0.gguf"
have() { [ -f "$OUT/$1.json" ]; }
if [ "${REPORT_ONLY:-0}" = 0 ]; then
[ -f "$SMOL" ] || $KV tools synth-gguf --shape smollm2-135m --type q8_0 --seed 0 -o "$SMOL" > /dev/null
[ -f "$OUT/smollm2-135m.stats.json" ] ||
  $KV calibrate -m "$SMOL" -f ../shared/data/tinystories/tinystories_sample.txt --tokens 512 -c 512 \
    -o "$OUT/smollm2-135m.stats.json" -t "$THREADS" > /dev/null 2>&1
grid_stats   # the reasoner's TriAttention statistics (out/report-grid/triattention-stats.json)
WAIT=(--max-load "$MAX_LOAD" --max-wait "$MAX_WAIT" -t "$THREADS")

have evict-round || { mark "evict-round-before"
$KV bench evict-round -m "$SMOL" --budgets 1024 -r 64 --reps 3 --max-cell-seconds 20 --policies "$EVICTING" \
  --param "triattention:stats=$OUT/smollm2-135m.stats.json" "${WAIT[@]}" --json "$OUT/evict-round.json" \
  > "$OUT/evict-round.md" 2> "$OUT/evict-round.log"
mark "evict-round-after"; }

have iso-batch || { mark "iso-batch-before"
$KV bench throughput -m "$SMOL" --tables iso-batch --batch 4 -B 1024 -r 64 --start-length 4096 --steps 64 --reps 3 \
  --policies "$POLICIES" --probs-kernel random --param "triattention:stats=$OUT/smollm2-135m.stats.json" \
  "${WAIT[@]}" --json "$OUT/iso-batch.json" > "$OUT/iso-batch.md" 2> "$OUT/iso-batch.log"
mark "iso-batch-after"; }

have iso-memory || { mark "iso-memory-before"
$KV bench throughput -m "$SMOL" --tables iso-memory --pool-mib 256 -B 1024 -r 64 --start-length 4096 --steps 64 \
  --reps 2 --policies full,random,h2o+prompt,snapkv+prompt,triattention \
  --param "triattention:stats=$OUT/smollm2-135m.stats.json" "${WAIT[@]}" --json "$OUT/iso-memory.json" \
  > "$OUT/iso-memory.md" 2> "$OUT/iso-memory.log"
mark "iso-memory-after"; }

have reasoner-evict-round || { mark "reasoner-evict-round-before"
$KV bench evict-round -m "$MODEL" --budgets 128 -r 32 --reps 5 --policies "$EVICTING" \
  --param "triattention:stats=$GRID/triattention-stats.json" --max-load "$MAX_LOAD" --max-wait "$MAX_WAIT" -t 1 \
  --json "$OUT/reasoner-evict-round.json" > "$OUT/reasoner-evict-round.md" 2> "$OUT/reasoner-evict-round.log"
mark "reasoner-evict-round-after"; }
have reasoner-iso-batch || { mark "reasoner-iso-batch-before"
$KV bench throughput -m "$MODEL" --tables iso-batch --batch 16 -B 128 -r 32 --start-length 600 --steps 64 --reps 3 \
  --policies "$POLICIES" --probs-kernel random --param "triattention:stats=$GRID/triattention-stats.json" \
  --max-load "$MAX_LOAD" --max-wait "$MAX_WAIT" -t 1 --json "$OUT/reasoner-iso-batch.json" \
  > "$OUT/reasoner-iso-batch.md" 2> "$OUT/reasoner-iso-batch.log"
mark "reasoner-iso-batch-after"; }

if [ "$SERVE" != 0 ] && ! have serve/bench; then
  mark "serve-before"
  SHAPE=smollm2-135m POOL=16MiB CLIENTS=4 REQUESTS=4 PROMPT=64 MAX_TOKENS=192 BUDGET=64 BUFFER=16 \
    THREADS="$THREADS" POLICIES=full,random,h2o,tova,snapkv PORT=${PORT:-18097} KVEVICT=$KV \
    scripts/bench-serve.sh "$OUT/serve" > "$OUT/serve.md" 2>&1
  mark "serve-after"
fi
fi

if [ "${REPORT_ONLY:-0}" != 0 ] && [ ! -f "$OUT/evict-round.json" ]; then
  # A fresh clone has no out/: re-write the report from the data committed with it.
  echo "REPORT_ONLY: no $OUT/evict-round.json; re-writing from the committed data in $DOC/"
else
  for f in evict-round iso-batch iso-memory reasoner-evict-round reasoner-iso-batch; do cp "$OUT/$f.json" "$DOC/"; done
  if [ "$SERVE" != 0 ]; then cp "$OUT/serve/bench.json" "$DOC/serve.json"; fi
  cp "$OUT/loads.txt" "$DOC/loads.txt"
fi
wall=$(/usr/bin/python3 -c 'import sys, datetime
t = {}
for line in open(sys.argv[1]):
    name, clock = line.split()[:2]
    t[name] = datetime.datetime.strptime(clock, "%H:%M:%S")
s = sum((t[n[:-len("before")] + "after"] - t[n]).seconds
        for n in t if n.endswith("-before") and n[:-len("before")] + "after" in t)
print(s)' "$DOC/loads.txt")
/usr/bin/python3 scripts/report-q5.py "$DOC" "$wall" > "$DOC/tables.md"
{
  echo "# Q5: where does random's throughput gain come from?"
  echo
  echo "Made by \`scripts/report-q5-throughput.sh\` from fresh runs (benches' wall time: $wall s in all, on the"
  echo "2-core machine shared with other jobs, which at times paused them; clock times and load averages per bench below). Data: \`$DOC/\` (JSON per bench,"
  echo "\`split.csv\`, \`loads.txt\`). Seeds: synthetic model \`--seed 0\`, bench \`--seed 0\` (prompts, synthetic"
  echo "cache contents, eviction draws), serve prompts \`--seed 0\`, request i seed i."
  echo
  echo "Commands (\`$KV\`; M = \`$SMOL\`, written by \`tools synth-gguf --shape smollm2-135m --type q8_0 --seed 0\`;"
  echo "TriAttention statistics from \`calibrate -m M -f ../shared/data/tinystories/tinystories_sample.txt --tokens 512 -c 512\`):"
  echo
  echo '```'
  echo "bench evict-round -m M --budgets 1024 -r 64 --reps 3 --max-cell-seconds 20 --policies $EVICTING \\"
  echo "  --param triattention:stats=STATS --max-load $MAX_LOAD --max-wait $MAX_WAIT -t $THREADS"
  echo "bench throughput -m M --tables iso-batch --batch 4 -B 1024 -r 64 --start-length 4096 --steps 64 --reps 3 \\"
  echo "  --policies $POLICIES --probs-kernel random \\"
  echo "  --param triattention:stats=STATS --max-load $MAX_LOAD --max-wait $MAX_WAIT -t $THREADS"
  echo "bench throughput -m M --tables iso-memory --pool-mib 256 -B 1024 -r 64 --start-length 4096 --steps 64 --reps 2 \\"
  echo "  --policies full,random,h2o+prompt,snapkv+prompt,triattention --param triattention:stats=STATS --max-load $MAX_LOAD -t $THREADS"
  echo "bench evict-round -m models/reasoner/reasoner.gguf --budgets 128 -r 32 --reps 5 --policies (same as above) \\"
  echo "  --param triattention:stats=$GRID/triattention-stats.json -t 1"
  echo "bench throughput -m models/reasoner/reasoner.gguf --tables iso-batch --batch 16 -B 128 -r 32 --start-length 600 \\"
  echo "  --steps 64 --reps 3 --policies (same) --probs-kernel random --param triattention:stats=$GRID/triattention-stats.json -t 1"
  [ "$SERVE" != 0 ] && echo "SHAPE=smollm2-135m POOL=16MiB CLIENTS=4 REQUESTS=4 PROMPT=64 MAX_TOKENS=192 BUDGET=64 BUFFER=16 \\" &&
    echo "  POLICIES=full,random,h2o,tova,snapkv scripts/bench-serve.sh $OUT/serve"
  echo '```'
  echo
  cat "$DOC/tables.md"
  echo
  echo "## Reading"
  echo
  cat docs/reports/readings/q5-throughput.md
} > docs/reports/q5-throughput.md
echo "wrote docs/reports/q5-throughput.md ($wall s)"
