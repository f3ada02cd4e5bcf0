#!/usr/bin/env bash
# Report Q4 "beacons" (docs/reports/q4-beacons.md), trace reasoner: revisit (a value computed
# early in the trace and re-read at 4 far checkpoints and at the end), random-beacon (random plus
# a share of K_sel on the far slots the last queries attend to most) against random, TriAttention
# and R-KV with the prompt pinned (rkv+prompt), and recency+prompt (the control). Does score-free
# eviction plus a few attention-chosen far slots keep far revisits? Each policy is tested against
# random and random-beacon against the scored ones on the same problems (TOST).
# Grid and statistics: scripts/report-common.sh. Cost at the defaults: 1 set x 31 cells at N = 300,
# about 0.5 h of wall time with two cells side by side on the 2 cores (2026-12-03, load ~2; rkv+prompt's
# cells are half of it); the report's header gives the measured CPU time.
# Usage: scripts/report-q4-beacons.sh [--from-data]   (env N, BUDGETS, POLICIES, SETS, JOBS, MODEL)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/report-common.sh
N="${N:-300}"
BUDGETS="${BUDGETS:-128,192,256,384,512,768}"
POLICIES="${POLICIES:-full,random,random-beacon,triattention,rkv+prompt,recency+prompt}"
read -r -a SETS <<< "${SETS:-revisit-m4}"
report_begin q4-beacons "$@"
report_grid random random-beacon
others=$(echo ",$RUN_POLICIES," | sed 's/,full,/,/; s/,random,/,/; s/^,//; s/,$//')
scored=$(echo ",$others," | sed 's/,random-beacon,/,/; s/,recency+prompt,/,/; s/^,//; s/,$//')
/usr/bin/python3 scripts/report-lib.py table "$out/tables.md" "$out/accuracy.png" "Q4: random + beacons" "${runs[@]}"
/usr/bin/python3 scripts/report-lib.py compare "$out/compare.md" --vs "random=$others" --vs "random-beacon=$scored" "${runs[@]}"
{
  report_header "Q4: random plus beacons — does score-free eviction keep far revisits?"
  echo "\`random-beacon\` with its defaults: share 1/8 of K_sel, window 32 queries, distance 64 tokens; prompt pinned as \`random\`."
  echo "Accuracy [95% interval]; \`recency+prompt\` keeps the prompt and the newest slots only (the control)."
  echo
  cat "$out/tables.md"
  echo "![accuracy](q4-beacons/accuracy.png)"
  echo
  echo "## Paired tests"
  echo
  echo "Each policy against \`random\`, and the scored ones against \`random-beacon\`, on the same problems and budget."
  echo
  cat "$out/compare.md"
  echo
  report_reading
} > "docs/reports/$REPORT.md"
echo "wrote docs/reports/$REPORT.md"
