#!/usr/bin/env bash
# Report Q2 "weak redundancy" (docs/reports/q2-redundancy.md), trace reasoner: recall with the
# value computed in the trace written M = 1, 2, 4, 8 times (M = 1: the seed's fact written once in
# the reasoning), random vs the scored selectors with the prompt pinned, TriAttention and
# recency+prompt (the control). Does random's accuracy rise with M (redundancy in the text), and
# does random ~ scored hold at M = 1? Each policy is tested against random on the same problems
# (TOST), and random at M = 2, 4, 8 against random at M = 1 (the sets share their problems'
# phase A, so problem i is paired across M). Grid and statistics: scripts/report-common.sh.
# N: 300 problems on recall-m1, where equivalence (random ~ scored within 5 points) is the claim and
# the TOST needs a few hundred paired problems to have power; 100 on recall-m2/m4/m8, where the
# questions are differences (random's gain from the restatements, random vs scored) of tens of points.
# Cost at the defaults (measured 2026-12-03, load ~2, two cells side by side): a recall-m1 cell at
# N = 300 takes 1.5-3 min (full, random, recency+prompt, h2o+prompt, triattention) to 3-15 min
# (snapkv/vase/rkv+prompt, rkv growing with B); the header gives the measured total.
# Usage: scripts/report-q2-redundancy.sh [--from-data]   (env N, SET_N, BUDGETS, POLICIES, SETS, JOBS, MODEL)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/report-common.sh
N="${N:-100}"
SET_N="${SET_N:-recall-m1=300}"
BUDGETS="${BUDGETS:-128,192,256,384,512,768}"
POLICIES="${POLICIES:-full,random,recency+prompt,triattention,snapkv+prompt,rkv+prompt,vase+prompt,h2o+prompt}"
read -r -a SETS <<< "${SETS:-recall-m1 recall-m2 recall-m4 recall-m8}"
report_begin q2-redundancy "$@"
report_grid random
across=()
for s in "${SETS[@]:1}"; do across+=(--across "random:$s:${SETS[0]}"); done
others=$(echo ",$RUN_POLICIES," | sed 's/,full,/,/; s/,random,/,/; s/^,//; s/,$//')
/usr/bin/python3 scripts/report-lib.py table "$out/tables.md" "$out/accuracy.png" \
  "Q2: recall, the value written M times" "${runs[@]}"
# Equivalence is the claim at M = 1 only (the first set), so the TOST family is that set's.
rest=$(IFS=,; echo "${SETS[*]:1}")
/usr/bin/python3 scripts/report-lib.py compare "$out/compare.md" --vs "random=$others@${SETS[0]}" \
  ${rest:+--diff "random=$others@$rest"} "${across[@]}" "${runs[@]}"
{
  report_header "Q2: weak redundancy — does random ≈ scored hold when a fact is written once in the trace?"
  echo "Accuracy [95% interval] per task set (\`recall-mM\`: the value written M times, the last copy ~160/M lines"
  echo "before the answer); \`recency+prompt\` keeps the prompt and the newest slots only (the control)."
  echo
  cat "$out/tables.md"
  echo "![accuracy](q2-redundancy/accuracy.png)"
  echo
  echo "## Paired tests"
  echo
  echo "Each policy against \`random\` on the same problems and budget (is random ≈ scored? equivalence tested on"
  echo "\`${SETS[0]}\` only, differences everywhere), and \`random\` on \`recall-mM\` against \`random\` on \`${SETS[0]}\`"
  echo "(does random gain from the restatements?)."
  echo
  cat "$out/compare.md"
  echo
  report_reading
} > "docs/reports/$REPORT.md"
echo "wrote docs/reports/$REPORT.md"
