#!/usr/bin/env bash
# Report "real models": how far each eviction policy moves real models' next-token distributions
# from the full cache (docs/reports/real-models.md), as a second line of evidence beside the
# synthetic reasoner, and whether these models have attention sinks at all.
#
# For stories260K (GGUF) and TinyStories-656K (Hugging Face directory, loaded directly), teacher-
# forced windows from wikitext-2 (test), three PG-19 books (body only) and the TinyStories sample;
# for the shipped reasoner, `kvevict tasks gen` files (chain / running / once; problem = prompt,
# trace = continuation). Every evicting policy of `kvevict policies` and its +prompt variant, at
# budgets of 10, 20 and 40% of the window, the first P tokens pinned as the prompt by +prompt
# policies, with --sink-mass. TriAttention's query statistics come from `kvevict calibrate` on the
# fourth PG-19 book (10762), which is therefore held out of the evaluation set (reasoner: on
# held-out tasks, seed 7100).
#
# Usage: scripts/report-real-models.sh [model...]   (models: stories260k tinystories656k trace-reasoner, and
# reasoner, the old small model;
# default all; CORPORA="wikitext pg19 tinystories" picks the text corpora of the stories models). Needs ./build/kvevict
# and python3 (stdlib only). The defaults give each stories model 101 texts (50 wikitext + 3 x 16
# PG-19 + 3 TinyStories windows); one stories model then takes 4-5 wall minutes at -t 1
# (measured at load ~3 on 2 cores, one of them busy), the reasoner about 19 minutes (measured at load ~10 with 6 tasks
# per family), the trace reasoner about 62 minutes (583 s prompt sets + 3,117 s trace sets at load 5-6,
# TRACE_TASKS=14); raise WIKI/BOOK/TASKS/TRACE_TASKS for tighter CIs.
# Writes docs/reports/data/real-models/<model>/<corpus>/{divergence.csv,summary.json,sink_mass.csv}
# (committed) and regenerates docs/reports/real-models.md. Seed 1 everywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
KV=./build/kvevict
SHARED="${KVEVICT_SHARED:-../shared}"
DATA=${DATA:-docs/reports/data/real-models}
REPORT=${REPORT:-docs/reports/real-models.md}  # set it too when DATA is not the committed folder
TMP=${TMP:-out/real-models}
mkdir -p "$DATA" "$TMP"
LEN=${LEN:-256}      # tokens per window (BOS included)
R=${R:-8}            # recent buffer: B = 26 > r at 10% of 256
PROMPT=${PROMPT:-8}  # leading tokens pinned as the prompt: at 10% (B = 26) K_sel = B - r = 18 leaves 10 slots
                     # for the trace (with P = 32 > K_sel every pinned policy kept the same slots)
# Windows are disjoint --length-token slices spread evenly over a file (kvevict divergence --texts);
# a file holding fewer asks kvevict to warn, and run_div copies that warning into run.txt.
WIKI=${WIKI:-50}     # wikitext-2 test windows per model (the 1.3 MB file holds hundreds of 256-token windows)
BOOK=${BOOK:-16}     # windows per PG-19 book (3 books of 275-346 KB, each holding hundreds)
TINY=${TINY:-3}      # TinyStories sample windows: the 3.8 KB file holds only 3 for TinyStories-656K (7 for stories260K)
TASKS=${TASKS:-6}    # small test reasoner: tasks per family
TRACE_TASKS=${TRACE_TASKS:-14}  # trace reasoner: tasks per task set (8 sets: 112 texts)
FRACS=0.1,0.2,0.4
CORPORA=${CORPORA:-wikitext pg19 tinystories}
# Every policy that evicts, and the +prompt variants that differ from their base policy.
# streaming+prompt is left out: with P = 8 >= 4 sinks (and the reasoner's 66-69-token prompt) it keeps exactly what recency+prompt keeps.
POLICIES=random,random-unprotected,random-shared,random-beacon,triattention,recency,recency+prompt,streaming,snapkv,snapkv+prompt,rkv,rkv+prompt,vase,vase+prompt,h2o,h2o+prompt,tova,tova+prompt
BOOKS_EVAL=("$SHARED"/data/gutenberg-pg19-test-books/{10146,10321,10356}.txt)
BOOK_CAL="$SHARED/data/gutenberg-pg19-test-books/10762.txt"
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(stories260k tinystories656k trace-reasoner)

model_path() {
  case "$1" in
    stories260k) echo "$SHARED/models/stories260K/stories260K.gguf" ;;
    tinystories656k) echo "$SHARED/models/tinystories-656k" ;;
    reasoner) echo "models/reasoner/reasoner.gguf" ;;
    trace-reasoner) echo "${TRACE_MODEL:-models/trace-reasoner/trace-reasoner.gguf}" ;;
    *) echo "unknown model: $1" >&2; exit 2 ;;
  esac
}

run_div() { # model corpus texts length extra-args...
  local name=$1 corpus=$2 texts=$3 len=$4; shift 4
  local m; m=$(model_path "$name")
  local out="$DATA/$name/$corpus"
  mkdir -p "$out"
  local start; start=$(date +%s)
  $KV divergence -m "$m" --texts "$texts" --length "$len" --prompt-tokens "$PROMPT" --policies "$POLICIES" \
    --budget-fractions "$FRACS" -r "${RUN_R:-$R}" --sink-mass --seed 1 -t 1 \
    --param "triattention:stats=$TMP/$name-tri.json" -o "$out" "$@" > "$out/stdout.txt" 2> "$TMP/$name-$corpus.log"
  # run.txt keeps one entry per (model, corpus): this run's replaces the previous one.
  { grep -v "^$name $corpus: " "$DATA/run.txt" 2> /dev/null || true; } > "$TMP/run.txt"
  echo "$name $corpus: $texts texts asked, wall $(( $(date +%s) - start )) s, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$TMP/run.txt"
  # A file with fewer windows than asked is not an error to kvevict: keep its warning visible.
  { grep -h 'warning' "$TMP/$name-$corpus.log" || true; } | sed "s/^/$name $corpus: /" | tee -a "$TMP/run.txt"
  mv "$TMP/run.txt" "$DATA/run.txt"
}

for name in "${models[@]}"; do
  m=$(model_path "$name")
  case "$name" in
    reasoner)
      # TriAttention's statistics from the reasoner's own kind of text: held-out tasks (seed 7100).
      for fam in chain running once; do
        $KV tasks gen --family "$fam" --count 2 --seed 7100 --length 900 -o "$TMP/cal-$fam.jsonl"
      done
      python3 -c 'import json,sys; print("\n".join(d["problem"] + d["trace"] for f in sys.argv[1:] for d in map(json.loads, open(f))))' \
        "$TMP"/cal-{chain,running,once}.jsonl > "$TMP/cal-tasks.txt"
      $KV calibrate -m "$m" -f "$TMP/cal-tasks.txt" --tokens 4000 -t 1 -o "$TMP/$name-tri.json" > /dev/null 2>&1
      # The shipped reasoner was trained on chain / running / once only (model card), so the
      # recall family is not run: its full-cache traces would not be the model's own reasoning.
      # The problem (66-69 tokens) is the prompt, so windows are 1024 tokens (traces of ~900):
      # at 10% K_sel = 102 - r still holds the whole prompt.
      args=()
      for fam in chain running once; do
        $KV tasks gen --family "$fam" --count "$TASKS" --seed 7000 --length 900 -o "$TMP/tasks-$fam.jsonl"
        args+=(-f "$TMP/tasks-$fam.jsonl")
      done
      run_div "$name" tasks "$TASKS" 1024 "${args[@]}"
      ;;
    trace-reasoner)
      # The trace reasoner on the main job's task sets (scripts/main-job.sh): chain / running / once
      # (the prompt's facts), recall at M = 1, 2, 4, 8 and revisit (a value computed in the trace and
      # needed ~1,100 tokens later). Teacher-forced gold traces, which are what the model writes at
      # full cache (greedy accuracy 0.9-1.0, model card). TriAttention's statistics from held-out
      # tasks of every family (seed 7100); evaluated tasks use seed 7000.
      for spec in "chain --length 600" "running --length 600" "once --length 600" \
                  "recall --steps 166 --depth 6 --restate 1,2,4,8" "revisit --steps 166 --depth 6 --restate 4"; do
        # shellcheck disable=SC2086  # spec is a family and its options
        $KV tasks gen --family $spec --count 2 --seed 7100
      done | python3 -c 'import json,sys; print("\n".join(d["problem"] + d["trace"] for d in map(json.loads, sys.stdin)))' \
        > "$TMP/cal-trace-tasks.txt"
      $KV calibrate -m "$m" -f "$TMP/cal-trace-tasks.txt" --tokens 8000 -c 1536 -t 1 -o "$TMP/$name-tri.json" > /dev/null 2>&1
      # r = 32 as in the main job (a trace line is ~7 tokens; the stories models' r = 8 is one line).
      RUN_R=32
      # Two corpora, because budgets are fractions of --length and the two kinds of trace differ in
      # length: ~670 tokens (problem + 600-token trace) and ~1,267 (problem + 166 steps).
      args=()
      for fam in chain running once; do
        $KV tasks gen --family "$fam" --length 600 --count "$TRACE_TASKS" --seed 7000 -o "$TMP/tasks-$fam.jsonl"
        args+=(-f "$TMP/tasks-$fam.jsonl")
      done
      run_div "$name" prompt-tasks "$TRACE_TASKS" 664 "${args[@]}"
      args=()
      for m_ in 1 2 4 8; do
        $KV tasks gen --family recall --steps 166 --depth 6 --restate "$m_" --count "$TRACE_TASKS" --seed 7000 \
          -o "$TMP/tasks-recall-m$m_.jsonl"
        args+=(-f "$TMP/tasks-recall-m$m_.jsonl")
      done
      $KV tasks gen --family revisit --steps 166 --depth 6 --restate 4 --count "$TRACE_TASKS" --seed 7000 \
        -o "$TMP/tasks-revisit-m4.jsonl"
      args+=(-f "$TMP/tasks-revisit-m4.jsonl")
      run_div "$name" trace-tasks "$TRACE_TASKS" 1267 "${args[@]}"
      unset RUN_R
      ;;
    *)
      $KV calibrate -m "$m" -f "$BOOK_CAL" --gutenberg-body --tokens 4000 -t 1 -o "$TMP/$name-tri.json" > /dev/null 2>&1
      for corpus in $CORPORA; do
        case "$corpus" in
          wikitext) run_div "$name" wikitext "$WIKI" "$LEN" -f "$SHARED/data/wikitext-2-raw/wiki.test.raw" ;;
          pg19)
            bargs=(); for b in "${BOOKS_EVAL[@]}"; do bargs+=(-f "$b"); done
            run_div "$name" pg19 "$BOOK" "$LEN" --gutenberg-body "${bargs[@]}" ;;
          tinystories) run_div "$name" tinystories "$TINY" "$LEN" -f "$SHARED/data/tinystories/tinystories_sample.txt" ;;
          *) echo "unknown corpus: $corpus" >&2; exit 2 ;;
        esac
      done
      ;;
  esac
done
python3 scripts/report-real-models.py "$DATA" "$REPORT"
