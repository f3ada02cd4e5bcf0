#!/usr/bin/env bash
# Report Q1 "protection off" (docs/reports/q1-protection.md): every scored selector and random,
# with and without the prompt pinned, at B = 128, 192, 256 on chain, running and once (reasoner,
# 20 held-out problems each, seed 1000, greedy, r = 32). Does any scored selector clearly beat
# random once protection is off? Shares its eval grid with the Q2 and Q4 reports
# (scripts/report-common.sh). Usage: scripts/report-q1-protection.sh  (env N = problems per family)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/report-common.sh
start=$(date +%s); load0=$(cut -d' ' -f1-3 /proc/loadavg)
for f in chain running once; do grid_run "$f" "$f" 600; done
mkdir -p docs/reports/q1-protection
REPORT_POLICIES=random-unprotected,random,snapkv,snapkv+prompt,rkv,rkv+prompt,vase,vase+prompt,h2o,h2o+prompt,tova,tova+prompt \
  /usr/bin/python3 scripts/report-lib.py table docs/reports/q1-protection/tables.md docs/reports/q1-protection/accuracy.png \
  "Q1: prompt pinned (dashed) or not (solid)" chain=$GRID/chain running=$GRID/running once=$GRID/once
{
  echo "# Q1: with prompt protection off, does any scored selector beat random?"
  echo
  echo "Made by \`scripts/report-q1-protection.sh\` (N = $N problems per family, tasks seed 1000, eval seed 1, greedy, r = 32;"
  echo "load $load0 before, $(cut -d' ' -f1-3 /proc/loadavg) after; wall $(( $(date +%s) - start )) s including any grid runs shared with Q2/Q4)."
  echo "Grid command per family F (scripts/report-common.sh):"
  echo
  echo '```'
  echo "kvevict tasks gen --family F --n $N --seed 1000 --length 600 -o F-tasks.jsonl"
  echo "kvevict eval -m models/reasoner/reasoner.gguf --tasks F-tasks.jsonl --policies $GRID_POLICIES \\"
  echo "  --budgets $GRID_BUDGETS --buffer 32 --temp 0 --rollouts 1 --seed 1 --param stats=triattention-stats.json"
  echo '```'
  echo
  echo "Accuracy [95% interval, method named above each table]; \`random-unprotected\` is random with protection off, \`random\` with it on."
  echo
  cat docs/reports/q1-protection/tables.md
  echo "![accuracy](q1-protection/accuracy.png)"
  echo
  echo "## Reading"
  echo
  cat docs/reports/readings/q1-protection.md
} > docs/reports/q1-protection.md
echo "wrote docs/reports/q1-protection.md"
