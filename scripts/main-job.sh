#!/usr/bin/env bash
# README's main command: installs what the build needs, builds kvevict, and runs the main job on
# the project's own trace-reading reasoner (models/trace-reasoner/trace-reasoner.gguf): held-out
# generated tasks of every family, the policies below at one budget, greedy decoding, accuracy
# with 95% CIs and paired tests against `full`. Results go to out/main-job/<task set>/ (summary.md,
# summary.csv, summary.json, PNGs) and the combined table to out/main-job/summary.md.
# Task sets: chain, running, once (~600-token traces; what they test is whether the prompt
# survives), recall at M = 1, 2, 4, 8 copies of a value computed in the trace, and revisit with 4
# re-reads (166 steps, ~1,190-token traces; the value is written ~1,100 tokens before the answer).
# Environment: MODEL, N (problems per task set, default 16), BUDGETS (default 256), POLICIES
# (default below; `all` = every registered policy, each unpinned scored one also with +prompt),
# THREADS (default 2), SKIP_BUILD=1 to reuse an existing ./build.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SKIP_BUILD:-0}" = 1 ] || bash scripts/setup.sh
# Only the kvevict binary: the test suite is built by scripts/test.sh.
[ "${SKIP_BUILD:-0}" = 1 ] || bash scripts/build.sh -DKVEVICT_BUILD_TESTS=OFF >/dev/null
KV=./build/kvevict
MODEL="${MODEL:-models/trace-reasoner/trace-reasoner.gguf}"
N="${N:-16}"
BUDGETS="${BUDGETS:-256}"
THREADS="${THREADS:-2}"
OUT=out/main-job
mkdir -p "$OUT"
# The default policies: full; random (prompt pinned) and the two random variants; the unpinned
# baselines; the scored selectors with the prompt pinned as random has it (the paper's matched
# protection); and recency+prompt, the control: the prompt plus the newest slots only. Where it
# matches random and the scored selectors, the task set needs nothing from the older trace and
# cannot tell them apart.
DEFAULT_POLICIES=full,random,random-unprotected,streaming,random-beacon,h2o+prompt,snapkv+prompt,rkv+prompt,tova+prompt,triattention,recency+prompt
POLICIES="${POLICIES:-$DEFAULT_POLICIES}"
if [ "$POLICIES" = all ]; then
  POLICIES=$($KV policies --json | python3 -c 'import json, sys
ps = json.load(sys.stdin)
unscored = {"random-unprotected", "recency", "streaming"}
names = [p["name"] for p in ps]
names += [p["name"] + "+prompt" for p in ps if p["evicts"] and not p["protect_prompt"] and p["name"] not in unscored]
names.append("recency+prompt")
print(",".join(names))')
fi
# Task sets: name, then the `kvevict tasks gen` options that make them.
SETS=(
  "chain|--family chain --length 600"
  "running|--family running --length 600"
  "once|--family once --length 600"
  "recall-m1|--family recall --steps 166 --depth 6 --restate 1"
  "recall-m2|--family recall --steps 166 --depth 6 --restate 2"
  "recall-m4|--family recall --steps 166 --depth 6 --restate 4"
  "recall-m8|--family recall --steps 166 --depth 6 --restate 8"
  "revisit-m4|--family revisit --steps 166 --depth 6 --restate 4"
)
echo "== kvevict main job: $MODEL, $N held-out problems per task set, budgets $BUDGETS" >&2

# TriAttention's query statistics come from tasks of every family that are not in the evaluation
# set (seed 7; held-out problems use seed 1000, training used seeds 100-107).
for spec in "chain --length 600" "running --length 600" "once --length 600" \
            "recall --steps 166 --restate 1,2,4,8" "revisit --steps 166 --restate 1,2,4,8"; do
  # shellcheck disable=SC2086  # spec is a family and its options
  $KV tasks gen --family $spec --count 10 --seed 7
done | python3 -c 'import json, sys
for line in sys.stdin:
    t = json.loads(line)
    sys.stdout.write(t["problem"] + t["trace"] + "\n")' > "$OUT/calibration.txt"
$KV calibrate -m "$MODEL" -f "$OUT/calibration.txt" --tokens 40000 -o "$OUT/triattention-stats.json" -c 1536 -t "$THREADS"

# A rollout stops at the model's context length, 2048 tokens with the prompt (1.6x the longest gold
# sequence): a trace that lost its place loops, and without the cap random-unprotected's recall
# rollouts averaged 5,690 generated tokens against 1,186, a third of the job's time.
names=()
for set in "${SETS[@]}"; do
  name=${set%%|*}
  names+=("$name")
  # shellcheck disable=SC2086  # the set's generator options
  $KV tasks gen ${set#*|} --count "$N" --seed 1000 -o "$OUT/$name-tasks.jsonl"
  echo "== task set: $name (${set#*|})"
  rm -rf "${OUT:?}/$name"
  $KV eval -m "$MODEL" -f "$OUT/$name-tasks.jsonl" --policies "$POLICIES" --budgets "$BUDGETS" \
    --buffer 32 --temp 0 --rollouts 1 --max-length 2048 --param "stats=$OUT/triattention-stats.json" \
    -t "$THREADS" -o "$OUT/$name"
done

# The combined accuracy table docs/results.md shows (README shows a few of its rows): one row per (policy, budget), one column per family,
# accuracy with its 95% CI as each family's summary.json gives it.
python3 - "$OUT" "${names[@]}" > "$OUT/summary.md" <<'PY'
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

# recall: how many copies of the value the traces held. The gold trace writes the memo plus its
# restatements; a rollout may write fewer (a missed restate decision or a wrong digit) or more.
# A copy is "&V" with V the gold value (the answer's digit after '&'). Accuracy is split by what
# each rollout wrote, so a column's M is checked, not assumed.
rec = [f for f in families if f.startswith("recall")]
if rec:
    def copies(trace, value):
        body = trace[:trace.rfind("\\boxed{")] if "\\boxed{" in trace else trace
        return body.count("&" + value)
    print()
    print("Copies of the value written before the answer (recall; gold = the generated trace's):")
    print()
    print("| task set | gold copies (mean) | policy | rollouts | copies written (mean) | accuracy, wrote < gold | accuracy, wrote >= gold |")
    print("|---|---:|---|---:|---:|---|---|")
    for f in rec:
        tasks = [json.loads(l) for l in open(f"{out}/{f}-tasks.jsonl")]
        values = [t["answer"].split("&")[-1] for t in tasks]
        gold = [copies(t["trace"], v) for t, v in zip(tasks, values)]
        by_policy = {}
        for l in open(f"{out}/{f}/rollouts.jsonl"):
            r = json.loads(l)
            label = r["policy"] + ("" if r["budget"] is None else f" B={r['budget']}")
            i = r["problem_index"]
            by_policy.setdefault(label, []).append((copies(r["text"], values[i]), gold[i], r["correct"]))
        for label, rows in by_policy.items():
            def acc(sel):
                return f"{sum(c for *_, c in sel) / len(sel):.2f} ({sum(c for *_, c in sel)}/{len(sel)})" if sel else "–"
            fewer = [x for x in rows if x[0] < x[1]]
            enough = [x for x in rows if x[0] >= x[1]]
            print(f"| {f} | {sum(gold) / len(gold):.1f} | {label} | {len(rows)} | {sum(x[0] for x in rows) / len(rows):.1f} | {acc(fewer)} | {acc(enough)} |")
PY
echo "== combined table: $OUT/summary.md" >&2
cat "$OUT/summary.md"
