#!/usr/bin/env bash
# Report "anomalies" (docs/reports/anomalies.md), reasoner, held-out seed 1000, greedy, r = 32:
# 1. vase+prompt on chain at B = 128: accuracy vs VaSE's value-range tier n_large (0, 8, 16, 24,
#    28, 32 = the default B/4). With the 67-token prompt pinned, K_sel = 96 leaves 29 free slots;
#    a tier of n_large >= 29 takes all of them and the SnapKV-weighted sample never runs.
# 2. running at B = 128 / 192 / 256 for snapkv+prompt and rkv+prompt (the main job saw lower
#    accuracy at 256 than at 128), from the old reasoner's grid (scripts/report-common-reasoner.sh).
# Usage: scripts/report-anomalies.sh  (env N = problems, default 20)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/report-common-reasoner.sh
start=$(date +%s); load0=$(cut -d' ' -f1-3 /proc/loadavg)
grid_run running running 600
$KV tasks gen --family chain --n "$N" --seed 1000 --length 600 -o "$GRID/vase-chain-tasks.jsonl"
for nl in 0 8 16 24 28 32; do
  $KV eval -m "$MODEL" --tasks "$GRID/vase-chain-tasks.jsonl" --policies full,vase+prompt,random --budgets 128 --buffer 32 \
    --temp 0 --rollouts 1 --seed 1 --param "n_large=$nl" -t 1 --no-plots -o "$GRID/vase-nlarge-$nl" > /dev/null 2>&1
done
# The running dip with 3x the problems (60; the first 20 are the grid's), pinned policies only.
$KV tasks gen --family running --n 60 --seed 1000 --length 600 -o "$GRID/running60-tasks.jsonl"
$KV eval -m "$MODEL" --tasks "$GRID/running60-tasks.jsonl" --policies full,random,snapkv+prompt,rkv+prompt \
  --budgets "$GRID_BUDGETS" --buffer 32 --temp 0 --rollouts 1 --seed 1 -t 1 --no-plots -o "$GRID/running60" \
  > "$GRID/running60.log" 2>&1
mkdir -p docs/reports/anomalies
/usr/bin/python3 scripts/report-lib.py table docs/reports/anomalies/running60.md docs/reports/anomalies/running60.png \
  "running, 60 problems" "running, 60 problems"=$GRID/running60
/usr/bin/python3 - "$GRID" <<'PY'
import csv, os, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
grid = sys.argv[1]
rows = []
for nl in (0, 8, 16, 24, 28, 32):
    for r in csv.DictReader(open(os.path.join(grid, f"vase-nlarge-{nl}", "summary.csv"))):
        if r["policy"] == "vase+prompt":
            rows.append((nl, float(r["accuracy"]), float(r["accuracy_lo"]), float(r["accuracy_hi"]), float(r["mean_generated"])))
with open("docs/reports/anomalies/vase.md", "w") as f:
    f.write("| n_large | free slots left for the weighted sample (29 - n_large) | vase+prompt accuracy [95% CI] | mean generated tokens |\n")
    f.write("|---:|---:|---|---:|\n")
    for nl, a, lo, hi, g in rows:
        f.write(f"| {nl} | {max(0, 29 - nl)} | {a:.2f} [{lo:.2f}, {hi:.2f}] | {g:.0f} |\n")
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.plot([r[0] for r in rows], [r[1] for r in rows], marker="o")
ax.axvline(29, color="k", ls=":", label="free slots = 29")
ax.set_xlabel("n_large (VaSE value-range tier)"); ax.set_ylabel("accuracy, chain, B = 128"); ax.set_ylim(-0.03, 1.03)
ax.legend(); fig.tight_layout(); fig.savefig("docs/reports/anomalies/vase.png", dpi=100)
PY
REPORT_POLICIES=random,snapkv+prompt,rkv+prompt,vase+prompt,h2o+prompt,tova+prompt \
  /usr/bin/python3 scripts/report-lib.py table docs/reports/anomalies/running.md docs/reports/anomalies/running.png \
  "running: accuracy vs budget" running=$GRID/running
{
  echo "# Anomalies: vase+prompt at B = 128, and running vs budget"
  echo
  echo "Made by \`scripts/report-anomalies.sh\` (N = $N problems, tasks seed 1000, eval seed 1, greedy, r = 32;"
  echo "load $load0 before, $(cut -d' ' -f1-3 /proc/loadavg) after; wall $(( $(date +%s) - start )) s)."
  echo
  echo '```'
  echo "kvevict tasks gen --family chain --n $N --seed 1000 --length 600 -o chain.jsonl"
  echo "kvevict eval -m models/reasoner/reasoner.gguf --tasks chain.jsonl --policies full,vase+prompt,random --budgets 128 \\"
  echo "  --buffer 32 --temp 0 --rollouts 1 --seed 1 --param n_large=NL     # NL in 0 8 16 24 28 32"
  echo '```'
  echo
  echo "## 1. vase+prompt on chain at B = 128"
  echo
  cat docs/reports/anomalies/vase.md
  echo
  echo "![vase](anomalies/vase.png)"
  echo
  echo "## 2. running: accuracy vs budget (the old reasoner's grid, scripts/report-common-reasoner.sh)"
  echo
  cat docs/reports/anomalies/running.md
  echo "![running](anomalies/running.png)"
  echo
  echo "The same with 60 problems (pinned policies; \`kvevict tasks gen --family running --n 60 --seed 1000 --length 600\`):"
  echo
  cat docs/reports/anomalies/running60.md
  echo "![running60](anomalies/running60.png)"
  echo
  echo "## Reading"
  echo
  cat docs/reports/readings/anomalies.md
} > docs/reports/anomalies.md
echo "wrote docs/reports/anomalies.md"
