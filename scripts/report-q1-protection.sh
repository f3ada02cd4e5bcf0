#!/usr/bin/env bash
# Report Q1 "protection off" (docs/reports/q1-protection.md), trace reasoner: every scored
# selector and random, with and without the prompt pinned (+prompt), and recency+prompt (the
# prompt plus the newest slots only: where it matches random, the set needs no older trace), on
# chain, running, once (what they test is whether the prompt survives) and recall M = 1 (a value
# computed once in the trace). Unpinned selectors are tested against random-unprotected (does any
# beat random once protection is off?), pinned ones against random (equivalence, TOST).
# Grid and statistics: scripts/report-common.sh. Cost at the defaults: 4 sets x 66 cells x N =
# ~35 CPU-s per problem (report-common.sh's rates), ~2.9 CPU-hours at N = 300.
# Usage: scripts/report-q1-protection.sh [--from-data]   (env N, BUDGETS, POLICIES, SETS, JOBS, MODEL)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/report-common.sh
N="${N:-300}"
BUDGETS="${BUDGETS:-128,192,256,384,512}"
POLICIES="${POLICIES:-full,random,random-unprotected,recency+prompt,snapkv,snapkv+prompt,rkv,rkv+prompt,vase,vase+prompt,h2o,h2o+prompt,tova,tova+prompt}"
read -r -a SETS <<< "${SETS:-chain running once recall-m1}"
report_begin q1-protection "$@"
report_grid random random-unprotected
pinned=() unpinned=(random)
for p in ${RUN_POLICIES//,/ }; do
  case $p in full|random|random-unprotected) ;; *+prompt|random-shared|random-beacon|triattention) pinned+=("$p") ;; *) unpinned+=("$p") ;; esac
done
/usr/bin/python3 scripts/report-lib.py table "$out/tables.md" "$out/accuracy.png" \
  "Q1: prompt pinned (dashed) or not (solid)" "${runs[@]}"
/usr/bin/python3 scripts/report-lib.py compare "$out/compare.md" \
  --vs "random=$(IFS=,; echo "${pinned[*]}")" --diff "random-unprotected=$(IFS=,; echo "${unpinned[*]}")" "${runs[@]}"
{
  report_header "Q1: with prompt protection off, does any scored selector beat random?"
  echo "Accuracy [95% interval]; \`random-unprotected\` is random with protection off, \`random\` with it on;"
  echo "\`recency+prompt\` keeps the prompt and the newest slots only (the control)."
  echo
  cat "$out/tables.md"
  echo "![accuracy](q1-protection/accuracy.png)"
  echo
  echo "## Paired tests"
  echo
  echo "Pinned policies against \`random\` (does pinned random match them?), unpinned ones and \`random\` against"
  echo "\`random-unprotected\` (does anything beat random once protection is off?)."
  echo
  cat "$out/compare.md"
  echo
  report_reading
} > "docs/reports/$REPORT.md"
echo "wrote docs/reports/$REPORT.md"
