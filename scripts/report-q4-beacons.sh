#!/usr/bin/env bash
# Report Q4 "beacons" (docs/reports/q4-beacons.md): random-beacon vs random vs TriAttention and
# R-KV (rkv+prompt, matched protection) on once and the other families, B = 128, 192, 256
# (reasoner, 20 held-out problems each, seed 1000, greedy, r = 32). Does score-free eviction plus
# a few attention-chosen far slots keep a fact stated once? Shares its eval grid with Q1/Q2
# (scripts/report-common.sh). Usage: scripts/report-q4-beacons.sh  (env N = problems per family)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/report-common.sh
start=$(date +%s); load0=$(cut -d' ' -f1-3 /proc/loadavg)
for f in chain running once; do grid_run "$f" "$f" 600; done
# Beacons without the prompt pin: random-beacon and random with --no-protect-prompt (same tasks).
for f in chain once; do
  $KV eval -m "$MODEL" --tasks "$GRID/$f-tasks.jsonl" --policies full,random,random-beacon --no-protect-prompt \
    --budgets "$GRID_BUDGETS" --buffer 32 --temp 0 --rollouts 1 --seed 1 -t 1 --no-plots -o "$GRID/$f-unpinned-beacon" \
    > "$GRID/$f-unpinned-beacon.log" 2>&1
done
mkdir -p docs/reports/q4-beacons
/usr/bin/python3 scripts/report-lib.py table docs/reports/q4-beacons/unpinned.md docs/reports/q4-beacons/unpinned.png \
  "Q4: prompt not pinned (--no-protect-prompt)" chain=$GRID/chain-unpinned-beacon once=$GRID/once-unpinned-beacon
REPORT_POLICIES=random,random-shared,random-beacon,triattention,rkv+prompt,snapkv+prompt \
  /usr/bin/python3 scripts/report-lib.py table docs/reports/q4-beacons/tables.md docs/reports/q4-beacons/accuracy.png \
  "Q4: random + beacons" chain=$GRID/chain running=$GRID/running once=$GRID/once
{
  echo "# Q4: random plus beacons — does score-free eviction keep far revisits?"
  echo
  echo "Made by \`scripts/report-q4-beacons.sh\` (N = $N problems per family, tasks seed 1000, eval seed 1, greedy, r = 32;"
  echo "load $load0 before, $(cut -d' ' -f1-3 /proc/loadavg) after; wall $(( $(date +%s) - start )) s including any grid runs shared with Q1/Q2)."
  echo "\`random-beacon\` with its defaults: share 1/8 of K_sel, window 32 queries, distance 64 tokens; prompt pinned as \`random\`."
  echo "Grid command per family F (scripts/report-common.sh):"
  echo
  echo '```'
  echo "kvevict tasks gen --family F --n $N --seed 1000 --length 600 -o F-tasks.jsonl"
  echo "kvevict eval -m models/reasoner/reasoner.gguf --tasks F-tasks.jsonl --policies $GRID_POLICIES \\"
  echo "  --budgets $GRID_BUDGETS --buffer 32 --temp 0 --rollouts 1 --seed 1 --param stats=triattention-stats.json"
  echo '```'
  echo
  cat docs/reports/q4-beacons/tables.md
  echo "![accuracy](q4-beacons/accuracy.png)"
  echo
  echo "With the prompt not pinned (\`--no-protect-prompt\`, so \`random\` here is random-unprotected):"
  echo
  echo '```'
  echo "kvevict eval -m models/reasoner/reasoner.gguf --tasks F-tasks.jsonl --policies full,random,random-beacon --no-protect-prompt \\"
  echo "  --budgets $GRID_BUDGETS --buffer 32 --temp 0 --rollouts 1 --seed 1"
  echo '```'
  echo
  cat docs/reports/q4-beacons/unpinned.md
  echo "![unpinned](q4-beacons/unpinned.png)"
  echo
  echo "## Reading"
  echo
  cat docs/reports/readings/q4-beacons.md
} > docs/reports/q4-beacons.md
echo "wrote docs/reports/q4-beacons.md"
