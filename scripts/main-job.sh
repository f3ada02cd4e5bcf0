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
# Only the kvevict binary: the test suite is built by scripts/test.sh.
[ "${SKIP_BUILD:-0}" = 1 ] || bash scripts/build.sh -DKVEVICT_BUILD_TESTS=OFF >/dev/null
KV=./build/kvevict
MODEL=models/reasoner/reasoner.gguf
N="${N:-30}"
BUDGETS="${BUDGETS:-128,256}"
THREADS="${THREADS:-1}"
OUT=out/main-job
mkdir -p "$OUT"
echo "== kvevict main job: models/reasoner/reasoner.gguf, $N held-out problems per family, budgets $BUDGETS" >&2
# Every registered policy, then "+prompt" for each evicting one that does not pin the prompt,
# except the unscored baselines (random-unprotected, recency, streaming), read from the registry.
POLICIES=$($KV policies --json | python3 -c 'import json, sys
ps = json.load(sys.stdin)
unscored = {"random-unprotected", "recency", "streaming"}
names = [p["name"] for p in ps]
names += [p["name"] + "+prompt" for p in ps if p["evicts"] and not p["protect_prompt"] and p["name"] not in unscored]
# recency+prompt is the control: the prompt plus the newest slots only. Where it matches the scored
# and random policies, the family needs nothing from the older trace and cannot tell them apart.
names.append("recency+prompt")
print(",".join(names))')

# TriAttention's query statistics come from tasks that are not in the evaluation set (seed 7).
for f in chain running once; do
  $KV tasks gen --family "$f" --count 25 --seed 7 --length 600
done | python3 -c 'import json, sys
for line in sys.stdin:
    t = json.loads(line)
    sys.stdout.write(t["problem"] + t["trace"] + "\n")' > "$OUT/calibration.txt"
$KV calibrate -m "$MODEL" -f "$OUT/calibration.txt" -o "$OUT/triattention-stats.json" -c 1024 -t "$THREADS"

for f in chain running once; do
  # Held-out problems (seed 1000; training used seeds 100-105), traces of ~600 tokens: more than
  # 4x the smallest budget, so eviction is exercised hard.
  $KV tasks gen --family "$f" --count "$N" --seed 1000 --length 600 -o "$OUT/$f-tasks.jsonl"
  echo "== family: $f"
  rm -rf "${OUT:?}/$f"
  $KV eval -m "$MODEL" -f "$OUT/$f-tasks.jsonl" --policies "$POLICIES" --budgets "$BUDGETS" \
    --buffer 32 --temp 0 --rollouts 1 --param "stats=$OUT/triattention-stats.json" -t "$THREADS" -o "$OUT/$f"
done

# The combined accuracy table docs/results.md shows (README shows a few of its rows): one row per (policy, budget), one column per family,
# accuracy with its 95% CI as each family's summary.json gives it.
python3 - "$OUT" chain running once > "$OUT/summary.md" <<'PY'
import json, sys
out, families = sys.argv[1], sys.argv[2:]
cells = {f: json.load(open(f"{out}/{f}/summary.json"))["cells"] for f in families}
def fmt(c):
    ci = c.get("accuracy_ci") or {}
    lo, hi = ci.get("lo"), ci.get("hi")
    return f"{c['accuracy']:.2f} [{lo:.2f}, {hi:.2f}]" if lo is not None else f"{c['accuracy']:.2f}"
heads = {"once": "once (stated once)"}
print("| policy | B | " + " | ".join(heads.get(f, f) for f in families) + " |")
print("|---|---:|" + "---|" * len(families))
for c0 in cells[families[0]]:
    row = [c0["policy"], "–" if c0["budget"] is None else str(c0["budget"])]
    for f in families:
        match = [c for c in cells[f] if c["label"] == c0["label"]]
        row.append(fmt(match[0]) if match else "–")
    print("| " + " | ".join(row) + " |")
PY
echo "== combined table: $OUT/summary.md" >&2
cat "$OUT/summary.md"
