#!/usr/bin/env bash
# Report Q2 "weak redundancy" (docs/reports/q2-redundancy.md): accuracy vs budget on the once
# family (a code stated exactly once in the prompt, asked for at the end) at ~600 trace tokens and
# on a short-trace variant (~240 tokens, <= 2 x the smallest B), random vs the scored selectors
# with the prompt pinned and unpinned. Where does random ~ scored break? Shares its eval grid with
# Q1/Q4 (scripts/report-common.sh). Usage: scripts/report-q2-redundancy.sh  (env N)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/report-common.sh
start=$(date +%s); load0=$(cut -d' ' -f1-3 /proc/loadavg)
grid_run once once 600
grid_run once-short once 240
mkdir -p docs/reports/q2-redundancy
REPORT_POLICIES=random-unprotected,random,random-beacon,snapkv,snapkv+prompt,rkv+prompt,h2o,h2o+prompt,tova+prompt,triattention \
  /usr/bin/python3 scripts/report-lib.py table docs/reports/q2-redundancy/tables.md docs/reports/q2-redundancy/accuracy.png \
  "Q2: once, long and short traces" "once, ~600-token trace"=$GRID/once "once, ~240-token trace"=$GRID/once-short
{
  echo "# Q2: weak redundancy — where does random ≈ scored break?"
  echo
  echo "Made by \`scripts/report-q2-redundancy.sh\` (N = $N problems per set, tasks seed 1000, eval seed 1, greedy, r = 32;"
  echo "load $load0 before, $(cut -d' ' -f1-3 /proc/loadavg) after; wall $(( $(date +%s) - start )) s including grid runs shared with Q1/Q4)."
  echo
  echo '```'
  echo "kvevict tasks gen --family once --n $N --seed 1000 --length 600   # and --length 240"
  echo "kvevict eval -m models/reasoner/reasoner.gguf --tasks TASKS --policies $GRID_POLICIES \\"
  echo "  --budgets $GRID_BUDGETS --buffer 32 --temp 0 --rollouts 1 --seed 1 --param stats=triattention-stats.json"
  echo '```'
  echo
  cat docs/reports/q2-redundancy/tables.md
  echo "![accuracy](q2-redundancy/accuracy.png)"
  echo
  echo "## Reading"
  echo
  cat docs/reports/readings/q2-redundancy.md
} > docs/reports/q2-redundancy.md
echo "wrote docs/reports/q2-redundancy.md"
