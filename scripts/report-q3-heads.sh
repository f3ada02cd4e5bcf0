#!/usr/bin/env bash
# Report Q3 "heads and GQA" (docs/reports/q3-heads.md): the reasoner with 1, 2 and 4 KV heads
# (models/reasoner-kv/: MQA / GQA / MHA, 4 query heads, one recipe), random (one keep-set draw per
# KV head) vs random-shared (one draw per layer, shared by its KV heads) vs scored selectors
# (snapkv+prompt, h2o+prompt, triattention) on chain / running / once (~600 trace tokens, N
# held-out problems each, tasks seed 1000, eval seed 1, greedy, r = 32).
# Prompt pinned at B = 80, 88, 128, 256 (the prompt is 67 tokens with BOS: at B = 80 / 88 only its
# first 47 / 55 tokens fit K_sel - 1, so some fact lines are left to the selector; from B = 100 on
# all of it is pinned), and random / random-shared with the prompt not pinned at B = 448, 512, 576.
# Usage: scripts/report-q3-heads.sh   (env N = problems per family, default 50; env VARIANTS = the
# variants to evaluate, default "kv1 kv2 kv4": several runs with disjoint VARIANTS may go side by
# side, and a last run with all of them (which resumes every finished rollout) writes the report;
# needs build/kvevict and /usr/bin/python3 with matplotlib)
set -euo pipefail
cd "$(dirname "$0")/.."
KV=./build/kvevict
N="${N:-50}"
OUT=out/report-q3
PINNED_POLICIES=full,random,random-shared,snapkv+prompt,h2o+prompt,triattention
PINNED_BUDGETS=80,88,128,256
UNPINNED_BUDGETS=448,512,576
DOC=docs/reports/q3-heads
mkdir -p "$OUT" "$DOC"
start=$(date +%s); load0=$(cut -d' ' -f1-3 /proc/loadavg)

for f in chain running once; do  # kept when present, so that side-by-side runs never rewrite them
  [ -f "$OUT/$f-tasks.jsonl" ] || $KV tasks gen --family "$f" --n "$N" --seed 1000 --length 600 -o "$OUT/$f-tasks.jsonl"
done
# TriAttention's query statistics, per model, from tasks outside the evaluation (seed 7).
[ -f "$OUT/calibration.txt" ] || for f in chain running once; do $KV tasks gen --family "$f" --n 25 --seed 7 --length 600; done |
  /usr/bin/python3 -c 'import json, sys
for line in sys.stdin:
    t = json.loads(line)
    sys.stdout.write(t["problem"] + t["trace"] + "\n")' > "$OUT/calibration.txt"

for v in ${VARIANTS:-kv1 kv2 kv4}; do
  model=models/reasoner-kv/reasoner-$v.gguf
  mkdir -p "$OUT/$v"
  [ -f "$OUT/$v/triattention-stats.json" ] ||
    $KV calibrate -m "$model" -f "$OUT/calibration.txt" -o "$OUT/$v/triattention-stats.json" --ctx 1024 -t 1 >/dev/null
  for f in chain running once; do
    $KV eval -m "$model" --tasks "$OUT/$f-tasks.jsonl" --policies "$PINNED_POLICIES" --budgets "$PINNED_BUDGETS" \
      --buffer 32 --temp 0 --rollouts 1 --seed 1 --param "stats=$OUT/$v/triattention-stats.json" -t 1 --no-plots \
      -o "$OUT/$v/$f" > "$OUT/$v/$f.log" 2>&1
    $KV eval -m "$model" --tasks "$OUT/$f-tasks.jsonl" --policies full,random,random-shared --no-protect-prompt \
      --budgets "$UNPINNED_BUDGETS" --buffer 32 --temp 0 --rollouts 1 --seed 1 -t 1 --no-plots \
      -o "$OUT/$v/$f-unpinned" > "$OUT/$v/$f-unpinned.log" 2>&1
  done
  # Seed check: the unpinned cells where random and random-shared differed most, re-drawn with eval
  # seeds 2 and 3 (kv1, where the two policies are the same distribution, is the null control).
  for s in 2 3; do
    for fb in once:576 chain:512,576; do
      f=${fb%%:*}
      $KV eval -m "$model" --tasks "$OUT/$f-tasks.jsonl" --policies full,random,random-shared --no-protect-prompt \
        --budgets "${fb#*:}" --buffer 32 --temp 0 --rollouts 1 --seed $s -t 1 --no-plots \
        -o "$OUT/$v/$f-unpinned-seed$s" > "$OUT/$v/$f-unpinned-seed$s.log" 2>&1
    done
  done
done
[ "${VARIANTS:-kv1 kv2 kv4}" = "kv1 kv2 kv4" ] || { echo "evaluated ${VARIANTS}; run again without VARIANTS for the report"; exit 0; }
/usr/bin/python3 scripts/report-q3-heads.py "$OUT" "$DOC"

{
  echo "# Q3: heads and GQA — does per-head independence matter, and does it need more KV heads?"
  echo
  echo "Made by \`scripts/report-q3-heads.sh\` (N = $N problems per family, tasks seed 1000, eval seed 1, greedy, r = 32;"
  echo "load $load0 before, $(cut -d' ' -f1-3 /proc/loadavg) after this run; this run's wall $(( $(date +%s) - start )) s, which resumes any finished rollouts;"
  echo "$(cat "$DOC/compute.txt")). Machine: 2 cores shared with other jobs."
  echo
  echo "Models: [\`models/reasoner-kv/\`](../../models/reasoner-kv/MODEL_CARD.md), three siblings fine-tuned by one recipe from the"
  echo "shipped reasoner (run 4): 1 KV head (MQA: the two K/V heads mean-pooled), 2 KV heads (GQA, unchanged),"
  echo "4 KV heads (MHA: each K/V head copied to both query heads of its group), all with 4 query heads of size 32."
  echo "\`random\` draws one keep-set per (layer, KV head); \`random-shared\` one per layer, used by all its KV heads"
  echo "(eviction-spec §3); both pin the prompt by default. With 1 KV head the two are the same policy."
  echo
  echo "Commands per variant V (kv1, kv2, kv4) and family F (chain, running, once):"
  echo
  echo '```'
  echo "kvevict tasks gen --family F --n $N --seed 1000 --length 600 -o F-tasks.jsonl"
  echo "kvevict calibrate -m models/reasoner-kv/reasoner-V.gguf -f calibration.txt -o V-stats.json --ctx 1024   # seed-7 tasks"
  echo "kvevict eval -m models/reasoner-kv/reasoner-V.gguf --tasks F-tasks.jsonl --policies $PINNED_POLICIES \\"
  echo "  --budgets $PINNED_BUDGETS --buffer 32 --temp 0 --rollouts 1 --seed 1 --param stats=V-stats.json"
  echo "kvevict eval -m models/reasoner-kv/reasoner-V.gguf --tasks F-tasks.jsonl --policies full,random,random-shared \\"
  echo "  --no-protect-prompt --budgets $UNPINNED_BUDGETS --buffer 32 --temp 0 --rollouts 1 --seed 1"
  echo '```'
  echo
  echo "Accuracy and 95% Wilson intervals (every cell also in [\`q3-heads/accuracy.csv\`](q3-heads/accuracy.csv)):"
  echo
  cat "$DOC/tables.md"
  echo "![random vs random-shared](q3-heads/independence.png)"
  echo
  echo "![all policies](q3-heads/scored.png)"
  echo
  echo "## Random vs random-shared, paired per problem"
  echo
  cat "$DOC/paired.md"
  echo
  echo "## Seed check (prompt not pinned)"
  echo
  echo "The same evaluations with eval seeds 2 and 3 (\`--seed S\`, new keep-set draws; same problems), for every variant:"
  echo
  cat "$DOC/seeds.md"
  echo
  echo "## Reading"
  echo
  cat docs/reports/readings/q3-heads.md
} > docs/reports/q3-heads.md
echo "wrote docs/reports/q3-heads.md"
