#!/usr/bin/env bash
# Report "sinks": seed 004's sink claims, re-run from scratch (docs/reports/sinks.md).
# 1. StreamingLLM table in the small: stories260K perplexity on the TinyStories sample with a
#    window without sinks (`recency`), a window with 4 sinks (`streaming`) and `full`, vs budget.
# 2. Sink survival vs budget from keep-logs: the fraction of (layer, KV head) pairs that still
#    hold each of the first 4 positions after the last round of a 1000-token generation, for h2o,
#    tova, snapkv, random-unprotected and streaming.
# 3. Every model of the real-models report, the trace reasoner included, from that report's
#    committed data (docs/reports/data/real-models): its largest per-head attention mass on the
#    first 4 positions, and what 4 sinks add to a window (teacher-forced KL of streaming vs recency,
#    paired over texts): scripts/report-sinks-models.py.
# Usage: scripts/report-sinks.sh   (needs ./build/kvevict and /usr/bin/python3 with matplotlib;
# about 2 minutes on a quiet 2-core machine). Seed 1 everywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
KV=./build/kvevict
SHARED="${KVEVICT_SHARED:-../shared}"
MODEL="$SHARED/models/stories260K/stories260K.gguf"
TEXT="$SHARED/data/tinystories/tinystories_sample.txt"
OUT=docs/reports/sinks
mkdir -p "$OUT"
BUDGETS=16,32,64,128,256
start=$(date +%s)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" > "$OUT/run.txt"
# Three settings: the whole sample (about 1,700 tokens, beyond the model's 512-token context),
# the same with StreamingLLM's cache positions (keys re-rotated to their slot), the first 512.
$KV perplexity -m "$MODEL" -f "$TEXT" --policies full,recency,streaming --budgets "$BUDGETS" -r 8 --seed 1 -t 1 \
  > "$OUT/perplexity.txt"
$KV perplexity -m "$MODEL" -f "$TEXT" --policies full,recency,streaming --budgets "$BUDGETS" -r 8 --seed 1 -t 1 \
  --position-mode cache > "$OUT/perplexity-cache.txt"
$KV perplexity -m "$MODEL" -f "$TEXT" --policies full,recency,streaming --budgets "$BUDGETS" -r 8 --seed 1 -t 1 \
  --tokens 512 > "$OUT/perplexity-512.txt"
for pol in h2o tova snapkv random-unprotected streaming; do
  for b in 32 64 128 256 512; do
    $KV generate -m "$MODEL" -p "Once upon a time" -n 1000 --ignore-eos --temp 0 --policy "$pol" --budget "$b" -r 16 \
      --seed 1 -t 1 --keep-log "$OUT/keep-$pol-$b.jsonl" --keep-log-positions > /dev/null 2>&1
  done
done
# The same on the trace reasoner, generating its own trace for the first held-out recall problem
# (prompt 72 tokens: BOS and the problem; it stops after its answer, ~1,210 tokens), r = 32.
mkdir -p "$OUT/trace"
TRACE_PROMPT=$($KV tasks gen --family recall --steps 166 --depth 6 --restate 1 --count 1 --seed 1000 |
  /usr/bin/python3 -c 'import json, sys; sys.stdout.write(json.loads(sys.stdin.readline())["problem"])')
for pol in h2o tova snapkv random-unprotected streaming; do
  for b in 128 192 256 384 512; do
    $KV generate -m models/trace-reasoner/trace-reasoner.gguf -p "$TRACE_PROMPT" -n 1400 --temp 0 --policy "$pol" \
      --budget "$b" -r 32 --seed 1 -t 1 --keep-log "$OUT/trace/keep-$pol-$b.jsonl" --keep-log-positions > /dev/null 2>&1
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); wall $(( $(date +%s) - start )) s" >> "$OUT/run.txt"
/usr/bin/python3 - "$OUT" <<'PY'
import json, os, sys, collections
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out = sys.argv[1]
# Part 1: the perplexity table printed by kvevict (policy, budget, tokens, perplexity, ...).
def read_ppl(name):
    rows = []
    for line in open(os.path.join(out, name)):
        f = line.split()
        if len(f) >= 4 and f[0] in ("full", "recency", "streaming"):
            rows.append((f[0], f[1], float(f[3]), int(f[2])))
    full = [p for pol, b, p, n in rows if pol == "full"][0]
    return full, {(pol, int(b)): p for pol, b, p, n in rows if b != "-"}, rows[0][3]
settings = [("whole sample, logical positions", "perplexity.txt"), ("whole sample, cache positions", "perplexity-cache.txt"),
            ("first 512 tokens, logical positions", "perplexity-512.txt")]
res = {s: read_ppl(f) for s, f in settings}
full, ppl, _ = res[settings[0][0]]
budgets = sorted({b for pol, b in ppl})
# Part 2: sink survival after the last round, from the kept positions of every (layer, KV head).
def survival(folder):
    surv = collections.defaultdict(dict)
    for fn in sorted(os.listdir(folder)):
        if not fn.startswith("keep-"):
            continue
        pol, b = fn[5:-6].rsplit("-", 1)
        lines = [json.loads(l) for l in open(os.path.join(folder, fn))]
        last = max(l["round"] for l in lines)
        heads = [set(h) for l in lines if l["round"] == last for h in l["positions"]]
        n_seen = [l["n_seen"] for l in lines if l["round"] == last][0]
        surv[pol][int(b)] = (sum(sum(p in h for h in heads) for p in range(4)) / (4 * len(heads)),
                             sum(0 in h for h in heads) / len(heads), n_seen)
    return surv
def survival_table(f, surv, what):
    f.write(f"\nSink survival, {what}:\n\n| policy | " + " | ".join(f"B = {b}" for b in sorted(next(iter(surv.values())))) + " |\n")
    f.write("|---|" + "---:|" * len(next(iter(surv.values()))) + "\n")
    for pol in surv:
        cells = [f"{surv[pol][b][0]:.2f} ({surv[pol][b][1]:.2f})" for b in sorted(surv[pol])]
        f.write(f"| {pol} | " + " | ".join(cells) + " |\n")
    seen = sorted({v[2] for per in surv.values() for v in per.values()})
    f.write(f"\nCells: mean survival of positions 0-3 over (layer, KV head) pairs after the last round "
            f"(in parentheses: of position 0, the BOS token); sequence length at the last round "
            f"{seen[0] if len(seen) == 1 else f'{seen[0]}-{seen[-1]}'}.\n")
surv = survival(out)
with open(os.path.join(out, "tables.md"), "w") as f:
    for name, (fl, pp, n) in res.items():
        f.write(f"Perplexity, {name} ({n} scored tokens):\n\n")
        f.write("| budget B | recency (window, no sinks) | streaming (window + 4 sinks) | full |\n|---:|---:|---:|---:|\n")
        for b in budgets:
            f.write(f"| {b} | {pp[('recency', b)]:.3f} | {pp[('streaming', b)]:.3f} | {fl:.3f} |\n")
        f.write("\n")
    survival_table(f, surv, "stories260K, a 1,005-token generation from \"Once upon a time\" (r = 16)")
    survival_table(f, survival(os.path.join(out, "trace")),
                   "trace reasoner, its own trace for held-out recall problem 0 (r = 32; positions 0-3 are BOS and "
                   "the prompt's first fact)")
fig, ax = plt.subplots(1, 2, figsize=(10, 4))
for (name, (fl, pp, n)), c in zip(res.items(), ("C0", "C1", "C2")):
    for pol, ls in (("recency", "-"), ("streaming", "--")):
        ax[0].plot(budgets, [pp[(pol, b)] for b in budgets], marker="o", color=c, ls=ls, label=f"{pol}, {name}", lw=1)
    ax[0].axhline(fl, color=c, ls=":", lw=1)
ax[0].set_xscale("log", base=2); ax[0].set_yscale("log")
ax[0].set_xlabel("budget B (slots per KV head)"); ax[0].set_ylabel("perplexity (dotted: full)"); ax[0].legend(fontsize=6)
ax[0].set_title("stories260K, TinyStories sample")
for pol in surv:
    bs = sorted(surv[pol])
    ax[1].plot(bs, [surv[pol][b][0] for b in bs], marker="o", label=pol)
ax[1].set_xscale("log", base=2); ax[1].set_xlabel("budget B"); ax[1].set_ylabel("survival of positions 0-3")
ax[1].set_title("after the last round, 1005-token generation"); ax[1].legend()
fig.tight_layout(); fig.savefig(os.path.join(out, "sinks.png"), dpi=110)
PY
/usr/bin/python3 scripts/report-sinks-models.py docs/reports/data/real-models "$OUT/models.md"
{
  echo "# Seed 004's sink claims, re-run"
  echo
  echo "Made by \`scripts/report-sinks.sh\` (seed 1; parts 1-2 model \`stories260K\`, $(tr '\n' ' ' < "$OUT/run.txt");"
  echo "part 3 every model of the [real-models report](real-models.md), the trace reasoner included, from its committed data)."
  echo
  echo "Commands (from the script):"
  echo
  echo '```'
  echo "kvevict perplexity -m stories260K.gguf -f tinystories_sample.txt --policies full,recency,streaming --budgets $BUDGETS -r 8 --seed 1 [--position-mode cache | --tokens 512]"
  echo "kvevict generate -m stories260K.gguf -p \"Once upon a time\" -n 1000 --ignore-eos --temp 0 --policy P --budget B -r 16 --seed 1 --keep-log F --keep-log-positions"
  echo "  for P in h2o tova snapkv random-unprotected streaming, B in 32 64 128 256 512"
  echo '```'
  echo
  cat "$OUT/tables.md"
  echo
  echo "![sinks](sinks/sinks.png)"
  echo
  echo "## 3. Every model: sink heads, and what 4 sinks add to a window (teacher-forced KL from full)"
  echo
  echo "\`streaming\` keeps positions 0-3 and the newest B − 4 slots, \`recency\` the newest B; neither pins the"
  echo "prompt. Δ < 0: the sinks help (StreamingLLM's claim); Δ > 0: the 4 slots were worth more as recent ones."
  echo
  cat "$OUT/models.md"
  echo
  echo "## Reading"
  echo
  cat docs/reports/readings/sinks.md
} > docs/reports/sinks.md
rm -rf "$OUT"/keep-*.jsonl "$OUT/trace" "$OUT/nll.csv"
echo "wrote docs/reports/sinks.md"
