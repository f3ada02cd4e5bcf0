#!/usr/bin/env bash
# Report Q3 on the trace reasoner (docs/reports/q3-trace-heads.md): per-head draws against one
# draw shared by a layer's KV heads, where the value lives in the trace. The paper's second claim
# is that the trace protects itself by redundancy across heads: with independent per-head draws
# (`random`) a value a head needs survives in some heads even when it is lost in others, which one
# shared draw (`random-shared`) cannot give. The trace reasoner has 4 KV heads initialised
# independently and trained from scratch (its head similarity is in models/trace-reasoner/
# MODEL_CARD.md), unlike the small reasoner's 4-KV-head variant (heads duplicated, Q3's main
# report). Sets: recall-m1 (a value computed once in the trace, needed ~1,100 tokens later) and
# revisit-m4 (re-read at 4 far checkpoints), prompt pinned by both policies; random is tested
# against random-shared on the same problems (sign test, TOST within the margin).
# Then where V survives: tools/value_survival.py (needs /usr/bin/python3 with torch for the
# tokenizer: scripts/setup.sh --train) on 100 recall-m1 problems at B = 768 for both policies —
# which (layer, KV head) caches hold a digit of V when the answer is written, in right and in
# wrong rollouts: does a right answer need V in some cache, or in a particular one?
# Grid and statistics: scripts/report-common.sh. Cost: 2 sets x 11 cells at N = 300, about
# 20 CPU-minutes, and 2 x 100 generations; the report's header gives the grid's measured time.
# Usage: scripts/report-q3-trace-heads.sh [--from-data]   (env N, BUDGETS, POLICIES, SETS, JOBS, MODEL)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/report-common.sh
N="${N:-300}"
BUDGETS="${BUDGETS:-128,256,384,512,768}"
POLICIES="${POLICIES:-full,random,random-shared}"
read -r -a SETS <<< "${SETS:-recall-m1 revisit-m4}"
report_begin q3-trace-heads "$@"
report_grid random-shared
SURVIVAL_N=100 SURVIVAL_B=768
# After the grid's record (report_grid), so run.env's wall time and load cover the grid only.
if [ "$FROM_DATA" = 0 ]; then
  for p in random random-shared; do
    # shellcheck disable=SC2086  # the set's generator options
    nice -n "${NICE:-10}" /usr/bin/python3 tools/value_survival.py --kvevict "$KV" --model "$MODEL" --n "$SURVIVAL_N" \
      --budget "$SURVIVAL_B" --policy "$p" -- ${SET_GEN[recall-m1]} > "$DATA/value-survival-$p.txt.tmp"
    mv "$DATA/value-survival-$p.txt.tmp" "$DATA/value-survival-$p.txt"
  done
fi
/usr/bin/python3 scripts/report-lib.py table "$out/tables.md" "$out/accuracy.png" \
  "Q3 on the trace reasoner: per-head vs shared draws" "${runs[@]}"
/usr/bin/python3 scripts/report-lib.py compare "$out/compare.md" --vs "random-shared=random" "${runs[@]}"
{
  report_header "Q3 on the trace reasoner: do independent per-head draws keep a trace value that one shared draw loses?"
  echo "\`random\` draws each KV head's keep-set independently; \`random-shared\` draws once per layer and"
  echo "gives every KV head of the layer the same slots. Both pin the prompt. Accuracy [95% interval]."
  echo
  cat "$out/tables.md"
  echo "![accuracy](q3-trace-heads/accuracy.png)"
  echo
  echo "## Paired tests"
  echo
  echo "\`random\` against \`random-shared\` on the same problems and budget."
  echo
  cat "$out/compare.md"
  echo
  echo "## Where the value survives (recall-m1, B = $SURVIVAL_B, $SURVIVAL_N problems, one greedy rollout each)"
  echo
  echo "\`tools/value_survival.py --n $SURVIVAL_N --budget $SURVIVAL_B --policy P -- ${SET_GEN[recall-m1]}\`: the grid's first"
  echo "$SURVIVAL_N problems, but fresh draws (\`kvevict generate -s\` with the task's index as seed, not the eval's"
  echo "per-problem streams) and a rollout counted right if any \`\\boxed{}\` holds the answer (eval reads the last), so its"
  echo "accuracy differs from the grid's cell; LlHh is layer l, KV head h:"
  echo
  for p in random random-shared; do
    echo '```'
    cat "$DATA/value-survival-$p.txt"
    echo '```'
  done
  echo
  report_reading
} > "docs/reports/$REPORT.md"
echo "wrote docs/reports/$REPORT.md"
