#!/usr/bin/env bash
# The old reasoner's grid (models/reasoner), kept for report-anomalies.sh and
# report-q5-throughput.sh, whose texts are about that model (the Q1/Q2/Q4 grid on the trace
# reasoner is report-common.sh). Sourced, not run: one eval grid per task set, the same settings
# in every report, so a second report resumes the first one's runs (kvevict eval never
# recomputes a finished rollout) and only re-summarizes.
# Grid: every scored selector and random, with and without the prompt pinned (+prompt), plus
# random-beacon, random-shared and TriAttention (which pin by design), at B = 128, 192, 256,
# r = 32, greedy, one rollout, N problems (env N, default 20) of held-out seed 1000.
# Task sets: chain, running, once at ~600 trace tokens (the main job's length), and once-short at
# ~240 (trace <= 2 x the smallest B).
set -euo pipefail
KV=./build/kvevict
MODEL=models/reasoner/reasoner.gguf
N="${N:-20}"
GRID=out/report-grid
GRID_POLICIES=full,random,random-unprotected,random-shared,random-beacon,snapkv,snapkv+prompt,rkv,rkv+prompt,vase,vase+prompt,h2o,h2o+prompt,tova,tova+prompt,triattention
GRID_BUDGETS=128,192,256
mkdir -p "$GRID"

grid_stats() {  # TriAttention's query statistics, from tasks outside the evaluation (seed 7)
  [ -f "$GRID/triattention-stats.json" ] && return
  for f in chain running once; do $KV tasks gen --family "$f" --n 25 --seed 7 --length 600; done |
    /usr/bin/python3 -c 'import json, sys
for line in sys.stdin:
    t = json.loads(line)
    sys.stdout.write(t["problem"] + t["trace"] + "\n")' > "$GRID/calibration.txt"
  $KV calibrate -m "$MODEL" -f "$GRID/calibration.txt" -o "$GRID/triattention-stats.json" --ctx 1024 -t 1 >/dev/null
}

grid_run() {  # grid_run NAME FAMILY LENGTH -> $GRID/NAME (eval output folder)
  local name=$1 family=$2 length=$3
  grid_stats
  $KV tasks gen --family "$family" --n "$N" --seed 1000 --length "$length" -o "$GRID/$name-tasks.jsonl"
  $KV eval -m "$MODEL" --tasks "$GRID/$name-tasks.jsonl" --policies "$GRID_POLICIES" --budgets "$GRID_BUDGETS" \
    --buffer 32 --temp 0 --rollouts 1 --seed 1 --param "stats=$GRID/triattention-stats.json" -t 1 --no-plots \
    -o "$GRID/$name" > "$GRID/$name.log" 2>&1
}
