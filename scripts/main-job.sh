#!/usr/bin/env bash
# README's main command: installs what the build needs, builds kvevict, and runs the main job on
# the project's own reasoning model (models/reasoner/reasoner.gguf): held-out generated tasks of
# each family, every policy at two budgets, greedy decoding, accuracy with paired 95% CIs against
# `full`. Results go to out/main-job/<family>/ (summary.md, summary.csv, summary.json, PNGs).
# Policies: every registered one, plus each unprotected scored selector with the prompt pinned
# ("+prompt": the paper's matched-protection rows, so random is compared with equally protected
# selectors). Environment: N (problems per family, default 30), BUDGETS (default 128,256), THREADS
# (default 1: the model is so small that every kernel call runs on one thread anyway),
# SKIP_BUILD=1 to reuse an existing ./build.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SKIP_BUILD:-0}" = 1 ] || bash scripts/setup.sh
[ "${SKIP_BUILD:-0}" = 1 ] || bash scripts/build.sh >/dev/null
KV=./build/kvevict
MODEL=models/reasoner/reasoner.gguf
N="${N:-30}"
BUDGETS="${BUDGETS:-128,256}"
THREADS="${THREADS:-1}"
OUT=out/main-job
mkdir -p "$OUT"
echo "== kvevict main job: models/reasoner/reasoner.gguf, $N held-out problems per family, budgets $BUDGETS" >&2
POLICIES=$($KV policies | awk 'NR > 1 {print $1}' | paste -sd, -)
MATCHED=$($KV policies | awk 'NR > 1 && $2 == "-" && $1 !~ /^(random-unprotected|recency|streaming)$/ {print $1 "+prompt"}' | paste -sd, -)
POLICIES="$POLICIES,$MATCHED"

# TriAttention's query statistics come from tasks that are not in the evaluation set (seed 7).
for f in chain running once; do
  $KV tasks gen --family "$f" --n 25 --seed 7 --length 600
done | python3 -c 'import json, sys
for line in sys.stdin:
    t = json.loads(line)
    sys.stdout.write(t["problem"] + t["trace"] + "\n")' > "$OUT/calibration.txt"
$KV calibrate -m "$MODEL" -f "$OUT/calibration.txt" -o "$OUT/triattention-stats.json" --ctx 1024 -t "$THREADS"

for f in chain running once; do
  # Held-out problems (seed 1000; training used seeds 100-105), traces of ~600 tokens: more than
  # 4x the smallest budget, so eviction is exercised hard.
  $KV tasks gen --family "$f" --n "$N" --seed 1000 --length 600 -o "$OUT/$f-tasks.jsonl"
  echo "== family: $f"
  rm -rf "${OUT:?}/$f"
  $KV eval -m "$MODEL" --tasks "$OUT/$f-tasks.jsonl" --policies "$POLICIES" --budgets "$BUDGETS" \
    --buffer 32 --temp 0 --rollouts 1 --param "stats=$OUT/triattention-stats.json" -t "$THREADS" -o "$OUT/$f"
done
